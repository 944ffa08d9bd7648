"""bandwidth.csv: copies large enough to fix a D2H bandwidth (no torch), timed by a CUDA sweep after its blocks
(kvpages.measure.probe) and read by `kvpages calibrate` as rows of its fit. The sweep's own copies are at most a few
MB, where a copy's fixed cost hides the bandwidth: these are 4-64 MiB, into pageable memory (`.cpu()`) and into a
pinned buffer, each round one blocking copy and its synchronize."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvpages.schema.rows import columns, read_rows
from kvpages.schema.writer import write_table

BANDWIDTH_CSV = "bandwidth.csv"
PROBE_BYTES = (4 << 20, 16 << 20, 64 << 20)
PROBE_BLOCKS = 3  # blocks per (memory, size): the units a fit resamples
PROBE_ROUNDS = 8  # rounds per block, each one copy of `bytes` and its synchronize


@dataclass(frozen=True)
class ProbeRow:
    """One block of one (memory, size): the median of its rounds, each a copy of `bytes` to the host and a sync."""

    memory: str  # pageable (`.cpu()`) or pinned (`copy_(non_blocking=True)` into a pinned buffer)
    bytes: int
    block: int
    rounds: int
    median_us: float
    min_us: float
    max_us: float


PROBE_COLUMNS = columns(ProbeRow)


def write_probe(folder: Path, rows: list[ProbeRow]) -> Path:
    return write_table(folder, BANDWIDTH_CSV, PROBE_COLUMNS, rows)


def read_probe(folder: Path) -> tuple[ProbeRow, ...]:
    """`folder/bandwidth.csv`'s rows; () without one. A malformed file is a ValueError naming it."""
    return read_rows(folder / BANDWIDTH_CSV, ProbeRow)
