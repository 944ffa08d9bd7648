"""What a run predicts for a GPU box, per link profile (kvpages.core.links; no torch), and how far each prediction
moves when the assumed terms do: every ratio carries its range over the profile's variations (each assumed term at its
low and its high, one at a time and all together), every crossover the variations that move it. The host work each
prediction adds is measured apart from any copy (kvpages.analysis.hostwork), so a CUDA run is priced as a CPU run is:
its copies once; a row whose host work cannot be separated is not priced."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvpages.analysis.cite import percent_up
from kvpages.analysis.families import Record, ScenarioRatio, records
from kvpages.analysis.hostwork import host_side, point_host_work, scenario_host_work
from kvpages.analysis.ratios import Analysis
from kvpages.core.links import LinkProfile, profile_for, variations
from kvpages.schema.rows import RatioRow

Call = tuple[str, int, int, float, float, float, bool]
"""LinkProfile.predicted_us's arguments: variant, page size, calls, bytes, transfers, host work µs, host side."""
Price = Callable[[LinkProfile], float]
"""What a call, a request or a step costs on a profile, in µs."""


@dataclass(frozen=True)
class Prediction:
    """One variant against its baseline on one profile: the predicted times, and the ratio's range over the profile's
    variations (`low_by`, `high_by`: the variation that gives each end, e.g. 'sync 2x')."""

    profile: LinkProfile
    variant_us: float
    baseline_us: float
    low: float
    high: float
    low_by: str
    high_by: str

    @property
    def ratio(self) -> float:
        return self.variant_us / self.baseline_us


def _ratio(profile: LinkProfile, calls: tuple[Call, Call]) -> float:
    return profile.predicted_us(*calls[0]) / profile.predicted_us(*calls[1])


def predict(profile: LinkProfile, calls: tuple[Call, Call]) -> Prediction:
    """`calls` (the variant's, then the baseline's) priced on `profile` and on each of its variations."""
    return predict_prices(profile, (lambda p: p.predicted_us(*calls[0]), lambda p: p.predicted_us(*calls[1])))


def predict_prices(profile: LinkProfile, prices: tuple[Price, Price]) -> Prediction:
    """The variant's and the baseline's prices on `profile` and on each of its variations."""
    def ratio(on: LinkProfile) -> float:
        return prices[0](on) / prices[1](on)

    varied = [(ratio(profile), "as assumed")] + [(ratio(v.profile), v.said) for v in variations(profile)]
    (low, low_by), (high, high_by) = min(varied, key=lambda t: t[0]), max(varied, key=lambda t: t[0])
    return Prediction(profile, prices[0](profile), prices[1](profile), low, high, low_by, high_by)


def row_call(analysis: Analysis, variant: str, row: Record, calls: int, time: float | None = None) -> Call | None:
    """One variant's call (or request or step) on a results.csv or scenarios.csv row: what the meter saw it move, one
    blocking copy per transfer, and its host work; None where the host work or the path cannot be told."""
    side = host_side(analysis, variant, row)
    work = point_host_work(analysis, variant, row) if time is None else scenario_host_work(analysis, variant, row, time)
    if side is None or work.us is None:
        return None
    return (variant, int(row["page_size"]), calls, float(row["d2h_bytes"]), float(row["d2h_transfers"]), work.us, side)


def point_calls(analysis: Analysis, r: RatioRow) -> tuple[Call, Call] | None:
    """`r`'s variant and baseline, one call each, priced by what the meter saw them move and their host work."""
    found = [analysis.row_at(name, r.dtype, r.layout, r.page_size, r.seq_len) for name in (r.variant, r.baseline)]
    calls = [None if row is None else row_call(analysis, name, row, 1) for name, row in zip((r.variant, r.baseline), found,
                                                                                         strict=True)]
    return None if calls[0] is None or calls[1] is None else (calls[0], calls[1])


def point_predictions(analysis: Analysis, r: RatioRow) -> tuple[Prediction, ...]:
    """`r` on every prediction profile; () where it cannot be priced (`point_calls`)."""
    calls = point_calls(analysis, r)
    return () if calls is None else tuple(predict(profile, calls) for profile in analysis.predicting)


def model_over_measured(analysis: Analysis, r: RatioRow) -> tuple[float, LinkProfile] | None:
    """On a run that crossed a link: `r`'s variant's modelled time per call (no host work added: the merged PR strides
    on the device) over its measured time, on the profile of the link its row crossed; None where none matches (the
    report's "Model vs measurement" and `kvpages cite` of its row)."""
    row = analysis.row_at(r.variant, r.dtype, r.layout, r.page_size, r.seq_len)
    pcie = analysis.run.meta.environment.pcie_link if analysis.run.meta else None
    profile = None if row is None else profile_for(pcie, str(row["link"]), analysis.profiles)
    if row is None or profile is None:
        return None
    modeled = profile.predicted_us(r.variant, r.page_size, 1, r.variant_d2h_bytes, int(row["d2h_transfers"]), 0.0)
    return modeled / r.variant_median_us, profile


@dataclass(frozen=True)
class FittedCheck:
    """A run that crossed a link, priced on its fitted profile (one fitted from it, else the first fitted one): the
    merged PR / pre-PR it predicts at page size 1 against the measured ratio, per length (the model check's "within")."""

    profile: LinkProfile
    rows: tuple[tuple[RatioRow, Prediction], ...]

    @property
    def worst(self) -> float:
        """The largest |predicted / measured - 1| over the lengths."""
        return max(abs(p.ratio / r.ratio - 1) for r, p in self.rows)

    @property
    def within(self) -> str:
        """`worst` as a bound ('7.9%': `percent_up`)."""
        return percent_up(self.worst)


def fitted_check(analysis: Analysis, merged: str) -> FittedCheck | None:
    """`FittedCheck` of the merged PR (`merged`) where a fitted profile predicts and page size 1 was timed; else None.
    Made once per run and baseline (the findings' model check and the appendix's table both read it)."""
    return analysis.run.cached(("fitted check", merged, analysis.baseline), lambda: _fitted_check(analysis, merged))


def _fitted_check(analysis: Analysis, merged: str) -> FittedCheck | None:
    fitted = [p for p in analysis.predicting if p.in_sample(analysis.run.run_id) or p.fitted]
    at1 = [(r, found) for r in analysis.ratios_of(merged) if r.page_size == 1 and (found := point_predictions(analysis, r))]
    if not fitted or not at1:
        return None
    n = analysis.predicting.index(fitted[0])
    return FittedCheck(fitted[0], tuple((r, found[n]) for r, found in at1))


def scenario_rows(analysis: Analysis) -> dict[str, dict[str, Record]]:
    """scenarios.csv's rows by scenario and variant, made once per run (a frame filter per row looked up cost 5-8 ms)."""
    frame = analysis.run.scenarios
    assert frame is not None

    def by_scenario() -> dict[str, dict[str, Record]]:
        every: dict[str, dict[str, Record]] = {}
        for r in records(frame):
            every.setdefault(str(r["scenario"]), {})[str(r["variant"])] = r
        return every

    return analysis.run.cached(("scenario rows",), by_scenario)


def scenario_predictions(analysis: Analysis, ratio: ScenarioRatio) -> tuple[Prediction, ...]:
    """A whole request's or step's variant and baseline (scenarios.csv rows) on every prediction profile; () where
    either cannot be priced."""
    rows = scenario_rows(analysis)[ratio.scenario]
    calls = [row_call(analysis, name, rows[name], int(rows[name]["calls"]), time)
             for name, time in ((ratio.variant, ratio.variant_us), (ratio.baseline, ratio.baseline_us))]
    if calls[0] is None or calls[1] is None:
        return ()
    return tuple(predict(profile, (calls[0], calls[1])) for profile in analysis.predicting)


def _first_below(calls: list[tuple[int, tuple[Call, Call]]], profile: LinkProfile) -> int | None:
    return next((seq_len for seq_len, c in calls if _ratio(profile, c) < 1), None)


@dataclass(frozen=True)
class PredictedCrossover:
    """The smallest swept seq_len the model puts below 1 on `profile` (None: none), and where each variation of the
    profile that moves it puts it instead."""

    profile: LinkProfile
    seq_len: int | None
    moved: tuple[tuple[str, int | None], ...]

    @staticmethod
    def at(seq_len: int | None) -> str:
        return f"L={seq_len}" if seq_len else "none"

    @property
    def span(self) -> str:
        """The crossover's range over the variations: 'L=8192-131072', 'L=32768', or with 'none' at an end."""
        found = [self.seq_len] + [c for _, c in self.moved]
        numbers = sorted({c for c in found if c})
        ends = ([self.at(numbers[0])] if numbers else []) + ([self.at(numbers[-1])] if len(numbers) > 1 else [])
        return " to ".join(ends + (["none"] if None in found else []))


def crossover(analysis: Analysis, rows: list[RatioRow], profile: LinkProfile) -> PredictedCrossover:
    """The crossover of `rows` (one variant and page size) on `profile`, and under each of its variations."""
    calls = [(r.seq_len, c) for r in sorted(rows, key=lambda r: r.seq_len) if (c := point_calls(analysis, r)) is not None]
    found = _first_below(calls, profile)
    moved = tuple((v.said, at) for v in variations(profile) if (at := _first_below(calls, v.profile)) != found)
    return PredictedCrossover(profile, found, moved)


def with_link_model(analysis: Analysis, rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` plus one `modeled_<link>_us` column per profile: one call without its host work (kvpages.core.links)."""
    out = rows.copy()
    found = records(rows)
    for profile in analysis.profiles:
        out[profile.column] = [
            profile.predicted_us(str(r["variant"]), int(r["page_size"]), 1, float(r["d2h_bytes"]),
                                 float(r["d2h_transfers"]), 0.0, bool(host_side(analysis, str(r["variant"]), r)))
            if pd.notna(r["d2h_bytes"]) and pd.notna(r["d2h_transfers"]) else np.nan for r in found]
    return out
