"""Analyse a run once (no torch): `analyze(run)` sets every variant against the baseline, finds the crossovers, the
fastest variants and the noise floor, whole requests and steps included, into one `Analysis` the renderers format."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvpages.analysis.cite import pair_repro
from kvpages.analysis.contention import contention
from kvpages.analysis.families import Record, ScenarioRatio, point_estimate, records, scenario_estimate, scenario_ratios, stability
from kvpages.analysis.intervals import levels, paired_logs
from kvpages.analysis.pairs import STABLE, PairEstimate
from kvpages.analysis.verdicts import DISTURBED, FASTER, MIN_EFFECT_FLOOR, SLOWER, judge, judge_family
from kvpages.core.estimator import mean_estimate
from kvpages.core.links import PREDICTION_PROFILES, LinkProfile
from kvpages.core.names import CANDIDATE, FLOOR, STEP_BASELINE, per_request_name, per_request_of, step_baseline, variant_sort_key
from kvpages.core.stats import Interval, finite_median, unknown
from kvpages.schema.breakdown import BreakdownRow, read_breakdown
from kvpages.schema.profiles import built_in_profiles
from kvpages.schema.ranks import ContentionRow
from kvpages.schema.reader import Run, RunError, row_key
from kvpages.schema.rows import RatioRow, ratio_id

NOISY_SPREAD = 0.10  # a row whose block medians vary by at least this much (log-sd, ~ the CV) is flagged as noisy
POINT_COLUMNS = ("dtype", "layout", "page_size", "seq_len")

@dataclass(frozen=True)
class _Pair:
    """A variant's row against the baseline's at one point; `estimate` None: a bare CSV's medians, nothing to judge."""

    variant: Record
    baseline: Record
    estimate: PairEstimate | None

    @property
    def interval(self) -> Interval:
        if self.estimate is None:
            return unknown(float(self.variant["median_us"] / self.baseline["median_us"]), 0)
        return self.estimate.found.interval

    @property
    def p_value(self) -> float:
        return 1.0 if self.estimate is None else self.estimate.found.p_value

    @property
    def disturbed(self) -> bool:
        return self.estimate is not None and self.estimate.disturbed


def _ratio(pair: _Pair, effect: float, q_value: float, verdict: str, stable: str) -> RatioRow:
    variant, baseline, interval = pair.variant, pair.baseline, pair.interval
    found = None if pair.estimate is None else pair.estimate.found
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
        processes=0 if found is None else found.processes, interval_unit=interval.unit, stability=stable,
        left_out="" if pair.estimate is None else pair.estimate.left_out,
    )


@dataclass(frozen=True)
class Crossover:
    dtype: str
    layout: str
    page_size: int
    seq_len: int | None  # None: not within the swept range
    swept: tuple[int, ...]
    after: int | None = None  # the longest swept length below seq_len whose interval lies above 1, not disturbed

    def bracket(self) -> str:
        """Where the ratio crosses 1, as finely as the swept lengths place it: above `after` (its interval above 1)
        and at most `seq_len` (judged faster); with no shorter length above 1, at or below `seq_len`."""
        if self.after is None:
            return f"at or below L={self.seq_len}"
        return f"in ({self.after}, {self.seq_len}]"

    def describe(self) -> str:
        if self.seq_len is None:
            return f"not within the swept range ({min(self.swept)}..{max(self.swept)})"
        return f"seq_len {self.seq_len} (crossing {self.bracket()})"


def crossovers(ratios: tuple[RatioRow, ...], variant: str = CANDIDATE) -> list[Crossover]:
    """Per (dtype, layout, page size): the smallest seq_len at which `variant` is judged faster than the baseline, and
    the longest shorter one whose interval lies above 1 and is not disturbed (the crossing of 1 between them)."""
    groups: dict[tuple[str, str, int], list[RatioRow]] = {}
    for r in ratios:
        if r.variant == variant:
            groups.setdefault((r.dtype, r.layout, r.page_size), []).append(r)
    found = []
    for key, group in sorted(groups.items()):
        first = min((r.seq_len for r in group if r.verdict == FASTER), default=None)
        after = None if first is None else max((r.seq_len for r in group if r.seq_len < first and r.ci_low > 1
                                                and r.verdict != DISTURBED), default=None)
        found.append(Crossover(*key, first, tuple(sorted(r.seq_len for r in group)), after))
    return found


def fastest(run: Run, rows: list[Record], effect: float, baseline: str) -> tuple[str, ...]:
    """At one point: the variant with the lowest median, then every variant not judged slower than it (or, unjudged,
    as fast), each pair on the spread of the run's family against `baseline`."""
    ordered = sorted(rows, key=lambda r: r["median_us"])  # stable: equal medians keep the file's order
    best = ordered[0]

    def tied(r: Record) -> bool:
        found = point_estimate(run, row_key(best), row_key(r), baseline)
        return r["median_us"] == best["median_us"] if found is None else judge(found.found.interval, effect) != SLOWER

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

    def stability_of(self, row_id: str) -> str:
        """A ratio's or a scenario ratio's (blocked) stability: stable, fragile or disturbed (kvpages.analysis.pairs)."""
        found = self._stability.get(row_id)
        return STABLE if found is None else found

    @functools.cached_property
    def _stability(self) -> dict[str, str]:
        return {**{r.id: r.stability for r in self.scenario_ratios if r.latency == "blocked"},
                **{r.id: r.stability for r in self.ratios}}

    def ratios_of(self, variant: str) -> tuple[RatioRow, ...]:
        return tuple(r for r in self.ratios if r.variant == variant)

    def ratio_at(self, variant: str, dtype: str, layout: str, page_size: int, seq_len: int) -> RatioRow | None:
        return self._ratio_index.get((variant, dtype, layout, page_size, seq_len))

    def row_at(self, variant: str, dtype: str, layout: str, page_size: int, seq_len: int) -> Record | None:
        """The timed results.csv row of a variant at a point."""
        return self._row_index.get((variant, dtype, layout, seq_len, page_size))

    @functools.cached_property
    def _row_index(self) -> dict[tuple, Record]:
        return {row_key(r): r for r in records(self.run.timed_rows())}

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
        """A variant's time over the processes its ratio keeps (its pair with the baseline; the baseline's own over
        the merged PR's pair's), with its interval; a point's when `scenario` is a point's key tuple."""
        point = isinstance(scenario, tuple)
        key = (variant, *scenario) if point else (scenario, variant)
        found = levels(self.run, key, latency)
        if found is None:
            return None
        baseline = self.baseline if point else self.scenario_baseline
        other = variant if variant != baseline else self._partner(scenario)

        def band() -> Interval:
            base_key, other_key = ((baseline, *scenario), (other, *scenario)) if point else \
                ((scenario, baseline), (scenario, other))
            pair = point_estimate(self.run, base_key, other_key) if point else \
                scenario_estimate(self.run, base_key, other_key, str(latency))
            return mean_estimate(found) if pair is None else pair.time(of_variant=variant != baseline)

        return self.run.cached(("time", key, latency), band)

    def _partner(self, scenario: str | tuple) -> str:
        """Whose pair the baseline's own time at a point or scenario takes its processes from: the merged PR's where
        it was timed (the report's main table), else the first other variant's."""
        point = isinstance(scenario, tuple)
        found = self._compared.get(scenario, [])
        candidate = CANDIDATE if point else per_request_name(CANDIDATE)
        return candidate if candidate in found or not found else min(found, key=variant_sort_key)

    @functools.cached_property
    def _compared(self) -> dict[str | tuple, list[str]]:
        """The variants set against the baseline per point key (dtype, layout, seq_len, page_size) and per scenario."""
        found: dict[str | tuple, list[str]] = {}
        for r in self.ratios:
            found.setdefault((r.dtype, r.layout, r.seq_len, r.page_size), []).append(r.variant)
        for s in self.scenario_ratios:
            if s.latency == "blocked":
                found.setdefault(s.scenario, []).append(s.variant)
        return found

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
                pairs.append(_Pair(row, base, point_estimate(run, row_key(base), row_key(row))))
    judged = judge_family([p.interval for p in pairs], [p.p_value for p in pairs], [p.disturbed for p in pairs])
    effect = judged.min_effect
    ratios = tuple(_ratio(p, effect, q, verdict, stability(p.estimate, verdict, judged))
                   for p, q, verdict in zip(pairs, judged.q_values, judged.verdicts, strict=True))
    best = {key: fastest(run, [r for r in at if r["variant"] != FLOOR] or at, effect, baseline)
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
    steps = step_baseline(baseline, () if run.scenarios is None else run.scenarios["variant"])
    try:
        breakdown = read_breakdown(run.path)  # the folder load_run read (a results CSV's too)
    except ValueError as exc:
        raise RunError(str(exc)) from None
    return Analysis(run, baseline, ratios, tuple(crossovers(ratios)), best, noise,
                    scenario_ratios(run, steps, effect), steps, breakdown, contention(run),
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


