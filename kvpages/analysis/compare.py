"""`kvpages compare`: judge run B against run A point by point, the relative and the absolute points each a family
judged as a run's ratios are (judge_family); the `--fail-above` gate keeps its own threshold (no torch)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvpages.analysis.intervals import levels, paired_logs
from kvpages.analysis.verdicts import VERDICTS, judge_family
from kvpages.core.estimator import between_runs
from kvpages.core.stats import Interval, Levels, unknown
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


@dataclass(frozen=True)
class RunComparison:
    relative: Family  # per (variant, point): B's variant/baseline ratio over A's (gated: robust to machine and process)
    absolute: Family  # per (variant, point): B's median over A's (informational: absolute times move between processes)
    only_a: list[tuple]
    only_b: list[tuple]
    baseline: str
    processes: tuple[int, int] = (1, 1)  # how many processes timed A and B

    @property
    def unit(self) -> str:
        return "process" if min(self.processes) >= 2 else "repetition"

    def caveat(self) -> str | None:
        """One line when the intervals cannot cover what varies between processes; None when they do."""
        if self.unit == "process":
            return None
        single = " and ".join(name for name, n in zip(("A", "B"), self.processes, strict=True) if n < 2)
        return (f"note: run {single} was timed in one process, so these intervals cover only what varies within a "
                "process, and a shift of a whole process reads as a change; rerun with --kv-processes 2 or more")

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
                         sorted(set(b_rows) - set(a_rows)), baseline, (a.process_count, b.process_count))


def _measured(key: tuple, a_logs: Levels | None, b_logs: Levels | None, fallback: tuple[float, float]
              ) -> PointComparison:
    """One key's figures and B/A, not yet judged; without samples in both, the rows' medians and no interval."""
    if a_logs is None or b_logs is None:
        a_value, b_value = fallback
        return PointComparison(key, a_value, b_value, unknown(b_value / a_value, 0), 1.0, 1.0, "")
    found = between_runs(a_logs, b_logs)
    return PointComparison(key, found.a, found.b, found.interval, found.p_value, 1.0, "")
