"""One compared pair of a run, estimated once (no torch): its repetitions aligned, its disturbed processes left out of
its centre (kvpages.core.stability), its ratio and times (kvpages.core.estimator), and whether its verdict holds when
any one of the processes behind it is left out (`fragile_without`). docs/method.md#disturbed-processes."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kvpages.analysis.intervals import levels, paired_logs
from kvpages.analysis.verdicts import FASTER, SLOWER, judge
from kvpages.core.estimator import Paired, kept_mean, kept_ratio, leave_one_out
from kvpages.core.stability import DEFAULT_FACTOR, Disturbance, Shift, disturbance, run_spread
from kvpages.core.stats import Interval, Levels, aligned, median, unknown
from kvpages.schema.reader import Run

STABLE, FRAGILE, DISTURBED = "stable", "fragile", "disturbed"
"""A pair's stability (ratios.csv `stability`): its verdict holds without any one of the processes behind it; it
flips when one of them is left out; more than a minority of its processes stand apart, so none could be left out
(its verdict is then `disturbed`, never faster or slower)."""


@dataclass(frozen=True)
class PairEstimate:
    """One pair: its estimate over the processes it keeps, what stood apart, and its aligned levels; `settled`: as
    many processes kept as the plan had (then the interval is theirs; else every process's, stretched to the centre)."""

    found: Paired
    disturbance: Disturbance
    settled: bool
    baseline: Levels
    variant: Levels

    @property
    def disturbed(self) -> bool:
        """More than a minority of its processes stand apart: no verdict (kvpages.core.stability)."""
        return bool(self.disturbance.beyond)

    @property
    def left_out(self) -> str:
        """ratios.csv's `left_out`: '3 (1.52x)', '3 (1.52x); 5 (0.61x)', '' for none."""
        return "; ".join(f"{s.process} ({s.factor:.3g}x)" for s in self.disturbance.left_out)

    def time(self, of_variant: bool) -> Interval:
        """The variant's (or the baseline's) time over the same processes as the ratio (`kept_mean`)."""
        return kept_mean(self.variant if of_variant else self.baseline, self.disturbance.processes, self.settled)


def disturb_factor(run: Run) -> float:
    remeasure = None if run.meta is None else run.meta.remeasure
    return DEFAULT_FACTOR if remeasure is None else remeasure.disturb_factor


def planned_processes(run: Run) -> int:
    """The processes the plan dealt repetitions to (a re-measurement round's come after them)."""
    if run.meta is not None and run.meta.remeasure is not None:
        return run.meta.remeasure.planned_processes
    return run.process_count


def family_spread(run: Run, pairs: list[tuple[tuple, tuple]], latency: str | None, name: str) -> float:
    """The run's spread between processes over a family's (baseline key, variant key) pairs (`run_spread`), once."""
    def compute() -> float:
        found = [paired_logs(run, b, v, latency) for b, v in pairs]
        return run_spread(logs for logs in found if logs is not None)

    return run.cached(("spread", name, latency), compute)


def estimate(run: Run, baseline_key: tuple, variant_key: tuple, spread: float, latency: str | None = None
             ) -> PairEstimate | None:
    """A pair's estimate (module doc), once per run; None without a common repetition."""
    def compute() -> PairEstimate | None:
        base, other = levels(run, baseline_key, latency), levels(run, variant_key, latency)
        both = None if base is None or other is None else aligned(base, other)
        logs = paired_logs(run, baseline_key, variant_key, latency)  # the family's spread took it already
        if both is None or logs is None:
            return None
        base, other = both
        found = disturbance(logs, spread, disturb_factor(run))
        settled = found.settled(planned_processes(run)) or base.process_count < 3
        paired = kept_ratio(base, other, found.processes, settled)
        if base.process_count < min(2, run.process_count):  # a row an interruption cut short to fewer processes
            paired = dataclasses.replace(paired, interval=unknown(paired.interval.ratio, paired.repetitions), p_value=1.0)
        return PairEstimate(paired, found, settled, base, other)

    return run.cached(("estimate", baseline_key, variant_key, latency, spread), compute)  # spread: its family's


def fragile_without(pair: PairEstimate, verdict: str, min_effect: float, p_cut: float) -> Shift | None:
    """The first kept process without which a faster or slower verdict would be another (leave-one-process-out, each
    judged as the family judged it: the same minimum effect, discovered when its p-value is at most the family's
    Benjamini-Hochberg cut `p_cut`), with how far it lies from the rest; None: it holds without any one of them."""
    if verdict not in (FASTER, SLOWER):
        return None
    gone = pair.disturbance.processes
    base, other = pair.baseline.without(gone), pair.variant.without(gone)
    if base.process_count < 3:
        return None
    logs = Levels(other.values - base.values, base.processes)
    for process, interval, p_value in leave_one_out(logs):
        if judge(interval, min_effect, p_value <= p_cut) != verdict:
            rest = median(logs.values[logs.processes != process])
            return Shift(process, math.exp(float(logs.values[logs.processes == process].mean()) - rest))
    return None
