"""Multi-rank runs (torchrun): the roles a step's rows take, and the contention a step pays (no torch import).

In a multi-rank run (kvpages.measure.ranks) every timed round of a step scenario starts on a
barrier, and the rounds alternate: rank 0 converts alone while the other ranks wait (the
one-rank baseline), then every rank converts at once, as the ranks of one scheduler step do.
The run folder holds meta.json's `ranks` (kvpages.schema.meta.RanksMeta), `ranks.csv` and
`rank_samples.csv` (kvpages.schema.rows.RankRow, RankSampleSet: one row per rank, one `step`
row, one `alone` row per (scenario, step variant)), and, once analysed, `contention.csv`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from kvpages.schema.rows import scenario_row_id

CONTENTION_CSV = "contention.csv"

RANK, STEP, ALONE = "rank", "step", "alone"
ROLES = (RANK, STEP, ALONE)
"""rank: one rank's own calls when every rank converts; step: per round, the maximum over the ranks (what the
scheduler step waits for); alone: rank 0 converting while the others wait at the barrier (the one-rank baseline)."""


@dataclass(frozen=True)
class ContentionRow:
    """What a step pays when every rank converts at once: the step (per round, the maximum over the ranks) over rank
    0 alone, for one latency; the median of the paired per-repetition log-ratios of block medians, with the interval
    of kvpages.core.stats (contention.csv)."""

    id: str
    scenario: str
    variant: str
    world_size: int
    latency: str
    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    repetitions: int
    processes: int
    interval_unit: str
    step_median_us: float
    alone_median_us: float
    skew_median_us: float | None
    repro: str


CONTENTION_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ContentionRow))


def contention_id(scenario: str, variant: str, world_size: int, latency: str) -> str:
    """A contention.csv row's stable id: x<N>-<scenarios.csv row id>-<latency>."""
    return f"x{world_size}-{scenario_row_id(scenario, variant)}-{latency}"
