"""What a run that crossed no link predicts for a GPU box, per link profile (kvpages.core.links; no torch), and how far
each prediction moves when the assumed terms do: every ratio carries its range over the profile's variations (each
assumed term at its low and its high, one at a time and all together), every crossover the variations that move it.
The host work each prediction adds is the run's own timed figure (kvpages.core.links.HOST_WORK)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvpages.analysis.ratios import Analysis, ScenarioRatio
from kvpages.core.links import LinkProfile, bounds_text, variations
from kvpages.schema.rows import RatioRow

Call = tuple[str, int, int, float, float, float, bool]
"""LinkProfile.predicted_us's arguments: variant, page size, calls, bytes, transfers, measured µs, host side."""
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


def point_calls(analysis: Analysis, r: RatioRow) -> tuple[Call, Call]:
    """`r`'s variant and baseline, one call each, priced by what the meter saw it move: its bytes, one blocking copy
    if any, and `Analysis.host_work` for an undeclared variant's stride."""
    variant, baseline = ((name, r.page_size, 1, float(moved), float(moved > 0), measured, analysis.host_side(name))
                         for name, moved, measured in ((r.variant, r.variant_d2h_bytes, r.variant_median_us),
                                                       (r.baseline, r.baseline_d2h_bytes, r.baseline_median_us)))
    return variant, baseline


def point_predictions(analysis: Analysis, r: RatioRow) -> tuple[Prediction, ...]:
    calls = point_calls(analysis, r)
    return tuple(predict(profile, calls) for profile in analysis.predicting)


def scenario_predictions(analysis: Analysis, ratio: ScenarioRatio) -> tuple[Prediction, ...]:
    """A whole request's or step's variant and baseline (scenarios.csv rows) on every prediction profile."""
    frame = analysis.run.scenarios
    assert frame is not None
    def by_scenario() -> dict[str, dict[str, dict]]:  # once per run: one frame filter per call cost 8 ms each
        every: dict[str, dict[str, dict]] = {}
        for r in frame.to_dict("records"):
            every.setdefault(str(r["scenario"]), {})[str(r["variant"])] = r
        return every

    rows = analysis.run.cached(("scenario rows",), by_scenario)[ratio.scenario]
    variant, baseline = ((name, int(rows[name]["page_size"]), int(rows[name]["calls"]), float(rows[name]["d2h_bytes"]),
                          float(rows[name]["d2h_transfers"]), measured, analysis.host_side(name))
                         for name, measured in ((ratio.variant, ratio.variant_us), (ratio.baseline, ratio.baseline_us)))
    return tuple(predict(profile, (variant, baseline)) for profile in analysis.predicting)


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

    def hangs_on(self) -> str:
        """'stays for every term within 0.5-2x', or 'L=131072 if sync 2x, all 2x; none if launch 2x'."""
        if not self.moved:
            return f"stays for {bounds_text(self.profile)}"
        places = sorted({seq_len for _, seq_len in self.moved}, key=lambda c: c or float("inf"))  # 'none' last
        return "; ".join(f"{self.at(place)} if {', '.join(s for s, c in self.moved if c == place)}" for place in places)

    @property
    def span(self) -> str:
        """The crossover's range over the variations: 'L=8192-131072', 'L=32768', or with 'none' at an end."""
        found = [self.seq_len] + [c for _, c in self.moved]
        numbers = sorted({c for c in found if c})
        ends = ([self.at(numbers[0])] if numbers else []) + ([self.at(numbers[-1])] if len(numbers) > 1 else [])
        return " to ".join(ends + (["none"] if None in found else []))


def crossover(analysis: Analysis, rows: list[RatioRow], profile: LinkProfile) -> PredictedCrossover:
    """The crossover of `rows` (one variant and page size) on `profile`, and under each of its variations."""
    calls = [(r.seq_len, point_calls(analysis, r)) for r in sorted(rows, key=lambda r: r.seq_len)]
    found = _first_below(calls, profile)
    moved = tuple((v.said, at) for v in variations(profile) if (at := _first_below(calls, v.profile)) != found)
    return PredictedCrossover(profile, found, moved)


def with_link_model(rows: pd.DataFrame, profiles: tuple[LinkProfile, ...], host_work: frozenset[str] = frozenset()
                    ) -> pd.DataFrame:
    """`rows` plus one `modeled_<link>_us` column per profile: one call without its host work (kvpages.core.links)."""
    out = rows.copy()
    for profile in profiles:
        out[profile.column] = [
            profile.predicted_us(str(v), int(p), 1, float(b), float(t), 0.0, v in host_work)
            if pd.notna(b) and pd.notna(t) else np.nan
            for v, p, b, t in zip(rows["variant"], rows["page_size"], rows["d2h_bytes"], rows["d2h_transfers"],
                                  strict=True)
        ]
    return out
