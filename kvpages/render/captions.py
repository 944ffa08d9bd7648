"""One caption sentence per chart, stating what it shows (no torch)."""

from __future__ import annotations

from kvpages.analysis.ratios import Analysis
from kvpages.core.links import LAUNCH_SYNC_US


def caption(analysis: Analysis, name: str) -> str:
    """The caption of the chart file `name` (e.g. 'ratio_int32_fragmented.png')."""
    cpu = "" if analysis.run.link_crossed else " On this CPU run no link was crossed: the times are host-side work."
    effect = f"{analysis.noise.min_effect:.1%}"
    stem = name.rsplit(".", 1)[0]
    texts = {
        "latency": "Median time per call against the sequence length, a panel per page size; each band is the "
                   "interval of the variant's ratio to pre-PR (the one the verdicts use) applied to pre-PR's median.",
        "bytes": "Metered bytes handed to the host per call against the sequence length, a panel per page size, with "
                 "the ideal ceil(L/p) x itemsize: every variant but pre-PR sits on it.",
        "ratio": f"Merged PR / pre-PR time per call at every point, on a colour scale capped at 1/4 and 4 and centred "
                 f"on 1 (▲/▼: beyond the cap); each cell prints its interval, or '~' when the verdict is same (within "
                 f"the {effect} minimum effect).",
        "link_model": f"A model, not a measurement: the modeled merged PR / pre-PR time ratio per page size, the median "
                      f"of the five link profiles (bands: their range at the smallest and largest page size), with "
                      f"{LAUNCH_SYNC_US:g} µs of launch and sync for the merged PR's device op (kvpages/core/links.py).",
        "scenario_requests": "Time per whole request against the prompt length, a panel per side and page size "
                             "(prefill: one conversion per chunk; decode: one conversion), bands the interval of "
                             "each step variant's ratio to per_request[host_stride].",
        "scenario_steps": "Time per whole scheduler step against the requests per step, a panel per page size, "
                          "bands as in the request chart: one D2H per request against one batched D2H.",
        "scenario_busy": "Behind a busy device queue: how long the scheduler thread is blocked against when the data "
                         "is ready, per step variant, with the queued busy time as a reference line.",
    }
    for prefix, text in texts.items():
        if stem == prefix or stem.startswith(prefix + "_"):
            return text + cpu
    return f"{stem}." + cpu
