"""Which processes stand apart for one compared pair: the rule the schedule re-measures by and the analysis leaves
processes out by (no torch). docs/method.md#disturbed-processes says why.

A pair is a variant against the baseline at one point (or a step variant against the baseline's on one scenario). Its
*level* in a process is the mean over that process's repetitions of log(variant / baseline), the paired block
medians, so drift a whole process shares with the baseline cancels. A process is *disturbed* for the pair when its
level lies further from the median of the processes' levels (with 3, the middle one: never pulled by the one apart)
than

- DISTURB_SDS robust standard deviations (1.4826 x the MAD) of the run's own spread: the larger of the median such
  spread over the run's pairs (`run_spread`) and this pair's own, but never within MIN_SHIFT; or
- log(factor) (`--kv-disturb-factor`, DEFAULT_FACTOR), whatever the spread, so a process 3x slower is always caught,
  even among three.

A box whose processes all spread alike disturbs nothing: its spread stays in the intervals. Only a minority is ever
left out (the worst first); more than that standing apart leaves the pair disturbed with nothing left out. A pair is
*settled* when none of its processes is disturbed beyond what can be left out and as many processes as the plan dealt
repetitions to remain. Needs 3 processes or more (with fewer, none can be told apart from the rest).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kvpages.core.stats import Levels, finite_median, median

DEFAULT_FACTOR = 1.5  # --kv-disturb-factor: a process this far from the others (either way) is always disturbed
DEFAULT_REMEASURE_BUDGET = 0.25  # --kv-remeasure-budget: of the sweep's planned timed seconds (0: off)
DISTURB_SDS = 3.0
MAD_TO_SD = 1.4826  # a normal sample's MAD times this estimates its standard deviation
MIN_SHIFT = math.log(1.05)  # a process within 5% of the others is never disturbed: it moves a centre of 6 by < 1%
MIN_PROCESSES = 3


def robust_spread(levels: Levels) -> float:
    """1.4826 x the MAD of the process levels about their median (~ their standard deviation, robust to a minority
    apart); nan with fewer than MIN_PROCESSES processes."""
    _, means = levels.process_means()
    if means.size < MIN_PROCESSES:
        return math.nan
    return MAD_TO_SD * median(np.abs(means - median(means)))


def run_spread(pairs: Iterable[Levels]) -> float:
    """The run's own spread between processes: the median `robust_spread` over its pairs (nan: none has 3 processes)."""
    return finite_median([robust_spread(levels) for levels in pairs])


@dataclass(frozen=True)
class Shift:
    """One process apart from the others: its level over the processes' median, as a factor (1.52: 52% slower)."""

    process: int
    factor: float

    def said(self) -> str:
        return f"process {self.process} at {self.factor:.3g}x the others"


@dataclass(frozen=True)
class Disturbance:
    """A pair's disturbed processes: `left_out` of its centre (worst first, never a majority), `kept` behind it, and
    `beyond` those disturbed too but kept, because more than a minority stood apart."""

    left_out: tuple[Shift, ...]
    beyond: tuple[Shift, ...]
    kept: int
    cut: float  # the distance (log) beyond which a process is disturbed; inf: too few processes to tell

    @property
    def processes(self) -> frozenset[int]:
        return frozenset(s.process for s in self.left_out)

    def settled(self, planned: int) -> bool:
        """No process disturbed beyond what is left out, and as many kept as the plan dealt repetitions to."""
        return not self.beyond and self.kept >= planned

    @property
    def worst(self) -> float:
        """How far the worst disturbed process lies, in cuts (0: none)."""
        shifts = self.left_out + self.beyond
        return max((abs(math.log(s.factor)) / self.cut for s in shifts), default=0.0)

    def said(self) -> str:
        """'process 3 at 1.52x the others left out' and/or '...; 3 of 6 apart, none left out'."""
        parts = [f"{', '.join(s.said() for s in self.left_out)} left out"] if self.left_out else []
        if self.beyond:
            parts.append(f"{', '.join(s.said() for s in self.beyond)} also apart (more than a minority: kept)")
        return "; ".join(parts)


def disturbance(levels: Levels, spread: float, factor: float = DEFAULT_FACTOR) -> Disturbance:
    """The disturbed processes of one pair's paired levels (module doc); `spread`: the run's (`run_spread`)."""
    ids, means = levels.process_means()
    if ids.size < MIN_PROCESSES:
        return Disturbance((), (), int(ids.size), math.inf)
    own = robust_spread(levels)
    scale = max(s for s in (spread, own, 0.0) if math.isfinite(s))
    cut = min(max(DISTURB_SDS * scale, MIN_SHIFT), math.log(factor))
    shifts = means - median(means)  # the median of every process: with 3, the middle one, never a mean with the apart
    apart = [Shift(int(p), math.exp(float(d))) for p, d in zip(ids, shifts, strict=True) if abs(d) > cut]
    apart.sort(key=lambda s: -abs(math.log(s.factor)))
    minority = (ids.size - 1) // 2
    left = tuple(apart) if len(apart) <= minority else ()
    return Disturbance(left, tuple(apart) if not left and apart else (), int(ids.size) - len(left), cut)
