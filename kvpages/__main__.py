"""`python -m kvpages` is the `kvpages` command."""

import sys

from kvpages.cli import main

sys.exit(main())
