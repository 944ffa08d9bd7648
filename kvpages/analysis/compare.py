"""`kvpages compare`: judge run B against run A point by point, the relative and the absolute points each a family
judged as a run's ratios are (judge_family); the `--fail-above` gate keeps its own threshold (no torch)."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from kvpages.analysis.intervals import levels, paired_logs
from kvpages.analysis.machines import Machine
from kvpages.analysis.verdicts import FASTER, SLOWER, VERDICTS, judge_family
from kvpages.core.estimator import between_runs
from kvpages.core.stats import Interval, Levels, finite_median, unknown
from kvpages.schema.meta import Environment
from kvpages.schema.reader import Run, RunError, row_key

RELATIVE, ABSOLUTE = "relative", "absolute"


@dataclass(frozen=True)
class PointComparison:
    key: tuple
    a_value: float
    b_value: float
    interval: Interval
    p_value: float
    q_value: float
    verdict: str


@dataclass(frozen=True)
class Family:
    points: list[PointComparison]
    min_effect: float

    def counts(self) -> dict[str, int]:
        return {v: sum(p.verdict == v for p in self.points) for v in VERDICTS}


SHIFT_P = 0.05
"""The sign test's p-value below which the shift of a whole run's ratios is taken as more than its points' scatter."""


@dataclass(frozen=True)
class Shift:
    """What moves every point of run B from run A's at once: `factor`, the median over points of B's figure over A's
    (those both finite and positive), and how many points moved up and down. A change to the baseline moves every
    ratio at once; so does the box's state over minutes, which no process of either run samples (`kvpages noise`)."""

    factor: float
    up: int
    down: int

    @classmethod
    def of(cls, moved: list[float]) -> Shift:
        """From each point's B over A."""
        kept = [m for m in moved if m > 0 and math.isfinite(m)]
        median = finite_median([math.log(m) for m in kept])
        return cls(1.0 if math.isnan(median) else math.exp(median), sum(m > 1 for m in kept), sum(m < 1 for m in kept))

    def percent(self) -> str:
        return f"{self.factor - 1:+.1%}"

    def sign_p(self) -> float:
        """Two-sided sign test of 'a point is as likely to move up as down' (ties left out), the points taken as
        independent (they share their runs' processes, so this p is if anything too small)."""
        n, k = self.up + self.down, min(self.up, self.down)
        return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0

    def clear(self) -> bool:
        """More than the points' scatter: p < SHIFT_P."""
        return self.sign_p() < SHIFT_P


@dataclass(frozen=True)
class RunComparison:
    relative: Family  # per (variant, point): B's variant/baseline ratio over A's (gated: robust to machine and process)
    absolute: Family  # per (variant, point): B's median over A's (informational: absolute times move between processes)
    only_a: list[tuple]
    only_b: list[tuple]
    baseline: str
    processes: tuple[int, int] = (1, 1)  # how many processes timed A and B
    environments: tuple[Environment | None, Environment | None] = (None, None)  # A's and B's (None: no meta.json)

    @property
    def machines(self) -> tuple[Machine | None, Machine | None]:
        """Where A and B ran (None: no meta.json)."""
        a, b = self.environments
        return None if a is None else Machine.of(a), None if b is None else Machine.of(b)

    @property
    def boots(self) -> tuple[str | None, str | None]:
        """The boot each ran in (Environment.boot_id; None: not known)."""
        a, b = self.environments
        return None if a is None else a.boot_id, None if b is None else b.boot_id

    @property
    def unit(self) -> str:
        return "process" if min(self.processes) >= 2 else "repetition"

    def caveat(self) -> str | None:
        """One line when the intervals cannot cover what varies between processes; None when they do."""
        if self.unit == "process":
            return None
        single = " and ".join(name for name, n in zip(("A", "B"), self.processes, strict=True) if n < 2)
        runs = f"run {single} was" if len(single) == 1 else "runs A and B were each"
        return (f"note: {runs} timed in one process, so these intervals cover only what varies within a "
                "process, and a shift of a whole process reads as a change; rerun with --kv-processes 2 or more")

    @functools.cached_property
    def shift(self) -> Shift:
        """How the relative points moved together, B over A (once: the note and the JSON document both ask)."""
        return Shift.of([p.interval.ratio for p in self.relative.points])

    def shift_note(self) -> str | None:
        """One line where the relative points moved together beyond their scatter (`Shift.clear`) and some verdict's
        interval holds that shift (the point moved no more than every point did): those verdicts may be the shift's;
        None otherwise."""
        shift = self.shift
        judged = [p for p in self.relative.points if p.verdict in (FASTER, SLOWER)]
        held = [p for p in judged if p.interval.ci_low <= shift.factor <= p.interval.ci_high]
        if not shift.clear() or not held:
            return None
        return (f"note: the relative points moved together: B's sit at a median of {shift.percent()} from A's "
                f"({shift.up} up and {shift.down} down of {len(self.relative.points)}; sign test p = "
                f"{shift.sign_p():.2g}, the points taken as independent). A change to {self.baseline}, or one every "
                "variant shares, moves every ratio at once, and so does the box's state over minutes, which neither "
                f"run's intervals sample (make noise measures it on this box): {len(held)} of the {len(judged)} "
                f"faster or slower verdicts hold that {shift.percent()} in their interval, and may be the shift's "
                "alone (the absolute family shows whether the baseline moved)")

    def machine_note(self) -> str | None:
        """One line where what meta.json records of A's and B's machines differs (`Machine.differences`), or where
        none of it does but their boots do: neither run's intervals sample what differs between them; None where
        nothing recorded for both differs."""
        a, b = self.machines
        if a is None or b is None:
            return None
        one_boot = None not in self.boots and self.boots[0] == self.boots[1]
        if differ := a.differences(b):
            said = "; ".join(f"{what}: A '{mine}', B '{theirs}'" for what, mine, theirs in differ)
            if one_boot:
                return (f"note: A and B ran in one boot of one box, but not alike ({said}): ratios move between "
                        "devices and set-ups, not only absolute times, so a verdict here may be the set-ups' and not the "
                        "change's")
            return (f"note: A and B ran on machines that differ ({said}): ratios move between machines, not only "
                    "absolute times, so a verdict here may be the machines' and not the change's; gate runs of one "
                    "machine")
        if None in self.boots or one_boot:
            return None
        where = f"'{a.describe()}'" if a == b else f"A '{a.describe()}', B '{b.describe()}'"
        return (f"note: A and B ran in different boots of machines whose recorded identity matches ({where}): a "
                "reboot, or another box of the same model; what differs between boots may move every point, and "
                "neither run's intervals sample it, so a verdict here may be the boots' and not the change's; to "
                "gate, rerun A in B's boot")

    def regressions(self, fail_above_pct: float) -> list[PointComparison]:
        return [p for p in self.relative.points if p.interval.ci_low > 1 + fail_above_pct / 100]


def _judged(measured: list[PointComparison]) -> Family:
    judged = judge_family([m.interval for m in measured], [m.p_value for m in measured])
    return Family([dataclasses.replace(m, q_value=q, verdict=verdict)
                   for m, q, verdict in zip(measured, judged.q_values, judged.verdicts, strict=True)],
                  judged.min_effect)


def compare_runs(a: Run, b: Run, baseline: str | None = None) -> RunComparison:
    """B against A on every (variant, point) of both, the ratios against `baseline` (None: the runs' own, which must be
    one); docs/method.md, "Comparing two runs"."""
    if baseline is None and a.baseline != b.baseline:
        raise RunError(f"{a.path} is against {a.baseline} and {b.path} against {b.baseline} (--kv-baseline): their "
                       "ratios do not compare; rerun one with the other's --kv-baseline")
    baseline = baseline or a.baseline
    a_rows, b_rows = ({row_key(r): r for _, r in run.ok_rows().iterrows()} for run in (a, b))
    common = sorted(set(a_rows) & set(b_rows))
    if not common:
        raise RunError(f"{a.path} and {b.path}: no timed (variant, point) in common; nothing to compare")
    absolute, relative = [], []
    for key in common:
        absolute.append(_measured(key, levels(a, key), levels(b, key),
                                  (float(a_rows[key]["median_us"]), float(b_rows[key]["median_us"]))))
        base_key = (baseline,) + key[1:]
        if key[0] == baseline or base_key not in a_rows or base_key not in b_rows:
            continue
        ratio_a, ratio_b = (float(rows[key]["median_us"] / rows[base_key]["median_us"]) for rows in (a_rows, b_rows))
        relative.append(_measured(key, paired_logs(a, base_key, key), paired_logs(b, base_key, key), (ratio_a, ratio_b)))
    return RunComparison(_judged(relative), _judged(absolute), sorted(set(a_rows) - set(b_rows)),
                         sorted(set(b_rows) - set(a_rows)), baseline, (a.process_count, b.process_count),
                         (None if a.meta is None else a.meta.environment, None if b.meta is None else b.meta.environment))


def _measured(key: tuple, a_logs: Levels | None, b_logs: Levels | None, fallback: tuple[float, float]
              ) -> PointComparison:
    """One key's figures and B/A, not yet judged; without samples in both, the rows' medians and no interval."""
    if a_logs is None or b_logs is None:
        a_value, b_value = fallback
        return PointComparison(key, a_value, b_value, unknown(b_value / a_value, 0), 1.0, 1.0, "")
    found = between_runs(a_logs, b_logs)
    return PointComparison(key, found.a, found.b, found.interval, found.p_value, 1.0, "")
