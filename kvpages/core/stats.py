"""Statistics at the levels that vary: processes, then repetitions within them (no torch, no scipy).

A block is summarised by its median; a whole process can run a few percent slow (layout, allocator state), so
intervals resample processes, then repetitions (Kalibera and Jones, "Rigorous Benchmarking in Reasonable Time",
ISMM 2013; `Levels`), or with one process use the order-statistic interval of the median (`median_interval`).
Between two runs: `between_runs` (Hodges-Lehmann with its Mann-Whitney interval below 2 processes; Hollander and
Wolfe 1999, 4.3). docs/method.md gives the reasoning and the coverage checks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Protocol

import numpy as np

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """A ratio estimate and its interval, from `n` repetitions, at the confidence the data allow (`confidence`)."""

    ratio: float
    ci_low: float
    ci_high: float
    n: int
    confidence: float
    unit: str = "repetition"
    """What `n` counts and the interval samples: "process" (fresh processes) or "repetition" (within one process)."""

    @property
    def known(self) -> bool:
        return math.isfinite(self.ci_high)



def unknown(ratio: float, n: int) -> Interval:
    """Too few repetitions to form any interval."""
    return Interval(ratio, 0.0, math.inf, n, math.nan)


def block_medians(blocks: list[np.ndarray]) -> np.ndarray:
    """One median per repetition."""
    return np.array([np.median(b) for b in blocks])


def median_rank(n: int, confidence: float = CONFIDENCE) -> tuple[int, float]:
    """(k, coverage): [x_(k), x_(n+1-k)] covers the median with probability `coverage` >= `confidence`,
    for the largest such k; where no k reaches it (n <= 5 at 95%), k = 1 with the coverage it has."""
    best, coverage = 1, 1 - 2 * 0.5**n
    for k in range(1, n // 2 + 1):
        tail = sum(math.comb(n, i) for i in range(k)) / 2**n
        if 1 - 2 * tail >= confidence:
            best, coverage = k, 1 - 2 * tail
    return best, coverage


def median_interval(logs: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """exp(median of `logs`) with the order-statistic interval of the median; one value forms none."""
    n = logs.size
    center = math.exp(float(np.median(logs)))
    if n < 2:
        return unknown(center, n)
    k, coverage = median_rank(n, confidence)
    ordered = np.sort(logs)
    return Interval(center, math.exp(float(ordered[k - 1])), math.exp(float(ordered[n - k])), n, coverage)


def shift_interval(a_logs: np.ndarray, b_logs: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """exp(Hodges-Lehmann shift of b_logs over a_logs) with its Mann-Whitney interval (normal approximation)."""
    n, m = a_logs.size, b_logs.size
    if n < 2 or m < 2:
        return unknown(math.exp(float(np.median(b_logs) - np.median(a_logs))), min(n, m))
    diffs = np.sort(np.subtract.outer(b_logs, a_logs).ravel())
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    k = math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12))
    k = max(k, 0)
    return Interval(math.exp(float(np.median(diffs))), math.exp(float(diffs[k])), math.exp(float(diffs[-1 - k])),
                    min(n, m), confidence)


@dataclass(frozen=True)
class Components:
    """The spread of a log quantity at each level (standard deviations; ~ relative spreads, as a CV)."""

    between_process: float
    """Of the process means, less what the within-process spread explains (nan with one process)."""
    within_process: float
    """Of the repetitions around their process's mean (pooled)."""


@dataclass(frozen=True)
class Levels:
    """Log values per repetition (a block median, or a paired log-ratio), with the process each came from."""

    values: np.ndarray
    processes: np.ndarray

    def __post_init__(self) -> None:
        if self.values.shape != self.processes.shape:
            raise ValueError(f"{self.values.size} values but {self.processes.size} process ids")

    @functools.cached_property
    def process_count(self) -> int:
        return int(np.unique(self.processes).size)

    def by_process(self) -> list[np.ndarray]:
        return [self.values[self.processes == p] for p in np.unique(self.processes)]

    def interval(self, confidence: float = CONFIDENCE) -> Interval:
        """exp of the estimate with its interval: at the process level with >= 2 processes, else within one."""
        if self.process_count < 2:
            return median_interval(self.values, confidence)
        return hierarchical_interval(self, confidence)

    @functools.cached_property
    def bootstrap(self) -> np.ndarray:
        """The two-stage bootstrap's resampled medians, seeded. The draws depend only on the shape (repetitions per
        process), so they are drawn once per shape (`_seeded_draws`): a run has hundreds of `Levels` of one shape."""
        groups = self.by_process()
        return _medians_of(groups, _seeded_draws(tuple(g.size for g in groups)))

    @functools.cached_property
    def bootstrap_means(self) -> np.ndarray:
        """The means of the same resamples as `bootstrap`."""
        groups = self.by_process()
        return _means_of(groups, _seeded_draws(tuple(g.size for g in groups)))

    def components(self) -> Components:
        groups = self.by_process()
        within_df = sum(g.size - 1 for g in groups)
        within_var = sum(float(np.sum((g - g.mean()) ** 2)) for g in groups) / within_df if within_df else math.nan
        if len(groups) < 2:
            return Components(math.nan, math.sqrt(within_var) if within_df else math.nan)
        sizes = np.array([g.size for g in groups], dtype=float)
        mean_var = float(np.var([g.mean() for g in groups], ddof=1))
        per_process = len(sizes) / float(np.sum(1 / sizes))  # harmonic mean: repetitions per process
        explained = within_var / per_process if within_df else 0.0
        return Components(math.sqrt(max(0.0, mean_var - explained)), math.sqrt(within_var) if within_df else math.nan)


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20130617
"""Fixed, so the same run folder always gives the same intervals."""


@dataclass(frozen=True)
class _Draws:
    """The indices of BOOTSTRAP_RESAMPLES two-stage resamples of one shape, into the processes' padded values."""

    flat: np.ndarray
    """(resamples, processes x width): the drawn process's row times the width, plus the drawn repetition."""
    padding: np.ndarray | None
    """Where a drawn process has fewer repetitions than the widest (those cells are skipped); None: none has."""


def _draws(sizes: tuple[int, ...], rng: np.random.Generator) -> _Draws:
    """Processes with replacement, then each drawn process's repetitions with replacement (Kalibera and Jones 2013,
    section 4.3), for processes of `sizes` repetitions: the generator is drawn exactly as it always was."""
    count, width = len(sizes), max(sizes)
    sizes_array = np.array(sizes)
    drawn = rng.integers(0, count, size=(BOOTSTRAP_RESAMPLES, count))
    within = (rng.random((BOOTSTRAP_RESAMPLES, count, width)) * sizes_array[drawn][:, :, None]).astype(int)
    flat = (drawn[:, :, None] * width + within).reshape(BOOTSTRAP_RESAMPLES, -1)
    if (sizes_array == width).all():
        return _Draws(flat, None)
    padding = (np.arange(width)[None, None, :] >= sizes_array[drawn][:, :, None]).reshape(BOOTSTRAP_RESAMPLES, -1)
    return _Draws(flat, padding)


@functools.lru_cache(maxsize=64)
def _seeded_draws(sizes: tuple[int, ...]) -> _Draws:
    """`_draws` from a fresh generator seeded with BOOTSTRAP_SEED (what every `Levels.bootstrap` uses)."""
    return _draws(sizes, np.random.default_rng(BOOTSTRAP_SEED))


def _medians_of(groups: list[np.ndarray], draws: _Draws) -> np.ndarray:
    """The median of each resample."""
    width = max(g.size for g in groups)
    padded = np.full((len(groups), width), np.nan)
    for i, g in enumerate(groups):
        padded[i, :g.size] = g
    values = padded.ravel()[draws.flat]
    if draws.padding is not None:
        values[draws.padding] = np.nan
        return np.nanmedian(values, axis=1)  # a smaller process draws fewer
    return np.median(values, axis=1)


def _means_of(groups: list[np.ndarray], draws: _Draws) -> np.ndarray:
    """The mean of each resample (a smaller process draws fewer: its padded cells are left out)."""
    width = max(g.size for g in groups)
    padded = np.zeros((len(groups), width))
    for i, g in enumerate(groups):
        padded[i, :g.size] = g
    values = padded.ravel()[draws.flat]
    if draws.padding is None:
        return values.mean(axis=1)
    kept = ~draws.padding
    return (values * kept).sum(axis=1) / kept.sum(axis=1)


def _resampled_medians(levels: Levels, rng: np.random.Generator) -> np.ndarray:
    """BOOTSTRAP_RESAMPLES medians, each of a two-stage resample drawn from `rng` (`_draws`)."""
    groups = levels.by_process()
    return _medians_of(groups, _draws(tuple(g.size for g in groups), rng))


def hierarchical_interval(levels: Levels, confidence: float = CONFIDENCE) -> Interval:
    """exp(median of every repetition) with the percentile interval of its two-stage bootstrap."""
    medians = levels.bootstrap
    lo, hi = np.percentile(medians, [50 * (1 - confidence), 50 * (1 + confidence)])
    return Interval(math.exp(float(np.median(levels.values))), math.exp(float(lo)), math.exp(float(hi)),
                    levels.process_count, confidence, "process")


def between_runs_shifts(a: Levels, b: Levels) -> np.ndarray:
    """The log shifts B - A of the two runs' independent two-stage bootstraps (seeded), each >= 2 processes."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    return _resampled_medians(b, rng) - _resampled_medians(a, rng)


def between_runs(a: Levels, b: Levels, confidence: float = CONFIDENCE) -> Interval:
    """B over A: the two medians' ratio, with the percentile interval of the ratio of the two runs' independent
    two-stage bootstraps when both have >= 2 processes; else the Hodges-Lehmann shift of their repetitions."""
    if a.process_count < 2 or b.process_count < 2:
        return shift_interval(a.values, b.values, confidence)
    shifts = between_runs_shifts(a, b)
    lo, hi = np.percentile(shifts, [50 * (1 - confidence), 50 * (1 + confidence)])
    center = float(np.median(b.values) - np.median(a.values))
    return Interval(math.exp(center), math.exp(float(lo)), math.exp(float(hi)),
                    min(a.process_count, b.process_count), confidence, "process")


def finite_median(values: list[float]) -> float:
    """The median of the finite values (an unknown interval's width is infinite), nan when there are none."""
    finite = [v for v in values if math.isfinite(v)]
    return float(np.median(finite)) if finite else math.nan


def relative_spread(medians: np.ndarray) -> float:
    """The spread between repetitions: the standard deviation of log block medians (~ the CV); 0 for one."""
    return float(np.std(np.log(medians), ddof=1)) if medians.size > 1 else 0.0


def quartiles(blocks_us: list[np.ndarray], prefix: str = "") -> dict[str, float]:
    """`{prefix}q1_us`, `{prefix}median_us`, `{prefix}q3_us` of every round of every block, pooled."""
    q1, median, q3 = np.percentile(np.concatenate(blocks_us), [25, 50, 75])
    return {f"{prefix}q1_us": float(q1), f"{prefix}median_us": float(median), f"{prefix}q3_us": float(q3)}


class LatencyBlock(Protocol):
    """One timed block of a whole request or step: per round, blocked and ready microseconds."""

    @property
    def blocked_us(self) -> tuple[float, ...]: ...
    @property
    def ready_us(self) -> tuple[float, ...]: ...


def latency_statistics(blocks: Sequence[LatencyBlock]) -> dict[str, float]:
    """A request's or step's row statistics: blocked and ready quartiles of every round of every block pooled, the
    rounds and the repetitions (blocks)."""
    pooled = [quartiles([np.asarray(getattr(b, f"{what}_us")) for b in blocks], f"{what}_")
              for what in ("blocked", "ready")]
    return {**pooled[0], **pooled[1], "rounds": sum(len(b.blocked_us) for b in blocks), "repetitions": len(blocks)}


def row_statistics(blocks_us: list[np.ndarray]) -> dict[str, float]:
    """A row's statistics: of every round of every block pooled (microseconds), and the spread between
    the block medians (`rep_spread`). results.csv's timing columns are exactly these."""
    data = np.concatenate(blocks_us)
    q = quartiles(blocks_us)
    return {
        **q, "iqr_us": q["q3_us"] - q["q1_us"],
        "min_us": float(data.min()), "max_us": float(data.max()), "mean_us": float(data.mean()),
        "stddev_us": float(data.std(ddof=1)) if data.size > 1 else 0.0,
        "rep_spread": relative_spread(block_medians(blocks_us)),
    }
