"""The host work the link model adds to a host-side variant (no torch): numpy's stride and divide, or the host
mirror's slice, measured apart from the copy and never a time that already holds one, so a CUDA run's copy is
priced once (docs/method.md, "The link model").

- A variant that hands the host nothing (the host mirror): its time; no copy is inside it. A whole request or step of
  it also copies its upkeep (the page indices allocated in the step): on a run that crossed no link its time (that
  copy crossed nothing); on a CUDA run not separable, so not priced (its time holds that copy). Its twin at page size
  1 is no guide: there it slices L entries of its table, not L/p (until 2026-12-07 the twin's time was subtracted,
  which left it none).
- A variant that copies every token index and strides on the host (pre-PR; an undeclared variant the meter saw do
  the same; `adaptive` below its threshold): its time at page size p less its *twin*'s, the same slice at page size 1,
  which moved the same bytes in the same transfers and strides nothing; 0 at p = 1. A whole request or step likewise,
  against the same scenario at page size 1.
- Without a twin: on a run that crossed no link its time (nothing was copied across a link there); on a CUDA run none,
  and the model cannot price that row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvpages.analysis.families import Record, records
from kvpages.analysis.ratios import Analysis
from kvpages.core.links import BY_ROW, carries_host_work
from kvpages.core.names import FLOOR, per_request_of
from kvpages.schema.rows import TIMED

TWIN_PAGE_SIZE = 1
SCENARIO_SHAPE = ("kind", "side", "variant", "dtype", "layout", "requests", "tokens", "chunk_size", "busy_us")
"""What a whole request's or step's twin shares with it: all but the page size (and so its id)."""


@dataclass(frozen=True)
class HostWork:
    """A row's host work in µs (None: not separable here) and how it was found, in words."""

    us: float | None
    how: str


def host_side(analysis: Analysis, variant: str, row: Record) -> bool | None:
    """Whether `variant` strides on the host at this row: a BY_ROW variant by what the meter saw it move here (every
    token index: host; fewer: device; a step of both: None, not priced), any other as `Analysis.host_side`."""
    name = per_request_of(variant) or variant
    if name not in BY_ROW:
        return analysis.host_side(variant)
    if int(row["page_size"]) == TWIN_PAGE_SIZE:
        return True
    tokens, calls = (int(row["tokens"]), int(row["requests"])) if "tokens" in row else (int(row["seq_len"]), 1)
    itemsize = np.dtype(str(row["dtype"])).itemsize
    moved = int(row["d2h_bytes"])
    if moved == tokens * itemsize:
        return True
    return False if moved <= (tokens // int(row["page_size"]) + calls) * itemsize else None  # at most a page each more


def point_host_work(analysis: Analysis, variant: str, row: Record) -> HostWork:
    """The host work of a results.csv row of `variant` (module doc)."""
    twin = _point_twins(analysis).get((variant, str(row["dtype"]), str(row["layout"]), int(row["seq_len"])))
    return _host_work(analysis, variant, row, lambda: analysis.time_of(row), twin, analysis.time_of)


def scenario_host_work(analysis: Analysis, variant: str, row: Record, time: float) -> HostWork:
    """The host work of a scenarios.csv row (a whole request or step of `variant`, timed `time`), as a point's."""
    twin = _scenario_twins(analysis).get(tuple(str(row[c]) for c in SCENARIO_SHAPE))
    return _host_work(analysis, variant, row, lambda: time, twin, analysis.scenario_time)


def _host_work(analysis: Analysis, variant: str, row: Record, time: Callable[[], float], twin: Record | None,
               twin_time: Callable[[Record], float]) -> HostWork:
    """A row's host work (module doc), its time and its twin's as `time()` and `twin_time(twin)` give them."""
    if not carries_host_work(variant, bool(host_side(analysis, variant, row))):
        return HostWork(0.0, "none: it strides on the device")
    if int(row["d2h_bytes"]) == 0:
        return HostWork(time(), "its time: it copies nothing")
    if (per_request_of(variant) or variant) == FLOOR:  # a host mirror's request or step, with its upkeep (module doc)
        if not analysis.run.link_crossed:
            return HostWork(time(), "its time: its upkeep's copy crossed no link here")
        return HostWork(None, "not separable: its time holds its upkeep's copy")
    if int(row["page_size"]) == TWIN_PAGE_SIZE:
        return HostWork(0.0, "none at page size 1: no stride")
    if twin is not None and (twin["d2h_bytes"], twin["d2h_transfers"]) == (row["d2h_bytes"], row["d2h_transfers"]):
        return HostWork(max(0.0, time() - twin_time(twin)), "its time less its time at page size 1")
    return _without_twin(analysis, time())


def _without_twin(analysis: Analysis, time: float) -> HostWork:
    if not analysis.run.link_crossed:
        return HostWork(time, "its time (no twin at page size 1; nothing crossed a link here)")
    return HostWork(None, "not separable: no twin at page size 1 holds the same copy")


def _point_twins(analysis: Analysis) -> dict[tuple, Record]:
    def compute() -> dict[tuple, Record]:
        return {(str(r["variant"]), str(r["dtype"]), str(r["layout"]), int(r["seq_len"])): r
                for r in records(analysis.run.timed_rows()) if int(r["page_size"]) == TWIN_PAGE_SIZE}

    return analysis.run.cached(("point twins",), compute)


def _scenario_twins(analysis: Analysis) -> dict[tuple, Record]:
    def compute() -> dict[tuple, Record]:
        frame = analysis.run.scenarios
        if frame is None:
            return {}
        return {tuple(str(r[c]) for c in SCENARIO_SHAPE): r for r in records(frame[frame["status"].isin(TIMED)])
                if int(r["page_size"]) == TWIN_PAGE_SIZE}

    return analysis.run.cached(("scenario twins",), compute)

