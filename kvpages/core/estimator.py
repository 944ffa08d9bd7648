"""The one estimator of a run's tables and charts: a variant's time and the ratio of two (no torch, no scipy).

A time is the geometric mean of the block medians; a ratio of two times equals the mean of the paired log-ratios, so
drift a repetition shares cancels. Each interval is the expanded percentile interval of that statistic over the
two-stage bootstrap of kvpages.core.stats.Levels, the same draws for both variants.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

from kvpages.core.stats import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CONFIDENCE,
    Interval,
    Levels,
    leave_one_out_means,
    percentiles,
    resampled_means,
    two_sided_z,
    unknown,
)


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
    lo, hi = percentiles(resampled, confidence)
    return _widened(center, float(lo), float(hi), units, confidence)


def _widened(center: float, lo: float, hi: float, units: tuple[str, int], confidence: float) -> Interval:
    unit, n = units
    widen = _widening(n, confidence)
    return Interval(math.exp(center), math.exp(center + (lo - center) * widen), math.exp(center + (hi - center) * widen),
                    n, confidence, unit)


@functools.lru_cache(maxsize=256)
def _widening(n: int, confidence: float) -> float:
    """sqrt(n / (n - 1)) x t_(n-1) / z (`_percentiles`)."""
    return math.sqrt(n / (n - 1)) * t_quantile(0.5 + confidence / 2, n - 1) / two_sided_z(confidence)


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
    times = (math.exp(other), math.exp(base))
    if n < 2:
        return Paired(unknown(math.exp(other - base), n), 1.0, *times, n, count)
    interval, p_value = shift_estimate(Levels(variant.values - baseline.values, variant.processes), confidence)
    return Paired(interval, p_value, *times, n, count)


def leave_one_out(logs: Levels, confidence: float = CONFIDENCE) -> list[tuple[int, Interval, float]]:
    """`shift_estimate` of paired log-ratios with each process left out in turn (process, interval, p-value): the
    fragility check (kvpages.analysis.pairs), its percentiles taken together."""
    rest = leave_one_out_means(logs)
    lows, highs = percentiles(rest.means, confidence)
    drawn = rest.means.shape[1]
    tails = np.minimum(np.count_nonzero(rest.means <= 0, axis=1), np.count_nonzero(rest.means >= 0, axis=1)) / drawn
    p_values = np.clip(2 * tails, 1 / BOOTSTRAP_RESAMPLES, 1.0)
    units = [("process", int(p)) if p >= 2 else ("repetition", int(v))
             for p, v in zip(rest.process_counts, rest.value_counts, strict=True)]
    return [(int(p), _widened(float(c), float(lo), float(hi), u, confidence), float(pv))
            for p, c, lo, hi, u, pv in zip(rest.processes, rest.centers, lows, highs, units, p_values, strict=True)]


def shift_estimate(logs: Levels, confidence: float = CONFIDENCE) -> tuple[Interval, float]:
    """The ratio exp(mean(logs)) of paired log-ratios, its interval and the p-value of 'the ratio is 1': one bootstrap
    of the differences, which equals the difference of the two variants' bootstraps drawn alike (a mean is linear)."""
    center = float(np.mean(logs.values))
    shifts = logs.bootstrap_means
    return _percentiles(center, shifts, _units(logs), confidence), _p_value(shifts)


def _stretched(every: Interval, centre: float) -> Interval:
    return replace(every, ratio=centre, ci_low=min(every.ci_low, centre), ci_high=max(every.ci_high, centre))


def kept_ratio(baseline: Levels, variant: Levels, left_out: frozenset[int], settled: bool,
               confidence: float = CONFIDENCE) -> Paired:
    """A pair's ratio without its disturbed processes `left_out` (kvpages.core.stability), so none moves the centre:
    settled (enough processes kept), `paired_ratio` of the kept ones; not settled, their centre with the interval and
    p-value of every process, the disturbed ones included, stretched to hold it, so what is left of the disturbance
    widens the interval instead of vanishing (docs/method.md#disturbed-processes)."""
    if not left_out:
        return paired_ratio(baseline, variant, confidence)
    kept = paired_ratio(baseline.without(left_out), variant.without(left_out), confidence)
    if settled:
        return kept
    every = paired_ratio(baseline, variant, confidence)
    return replace(kept, interval=_stretched(every.interval, kept.interval.ratio), p_value=every.p_value)


def kept_mean(levels: Levels, left_out: frozenset[int], settled: bool, confidence: float = CONFIDENCE) -> Interval:
    """A variant's time beside `kept_ratio`: its geometric mean over the kept processes (so a table's time is its
    chart's marker), with their interval when settled, else every process's stretched to hold it."""
    if not left_out:
        return mean_estimate(levels, confidence)
    kept = mean_estimate(levels.without(left_out), confidence)
    return kept if settled else _stretched(mean_estimate(levels, confidence), kept.ratio)


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
