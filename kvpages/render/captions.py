"""One caption sentence per chart, stating what it shows (no torch)."""

from __future__ import annotations

from kvpages.analysis.cite import percent
from kvpages.analysis.ratios import Analysis
from kvpages.core.names import called, variant_sort_key
from kvpages.core.sweep import ITEMSIZE, paged_bytes
from kvpages.render.text import coverage


def time_label(analysis: Analysis, what: str = "time") -> str:
    """What a measured time is on this run: a transfer only where a link was crossed."""
    return what if analysis.run.link_crossed else f"host-side {what} (no transfer)"


def caption(analysis: Analysis, name: str) -> str:
    """The caption of the chart file `name` (e.g. 'ratio_int32_fragmented.png')."""
    cpu = "" if analysis.run.link_crossed else " CPU run: no link crossed, so the measured times are host-side work."
    effect = percent(analysis.noise.min_effect)
    band = f"each band that variant's own {coverage(analysis)}"
    time = time_label(analysis)
    stem = name.rsplit(".", 1)[0]
    base = called(analysis.baseline)
    ideal = _on_the_ideal(analysis, stem) if stem.startswith("bytes_") else ""  # the rows read for that chart alone
    texts = {
        "latency": f"Measured {time} per call against the sequence length, a panel per page size: each marker is a "
                   f"variant's time (the geometric mean of its block medians), {band}.",
        "bytes": "Metered bytes handed to the host per call against the sequence length, a panel per page size, with "
                 f"the ideal ceil(L/p) x itemsize: {ideal}; a variant that hands over 0 "
                 "bytes (the host mirror) is marked on the axis floor.",
        "ratio": f"Merged PR / {base} {time} per call at every point, on a colour scale capped at 1/4 and 4 and centred "
                 f"on 1 (▲/▼: beyond the cap); each cell prints its interval; '~' with grey text: same (its interval "
                 f"within the {effect} minimum effect); '?' on a hatched cell: unclear.",
        "link_model": f"A model, not a measurement: the predicted merged PR / {base} time per call on each link profile "
                      "(pre-PR's measured host work + device ops, syncs, copies and bytes / bandwidth; every term and "
                      "its source in the report's link model section), against the sequence length, a panel per page "
                      "size; each band is the ratio's range with the assumed terms at their bounds (0.5-2x, or a fitted "
                      "profile's intervals), one at a time and all together.",
        "scenario_requests": f"Measured {time} per whole request against the prompt length, a panel per side and page "
                             f"size (prefill: one conversion per chunk; decode: one), {band}; the host mirror's line "
                             "includes its upkeep (one batched D2H per step).",
        "scenario_steps": f"Measured {time} per whole scheduler step against the requests per step B (ticks at the "
                          f"swept B), {band}: one D2H per request against one batched D2H; the host mirror's line "
                          "includes its upkeep.",
        "scenario_busy": "Behind a busy device queue: how long the scheduler thread is blocked against when the data "
                         "is ready, per step variant, with the queued busy time as a reference line.",
        "breakdown": "Where one call's wall time goes, as shares per part, a panel per page size, one bar per variant "
                     "and length, the profiled µs per call above each bar (the profiler inflates absolute times).",
        "contention": "Every rank's step at once against the ranks alone (see the contention table).",
    }
    for prefix, text in texts.items():
        if stem == prefix or stem.startswith(prefix + "_"):
            return text + cpu
    return f"{stem}." + cpu


def _on_the_ideal(analysis: Analysis, stem: str) -> str:
    """Which variants of the bytes chart `stem` (bytes_<dtype>_<layout>) hand over more than the ideal, and where:
    'every variant sits on it but pre-PR (21 of 28 points) and `adaptive` (12 of 28 points)'; rows of 0 bytes are the
    caption's next clause."""
    rows = analysis.run.ok_rows()
    at = rows[(rows["dtype"] + "_" + rows["layout"]) == stem.removeprefix("bytes_")]
    ideal = paged_bytes(at["seq_len"], at["page_size"], at["dtype"].map(ITEMSIZE))
    moved = at[at["d2h_bytes"] > 0]
    off = (moved["d2h_bytes"] != ideal[moved.index]).groupby(moved["variant"]).agg(["sum", "size"])
    off = off[off["sum"] > 0].sort_index(key=lambda names: names.map(variant_sort_key))
    if off.empty:
        return "every variant sits on it"
    said = [f"{called(str(v))} ({'every point' if n == size else f'{n} of {size} points'})"
            for v, n, size in zip(off.index, off["sum"], off["size"], strict=True)]
    return f"every variant sits on it but {', '.join(said[:-1]) + ' and ' if len(said) > 1 else ''}{said[-1]}"
