"""`python -m kvpages` is the `kvpages` command."""

from kvpages.cli import main

raise SystemExit(main())
