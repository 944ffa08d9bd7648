"""breakdown.csv: where the time of one call goes, per (variant, point), from profiled passes (no torch). The profiler
inflates every absolute figure, so a row's shares are the result; the other device's columns are empty."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from kvpages.schema.rows import columns, read_rows
from kvpages.schema.writer import write_table

BREAKDOWN_CSV = "breakdown.csv"
PASSES = 1  # profiled passes over all the cases (kvpages.measure.breakdown); 3 before 2026-12-05 (calls 3)
CALLS = 5  # profiled calls per case in each pass, each in its own range (a row is the call of median wall time of them all)


@dataclass(frozen=True)
class BreakdownRow:
    """One (variant, point): microseconds of the call of median wall time among its `calls` profiled calls (all passes)."""

    id: str  # stable across runs: `<variant>-<point id>`, the case id of the timed row
    variant: str
    device: str
    dtype: str
    layout: str
    seq_len: int
    page_size: int
    calls: int
    wall_us: float  # inside its profiler range
    host_us: float  # CPU: outside every aten op (Python, numpy); CUDA: outside the CUDA API calls (and dispatch)
    aten_copy_us: float | None  # CPU: self time of the aten copy ops (copy_, _to_copy, to, clone)
    aten_ops_us: float | None  # CPU: self time of every other aten op (slicing views, divide, shift, cat, ...)
    launch_us: float | None  # CUDA: the API calls that only queue work (launches, allocations, events, async pinned copies)
    wait_us: float | None  # CUDA: the calls the host waits in (cu*Synchronize, pageable copies: measure.breakdown.host_waits)
    kernel_us: float | None
    memcpy_us: float | None
    memcpy_bytes: int | None
    memcpy_direction: str  # the GPU copies' directions, e.g. 'DtoH' ('' when there was no copy)
    top_ops: str  # the largest self times, e.g. 'aten::copy_ 12.1; aten::floor_divide 3.2' (µs per call)


BREAKDOWN_COLUMNS = columns(BreakdownRow)


def write_breakdown(folder: Path, rows: list[BreakdownRow]) -> Path:
    return write_table(folder, BREAKDOWN_CSV, BREAKDOWN_COLUMNS, rows)


def read_breakdown(folder: Path) -> tuple[BreakdownRow, ...]:
    """The rows of `folder/breakdown.csv`; () when there is none. A malformed file is a ValueError naming it."""
    return read_rows(folder / BREAKDOWN_CSV, BreakdownRow)


STACK_PARTS = {"cpu": ("aten copies", "other aten ops (stride, divide, ...)", "host: Python, numpy"),
               "cuda": ("GPU kernels (waited for)", "GPU copies (waited for)", "other wait (synchronize, queue)",
                        "CUDA API calls (launches)", "host: Python, numpy, dispatch")}


def stack(row: BreakdownRow) -> tuple[tuple[str, float], ...]:
    """The parts of the call's wall time, in µs, that add up to `wall_us`. On CUDA the wait is split between the
    kernels and copies by their GPU durations, and what remains of it (queueing, synchronize latency) is a part."""
    if row.device == "cuda":
        wait, launch = row.wait_us or 0.0, row.launch_us or 0.0
        kernel, memcpy = row.kernel_us or 0.0, row.memcpy_us or 0.0
        gpu = kernel + memcpy
        waited = min(wait, gpu)
        share = (lambda part: waited * part / gpu) if gpu > 0 else (lambda part: 0.0)
        return tuple(zip(STACK_PARTS["cuda"], (share(kernel), share(memcpy), wait - waited, launch, row.host_us),
                         strict=True))
    return tuple(zip(STACK_PARTS["cpu"], (row.aten_copy_us or 0.0, row.aten_ops_us or 0.0, row.host_us), strict=True))


def shares(row: BreakdownRow) -> tuple[tuple[str, float], ...]:
    """`stack` as fractions of the wall time (the result of the profiled passes)."""
    total = row.wall_us if row.wall_us > 0 and math.isfinite(row.wall_us) else 1.0
    return tuple((label, value / total) for label, value in stack(row))
