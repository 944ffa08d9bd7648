"""A/A figures: two runs of the same code on the same machine, back to back. Do their intervals hold each other?

A calibrated 95% interval of a ratio holds the other run's estimate about 83% of the time
(two independent estimates with equal standard errors: P(|Z| < 1.96 / sqrt(2))), and two
such intervals overlap about 99.4% of the time. No torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvpages.analysis.compare import compare_runs
from kvpages.analysis.ratios import Analysis


@dataclass(frozen=True)
class AAFigures:
    a_run: str
    b_run: str
    variant: str
    baseline: str
    points: int
    overlap: int
    a_in_b: int
    b_in_a: int
    moved_10pct: int
    median_width_a: float
    median_width_b: float
    """Median over points of the CI's width divided by the ratio."""
    crossovers_a: tuple[str, ...]
    crossovers_b: tuple[str, ...]
    fail_above_pct: float
    regressions: int
    slower: int
    faster: int

    def text(self) -> str:
        n = self.points

        def frac(k: int) -> str:
            return f"{k}/{n} ({k / n:.0%})" if n else "0/0"

        lines = [
            f"A/A noise check of {self.variant}/{self.baseline}: A = {self.a_run}, B = {self.b_run}",
            f"points with the ratio in both runs: {n}",
            f"95% CIs overlap: {frac(self.overlap)} (target >= 95%)",
            f"A's ratio inside B's CI: {frac(self.a_in_b)}; B's ratio inside A's CI: {frac(self.b_in_a)} "
            "(target >= 75% each; calibrated ~83%)",
            f"median CI width / ratio: A {self.median_width_a:.1%}, B {self.median_width_b:.1%} (target <= 25%)",
            f"ratio moved by more than 10%: {frac(self.moved_10pct)}",
            f"crossover A: {'; '.join(self.crossovers_a) or 'none computed'}",
            f"crossover B: {'; '.join(self.crossovers_b) or 'none computed'}",
            f"compare A B (relative, every variant): {self.slower} slower, {self.faster} faster beyond their CIs; "
            f"--fail-above {self.fail_above_pct:g}: {'FAIL' if self.regressions else 'OK'} "
            f"({self.regressions} point(s) beyond it)",
        ]
        return "\n".join(lines)


def _width(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.median(finite)) if finite else math.nan


def aa_figures(a: Analysis, b: Analysis, variant: str, fail_above_pct: float) -> AAFigures:
    """The A/A figures of `variant`/baseline between two analysed runs, and what `compare` says of them."""
    a_ratios = {(r.dtype, r.layout, r.page_size, r.seq_len): r for r in a.ratios_of(variant)}
    b_ratios = {(r.dtype, r.layout, r.page_size, r.seq_len): r for r in b.ratios_of(variant)}
    common = sorted(set(a_ratios) & set(b_ratios))
    pairs = [(a_ratios[k], b_ratios[k]) for k in common]

    def inside(r, other) -> bool:
        return other.ci_low <= r.ratio <= other.ci_high

    comparison = compare_runs(a.run, b.run, a.baseline)

    def crossings(analysis: Analysis) -> tuple[str, ...]:
        return tuple(f"p{c.page_size}: {c.describe()}" for c in analysis.crossovers)

    return AAFigures(
        a_run=a.run.run_id, b_run=b.run.run_id, variant=variant, baseline=a.baseline, points=len(pairs),
        overlap=sum(ra.ci_low <= rb.ci_high and rb.ci_low <= ra.ci_high for ra, rb in pairs),
        a_in_b=sum(inside(ra, rb) for ra, rb in pairs),
        b_in_a=sum(inside(rb, ra) for ra, rb in pairs),
        moved_10pct=sum(abs(rb.ratio / ra.ratio - 1) > 0.10 for ra, rb in pairs),
        median_width_a=_width([(ra.ci_high - ra.ci_low) / ra.ratio for ra, _ in pairs]),
        median_width_b=_width([(rb.ci_high - rb.ci_low) / rb.ratio for _, rb in pairs]),
        crossovers_a=crossings(a), crossovers_b=crossings(b),
        fail_above_pct=fail_above_pct,
        regressions=len(comparison.regressions(fail_above_pct)),
        slower=sum(p.verdict == "slower" for p in comparison.relative),
        faster=sum(p.verdict == "faster" for p in comparison.relative),
    )
