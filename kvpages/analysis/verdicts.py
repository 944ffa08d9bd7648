"""Verdicts with an effect size, over a family of comparisons (no torch); `judge` is the one place they are decided:
faster or slower only when the interval excludes 1, |log ratio| >= log(1 + min_effect) and the Benjamini-Hochberg
step at `FDR` keeps it within its family (Holm's first cut falls below the bootstrap's smallest p-value from 100
comparisons on: `holm_sentence`); `SAME` only when the whole interval lies within the minimum effect either side of 1
(sameness shown, not a difference missed: before 2026-12-06 an estimate within it sufficed, so a 2-process run's
2.23 [1.39, 3.68] under its 134% minimum effect read *same*); else `UNCLEAR`: neither shown (an estimate beyond it
whose interval reaches 1 or which the correction drops, an interval reaching past it, or no interval); `DISTURBED`
for a pair whose processes stand apart beyond what could be left out or replaced (kvpages.core.stability).
docs/method.md, "Ratios, intervals and verdicts", has the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvpages.core.stats import BOOTSTRAP_RESAMPLES, Interval, finite_median

FASTER, SLOWER, SAME, UNCLEAR, DISTURBED = "faster", "slower", "same", "unclear", "disturbed"
VERDICTS = (FASTER, SLOWER, SAME, UNCLEAR, DISTURBED)
MIN_EFFECT_FLOOR = 0.02  # whatever a run's intervals: a quiet run's noise floor can be tighter
FDR = 0.05  # the false-discovery rate the Benjamini-Hochberg step controls within a family


def judge(interval: Interval, min_effect: float, discovered: bool = True, disturbed: bool = False) -> str:
    """A ratio's verdict; `discovered`: whether the family correction kept it (`discoveries`; True: judged alone);
    `disturbed`: its pair is not settled (kvpages.core.stability), so it is never faster or slower."""
    if disturbed:
        return DISTURBED
    if not interval.known or not interval.ratio > 0 or math.isnan(interval.ci_low):
        return UNCLEAR
    band = math.log1p(min_effect)
    if interval.ci_low > 0 and -band < math.log(interval.ci_low) and math.log(interval.ci_high) < band:
        return SAME
    if discovered and abs(math.log(interval.ratio)) >= band and (interval.ci_high < 1 or interval.ci_low > 1):
        return FASTER if interval.ci_high < 1 else SLOWER
    return UNCLEAR


def holm_sentence(family: int) -> str:
    """Why a family is corrected by the Benjamini-Hochberg step and not Holm's: the first Holm step's cut against the
    smallest p-value the bootstrap gives (its resamples' floor)."""
    cut, floor = FDR / max(1, family), 1 / BOOTSTRAP_RESAMPLES
    crossing = math.floor(cut * BOOTSTRAP_RESAMPLES / 2 + 1e-9)  # p = 2 x (resamples across 1) / resamples, floored
    reach = "so it could call nothing" if floor > cut else "which a ratio reaches only where " + (
        "none of the resamples cross 1" if crossing == 0 else f"at most {crossing} of the resamples cross 1")
    return (f"Holm's family-wise control would need p at most {FDR:g}/{family} = {cut:.2g} for its first call; the "
            f"bootstrap's smallest p-value is 1/{BOOTSTRAP_RESAMPLES} = {floor:.2g}, {reach}.")


def bh_adjusted(pvalues: list[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (q-values), in the order given."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [1.0] * m
    running = 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, pvalues[i] * m / rank)
        adjusted[i] = running
    return adjusted


def discoveries(qvalues: list[float]) -> list[bool]:
    return [q <= FDR for q in qvalues]


@dataclass(frozen=True)
class Judged:
    verdicts: tuple[str, ...]
    q_values: tuple[float, ...]
    half_width: float  # the family's noise floor: the median relative half-width of its intervals
    min_effect: float
    p_cut: float = 0.0  # the largest p-value the Benjamini-Hochberg step kept (0: none kept)


def judge_family(intervals: Sequence[Interval], p_values: Sequence[float], disturbed: Sequence[bool] = (),
                 min_effect: float | None = None) -> Judged:
    """Judge every ratio of a family (a run's ratios; `kvpages compare`'s B against A) with `judge`: the minimum
    effect from the family's own intervals (or `min_effect`: the scenario family takes the per-call family's), the
    Benjamini-Hochberg step over its p-values; `disturbed`: per ratio."""
    half_width = finite_median([(i.ci_high - i.ci_low) / 2 / i.ratio for i in intervals if i.known])
    q_values = bh_adjusted(list(p_values))
    effect = max(MIN_EFFECT_FLOOR, half_width) if math.isfinite(half_width) else MIN_EFFECT_FLOOR
    effect = effect if min_effect is None else min_effect
    flags = list(disturbed) or [False] * len(intervals)
    kept = discoveries(q_values)
    verdicts = tuple(judge(i, effect, k, bad) for i, k, bad in zip(intervals, kept, flags, strict=True))
    p_cut = max((p for p, k in zip(p_values, kept, strict=True) if k), default=0.0)
    return Judged(verdicts, tuple(q_values), half_width, effect, p_cut)
