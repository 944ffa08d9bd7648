"""Statistics at the level that varies: repetitions, not rounds (no torch, no scipy).

A run measures each (variant, point) in R *repetitions* (blocks of rounds), and the
variants of a point run interleaved, in a fresh seeded order in every repetition, with
the repetitions dealt to several passes over the whole sweep. Rounds within a block are
not independent draws of what a rerun would see: the machine drifts between blocks and
between passes. So every interval here treats the repetition as the independent unit
(Kalibera and Jones, "Rigorous Benchmarking in Reasonable Time", ISMM 2013), summarising
each block by its median, and uses distribution-free, rank-based intervals, which a few
disturbed repetitions on a shared machine do not drag along:

- within a run, `median_interval` of the paired per-repetition log-ratios
  log(candidate_k / baseline_k): the median, with the order-statistic confidence interval
  of a median (the binomial/sign-test interval, as Go's benchstat reports);
- between runs, `shift_interval`: the Hodges-Lehmann estimate of the shift between two
  runs' log values, with its Mann-Whitney confidence interval (Hollander and Wolfe,
  "Nonparametric Statistical Methods", 1999, section 4.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

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

    def contains(self, value: float) -> bool:
        return self.ci_low <= value <= self.ci_high

    @property
    def known(self) -> bool:
        return math.isfinite(self.ci_high)


def unknown(ratio: float, n: int) -> Interval:
    """Too few repetitions to form any interval."""
    return Interval(ratio, 0.0, math.inf, n, math.nan)


def block_medians(blocks: list[np.ndarray]) -> np.ndarray:
    """One median per repetition."""
    return np.array([float(np.median(b)) for b in blocks])


def paired_log_ratios(baseline: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """log(candidate_k / baseline_k) per repetition k, from the two variants' block medians."""
    if baseline.shape != candidate.shape:
        raise ValueError(f"paired repetitions differ in number: {baseline.size} vs {candidate.size}")
    return np.log(candidate) - np.log(baseline)


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


def relative_spread(medians: np.ndarray) -> float:
    """The spread between repetitions: the standard deviation of log block medians (~ the CV); 0 for one."""
    return float(np.std(np.log(medians), ddof=1)) if medians.size > 1 else 0.0


def quartiles(blocks_us: list[np.ndarray], prefix: str = "") -> dict[str, float]:
    """`{prefix}q1_us`, `{prefix}median_us`, `{prefix}q3_us` of every round of every block, pooled."""
    q1, median, q3 = np.percentile(np.concatenate(blocks_us), [25, 50, 75])
    return {f"{prefix}q1_us": float(q1), f"{prefix}median_us": float(median), f"{prefix}q3_us": float(q3)}


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
