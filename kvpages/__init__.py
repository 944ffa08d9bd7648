"""kvpages: measure the device-to-host cost of turning KV token indices into page indices. Only the measuring side
(`kvpages.measure`) imports torch; core, schema, analysis and render need only pandas and matplotlib."""

__version__ = "0.1.0"
