"""`kvpages compare`: judge run B against run A point by point, gating on ratios (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from kvpages.analysis.intervals import levels, paired_logs
from kvpages.analysis.ratios import verdict
from kvpages.core.names import BASELINE
from kvpages.core.stats import Interval, Levels, between_runs, unknown
from kvpages.schema.reader import Run, RunError, row_key


@dataclass(frozen=True)
class PointComparison:
    """One key in both runs: B against A, with the confidence interval of B/A and its verdict."""

    key: tuple
    a_value: float
    b_value: float
    interval: Interval
    verdict: str  # "faster", "slower", "same within noise"


@dataclass(frozen=True)
class RunComparison:
    relative: list[PointComparison]
    """Per (variant, point): B's variant/baseline ratio over A's (gated: robust to machine and process)."""
    absolute: list[PointComparison]
    """Per (variant, point): B's median over A's (informational: absolute times move between processes)."""
    only_a: list[tuple]
    only_b: list[tuple]
    baseline: str
    processes: tuple[int, int] = (1, 1)
    """How many processes timed A and B: with >= 2 in both, the intervals sample processes."""

    @property
    def unit(self) -> str:
        """What the between-run intervals sample: 'process', or 'repetition' when a run has one process."""
        return "process" if min(self.processes) >= 2 else "repetition"

    def caveat(self) -> str | None:
        """One line when the intervals cannot cover what varies between processes; None when they do."""
        if self.unit == "process":
            return None
        single = " and ".join(name for name, n in zip(("A", "B"), self.processes, strict=True) if n < 2)
        return (f"note: run {single} was timed in one process, so these intervals cover only what varies within a "
                "process, and a shift of a whole process reads as a change; rerun with --kv-processes 2 or more")
    def regressions(self, fail_above_pct: float) -> list[PointComparison]:
        """Relative points whose whole CI of B/A lies above 1 + fail_above_pct / 100."""
        return [p for p in self.relative if p.interval.ci_low > 1 + fail_above_pct / 100]


def _compare_verdict(interval: Interval) -> str:
    v = verdict(interval)
    return "same within noise" if v == "within noise" else v


def compare_runs(a: Run, b: Run, baseline: str = BASELINE) -> RunComparison:
    """Align two runs on (variant, dtype, layout, seq_len, page_size) and judge B against A.

    Relative: each run's paired per-repetition log-ratios variant/baseline, so what drifts with
    the machine cancels within each run; compared at the same level in both runs
    (kvpages.core.stats.between_runs): the two runs' independent two-stage bootstraps when both
    runs have >= 2 processes, else the Hodges-Lehmann shift of the repetitions.
    Absolute: each run's log block medians, compared the same way. Without repetitions
    (1 each), no interval can be formed and the verdict is 'same within noise'.
    """
    a_rows = {row_key(r): r for _, r in a.ok_rows().iterrows()}
    b_rows = {row_key(r): r for _, r in b.ok_rows().iterrows()}
    common = sorted(set(a_rows) & set(b_rows))
    if not common:
        raise RunError(f"{a.path} and {b.path}: no timed (variant, point) in common; nothing to compare")
    absolute, relative = [], []
    for key in common:
        ra, rb = a_rows[key], b_rows[key]
        la, lb = levels(a, key), levels(b, key)
        interval = _between(la, lb, float(rb["median_us"] / ra["median_us"]))
        absolute.append(PointComparison(key, float(ra["median_us"]), float(rb["median_us"]), interval,
                                        _compare_verdict(interval)))
        base_key = (baseline,) + key[1:]
        if key[0] == baseline or base_key not in a_rows or base_key not in b_rows:
            continue
        pa, pb = paired_logs(a, base_key, key), paired_logs(b, base_key, key)
        ratio_a = float(ra["median_us"] / a_rows[base_key]["median_us"])
        ratio_b = float(rb["median_us"] / b_rows[base_key]["median_us"])
        interval = _between(pa, pb, ratio_b / ratio_a)
        a_value = pa.interval().ratio if pa is not None else ratio_a
        b_value = pb.interval().ratio if pb is not None else ratio_b
        relative.append(PointComparison(key, a_value, b_value, interval, _compare_verdict(interval)))
    return RunComparison(relative, absolute, sorted(set(a_rows) - set(b_rows)), sorted(set(b_rows) - set(a_rows)),
                         baseline, (a.process_count, b.process_count))


def _between(a_logs: Levels | None, b_logs: Levels | None, fallback: float) -> Interval:
    if a_logs is None or b_logs is None or a_logs.values.size < 2 or b_logs.values.size < 2:
        return unknown(fallback, 0)
    return between_runs(a_logs, b_logs)

