"""What a run that crossed no link predicts for a GPU box, per link profile (kvpages.core.links; no torch): the host
work each prediction adds is the run's own timed figure (kvpages.core.links.HOST_WORK)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvpages.analysis.ratios import Analysis, ScenarioRatio
from kvpages.core.links import LINK_PROFILES, LinkProfile, prediction_profiles
from kvpages.schema.rows import RatioRow


@dataclass(frozen=True)
class Prediction:
    profile: LinkProfile
    variant_us: float
    baseline_us: float

    @property
    def ratio(self) -> float:
        return self.variant_us / self.baseline_us


def point_predictions(analysis: Analysis, r: RatioRow) -> tuple[Prediction, ...]:
    """`r`'s variant and baseline, one call each, on every prediction profile, each priced by what the meter saw it
    move: its bytes, one blocking copy if any, and `Analysis.host_work` for an undeclared variant's stride."""
    calls = [(r.variant, r.variant_d2h_bytes, r.variant_median_us), (r.baseline, r.baseline_d2h_bytes, r.baseline_median_us)]
    priced = [(name, r.page_size, 1, moved, int(moved > 0), measured, analysis.host_side(name)) for name, moved, measured in calls]
    return tuple(Prediction(profile, *(profile.predicted_us(*call) for call in priced)) for profile in prediction_profiles())


def crossover(analysis: Analysis, rows: list[RatioRow], profile: LinkProfile) -> int | None:
    """The smallest swept seq_len of `rows` (one variant and page size) the model puts below 1 on `profile`, or None."""
    for r in sorted(rows, key=lambda r: r.seq_len):
        if next(p for p in point_predictions(analysis, r) if p.profile == profile).ratio < 1:
            return r.seq_len
    return None


def scenario_predictions(analysis: Analysis, ratio: ScenarioRatio) -> tuple[Prediction, ...]:
    """A whole request's or step's variant and baseline (scenarios.csv rows) on every prediction profile."""
    frame = analysis.run.scenarios
    assert frame is not None
    rows = {str(r["variant"]): r for r in frame[frame["scenario"] == ratio.scenario].to_dict("records")}
    calls = ((rows[name], name, measured) for name, measured in ((ratio.variant, ratio.variant_us),
                                                                  (ratio.baseline, ratio.baseline_us)))
    priced = [(name, int(row["page_size"]), int(row["calls"]), float(row["d2h_bytes"]), float(row["d2h_transfers"]),
               measured, analysis.host_side(name)) for row, name, measured in calls]
    return tuple(Prediction(profile, *(profile.predicted_us(*call) for call in priced)) for profile in prediction_profiles())


def with_link_model(rows: pd.DataFrame, host_work: frozenset[str] = frozenset()) -> pd.DataFrame:
    """`rows` plus one `modeled_<link>_us` column per link profile: one call without its host work (kvpages.core.links)."""
    out = rows.copy()
    for profile in LINK_PROFILES:
        out[profile.column] = [
            profile.predicted_us(str(v), int(p), 1, float(b), float(t), 0.0, v in host_work)
            if pd.notna(b) and pd.notna(t) else np.nan
            for v, p, b, t in zip(rows["variant"], rows["page_size"], rows["d2h_bytes"], rows["d2h_transfers"],
                                  strict=True)
        ]
    return out
