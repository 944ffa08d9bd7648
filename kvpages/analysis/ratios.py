"""Analyse a run once: every variant against the baseline, crossovers, the fastest variants, the noise floor.

`analyze(run)` computes one typed `Analysis` of a run (every variant against the baseline with
repetition-level confidence intervals, the crossovers, the fastest variants per point, the noise
floor, the whole requests and steps); the renderers only format it. Every figure comes from a
run's files (kvpages.schema.reader). No torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvpages.core.links import LINK_PROFILES
from kvpages.core.names import BASELINE, CANDIDATE, STEP_BASELINE, per_request_name, variant_sort_key
from kvpages.core.stats import Interval, Levels, unknown
from kvpages.schema.reader import Run, row_key
from kvpages.schema.rows import RatioRow

NOISY_SPREAD = 0.10
"""A row whose block medians vary by at least this much (log-sd, ~ the CV) is flagged as noisy."""


def with_link_model(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` plus one `modeled_<link>_us` column per link profile (a model, see kvpages.core.links)."""
    out = rows.copy()
    for profile in LINK_PROFILES:
        out[profile.column] = [
            profile.modeled_us(float(b), float(t)) if pd.notna(b) and pd.notna(t) else np.nan
            for b, t in zip(rows["d2h_bytes"], rows["d2h_transfers"], strict=True)
        ]
    return out


POINT_COLUMNS = ("dtype", "layout", "page_size", "seq_len")


def verdict(interval: Interval) -> str:
    if interval.ci_high < 1:
        return "faster"
    if interval.ci_low > 1:
        return "slower"
    return "within noise"


def paired_logs(run: Run, baseline_key: tuple, variant_key: tuple, latency: str | None = None) -> Levels | None:
    """Per repetition, log(variant / baseline) of the block medians, with each repetition's process; None
    without samples for both (keys: row keys, or (scenario, variant) with a `latency`)."""
    base, other = run.levels(baseline_key, latency), run.levels(variant_key, latency)
    if base is None or other is None or base.values.size != other.values.size:
        return None
    return Levels(other.values - base.values, base.processes)


def _ratio(run: Run, variant: pd.Series, baseline: pd.Series) -> RatioRow:
    logs = paired_logs(run, row_key(baseline), row_key(variant))
    # A bare CSV has no repetitions to judge from.
    interval = unknown(float(variant["median_us"] / baseline["median_us"]), 0) if logs is None else logs.interval()
    return RatioRow(
        variant=str(variant["variant"]), baseline=str(baseline["variant"]), dtype=str(variant["dtype"]),
        layout=str(variant["layout"]), seq_len=int(variant["seq_len"]), page_size=int(variant["page_size"]),
        ratio=interval.ratio, ci_low=interval.ci_low, ci_high=interval.ci_high, confidence=interval.confidence,
        repetitions=0 if logs is None else int(logs.values.size),
        bytes_ratio=float(variant["d2h_bytes"] / baseline["d2h_bytes"]),
        variant_median_us=float(variant["median_us"]), baseline_median_us=float(baseline["median_us"]),
        variant_d2h_bytes=int(variant["d2h_bytes"]), baseline_d2h_bytes=int(baseline["d2h_bytes"]),
        verdict=verdict(interval),
        processes=0 if logs is None else logs.process_count, interval_unit=interval.unit,
    )


@dataclass(frozen=True)
class Crossover:
    dtype: str
    layout: str
    page_size: int
    seq_len: int | None  # None: not within the swept range
    swept: tuple[int, ...]

    def describe(self) -> str:
        if self.seq_len is None:
            return f"not within the swept range ({min(self.swept)}..{max(self.swept)})"
        return f"seq_len {self.seq_len}"


def crossovers(ratios: tuple[RatioRow, ...], variant: str = CANDIDATE) -> list[Crossover]:
    """Per (dtype, layout, page size): the smallest seq_len at which `variant` beats the baseline,
    i.e. the upper end of the confidence interval of variant/baseline is below 1."""
    groups: dict[tuple, list[RatioRow]] = {}
    for r in ratios:
        if r.variant == variant:
            groups.setdefault((r.dtype, r.layout, r.page_size), []).append(r)
    out = []
    for (dtype, layout, page_size), group in sorted(groups.items()):
        group.sort(key=lambda r: r.seq_len)
        wins = [r.seq_len for r in group if r.ci_high < 1]
        out.append(Crossover(dtype, layout, page_size, wins[0] if wins else None, tuple(r.seq_len for r in group)))
    return out


def fastest(run: Run, rows: pd.DataFrame) -> tuple[str, ...]:
    """At one point: the variant with the lowest median, then every variant tied with it, i.e. whose
    paired ratio to it has a confidence interval that reaches 1 (no repetitions: equal medians only)."""
    ordered = rows.sort_values("median_us")
    best = ordered.iloc[0]
    tied = []
    for _, r in ordered.iterrows():
        logs = paired_logs(run, row_key(best), row_key(r))
        tie = r["median_us"] == best["median_us"] if logs is None else logs.interval().ci_low <= 1
        if tie:
            tied.append(str(r["variant"]))
    return tuple(tied)


@dataclass(frozen=True)
class NoiseFloor:
    """The spread of this run at each level that varies (log-sds, ~ relative spreads, as a CV)."""

    repetitions: int
    median_spread: float
    """Between the repetitions of each ok row (block medians, every process pooled): the median over rows."""
    max_spread: float
    median_ci_half_width: float
    """The median, over ratios, of the relative half-width of the ratio's confidence interval."""
    processes: int = 1
    ratio_between_process: float = math.nan
    """Of each ratio's paired log-ratios: the between-process component (median over ratios; nan with one process)."""
    ratio_within_process: float = math.nan
    """...and the within-process component, between repetitions of one process."""
    time_between_process: float = math.nan
    """Of each ok row's log block medians (absolute times): the between-process component, median over rows."""
    time_within_process: float = math.nan
    interval_unit: str = "repetition"
    """What the intervals sample: 'process' (fresh processes) or 'repetition' (within one process)."""


@dataclass(frozen=True)
class ScenarioRatio:
    """A step variant against the baseline step variant on one scenario, for one latency (blocked or ready)."""

    scenario: str
    variant: str
    baseline: str
    latency: str  # blocked | ready
    interval: Interval
    verdict: str


def scenario_ratios(run: Run, baseline: str) -> tuple[ScenarioRatio, ...]:
    """Paired per-repetition ratios of block medians, every ok step variant against `baseline`, per scenario."""
    if run.scenarios is None or run.scenario_samples is None:
        return ()
    ok = run.scenarios[run.scenarios["status"] == "ok"]
    out = []
    for scenario, rows in ok.groupby("scenario", sort=False):
        if (scenario, baseline) not in run.scenario_samples:
            continue
        for variant in rows["variant"]:
            for latency in ("blocked", "ready") if variant != baseline else ():
                logs = paired_logs(run, (scenario, baseline), (scenario, variant), latency)
                if logs is not None:
                    interval = logs.interval()
                    out.append(ScenarioRatio(str(scenario), str(variant), baseline, latency, interval,
                                             verdict(interval)))
    return tuple(out)


@dataclass(frozen=True)
class Analysis:
    """Everything the report, the charts, the notebook and `compare` show of one run, computed once."""

    run: Run
    baseline: str
    ratios: tuple[RatioRow, ...]
    crossovers: tuple[Crossover, ...]
    fastest: dict[tuple, tuple[str, ...]]
    """Per point (dtype, layout, page_size, seq_len): the fastest variants, tied within noise."""
    noise: NoiseFloor
    scenario_ratios: tuple[ScenarioRatio, ...] = ()
    scenario_baseline: str = STEP_BASELINE

    def scenario_ratio(self, scenario: str, variant: str, latency: str) -> ScenarioRatio | None:
        return next((r for r in self.scenario_ratios
                     if (r.scenario, r.variant, r.latency) == (scenario, variant, latency)), None)

    def ratios_of(self, variant: str) -> tuple[RatioRow, ...]:
        return tuple(r for r in self.ratios if r.variant == variant)

    def ratio_at(self, variant: str, dtype: str, layout: str, page_size: int, seq_len: int) -> RatioRow | None:
        return next((r for r in self.ratios if (r.variant, r.dtype, r.layout, r.page_size, r.seq_len)
                     == (variant, dtype, layout, page_size, seq_len)), None)

    def ratios_frame(self) -> pd.DataFrame:
        return pd.DataFrame([r.__dict__ for r in self.ratios])


def analyze(run: Run, baseline: str = BASELINE) -> Analysis:
    """Analyse `run` once: every timed variant against `baseline` at every point where both were timed."""
    ok = run.ok_rows()
    ratios: list[RatioRow] = []
    best: dict[tuple, tuple[str, ...]] = {}
    for key, at in ok.groupby(list(POINT_COLUMNS), sort=True):
        point = tuple(key)
        best[point] = fastest(run, at)
        base = at[at["variant"] == baseline]
        if base.empty:
            continue
        for _, row in at.sort_values("variant", key=variant_order).iterrows():
            if row["variant"] != baseline:
                ratios.append(_ratio(run, row, base.iloc[0]))
    found = tuple(crossovers(tuple(ratios)))
    spreads = ok["rep_spread"].dropna()
    finite = [(r.ci_high - r.ci_low) / 2 / r.ratio for r in ratios if math.isfinite(r.ci_high)]
    repetitions = int(ok["repetitions"].dropna().max()) if ok["repetitions"].notna().any() else 1
    ratio_levels = [paired_logs(run, ratio_key(r, baseline), ratio_key(r, r.variant)) for r in ratios]
    ratio_parts = [levels.components() for levels in ratio_levels if levels is not None]
    time_parts = [levels.components() for levels in (run.levels(row_key(row)) for _, row in ok.iterrows())
                  if levels is not None]
    noise = NoiseFloor(
        repetitions=repetitions,
        median_spread=float(spreads.median()) if len(spreads) else math.nan,
        max_spread=float(spreads.max()) if len(spreads) else math.nan,
        median_ci_half_width=float(np.median(finite)) if finite else math.nan,
        processes=run.process_count,
        ratio_between_process=_median([c.between_process for c in ratio_parts]),
        ratio_within_process=_median([c.within_process for c in ratio_parts]),
        time_between_process=_median([c.between_process for c in time_parts]),
        time_within_process=_median([c.within_process for c in time_parts]),
        interval_unit=ratios[0].interval_unit if ratios else "repetition",
    )
    step_baseline = per_request_name(baseline)
    return Analysis(run, baseline, tuple(ratios), found, best, noise, scenario_ratios(run, step_baseline), step_baseline)



def ratio_key(ratio: RatioRow, variant: str) -> tuple:
    """The row key of `variant` at a ratio's point."""
    return (variant, ratio.dtype, ratio.layout, ratio.seq_len, ratio.page_size)


def _median(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.median(finite)) if finite else math.nan


def variant_order(column: pd.Series) -> pd.Series:
    """A `sort_values(key=...)` that orders the variant column by `variant_sort_key`."""
    return column.map(variant_sort_key) if column.name == "variant" else column


