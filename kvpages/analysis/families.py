"""The two families of a run's comparisons, each judged as one (no torch): the per-call pairs (every variant against
the baseline at every point) and the scenario pairs (every step variant against the baseline's on every whole request
and step, per latency); each pair estimated on its family's spread between processes (kvpages.analysis.pairs)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import pandas as pd

from kvpages.analysis.cite import pair_repro
from kvpages.analysis.pairs import DISTURBED, FRAGILE, STABLE, PairEstimate, estimate, family_spread, fragile_without
from kvpages.analysis.verdicts import MIN_EFFECT_FLOOR, Judged, judge_family
from kvpages.core.stats import Interval
from kvpages.schema.reader import Run, row_key
from kvpages.schema.rows import TIMED, ScenarioRatioRow

Record = dict[str, Any]  # a results.csv or scenarios.csv row from to_dict("records"): iterrows costs 100x more


def records(frame: pd.DataFrame) -> list[Record]:
    return cast(list[Record], frame.to_dict("records"))  # a frame read from CSV: its column names are strings


def point_pairs(run: Run, baseline: str) -> list[tuple[tuple, tuple]]:
    """Every (baseline key, variant key) of the per-call family: each timed variant against `baseline` at each point."""
    def compute() -> list[tuple[tuple, tuple]]:
        keys = [row_key(r) for r in records(run.timed_rows())]
        at = {key[1:] for key in keys if key[0] == baseline}
        return [((baseline, *key[1:]), key) for key in keys if key[0] != baseline and key[1:] in at]

    return run.cached(("point pairs", baseline), compute)


def point_estimate(run: Run, baseline_key: tuple, variant_key: tuple, family: str | None = None) -> PairEstimate | None:
    """A per-call pair (kvpages.analysis.pairs.estimate), on the spread of the run's per-call family against `family`
    (None: the pair's own baseline)."""
    family = family or baseline_key[0]
    spread = family_spread(run, point_pairs(run, family), None, f"points vs {family}")
    return estimate(run, baseline_key, variant_key, spread)


def stability(pair: PairEstimate | None, verdict: str, judged: Judged) -> str:
    """`stable`, `fragile` (leaving out one kept process flips the verdict) or `disturbed` (kvpages.analysis.pairs)."""
    if pair is None:
        return STABLE
    if pair.disturbed:
        return DISTURBED
    return FRAGILE if fragile_without(pair, verdict, judged.min_effect, judged.p_cut) is not None else STABLE


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
    stability: str = STABLE
    left_out: str = ""

    def row(self) -> ScenarioRatioRow:
        i = self.interval
        return ScenarioRatioRow(self.id, self.scenario, self.variant, self.baseline, self.latency, i.ratio, i.ci_low,
                                i.ci_high, i.confidence, self.repetitions, self.verdict, self.min_effect, self.q_value,
                                self.repro, self.processes, i.unit, self.stability, self.left_out)


def scenario_pairs(run: Run, baseline: str) -> list[tuple[tuple, tuple]]:
    """Every (baseline key, variant key) of the scenario family: each timed step variant against `baseline`."""
    def compute() -> list[tuple[tuple, tuple]]:
        if run.scenarios is None:
            return []
        timed = records(run.scenarios[run.scenarios["status"].isin(TIMED)])
        keys = [(str(r["scenario"]), str(r["variant"])) for r in timed]
        at = {scenario for scenario, variant in keys if variant == baseline}
        return [((scenario, baseline), (scenario, variant)) for scenario, variant in keys
                if variant != baseline and scenario in at]

    return run.cached(("scenario pairs", baseline), compute)


def scenario_estimate(run: Run, baseline_key: tuple, variant_key: tuple, latency: str) -> PairEstimate | None:
    """A whole request's or step's pair, on the spread of the run's scenario family at `latency`."""
    spread = family_spread(run, scenario_pairs(run, baseline_key[1]), latency, f"scenarios vs {baseline_key[1]}")
    return estimate(run, baseline_key, variant_key, spread, latency)


def scenario_ratios(run: Run, baseline: str, effect: float) -> tuple[ScenarioRatio, ...]:
    """Every timed step variant against `baseline` per scenario and latency, judged as one family."""
    if run.scenarios is None or run.scenario_samples is None:
        return ()
    rows = {(str(r["scenario"]), str(r["variant"])): r for r in records(run.scenarios[run.scenarios["status"].isin(TIMED)])}
    found: list[tuple[Record, str, PairEstimate]] = []
    for base_key, key in scenario_pairs(run, baseline):  # grouped by scenario in the file's order
        for latency in ("blocked", "ready"):
            pair = scenario_estimate(run, base_key, key, latency)
            if pair is not None:
                found.append((rows[key], latency, pair))
    judged = judge_family([p.found.interval for *_, p in found], [p.found.p_value for *_, p in found],
                          [p.disturbed for *_, p in found], min_effect=effect)
    return tuple(ScenarioRatio(str(row["scenario"]), str(row["variant"]), baseline, latency, p.found.interval, verdict,
                               str(row["id"]), effect, q, pair_repro(str(row["repro"]), str(row["variant"]), baseline),
                               p.found.repetitions, p.found.processes, p.found.variant_us, p.found.baseline_us,
                               stability(p, verdict, judged), p.left_out)
                 for (row, latency, p), q, verdict in zip(found, judged.q_values, judged.verdicts, strict=True))


