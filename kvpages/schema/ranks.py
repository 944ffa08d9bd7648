"""Multi-rank runs (torchrun): the roles of ranks.csv's rows, and contention.csv's rows (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from kvpages.schema.rows import columns, scenario_row_id

CONTENTION_CSV = "contention.csv"

RANK, ALONE, STEP, ALONE_MAX = "rank", "alone", "step", "alone_max"
"""The roles of a block. rank: one rank's calls when every rank converts at once; alone: one rank's calls while the
others wait at the barrier; step: per cycle, the maximum over the ranks at once (what the scheduler step waits for);
alone_max: per cycle, the maximum over the ranks of their alone calls (the step the ranks would make if they did not
slow each other down). The k-th value of every role's block is the k-th cycle's."""


@dataclass(frozen=True)
class ContentionRow:
    """What converting at once costs, for one latency (contention.csv): the step (`rank` empty: `step` against
    `alone_max`) or one rank (`rank` against `alone`); ratio = at_once_median_us / alone_median_us, with its interval."""

    id: str
    scenario: str
    variant: str
    world_size: int
    rank: int | None
    latency: str
    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    repetitions: int
    cycles: int
    interval_unit: str
    at_once_median_us: float
    alone_median_us: float
    skew_median_us: float | None
    repro: str


CONTENTION_COLUMNS = columns(ContentionRow)


def contention_id(scenario: str, variant: str, world_size: int, latency: str, rank: int | None = None) -> str:
    """A contention.csv row's id: x<N>-<scenarios.csv row id>-<latency> for the step, x<N>-r<rank>-... for a rank."""
    who = "" if rank is None else f"r{rank}-"
    return f"x{world_size}-{who}{scenario_row_id(scenario, variant)}-{latency}"
