"""Analyse a run once (no torch): `analyze(run)` sets every variant against the baseline, finds the crossovers, the
fastest variants and the noise floor, whole requests and steps included, into one `Analysis` the renderers format."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd

from kvpages.analysis.cite import pair_repro
from kvpages.analysis.contention import contention
from kvpages.analysis.intervals import levels, paired_logs
from kvpages.analysis.verdicts import FASTER, MIN_EFFECT_FLOOR, SLOWER, bh_adjusted, discoveries, judge, judge_family
from kvpages.core.estimator import Paired, mean_estimate, paired_ratio, trimmed_mean, trimmed_ratio
from kvpages.core.links import PREDICTION_PROFILES, LinkProfile
from kvpages.core.names import CANDIDATE, FLOOR, STEP_BASELINE, per_request_name, per_request_of, point_id, variant_sort_key
from kvpages.core.stability import outlying
from kvpages.core.stats import Interval, Levels, finite_median, unknown
from kvpages.schema.breakdown import BreakdownRow, read_breakdown
from kvpages.schema.profiles import built_in_profiles
from kvpages.schema.ranks import ContentionRow
from kvpages.schema.reader import Run, RunError, row_key
from kvpages.schema.rows import TIMED, RatioRow, ScenarioRatioRow, ratio_id

NOISY_SPREAD = 0.10  # a row whose block medians vary by at least this much (log-sd, ~ the CV) is flagged as noisy
POINT_COLUMNS = ("dtype", "layout", "page_size", "seq_len")

Record = dict[str, Any]  # a results.csv or scenarios.csv row from to_dict("records"): iterrows costs 100x more


def records(frame: pd.DataFrame) -> list[Record]:
    return cast(list[Record], frame.to_dict("records"))  # a frame read from CSV: its column names are strings


def point_of(key: tuple) -> str:
    """The point id (meta.json's name for it) of a results.csv row key."""
    _, dtype, layout, seq_len, page_size = key
    return point_id(seq_len, page_size, dtype, layout)


def estimate(run: Run, baseline_key: tuple, variant_key: tuple, latency: str | None = None) -> Paired | None:
    """The one estimator (kvpages.core.estimator.paired_ratio) of a pair, once per run; None without paired samples."""
    def compute() -> Paired | None:
        base, other = levels(run, baseline_key, latency), levels(run, variant_key, latency)
        if base is None or other is None:
            return None
        common = min(base.values.size, other.values.size)
        if run.meta is not None and common >= run.meta.repetitions:  # a re-measurement round cut short: the rounds
            base, other = (Levels(x.values[:common], x.processes[:common]) for x in (base, other))  # both finished
        if not np.array_equal(base.processes, other.processes):
            return None
        left_out = left_out_of(run, variant_key) if latency is None else None
        found = paired_ratio(base, other) if left_out is None else trimmed_ratio(base, other, left_out)
        if base.process_count < min(2, run.process_count):  # a row an interruption cut short to fewer processes
            return dataclasses.replace(found, interval=unknown(found.interval.ratio, found.repetitions), p_value=1.0)
        return found

    return run.cached(("estimate", baseline_key, variant_key, latency), compute)


def left_out_of(run: Run, key: tuple) -> frozenset[int] | None:
    """The processes a re-measured point's centres leave out (None: not a re-measured point): those outlying in any
    variant's paired log-ratios to the run's baseline there (kvpages.core.stability), the same for every ratio and
    time of the point, so each ratio stays the ratio of its two printed times (docs/method.md)."""
    remeasure = None if run.meta is None else run.meta.remeasure
    if remeasure is None or point_of(key) not in remeasure.remeasured:
        return None

    def compute() -> frozenset[int]:
        point = key[1:]
        base = levels(run, (run.baseline, *point))
        out: set[int] = set()
        for variant in run.rows["variant"].unique():
            other = levels(run, (str(variant), *point))
            if base is not None and other is not None and np.array_equal(base.processes, other.processes):
                out |= outlying(Levels(other.values - base.values, base.processes), remeasure.stable_spread)
        return frozenset(out)

    return run.cached(("left out", point_of(key)), compute)


@dataclass(frozen=True)
class _Pair:
    """A variant's row against the baseline's at one point; `found` None: a bare CSV's medians, nothing to judge."""

    variant: Record
    baseline: Record
    found: Paired | None

    @property
    def interval(self) -> Interval:
        if self.found is None:
            return unknown(float(self.variant["median_us"] / self.baseline["median_us"]), 0)
        return self.found.interval


def _ratio(pair: _Pair, effect: float, q_value: float, verdict: str, unstable: bool) -> RatioRow:
    variant, baseline, interval, found = pair.variant, pair.baseline, pair.interval, pair.found
    (name, dtype, layout, seq_len, page_size), base = row_key(variant), str(baseline["variant"])
    return RatioRow(
        id=ratio_id(name, base, dtype, layout, seq_len, page_size),
        variant=name, baseline=base, dtype=dtype, layout=layout, seq_len=seq_len, page_size=page_size,
        ratio=interval.ratio, ci_low=interval.ci_low, ci_high=interval.ci_high, confidence=interval.confidence,
        repetitions=0 if found is None else found.repetitions,
        bytes_ratio=float(variant["d2h_bytes"] / baseline["d2h_bytes"]),
        variant_median_us=float(variant["median_us"]) if found is None else found.variant_us,
        baseline_median_us=float(baseline["median_us"]) if found is None else found.baseline_us,
        variant_d2h_bytes=int(variant["d2h_bytes"]), baseline_d2h_bytes=int(baseline["d2h_bytes"]),
        verdict=verdict, min_effect=effect, q_value=q_value,
        repro=pair_repro(str(variant["repro"]), name, base),
        processes=0 if found is None else found.processes, interval_unit=interval.unit, unstable=unstable,
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
    """Per (dtype, layout, page size): the smallest seq_len at which `variant` is judged faster than the baseline."""
    groups: dict[tuple[str, str, int], list[RatioRow]] = {}
    for r in ratios:
        if r.variant == variant:
            groups.setdefault((r.dtype, r.layout, r.page_size), []).append(r)
    return [Crossover(*key, min((r.seq_len for r in group if r.verdict == FASTER), default=None),
                      tuple(sorted(r.seq_len for r in group))) for key, group in sorted(groups.items())]


def fastest(run: Run, rows: list[Record], effect: float) -> tuple[str, ...]:
    """At one point: the variant with the lowest median, then every variant not judged slower than it (or, unjudged, as fast)."""
    ordered = sorted(rows, key=lambda r: r["median_us"])  # stable: equal medians keep the file's order
    best = ordered[0]

    def tied(r: Record) -> bool:
        found = estimate(run, row_key(best), row_key(r))
        return r["median_us"] == best["median_us"] if found is None else judge(found.interval, effect) != SLOWER

    return tuple(str(r["variant"]) for r in ordered if tied(r))


@dataclass(frozen=True)
class NoiseFloor:
    """The spread of this run at each level that varies (log-sds, ~ relative spreads, as a CV): `*_spread` between
    the repetitions of each row; `median_ci_half_width` of the ratios' intervals, relative, and the `min_effect` it
    sets; `ratio_*` and `time_*` the between- and within-process components of the ratios' paired log-ratios and of
    the rows' log block medians (medians over them; nan with one process)."""

    repetitions: int
    median_spread: float
    max_spread: float
    median_ci_half_width: float
    min_effect: float = MIN_EFFECT_FLOOR
    processes: int = 1
    ratio_between_process: float = math.nan
    ratio_within_process: float = math.nan
    time_between_process: float = math.nan
    time_within_process: float = math.nan
    interval_unit: str = "repetition"


@dataclass(frozen=True)
class ScenarioRatio:
    """A step variant against the baseline step variant on one scenario, for one latency (blocked or ready)."""

    scenario: str
    variant: str
    baseline: str
    latency: str  # blocked | ready
    interval: Interval
    verdict: str
    id: str = ""  # the variant's scenarios.csv row id
    min_effect: float = MIN_EFFECT_FLOOR
    q_value: float = 1.0
    repro: str = ""
    repetitions: int = 0
    processes: int = 1
    variant_us: float = math.nan  # as the tables print it: interval.ratio is exactly variant_us / baseline_us
    baseline_us: float = math.nan

    def row(self) -> ScenarioRatioRow:
        i = self.interval
        return ScenarioRatioRow(self.id, self.scenario, self.variant, self.baseline, self.latency, i.ratio, i.ci_low,
                                i.ci_high, i.confidence, self.repetitions, self.verdict, self.min_effect, self.q_value,
                                self.repro, self.processes, i.unit)


def scenario_ratios(run: Run, baseline: str, effect: float) -> tuple[ScenarioRatio, ...]:
    """Every timed step variant against `baseline` per scenario and latency, judged as one family."""
    if run.scenarios is None or run.scenario_samples is None:
        return ()
    rows = records(run.scenarios[run.scenarios["status"].isin(TIMED)])
    first = {scenario: i for i, scenario in enumerate(dict.fromkeys(r["scenario"] for r in rows))}
    found: list[tuple[Record, str, Paired]] = []
    for row in sorted(rows, key=lambda r: first[r["scenario"]]):  # grouped as groupby(sort=False): first row's order
        scenario, variant = row["scenario"], row["variant"]
        for latency in ("blocked", "ready") if variant != baseline else ():
            pair = estimate(run, (scenario, baseline), (scenario, variant), latency)
            if pair is not None:
                found.append((row, latency, pair))
    qvalues = bh_adjusted([pair.p_value for *_, pair in found])
    return tuple(ScenarioRatio(str(row["scenario"]), str(row["variant"]), baseline, latency, pair.interval,
                               judge(pair.interval, effect, keep), str(row["id"]), effect, q,
                               pair_repro(str(row["repro"]), str(row["variant"]), baseline), pair.repetitions,
                               pair.processes, pair.variant_us, pair.baseline_us)
                 for (row, latency, pair), q, keep in zip(found, qvalues, discoveries(qvalues), strict=True))


@dataclass(frozen=True)
class Analysis:
    """Everything the report, the charts, the notebook and `compare` show of one run, computed once."""

    run: Run
    baseline: str
    ratios: tuple[RatioRow, ...]
    crossovers: tuple[Crossover, ...]
    fastest: dict[tuple, tuple[str, ...]]  # per point: the variants tied fastest (never the zero-D2H floor)
    noise: NoiseFloor
    scenario_ratios: tuple[ScenarioRatio, ...] = ()
    scenario_baseline: str = STEP_BASELINE
    breakdown: tuple[BreakdownRow, ...] = ()  # breakdown.csv
    contention: tuple[ContentionRow, ...] = ()  # a multi-rank run's steps (kvpages.analysis.contention)
    host_work: frozenset[str] = frozenset()  # the variants whose page indices come from host work (`host_work`)
    profiles: tuple[LinkProfile, ...] = ()  # every link profile the run is priced on: the built-in ones, then the user's

    @property
    def predicting(self) -> tuple[LinkProfile, ...]:
        """The profiles a prediction is made on: the built-in PREDICTION_PROFILES, then the user's (meta.json)."""
        return tuple(p for p in self.profiles if p.name in PREDICTION_PROFILES or p.origin != "built-in")

    @property
    def floor(self) -> tuple[RatioRow, ...]:
        """The zero-D2H floor (host_mirror) against the baseline at every point where both were timed."""
        return self.ratios_of(FLOOR)

    def host_side(self, variant: str) -> bool:
        """Whether `variant` (or the variant of per_request[variant]) strides on the host, by `host_work`."""
        return (per_request_of(variant) or variant) in self.host_work

    def scenario_ratio(self, scenario: str, variant: str, latency: str) -> ScenarioRatio | None:
        return self._scenario_index.get((scenario, variant, latency))

    @property
    def unstable(self) -> frozenset[str]:
        """The ids of the ratios whose point was still unstable after its re-measurement (meta.json `remeasure`)."""
        return frozenset(r.id for r in self.ratios if r.unstable)

    def ratios_of(self, variant: str) -> tuple[RatioRow, ...]:
        return tuple(r for r in self.ratios if r.variant == variant)

    def ratio_at(self, variant: str, dtype: str, layout: str, page_size: int, seq_len: int) -> RatioRow | None:
        return self._ratio_index.get((variant, dtype, layout, page_size, seq_len))

    @functools.cached_property
    def _ratio_index(self) -> dict[tuple, RatioRow]:
        return {(r.variant, r.dtype, r.layout, r.page_size, r.seq_len): r for r in self.ratios}

    @functools.cached_property
    def _scenario_index(self) -> dict[tuple, ScenarioRatio]:
        return {(r.scenario, r.variant, r.latency): r for r in self.scenario_ratios}

    def time_band(self, variant: str, dtype: str, layout: str, page_size: int, seq_len: int) -> Interval | None:
        """A variant's time at a point with its own interval (the tables' figure; a chart's marker and band)."""
        return self.scenario_band((dtype, layout, seq_len, page_size), variant, None)

    def scenario_band(self, scenario: str | tuple, variant: str, latency: str | None = "blocked") -> Interval | None:
        key = (variant, *scenario) if isinstance(scenario, tuple) else (scenario, variant)  # a point, or a scenario
        found = levels(self.run, key, latency)
        if found is None:
            return None
        left_out = left_out_of(self.run, key) if latency is None and isinstance(scenario, tuple) else None
        return self.run.cached(("time", key, latency), lambda: mean_estimate(found) if left_out is None
                               else trimmed_mean(found, left_out))

    def time_of(self, row: Record | pd.Series) -> float:
        """A results.csv row's time as the tables print it (`time_band`; without samples, its median)."""
        band = self.time_band(str(row["variant"]), str(row["dtype"]), str(row["layout"]), int(row["page_size"]),
                              int(row["seq_len"]))
        return float(row["median_us"]) if band is None else band.ratio

    def scenario_time(self, row: Record | pd.Series, latency: str = "blocked") -> float:
        band = self.scenario_band(str(row["scenario"]), str(row["variant"]), latency)
        return float(row[f"{latency}_median_us"]) if band is None else band.ratio

    def ratios_frame(self) -> pd.DataFrame:
        return pd.DataFrame([r.__dict__ for r in self.ratios])


def analyze(run: Run, baseline: str | None = None) -> Analysis:
    """Every timed variant against `baseline` (None: the run's own) at every point where both were timed, judged as one
    family (kvpages.analysis.verdicts); the steps against per_request[baseline] where timed, else the default's."""
    baseline = baseline or run.baseline
    ok = run.timed_rows()
    rows = records(ok)
    points: dict[tuple, list[Record]] = {}  # per point, sorted, as groupby(POINT_COLUMNS, sort=True)
    for row in rows:
        key = tuple(row[c] for c in POINT_COLUMNS)
        if not any(pd.isna(k) for k in key):
            points.setdefault(key, []).append(row)
    points = dict(sorted(points.items()))
    pairs: list[_Pair] = []
    for at in points.values():
        base = next((r for r in at if r["variant"] == baseline), None)
        if base is None:
            continue
        for row in sorted(at, key=lambda r: variant_sort_key(r["variant"])):
            if row["variant"] != baseline:
                pairs.append(_Pair(row, base, estimate(run, row_key(base), row_key(row))))
    still = run.remeasure_points("unstable")
    unstable = [point_of(row_key(p.variant)) in still for p in pairs]
    judged = judge_family([p.interval for p in pairs], [1.0 if p.found is None else p.found.p_value for p in pairs],
                          unstable)
    effect = judged.min_effect
    ratios = tuple(_ratio(p, effect, q, verdict, bad)
                   for p, q, verdict, bad in zip(pairs, judged.q_values, judged.verdicts, unstable, strict=True))
    best = {key: fastest(run, [r for r in at if r["variant"] != FLOOR] or at, effect)
            for key, at in points.items()}  # the zero-D2H floor is a reference, not a contender
    spreads = ok["rep_spread"].dropna()
    repetitions = int(ok["repetitions"].dropna().max()) if ok["repetitions"].notna().any() else 1
    ratio_parts = [logs.components() for logs in (paired_logs(run, row_key(p.baseline), row_key(p.variant))
                                                  for p in pairs) if logs is not None]
    time_parts = [levels.components() for levels in (levels(run, row_key(row)) for row in rows) if levels is not None]
    noise = NoiseFloor(
        repetitions=repetitions,
        median_spread=float(spreads.median()) if len(spreads) else math.nan,
        max_spread=float(spreads.max()) if len(spreads) else math.nan,
        median_ci_half_width=judged.half_width,
        min_effect=effect,
        processes=run.process_count,
        ratio_between_process=finite_median([c.between_process for c in ratio_parts]),
        ratio_within_process=finite_median([c.within_process for c in ratio_parts]),
        time_between_process=finite_median([c.between_process for c in time_parts]),
        time_within_process=finite_median([c.within_process for c in time_parts]),
        interval_unit=ratios[0].interval_unit if ratios else "repetition",
    )
    step_baseline = per_request_name(baseline)
    if run.scenarios is not None and step_baseline not in set(run.scenarios["variant"]):
        step_baseline = STEP_BASELINE
    try:
        breakdown = read_breakdown(run.path)  # the folder load_run read (a results CSV's too)
    except ValueError as exc:
        raise RunError(str(exc)) from None
    return Analysis(run, baseline, ratios, tuple(crossovers(ratios)), best, noise,
                    scenario_ratios(run, step_baseline, effect), step_baseline, breakdown, contention(run),
                    host_work(rows), run_profiles(run))


def run_profiles(run: Run) -> tuple[LinkProfile, ...]:
    """The built-in profiles, then the user's that the run's meta.json records (one of a built-in's name replaces it)."""
    own = tuple(run.meta.link_profiles) if run.meta else ()
    return tuple(p for p in built_in_profiles() if p.name not in {u.name for u in own}) + own


def host_work(rows: list[Record]) -> frozenset[str]:
    """The variants that, at every timed point with a page size above 1, handed the host every token index or none:
    what the link model takes as host work for a variant it has no declaration of (e.g. sglang@<label>)."""
    verdicts: dict[str, bool] = {}
    for r in rows:
        if r["page_size"] > 1 and not pd.isna(r["d2h_bytes"]):
            whole = r["d2h_bytes"] in (0, r["seq_len"] * np.dtype(r["dtype"]).itemsize)
            verdicts[r["variant"]] = verdicts.get(r["variant"], True) and bool(whole)
    return frozenset(v for v, host in verdicts.items() if host)


def variant_order(column: pd.Series) -> pd.Series:
    return column.map(variant_sort_key) if column.name == "variant" else column


