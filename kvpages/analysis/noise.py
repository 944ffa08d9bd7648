"""A/A figures: do the intervals of two runs of the same code on the same machine, back to back, hold each other?
docs/method.md, "Noise"."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvpages.analysis.compare import compare_runs
from kvpages.analysis.ratios import Analysis, NoiseFloor
from kvpages.analysis.verdicts import FASTER, SLOWER
from kvpages.core.stats import finite_median
from kvpages.schema.meta import RunMeta
from kvpages.schema.rows import RatioRow

CALIBRATED = {"overlap": 0.994, "coverage": 0.834, "false_verdicts": 0.0}
"""Calibrated 95% intervals hold the other run's estimate 83% of the time (two independent estimates with equal
standard errors: P(|Z| < 1.96 / sqrt(2))) and overlap 99.4%."""
TARGETS = {"overlap": 0.95, "coverage": 0.75, "false_verdicts": 0.10, "width": 0.10}  # for a box fit for comparisons


SHIFT_P = 0.05
"""The sign test's p-value below which the shift of a whole run's ratios is taken as more than its points' scatter."""

Pairs = list[tuple[RatioRow, RatioRow]]
"""A variant's ratio rows in runs A and B, paired point by point."""


@dataclass(frozen=True)
class Held:
    """How the ratios and intervals of two runs hold each other over their common points, A's taken `factor` times
    (1: as they are): the intervals that overlap, A's ratio inside B's interval, B's inside A's."""

    points: int
    overlap: int
    a_in_b: int
    b_in_a: int

    @classmethod
    def of(cls, pairs: Pairs, factor: float = 1.0) -> Held:
        return cls(len(pairs),
                   overlap=sum(ra.ci_low * factor <= rb.ci_high and rb.ci_low <= ra.ci_high * factor
                               for ra, rb in pairs),
                   a_in_b=sum(rb.ci_low <= ra.ratio * factor <= rb.ci_high for ra, rb in pairs),
                   b_in_a=sum(ra.ci_low * factor <= rb.ratio <= ra.ci_high * factor for ra, rb in pairs))

    def overlapping(self) -> float:
        return self.overlap / max(self.points, 1)

    def coverage(self) -> float:
        """The smaller of the two directions' shares of points."""
        return min(self.a_in_b, self.b_in_a) / max(self.points, 1)

    def meets_targets(self) -> bool:
        """Whether the intervals meet TARGETS' overlap and coverage."""
        return self.overlapping() >= TARGETS["overlap"] and self.coverage() >= TARGETS["coverage"]

    def frac(self, k: int) -> str:
        return f"{k}/{self.points} ({k / self.points:.0%})" if self.points else "0/0"


@dataclass(frozen=True)
class AAFigures:
    """The A/A figures of `variant` against A's baseline between runs A and B (their analyses `a` and `b`)."""

    a: Analysis
    b: Analysis
    variant: str
    held: Held
    moved_10pct: int
    median_width_a: float  # median over points of the CI's width divided by the ratio
    median_width_b: float
    fail_above_pct: float
    regressions: int
    slower: int
    faster: int
    relative_points: int
    run_shift: RunShift

    def text(self) -> str:
        held, shift, frac = self.held, self.run_shift, self.held.frac
        runs = (("A", self.a), ("B", self.b))
        false = (self.slower + self.faster) / max(self.relative_points, 1)
        fit = held.meets_targets() and false <= TARGETS["false_verdicts"]
        fit_line = (f"fit for comparisons: {'yes' if fit else 'NO'}: intervals overlap at {held.overlapping():.0%} of "
                    f"points (calibrated {CALIBRATED['overlap']:.1%}, needs >= {TARGETS['overlap']:.0%}), hold the "
                    f"other run's ratio at {held.coverage():.0%} (calibrated {CALIBRATED['coverage']:.0%}, needs >= "
                    f"{TARGETS['coverage']:.0%}), false verdicts {false:.0%} (calibrated "
                    f"{CALIBRATED['false_verdicts']:.0%}, needs <= {TARGETS['false_verdicts']:.0%}); the intervals are "
                    f"{self.median_width_a:.0%} wide (median), so smaller differences are not resolved here")
        if shift.explains(held):
            fit_line += (f"; without the shift of the whole run's ratios ({shift.percent()}, sign test p = "
                         f"{shift.sign_p():.2g}) the intervals would overlap at {shift.held.overlapping():.0%} and hold "
                         f"the other run's ratio at {shift.held.coverage():.0%}: each run's intervals cover its own "
                         "processes, not what moves a whole run's ratios on this box over minutes, so a difference of "
                         f"about {abs(shift.factor - 1):.1%} between two runs may be the box's, not the code's")
        lines = [
            f"A/A noise check of {self.variant}/{self.a.baseline}: A = {self.a.run.run_id}, B = {self.b.run.run_id}",
            f"points with the ratio in both runs: {held.points}",
            f"intervals overlap: {frac(held.overlap)} (target >= {TARGETS['overlap']:.0%})",
            f"A's ratio inside B's CI: {frac(held.a_in_b)}; B's ratio inside A's CI: {frac(held.b_in_a)} "
            f"(target >= {TARGETS['coverage']:.0%} each; calibrated ~{CALIBRATED['coverage']:.0%})",
            f"median CI width / ratio: A {self.median_width_a:.1%}, B {self.median_width_b:.1%} "
            f"(target <= {TARGETS['width']:.0%})",
            f"ratio moved by more than 10%: {frac(self.moved_10pct)}",
            *(f"crossover {name}: {'; '.join(f'p{c.page_size}: {c.describe()}' for c in run.crossovers) or 'none computed'}"
              for name, run in runs),
            f"compare A B (relative, every variant): {self.slower} slower, {self.faster} faster of "
            f"{self.relative_points} points; "
            f"--fail-above {self.fail_above_pct:g}: {'FAIL' if self.regressions else 'OK'} "
            f"({self.regressions} point(s) beyond it)",
            shift.text(),
        ]
        lines += [f"noise floor {name}: {components_text(run.noise)}" for name, run in runs]
        lines += [f"{name}: {timed}" for name, run in runs if (timed := efficiency(run))]
        lines.append(fit_line)  # is this box fit for comparisons, judged by this pair against the calibrated values?
        return "\n".join(lines)


@dataclass(frozen=True)
class RunShift:
    """What moves the ratios of every point of run B from run A's at once (the box's state over minutes, which no
    process of one run samples): `factor`, the median over points of B's ratio over A's (those both finite and
    positive), how many points moved up and down, and how the intervals hold each other with A's taken `factor`
    times (`held`)."""

    factor: float
    up: int
    down: int
    held: Held

    def percent(self) -> str:
        return f"{self.factor - 1:+.1%}"

    def sign_p(self) -> float:
        """Two-sided sign test of 'a point is as likely to move up as down' (ties left out), the points taken as
        independent (they share their runs' processes, so this p is if anything too small)."""
        n, k = self.up + self.down, min(self.up, self.down)
        return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0

    def explains(self, held: Held) -> bool:
        """Whether the intervals `held` as they are miss their targets only by this shift: it is more than the
        points' scatter (p < SHIFT_P), and taken out, they meet them."""
        return not held.meets_targets() and self.sign_p() < SHIFT_P and self.held.meets_targets()

    def text(self) -> str:
        frac = self.held.frac
        return (f"shift of the whole run's ratios: B's sit at a median of {self.percent()} from A's, {self.up} of "
                f"{self.held.points} points up and {self.down} down (sign test p = {self.sign_p():.2g}); taken out, "
                f"the intervals overlap at {frac(self.held.overlap)}, A's ratio is inside B's CI at "
                f"{frac(self.held.a_in_b)} and B's inside A's at {frac(self.held.b_in_a)}")

    @classmethod
    def of(cls, pairs: Pairs) -> RunShift:
        moved = [rb.ratio / ra.ratio for ra, rb in pairs if ra.ratio > 0 and math.isfinite(rb.ratio / ra.ratio)]
        median = finite_median([math.log(m) for m in moved if m > 0])
        factor = 1.0 if math.isnan(median) else math.exp(median)
        return cls(factor, sum(m > 1 for m in moved), sum(m < 1 for m in moved), Held.of(pairs, factor))


def components_text(noise: NoiseFloor) -> str:
    """The spread at each level, as the report and `kvpages noise` state it."""
    if noise.processes < 2:
        return (f"1 process: between-process spread unknown; within it, ratios {noise.ratio_within_process:.1%}, "
                f"times {noise.time_within_process:.1%} (log-sd between repetitions)")
    if math.isnan(noise.ratio_within_process):  # one repetition per process: the levels cannot be told apart
        return (f"{noise.processes} processes of one repetition: ratios vary {noise.ratio_between_process:.1%} and "
                f"absolute times {noise.time_between_process:.1%} between them, each repetition's own spread "
                "included (log-sd, median over rows)")
    return (f"{noise.processes} processes: ratios vary {noise.ratio_between_process:.1%} between processes and "
            f"{noise.ratio_within_process:.1%} between repetitions within one; absolute times "
            f"{noise.time_between_process:.1%} and {noise.time_within_process:.1%} (log-sd components, median over rows)")


def aa_figures(a: Analysis, b: Analysis, variant: str, fail_above_pct: float) -> AAFigures:
    a_ratios, b_ratios = ({(r.dtype, r.layout, r.page_size, r.seq_len): r for r in x.ratios_of(variant)} for x in (a, b))
    pairs = [(a_ratios[k], b_ratios[k]) for k in sorted(set(a_ratios) & set(b_ratios))]
    comparison = compare_runs(a.run, b.run, a.baseline)
    return AAFigures(
        a=a, b=b, variant=variant, held=Held.of(pairs),
        moved_10pct=sum(abs(rb.ratio / ra.ratio - 1) > 0.10 for ra, rb in pairs),
        median_width_a=finite_median([(ra.ci_high - ra.ci_low) / ra.ratio for ra, _ in pairs]),
        median_width_b=finite_median([(rb.ci_high - rb.ci_low) / rb.ratio for _, rb in pairs]),
        fail_above_pct=fail_above_pct,
        regressions=len(comparison.regressions(fail_above_pct)),
        slower=comparison.relative.counts()[SLOWER],
        faster=comparison.relative.counts()[FASTER],
        relative_points=len(comparison.relative.points),
        run_shift=RunShift.of(pairs),
    )


def efficiency(analysis: Analysis) -> str:
    """How much of the run's wall time was timed, and the repetitions per process its noise and costs call for."""
    meta = analysis.run.meta
    if meta is None:
        return "no meta.json beside the CSV: timed seconds unknown"
    return "; ".join(filter(None, (meta.efficiency_text(), allocation_text(analysis.noise, meta))))


def allocation_text(noise: NoiseFloor, meta: RunMeta) -> str:
    """Kalibera and Jones's allocation (ISMM 2013): the repetitions per process that narrow a ratio's interval most per
    second, r = sqrt(c_p s_w^2 / (c_r s_b^2)), c_p a process's cost besides its repetitions, c_r a repetition's of
    every case, s_b and s_w the ratios' between- and within-process components; "" where the run cannot say."""
    processes = meta.processes
    if len(processes) < 2 or any(p.end_s is None for p in processes):
        return ""
    each = meta.repetitions / len(processes)
    overlap = meta.timing.startup_overlap_s if meta.timing is not None else 0.0
    c_p = float(np.mean([p.startup_s + p.inputs_s + (p.checks_s or 0) + (p.end_s or 0) for p in processes]))
    c_p -= overlap / len(processes)
    c_r = float(np.mean([((p.warmup_s or 0) + (p.timed_s or 0) + (p.untimed_s or 0)) / each for p in processes]))
    costs = f"a process costs {c_p:.1f} s besides its repetitions, a repetition of every case {c_r:.1f} s"
    s_b, s_w = noise.ratio_between_process, noise.ratio_within_process
    if each == 1 and math.isnan(s_w):
        return (f"{costs}; one repetition per process, so the within-process spread that Kalibera and Jones's "
                "allocation needs is not measured here (a run with 2 per process measures it)")
    if not (s_b > 0 and s_w > 0):
        return ""
    best = math.sqrt(c_p * s_w ** 2 / (c_r * s_b ** 2))
    return (f"{costs}; with ratios varying {s_b:.1%} between processes and {s_w:.1%} within one, {best:.1f} repetitions "
            f"per process narrow the intervals most per second (Kalibera and Jones; this run: {each:g})")
