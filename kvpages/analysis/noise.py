"""A/A figures: do the intervals of two runs of the same code on the same machine, back to back, hold each other?
docs/method.md, "Noise"."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from kvpages.analysis.cite import percent_down, percent_up
from kvpages.analysis.compare import Shift, compare_runs
from kvpages.analysis.ratios import Analysis, NoiseFloor
from kvpages.analysis.verdicts import FASTER, SLOWER
from kvpages.core.checks import UserError
from kvpages.core.stats import CONFIDENCE, finite_median, two_sided_z
from kvpages.schema.meta import RunMeta
from kvpages.schema.rows import RatioRow

Shares = tuple[float, float, float]
"""Shares of points: the intervals that overlap, A's ratio inside B's interval, B's inside A's."""


def calibrated(se_a: float, se_b: float) -> Shares:
    """What calibrated intervals of two independent estimates of one ratio hold, with log standard errors `se_a`
    (run A's) and `se_b` (any scale: only their ratio counts): the probabilities that they overlap, that A's ratio
    lies inside B's interval, and B's inside A's. The difference of the two log ratios has a standard deviation of
    hypot(se_a, se_b); the narrower interval holds the other's ratio less often (equal widths: 99.4%, 83.4%, 83.4%)."""
    both, z = math.hypot(se_a, se_b), two_sided_z(CONFIDENCE)

    def within(reach: float) -> float:  # P(|difference| < z * reach)
        return 2 * NormalDist().cdf(z * reach / both) - 1

    return within(se_a + se_b), within(se_b), within(se_a)


EQUAL = calibrated(1.0, 1.0)
CALIBRATED = {"overlap": EQUAL[0], "coverage": EQUAL[1], "false_verdicts": 0.0}
"""Calibrated 95% intervals of equal widths hold the other run's estimate 83% of the time (P(|Z| < 1.96 / sqrt(2)))
and overlap 99.4%; `calibrated` gives what they hold where the widths differ."""
TARGETS = {"overlap": 0.95, "coverage": 0.75, "false_verdicts": 0.10, "width": 0.10}  # for a box fit for comparisons
"""For intervals of equal widths; where one run's are wider, the overlap and coverage asked for are as far below what
calibrated intervals of those widths hold (`Held.needs`)."""
WIDTHS_CAP = 3.0
"""The most times one run's intervals are taken as wider than the other's (`width_ratio`): beyond it, what the
narrower run's intervals would be asked to hold is too little to tell them from intervals too narrow."""


Pairs = list[tuple[RatioRow, RatioRow]]
"""A variant's ratio rows in runs A and B, paired point by point."""


def width_ratio(pairs: Pairs) -> float:
    """How many times as wide A's intervals are as B's on the log scale: the median over points of the ratio of their
    log widths (points where both are finite and positive; 1 for none), within 1/WIDTHS_CAP and WIDTHS_CAP. One figure
    for the run, as the runs' spreads are: each point's width is itself an estimate, and calibrated shares averaged
    over the points' noisy ratios would ask for less than equal widths do where the runs are equally noisy."""
    def log_width(row: RatioRow) -> float:
        width = math.log(row.ci_high / row.ci_low) if row.ci_low > 0 else math.nan
        return width if math.isfinite(width) and width > 0 else math.nan

    logs = [math.log(wa / wb) for ra, rb in pairs if math.isfinite(wa := log_width(ra)) and math.isfinite(wb := log_width(rb))]
    ratio = math.exp(finite_median(logs)) if logs else 1.0
    return min(max(ratio, 1 / WIDTHS_CAP), WIDTHS_CAP)


@dataclass(frozen=True)
class Held:
    """How the ratios and intervals of two runs hold each other over their common points, A's taken `factor` times
    (1: as they are): the intervals that overlap, A's ratio inside B's interval, B's inside A's; and how many times as
    wide A's intervals are as B's (`width_ratio`; a factor leaves it as it is)."""

    points: int
    overlap: int
    a_in_b: int
    b_in_a: int
    widths: float = 1.0

    @classmethod
    def of(cls, pairs: Pairs, factor: float = 1.0) -> Held:
        return cls(len(pairs),
                   overlap=sum(ra.ci_low * factor <= rb.ci_high and rb.ci_low <= ra.ci_high * factor
                               for ra, rb in pairs),
                   a_in_b=sum(rb.ci_low <= ra.ratio * factor <= rb.ci_high for ra, rb in pairs),
                   b_in_a=sum(ra.ci_low * factor <= rb.ratio <= ra.ci_high * factor for ra, rb in pairs),
                   widths=width_ratio(pairs))

    @property
    def expected(self) -> Shares:
        """What calibrated intervals of these widths hold (`calibrated`)."""
        return calibrated(self.widths, 1.0)

    def shares(self) -> Shares:
        """The shares of points held: overlapping, A's ratio inside B's interval, B's inside A's."""
        n = max(self.points, 1)
        return self.overlap / n, self.a_in_b / n, self.b_in_a / n

    def needs(self) -> Shares:
        """The shares of points the targets ask for: TARGETS' for equal widths, and as far below `expected` as TARGETS
        are below CALIBRATED where one run's intervals are wider."""
        overlap, a_in_b, b_in_a = self.expected
        return (TARGETS["overlap"] - (CALIBRATED["overlap"] - overlap),
                TARGETS["coverage"] - (CALIBRATED["coverage"] - a_in_b),
                TARGETS["coverage"] - (CALIBRATED["coverage"] - b_in_a))

    def short_of(self) -> list[str]:
        """Each share below what it needs, in words ('B's ratio inside A's CI 25.0% < 38.1%')."""
        names = ("intervals overlapping", "A's ratio inside B's CI", "B's ratio inside A's CI")
        return [f"{name} {percent_down(held)} < {percent_up(need)}"
                for name, held, need in zip(names, self.shares(), self.needs(), strict=True) if held < need]

    def meets_targets(self) -> bool:
        """Whether the intervals overlap and hold each other's ratios as often as `needs` asks (no share `short_of`)."""
        return not self.short_of()

    def widths_text(self) -> str:
        if self.widths == 1.0:
            return "equal widths"
        capped = " (the most it is taken as)" if max(self.widths, 1 / self.widths) >= WIDTHS_CAP else ""
        return f"these widths, A's {self.widths:.2g}x B's{capped}"

    def held_text(self) -> str:
        """The shares held beside what calibrated intervals of these widths hold and what is asked, for a verdict."""
        (overlap, a_in_b, b_in_a), (e_o, e_a, e_b), (n_o, n_a, n_b) = self.shares(), self.expected, self.needs()
        held, need = percent_down, percent_up  # so that a share and its need print as they compare
        return (f"intervals overlap at {held(overlap)} of points (calibrated at {self.widths_text()}: {e_o:.1%}, needs "
                f">= {need(n_o)}), A's ratio inside B's CI at {held(a_in_b)} and B's inside A's at {held(b_in_a)} "
                f"(calibrated {e_a:.1%} and {e_b:.1%}, needs >= {need(n_a)} and {need(n_b)})")

    def frac(self, k: int) -> str:
        return f"{k}/{self.points} ({percent_down(k / self.points)})" if self.points else "0/0"


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
    machine_note: str | None = None  # RunComparison.machine_note: an A/A pair is of one boot of one machine

    def text(self) -> str:
        held, shift, frac = self.held, self.run_shift, self.held.frac
        runs = (("A", self.a), ("B", self.b))
        false = (self.slower + self.faster) / max(self.relative_points, 1)
        (e_overlap, e_a, e_b), (n_overlap, n_a, n_b) = held.expected, held.needs()
        short = held.short_of() + ([f"false verdicts {percent_up(false)} > {percent_down(TARGETS['false_verdicts'])}"]
                                   if false > TARGETS["false_verdicts"] else [])
        verdict = f"NO (short of the targets: {'; '.join(short)})" if short else "yes"
        fit_line = (f"fit for comparisons: {verdict}: {held.held_text()}, false verdicts {percent_up(false)} "
                    f"(calibrated {CALIBRATED['false_verdicts']:.1%}, needs <= {percent_down(TARGETS['false_verdicts'])}); the "
                    f"intervals are {percent_up(self.median_width_a)} (A) and {percent_up(self.median_width_b)} (B) wide "
                    "(median), so smaller differences are not resolved here")
        if shift.explains(held):
            fit_line += (f"; without the shift of the whole run's ratios ({shift.moved.percent()}, sign test p = "
                         f"{shift.moved.sign_p():.2g}), {shift.held.held_text()}: each run's intervals cover its own "
                         "processes, not what moves a whole run's ratios on this box over minutes, so a difference of "
                         f"about {abs(shift.moved.factor - 1):.1%} between two runs may be the box's, not the code's")
        lines = [
            f"A/A noise check of {self.variant}/{self.a.baseline}: A = {self.a.run.run_id}, B = {self.b.run.run_id}",
            f"points with the ratio in both runs: {held.points}",
            f"intervals overlap: {frac(held.overlap)} (calibrated at {held.widths_text()}: {e_overlap:.1%}; target >= "
            f"{percent_up(n_overlap)})",
            f"A's ratio inside B's CI: {frac(held.a_in_b)}; B's ratio inside A's CI: {frac(held.b_in_a)} (calibrated at "
            f"{held.widths_text()}: {e_a:.1%} and {e_b:.1%}, {CALIBRATED['coverage']:.1%} each at equal widths; target "
            f">= {percent_up(n_a)} and {percent_up(n_b)})",
            f"median CI width / ratio: A {percent_up(self.median_width_a)}, B {percent_up(self.median_width_b)} "
            f"(target <= {percent_down(TARGETS['width'])})",
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
        lines += [self.machine_note] if self.machine_note else []
        lines.append(fit_line)  # is this box fit for comparisons, judged by this pair against the calibrated values?
        return "\n".join(lines)


@dataclass(frozen=True)
class RunShift:
    """A variant's `Shift` between two runs of the same code (`moved`: the box's state over minutes, which no process
    of one run samples), with how the intervals hold each other with A's taken that factor times (`held`)."""

    moved: Shift
    held: Held

    def explains(self, held: Held) -> bool:
        """Whether the intervals `held` as they are miss their targets only by this shift: it is more than the
        points' scatter (`Shift.clear`), and taken out, they meet them."""
        return not held.meets_targets() and self.moved.clear() and self.held.meets_targets()

    def text(self) -> str:
        moved, frac = self.moved, self.held.frac
        return (f"shift of the whole run's ratios: B's sit at a median of {moved.percent()} from A's, {moved.up} of "
                f"{self.held.points} points up and {moved.down} down (sign test p = {moved.sign_p():.2g}); taken out, "
                f"the intervals overlap at {frac(self.held.overlap)}, A's ratio is inside B's CI at "
                f"{frac(self.held.a_in_b)} and B's inside A's at {frac(self.held.b_in_a)}")

    @classmethod
    def of(cls, pairs: Pairs) -> RunShift:
        moved = Shift.of([rb.ratio / ra.ratio for ra, rb in pairs if ra.ratio > 0])
        return cls(moved, Held.of(pairs, moved.factor))


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
    """The A/A figures; a UserError names the variants both runs have where `variant` is not one of them."""
    both = sorted({r.variant for r in a.ratios} & {r.variant for r in b.ratios})
    if variant not in both:
        raise UserError(f"--variant {variant!r}: no ratio of it in both runs; theirs: {', '.join(both) or 'none'}")
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
        machine_note=comparison.machine_note(),
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
