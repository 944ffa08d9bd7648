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
from kvpages.core.names import BASELINE, CANDIDATE, FLOOR, STEP_BASELINE, per_request_name, variant_sort_key
from kvpages.core.stats import Interval, block_medians, median_interval, paired_log_ratios, unknown
from kvpages.schema.breakdown import BreakdownRow, read_breakdown
from kvpages.schema.reader import Run, RunError, row_key
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


def log_block_medians(run: Run, key: tuple) -> np.ndarray | None:
    blocks = run.blocks(key)
    return None if blocks is None else np.log(block_medians(blocks))


def paired_logs(run: Run, baseline_key: tuple, variant_key: tuple) -> np.ndarray | None:
    """Per repetition, log(variant / baseline) of the block medians; None without samples for both."""
    base, other = run.blocks(baseline_key), run.blocks(variant_key)
    if base is None or other is None or len(base) != len(other):
        return None
    return paired_log_ratios(block_medians(base), block_medians(other))


def _ratio(run: Run, variant: pd.Series, baseline: pd.Series) -> RatioRow:
    logs = paired_logs(run, row_key(baseline), row_key(variant))
    # A bare CSV has no repetitions to judge from.
    interval = unknown(float(variant["median_us"] / baseline["median_us"]), 0) if logs is None else median_interval(logs)
    return RatioRow(
        variant=str(variant["variant"]), baseline=str(baseline["variant"]), dtype=str(variant["dtype"]),
        layout=str(variant["layout"]), seq_len=int(variant["seq_len"]), page_size=int(variant["page_size"]),
        ratio=interval.ratio, ci_low=interval.ci_low, ci_high=interval.ci_high, confidence=interval.confidence,
        repetitions=interval.n,
        bytes_ratio=float(variant["d2h_bytes"] / baseline["d2h_bytes"]),
        variant_median_us=float(variant["median_us"]), baseline_median_us=float(baseline["median_us"]),
        variant_d2h_bytes=int(variant["d2h_bytes"]), baseline_d2h_bytes=int(baseline["d2h_bytes"]),
        verdict=verdict(interval),
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
        tie = r["median_us"] == best["median_us"] if logs is None else median_interval(logs).ci_low <= 1
        if tie:
            tied.append(str(r["variant"]))
    return tuple(tied)


@dataclass(frozen=True)
class NoiseFloor:
    """The spread between this run's repetitions: log-sd of each ok row's block medians (~ its CV)."""

    repetitions: int
    median_spread: float
    max_spread: float
    median_ci_half_width: float
    """The median, over ratios, of the relative half-width of the ratio's confidence interval."""


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
        base = run.scenario_samples.get((scenario, baseline))
        if base is None:
            continue
        for variant in rows["variant"]:
            other = run.scenario_samples[(scenario, variant)]
            if variant == baseline or len(other["blocked"]) != len(base["blocked"]):
                continue
            for latency in ("blocked", "ready"):
                logs = paired_log_ratios(block_medians(base[latency]), block_medians(other[latency]))
                interval = median_interval(logs)
                out.append(ScenarioRatio(str(scenario), str(variant), baseline, latency, interval, verdict(interval)))
    return tuple(out)


@dataclass(frozen=True)
class Analysis:
    """Everything the report, the charts, the notebook and `compare` show of one run, computed once."""

    run: Run
    baseline: str
    ratios: tuple[RatioRow, ...]
    crossovers: tuple[Crossover, ...]
    fastest: dict[tuple, tuple[str, ...]]
    """Per point (dtype, layout, page_size, seq_len): the fastest variants, tied within noise (the zero-D2H floor,
    host_mirror, is a reference and never counted among them)."""
    noise: NoiseFloor
    scenario_ratios: tuple[ScenarioRatio, ...] = ()
    scenario_baseline: str = STEP_BASELINE
    breakdown: tuple[BreakdownRow, ...] = ()
    """Where the time goes (breakdown.csv): one profiled pass over a few points; its shares are the result."""

    @property
    def floor(self) -> tuple[RatioRow, ...]:
        """The zero-D2H floor (host_mirror) against the baseline at every point where both were timed."""
        return self.ratios_of(FLOOR)

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
        contenders = at[at["variant"] != FLOOR]  # the zero-D2H floor is a reference, not a contender
        best[point] = fastest(run, contenders if not contenders.empty else at)
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
    noise = NoiseFloor(
        repetitions=repetitions,
        median_spread=float(spreads.median()) if len(spreads) else math.nan,
        max_spread=float(spreads.max()) if len(spreads) else math.nan,
        median_ci_half_width=float(np.median(finite)) if finite else math.nan,
    )
    step_baseline = per_request_name(baseline)
    try:
        breakdown = read_breakdown(run.path if run.path.is_dir() else run.path.parent)
    except ValueError as exc:
        raise RunError(str(exc)) from None
    return Analysis(run, baseline, tuple(ratios), found, best, noise, scenario_ratios(run, step_baseline), step_baseline,
                    breakdown)



def variant_order(column: pd.Series) -> pd.Series:
    """A `sort_values(key=...)` that orders the variant column by `variant_sort_key`."""
    return column.map(variant_sort_key) if column.name == "variant" else column


