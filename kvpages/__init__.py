"""kvpages: measure the device-to-host cost of turning KV token indices into page indices.

Importing this package is cheap and never imports torch: the analysis side
(`kvpages plot`, `report`, `compare`) works with only pandas and matplotlib.
The measuring side lives in `kvpages.variants`, `kvpages.inputs`,
`kvpages.meter` and `kvpages.harness`, which need torch.
"""

__version__ = "0.1.0"
