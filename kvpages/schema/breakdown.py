"""breakdown.csv: where the time of one call goes, per (variant, point), from three profiled passes (no torch).

Written by kvpages.measure.breakdown into the run folder; read by the report and the charts. The profiler's
overhead inflates every absolute figure, so the shares of a row are the result, not its microseconds.
Columns that do not apply on the run's device are empty: the aten columns on CUDA (there the host side
is split by CUDA API calls instead), the CUDA columns on CPU.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from dataclasses import dataclass, fields
from pathlib import Path

from kvpages.schema.writer import write_atomic

BREAKDOWN_CSV = "breakdown.csv"
PASSES = 3
"""Profiled passes over all the cases (kvpages.measure.breakdown)."""
CALLS = 3
"""Profiled calls per case in each pass, each in its own range; a row is the call of median wall time among a
case's PASSES x CALLS calls."""


@dataclass(frozen=True)
class BreakdownRow:
    """One (variant, point): microseconds of the call of median wall time among its `calls` profiled calls (all passes)."""

    id: str
    """Stable across runs: `<variant>-<point id>`, the case id of the timed row."""
    variant: str
    device: str
    dtype: str
    layout: str
    seq_len: int
    page_size: int
    calls: int
    wall_us: float
    """The call's wall time inside its profiler range."""
    host_us: float
    """CPU: outside every aten op (Python, numpy); CUDA: outside the CUDA API calls (Python, numpy, dispatch)."""
    aten_copy_us: float | None
    """CPU: self time of the aten copy ops (copy_, _to_copy, to, clone)."""
    aten_ops_us: float | None
    """CPU: self time of every other aten op (slicing views, divide, shift, cat, ...)."""
    launch_us: float | None
    """CUDA: CUDA API calls other than copies and synchronizes (kernel launches, allocations, events)."""
    wait_us: float | None
    """CUDA: copy and synchronize calls (cudaMemcpy*, *Synchronize): the host waits on the device there."""
    kernel_us: float | None
    memcpy_us: float | None
    memcpy_bytes: int | None
    memcpy_direction: str
    """The GPU copies' directions, e.g. 'DtoH' ('' when there was no copy)."""
    top_ops: str
    """The largest self times, e.g. 'aten::copy_ 12.1; aten::floor_divide 3.2' (µs per call)."""


BREAKDOWN_COLUMNS = tuple(f.name for f in fields(BreakdownRow))
_INTS = ("seq_len", "page_size", "calls", "memcpy_bytes")
_FLOATS = tuple(c for c in BREAKDOWN_COLUMNS if c.endswith("_us"))


def write_breakdown(folder: Path, rows: list[BreakdownRow]) -> Path:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=BREAKDOWN_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in dataclasses.asdict(row).items()})
    path = folder / BREAKDOWN_CSV
    write_atomic(path, out.getvalue())
    return path


def _value(column: str, text: str) -> object:
    if text == "" and column in _INTS + _FLOATS:
        return None
    if column in _INTS:
        return int(text)
    if column in _FLOATS:
        return float(text)
    return text


def read_breakdown(folder: Path) -> tuple[BreakdownRow, ...]:
    """The rows of `folder/breakdown.csv`; () when there is none. A malformed file is a ValueError naming it."""
    path = folder / BREAKDOWN_CSV
    if not path.is_file():
        return ()
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != BREAKDOWN_COLUMNS:
                raise ValueError(f"columns {reader.fieldnames}, expected {list(BREAKDOWN_COLUMNS)}")
            return tuple(BreakdownRow(**{k: _value(k, v) for k, v in line.items()}) for line in reader)  # type: ignore[arg-type]
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read it ({exc})") from None


def stack(row: BreakdownRow) -> tuple[tuple[str, float], ...]:
    """The parts of the call's wall time, in µs, that add up to `wall_us` (what the stacked chart shows).

    On CUDA the device time is shown inside the wait it caused: the kernels' and copies' share of the wait is
    split by their GPU durations, and what remains of the wait (queueing, synchronize latency) is its own part.
    """
    if row.device == "cuda":
        wait, launch = row.wait_us or 0.0, row.launch_us or 0.0
        kernel, memcpy = row.kernel_us or 0.0, row.memcpy_us or 0.0
        gpu = kernel + memcpy
        waited = min(wait, gpu)
        share = (lambda part: waited * part / gpu) if gpu > 0 else (lambda part: 0.0)
        return (("GPU kernels (waited for)", share(kernel)), ("GPU copies (waited for)", share(memcpy)),
                ("other wait (synchronize, queue)", wait - waited), ("CUDA API calls (launches)", launch),
                ("host: Python, numpy, dispatch", row.host_us))
    return (("aten copies", row.aten_copy_us or 0.0), ("other aten ops (stride, divide, ...)", row.aten_ops_us or 0.0),
            ("host: Python, numpy", row.host_us))


STACK_PARTS = {"cpu": tuple(label for label, _ in stack(BreakdownRow("", "", "cpu", "", "", 1, 1, 1, 0, 0, 0, 0, None,
                                                                     None, None, None, None, "", ""))),
               "cuda": tuple(label for label, _ in stack(BreakdownRow("", "", "cuda", "", "", 1, 1, 1, 0, 0, None, None,
                                                                      0, 0, 0, 0, 0, "", "")))}
"""The parts of `stack`, per device, in stacking order."""


def shares(row: BreakdownRow) -> tuple[tuple[str, float], ...]:
    """`stack` as fractions of the wall time (the result of the profiled passes)."""
    total = row.wall_us if row.wall_us > 0 and math.isfinite(row.wall_us) else 1.0
    return tuple((label, value / total) for label, value in stack(row))
