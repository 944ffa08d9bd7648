"""Statistics at the levels that vary: processes, then repetitions within them (no torch, no scipy).

A block is summarised by its median; a whole process can run a few percent slow, so intervals resample processes,
then repetitions (Kalibera and Jones, "Rigorous Benchmarking in Reasonable Time", ISMM 2013); with one process, its
repetitions alone. docs/method.md gives the reasoning and the coverage checks."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Protocol

import numpy as np

CONFIDENCE = 0.95


def two_sided_z(confidence: float) -> float:
    """The standard normal quantile a two-sided interval of `confidence` reaches (1.96 for 0.95)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


@dataclass(frozen=True)
class Interval:
    """A ratio estimate and its interval, from `n` units, at the confidence the data allow."""

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
    return np.array([median(b) for b in blocks])


def logs(values: Iterable[float]) -> np.ndarray:
    """The natural log of each value as the C library's `log` gives it (`math.log`), on every CPU: numpy's own kernel
    for CPUs with AVX-512 rounds a few values one unit in the last place apart from it (elsewhere numpy calls the C
    library), so a report re-made from a run on another CPU rewrote a CSV's last digits (the H200 run
    20261204T184229Z's scenario_ratios.csv, re-made on an AVX-512 Intel Xeon: 1.3803579012146654 -> ...652). The
    analysis takes these of block medians, a few per row (a few ms a run). 0 gives -inf and a negative value nan, as
    numpy does (without its warning). Other last bits can still differ between CPU models: tests/test_calibrate.py
    records one, in a one-run fit of `kvpages calibrate`."""
    return np.array([math.log(v) if v > 0 else -math.inf if v == 0 else math.nan for v in values], dtype=np.float64)


def exps(values: Iterable[float]) -> np.ndarray:
    """e to each value as the C library's `exp` gives it (`math.exp`), on every CPU, for the reason `logs` gives
    (numpy's AVX-512 kernel for exp differs from it in the last place more often: 4.6% of a million normal draws on
    an AVX-512 Intel Xeon, 2026-12-07; its log, 74 of a million). Past the largest double, inf, as numpy gives."""
    return np.array([_exp(v) for v in values], dtype=np.float64)


def _exp(value: float) -> float:
    try:
        return math.exp(value)
    except OverflowError:
        return math.inf


def median(block: np.ndarray) -> float:
    """np.median(block), bit for bit (the middle value, or the two middle ones' sum over 2, as it computes them), from
    one partition without its generic machinery (the analysis takes thousands of block medians); an empty block or one
    holding nan takes np.median itself."""
    n = block.size
    if n == 0:
        return float(np.median(block))
    k = n // 2
    if n % 2:
        middle = np.partition(block, k)[k]
    else:
        part = np.partition(block, (k - 1, k))
        middle = (part[k - 1] + part[k]) / 2
    return float(np.median(block)) if np.isnan(middle) or np.isnan(block).any() else float(middle)


@dataclass(frozen=True)
class Components:
    """The spread of a log quantity at each level (standard deviations; ~ relative spreads, as a CV)."""

    between_process: float
    """Of the process means, less what the within-process spread explains (nan with one process)."""
    within_process: float
    """Of the repetitions around their process's mean (pooled)."""


@dataclass(frozen=True)
class Levels:
    """Log values per repetition (a block median, or a paired log-ratio), with the process each came from and, where
    known, the repetition it was (a re-measurement round times some variants of a point and not others)."""

    values: np.ndarray
    processes: np.ndarray
    repetitions: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.values.shape != self.processes.shape:
            raise ValueError(f"{self.values.size} values but {self.processes.size} process ids")
        if self.repetitions is not None and self.repetitions.shape != self.values.shape:
            raise ValueError(f"{self.values.size} values but {self.repetitions.size} repetition ids")

    @functools.cached_property
    def process_count(self) -> int:
        return int(self._owners[0].size)

    def by_process(self) -> list[np.ndarray]:
        return [self.values[self.processes == p] for p in self._owners[0]]

    def without(self, processes: Iterable[int]) -> Levels:
        """These levels less the repetitions of `processes` (a pair's disturbed ones: kvpages.core.stability)."""
        keep = ~np.isin(self.processes, list(processes))
        return Levels(self.values[keep], self.processes[keep],
                      None if self.repetitions is None else self.repetitions[keep])

    def process_means(self) -> tuple[np.ndarray, np.ndarray]:
        """(process ids, the mean level of each), in id order."""
        ids, owner, counts = self._owners
        return ids, np.bincount(owner, weights=self.values) / counts

    @functools.cached_property
    def _owners(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(process ids, each value's index among them, values per process): read-only, shared by every `Levels` of
        the same process ids (`_owners_of`)."""
        return _owners_of(self.processes.tobytes(), self.processes.dtype.str)

    @functools.cached_property
    def bootstrap_means(self) -> np.ndarray:
        """Seeded resample means: every `Levels` of one shape is resampled alike (two variants of a point are), drawn once."""
        return resampled_means(self)

    def components(self) -> Components:
        groups = self.by_process()
        within_df = sum(g.size - 1 for g in groups)
        within_var = sum(float(np.sum((g - g.mean()) ** 2)) for g in groups) / within_df if within_df else math.nan
        within = math.sqrt(within_var) if within_df else math.nan
        if len(groups) < 2:
            return Components(math.nan, within)
        sizes = np.array([g.size for g in groups], dtype=float)
        mean_var = float(np.var([g.mean() for g in groups], ddof=1))
        per_process = len(sizes) / float(np.sum(1 / sizes))  # harmonic mean: repetitions per process
        explained = within_var / per_process if within_df else 0.0
        return Components(math.sqrt(max(0.0, mean_var - explained)), within)


@functools.lru_cache(maxsize=4096)
def _owners_of(processes: bytes, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`Levels._owners` of the process ids `processes` (an array's bytes) once: a run's pairs share a few layouts of
    processes, and the analysis asks thousands of them (`np.unique` was a tenth of the reference run's analysis)."""
    ids, owner = np.unique(np.frombuffer(processes, dtype=dtype), return_inverse=True)
    owners = (ids, owner, np.bincount(owner))
    for array in owners:
        array.flags.writeable = False
    return owners


def aligned(baseline: Levels, variant: Levels) -> tuple[Levels, Levels] | None:
    """The repetitions both timed, in the same order: matched by id where both carry ids, else by position (equal
    sizes); None when nothing matches or a matched repetition's processes differ."""
    if baseline.repetitions is not None and variant.repetitions is not None and \
            not np.array_equal(baseline.repetitions, variant.repetitions):  # equal: as they are (their draws cached)
        common, at_base, at_other = np.intersect1d(baseline.repetitions, variant.repetitions, return_indices=True)
        if common.size == 0:
            return None
        base = Levels(baseline.values[at_base], baseline.processes[at_base], common)
        other = Levels(variant.values[at_other], variant.processes[at_other], common)
    elif baseline.values.size == variant.values.size:
        base, other = baseline, variant
    else:
        return None
    return (base, other) if np.array_equal(base.processes, other.processes) else None


def paired(baseline: Levels, variant: Levels) -> Levels | None:
    """Per repetition both timed (`aligned`), log(variant / baseline) of the block medians, with its process."""
    found = aligned(baseline, variant)
    if found is None:
        return None
    base, other = found
    return Levels(other.values - base.values, base.processes, base.repetitions)


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20130617
"""Fixed, so the same run folder always gives the same intervals."""


@dataclass(frozen=True)
class _Draws:
    """The indices of BOOTSTRAP_RESAMPLES two-stage resamples of one shape, into the processes' padded values."""

    flat: np.ndarray
    """(resamples, processes x width): the drawn process's row times the width, plus the drawn repetition."""
    padding: np.ndarray | None  # where a drawn process has fewer repetitions than the widest (left out); None: none has

    @functools.cached_property
    def weights(self) -> np.ndarray:
        """(processes x width, resamples): how often each value is drawn into each resample over the draws' size, so a
        resample's mean is a dot product (equal processes only: no padding)."""
        resamples, size = self.flat.shape
        offsets = np.arange(resamples)[:, None] * size
        counts = np.bincount((self.flat + offsets).ravel(), minlength=resamples * size).reshape(resamples, size)
        return counts.T / size


def _draws(sizes: tuple[int, ...], rng: np.random.Generator) -> _Draws:
    """Processes with replacement, then each drawn one's repetitions (Kalibera and Jones 2013, section 4.3)."""
    count, width = len(sizes), max(sizes)
    sizes_array = np.array(sizes)
    drawn = rng.integers(0, count, size=(BOOTSTRAP_RESAMPLES, count))
    within = (rng.random((BOOTSTRAP_RESAMPLES, count, width)) * sizes_array[drawn][:, :, None]).astype(int)
    flat = (drawn[:, :, None] * width + within).reshape(BOOTSTRAP_RESAMPLES, -1)
    if (sizes_array == width).all():  # equal processes: a plain mean (no 2000 x N mask to build and multiply)
        return _Draws(flat, None)
    padding = (np.arange(width)[None, None, :] >= sizes_array[drawn][:, :, None]).reshape(BOOTSTRAP_RESAMPLES, -1)
    return _Draws(flat, padding)


@functools.lru_cache(maxsize=64)
def _seeded_draws(sizes: tuple[int, ...]) -> _Draws:
    return _draws(sizes, np.random.default_rng(BOOTSTRAP_SEED))


def resampled_means(levels: Levels, rng: np.random.Generator | None = None) -> np.ndarray:
    """Each two-stage resample's mean, drawn from `rng` (None: `bootstrap_means`'s seeded draws), padding left out."""
    _, owner, counts = levels._owners
    sizes = tuple(int(c) for c in counts)
    draws = _seeded_draws(sizes) if rng is None else _draws(sizes, rng)
    if draws.padding is None:  # equal processes: their values in process order are the padded rows
        return levels.values[np.argsort(owner, kind="stable")] @ draws.weights
    groups = levels.by_process()
    padded = np.zeros((len(groups), max(sizes)))
    for i, g in enumerate(groups):
        padded[i, :g.size] = g
    values = padded.ravel()[draws.flat]
    kept = ~draws.padding
    return (values * kept).sum(axis=1) / kept.sum(axis=1)


@dataclass(frozen=True)
class LeftOut:
    """Levels with each process left out in turn (`leave_one_out_means`), row by row: the process left out, the
    seeded resample means of the rest, their mean, and how many processes and values remain."""

    processes: np.ndarray
    means: np.ndarray  # (processes, resamples)
    centers: np.ndarray
    process_counts: np.ndarray
    value_counts: np.ndarray


def leave_one_out_means(levels: Levels) -> LeftOut:
    """Each process of `levels` left out in turn (`LeftOut`). Processes of equal repetitions (every planned run) are
    resampled together, with the draws `bootstrap_means` uses for their shape."""
    ids, owner, counts = levels._owners
    n = ids.size
    if n < 2 or not (counts == counts[0]).all():
        rest = [levels.without((int(p),)) for p in ids]
        return LeftOut(ids, np.stack([r.bootstrap_means for r in rest]), np.array([r.values.mean() for r in rest]),
                       np.array([r.process_count for r in rest]), np.array([r.values.size for r in rest]))
    width = int(counts[0])
    rows = levels.values[np.argsort(owner, kind="stable")].reshape(n, width)  # a row per process, in id order
    others = np.broadcast_to(rows, (n, n, width))[~np.eye(n, dtype=bool)].reshape(n, (n - 1) * width)
    return LeftOut(ids, others @ _seeded_draws((width,) * (n - 1)).weights, others.mean(axis=1),
                   np.full(n, n - 1), np.full(n, (n - 1) * width))


def percentiles(resampled: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """The two-sided percentiles of `resampled` along its last axis, as np.percentile's default (linear) method
    computes them, from a partial sort (a third of its time on 2000 values)."""
    size = resampled.shape[-1]
    ranks = np.array([50 * (1 - confidence), 50 * (1 + confidence)]) / 100 * (size - 1)
    below = np.floor(ranks).astype(int)
    upper = np.minimum(below + 1, size - 1)
    ordered = np.partition(resampled, np.unique(np.concatenate([below, upper])), axis=-1)
    lo, hi = (ordered[..., b] + (ordered[..., u] - ordered[..., b]) * (r - b) for b, u, r in zip(below, upper, ranks,
                                                                                                  strict=True))
    return lo, hi


def finite_median(values: list[float]) -> float:
    """The median of the finite values (an unknown interval's width is infinite), nan when there are none."""
    finite = [v for v in values if math.isfinite(v)]
    return float(np.median(finite)) if finite else math.nan


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
    """A request's or step's row statistics: pooled blocked and ready quartiles, rounds and repetitions (a block each)."""
    pooled = [quartiles([np.asarray(getattr(b, f"{what}_us")) for b in blocks], f"{what}_")
              for what in ("blocked", "ready")]
    return {**pooled[0], **pooled[1], "rounds": sum(len(b.blocked_us) for b in blocks), "repetitions": len(blocks)}


def row_statistics(blocks_us: list[np.ndarray]) -> dict[str, float]:
    """results.csv's timing columns: of every round of every block pooled (microseconds), and `rep_spread`, the
    standard deviation of the log block medians (~ their CV; 0 for one block)."""
    data = np.concatenate(blocks_us)
    q = quartiles(blocks_us)
    medians = block_medians(blocks_us)
    return {**q, "iqr_us": q["q3_us"] - q["q1_us"],
            "min_us": float(data.min()), "max_us": float(data.max()), "mean_us": float(data.mean()),
            "stddev_us": float(data.std(ddof=1)) if data.size > 1 else 0.0,
            "rep_spread": log_spread(logs(medians))}


def log_spread(values: np.ndarray) -> float:
    """The standard deviation of log values (ddof 1; 0 for fewer than 2): results.csv's `rep_spread`."""
    return float(np.std(values, ddof=1)) if values.size > 1 else 0.0
