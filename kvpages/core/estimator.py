"""The one estimator of a run's tables and charts: a variant's time and the ratio of two (no torch, no scipy).

A time is the geometric mean of the block medians; a ratio of two times equals the mean of the paired log-ratios, so
drift a repetition shares cancels. Each interval is the expanded percentile interval of that statistic over the
two-stage bootstrap of kvpages.core.stats.Levels, the same draws for both variants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

from kvpages.core.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CONFIDENCE, Interval, Levels, resampled_means, unknown


@dataclass(frozen=True)
class Paired:
    """One variant against a baseline at one point: `interval.ratio` is exactly variant_us / baseline_us."""

    interval: Interval
    p_value: float
    variant_us: float
    baseline_us: float
    repetitions: int
    processes: int


def _units(levels: Levels) -> tuple[str, int]:
    """What the first bootstrap stage draws, and how many: processes (>= 2 of them), else one process's repetitions."""
    return ("process", levels.process_count) if levels.process_count >= 2 else ("repetition", int(levels.values.size))


def _percentiles(center: float, resampled: np.ndarray, units: tuple[str, int], confidence: float) -> Interval:
    """The percentile interval of a resampled mean, widened about `center` for the m units the first stage draws
    (`_units`) by sqrt(m / (m - 1)) x t_(m-1) / z: the bootstrap variance of a mean of m is (m - 1) / m of its
    variance, and with few units its spread is Student's t (Hesterberg, "What Teachers Should Know About the
    Bootstrap", 2015: the expanded percentile)."""
    lo, hi = np.percentile(resampled, [50 * (1 - confidence), 50 * (1 + confidence)])
    unit, n = units
    widen = math.sqrt(n / (n - 1)) * t_quantile(0.5 + confidence / 2, n - 1) / NormalDist().inv_cdf(0.5 + confidence / 2)
    return Interval(math.exp(center), math.exp(center + (float(lo) - center) * widen),
                    math.exp(center + (float(hi) - center) * widen), n, confidence, unit)


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile from the normal one (Cornish-Fisher expansion, Abramowitz and Stegun 26.7.5): within
    0.3% of the exact value at df >= 3 for p in [0.9, 0.995] (tests/test_processes.py checks it); no scipy."""
    z = NormalDist().inv_cdf(p)
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
            + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * df**4))


def mean_estimate(levels: Levels, confidence: float = CONFIDENCE) -> Interval:
    """The geometric mean of the block medians with its bootstrap interval; `unknown` from fewer than 2 repetitions."""
    center = float(np.mean(levels.values))
    if levels.values.size < 2:
        return unknown(math.exp(center), int(levels.values.size))
    return _percentiles(center, levels.bootstrap_means, _units(levels), confidence)


def paired_ratio(baseline: Levels, variant: Levels, confidence: float = CONFIDENCE) -> Paired:
    """`variant`'s time over `baseline`'s (log block medians of the same repetitions), bootstrapped as one statistic
    with the same resamples for both (Kalibera and Jones 2013), and the two-sided p-value of 'the ratio is 1'."""
    if not np.array_equal(baseline.processes, variant.processes):
        raise ValueError(f"the two variants' repetitions come from different processes: "
                         f"{baseline.processes.tolist()} vs {variant.processes.tolist()}")
    base, other = float(np.mean(baseline.values)), float(np.mean(variant.values))
    n, count = int(variant.values.size), variant.process_count
    center = other - base
    times = (math.exp(other), math.exp(base))
    if n < 2:
        return Paired(unknown(math.exp(center), n), 1.0, *times, n, count)
    shifts = variant.bootstrap_means - baseline.bootstrap_means
    return Paired(_percentiles(center, shifts, _units(variant), confidence), _p_value(shifts), *times, n, count)


def _stretched(every: Interval, centre: float) -> Interval:
    return replace(every, ratio=centre, ci_low=min(every.ci_low, centre), ci_high=max(every.ci_high, centre))


def trimmed_ratio(baseline: Levels, variant: Levels, left_out: frozenset[int], confidence: float = CONFIDENCE) -> Paired:
    """A re-measured point's ratio: `paired_ratio` of the processes not `left_out` (the point's disturbed ones:
    kvpages.core.stability), so a disturbed process does not move the centre; its interval and p-value are
    `paired_ratio`'s over every process, the disturbed ones included, stretched to hold that centre, so the
    disturbance widens the interval instead (docs/method.md#re-measuring-unstable-points)."""
    every = paired_ratio(baseline, variant, confidence)
    if not left_out:
        return every
    centre = paired_ratio(baseline.without(left_out), variant.without(left_out), confidence)
    return replace(centre, interval=_stretched(every.interval, centre.interval.ratio), p_value=every.p_value,
                   repetitions=every.repetitions, processes=every.processes)


def trimmed_mean(levels: Levels, left_out: frozenset[int], confidence: float = CONFIDENCE) -> Interval:
    """A variant's time at a re-measured point, as `trimmed_ratio` makes its ratio: the centre over the processes not
    `left_out`, the interval over every process stretched to hold it (so a table's time is its chart's marker)."""
    every = mean_estimate(levels, confidence)
    if not left_out:
        return every
    return _stretched(every, mean_estimate(levels.without(left_out), confidence).ratio)


def _p_value(shifts: np.ndarray) -> float:
    """Two-sided p-value of 'the log shift is 0' (at least 1 / the resamples)."""
    tail = min(float(np.mean(shifts <= 0)), float(np.mean(shifts >= 0)))
    return min(1.0, max(2 * tail, 1 / BOOTSTRAP_RESAMPLES))


@dataclass(frozen=True)
class BetweenRuns:
    """One quantity in two runs A and B (`kvpages compare`): each run's figure, and B over A, exactly `b / a`."""

    a: float
    b: float
    interval: Interval
    p_value: float


def between_runs(a: Levels, b: Levels, confidence: float = CONFIDENCE) -> BetweenRuns:
    """B over A of two runs' levels, its interval over independent bootstraps (two-stage when both have >= 2 processes)
    widened for the fewer units, and the p-value of 'B equals A'; unknown, p = 1, below 2 repetitions in either."""
    center = float(np.mean(b.values) - np.mean(a.values))
    figures = (math.exp(float(np.mean(a.values))), math.exp(float(np.mean(b.values))))
    if a.values.size < 2 or b.values.size < 2:
        return BetweenRuns(*figures, unknown(math.exp(center), int(min(a.values.size, b.values.size))), 1.0)
    if min(a.process_count, b.process_count) < 2:
        a, b = (Levels(x.values, np.zeros(x.values.size, dtype=int)) for x in (a, b))
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    shifts = resampled_means(b, rng) - resampled_means(a, rng)
    fewer = min((_units(a), _units(b)), key=lambda u: u[1])
    return BetweenRuns(*figures, _percentiles(center, shifts, fewer, confidence), _p_value(shifts))
