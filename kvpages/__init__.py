"""kvpages: measure the device-to-host cost of turning KV token indices into page indices.

Importing this package is cheap and never imports torch. The measuring side
(`kvpages.measure`) is the only one that needs torch; the core (`kvpages.core`), the
run-folder schema (`kvpages.schema`), the analysis (`kvpages.analysis`) and the rendering
(`kvpages.render`: `kvpages plot`, `report`, `compare`) work with only pandas and matplotlib.
"""

__version__ = "0.1.0"
