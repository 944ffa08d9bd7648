"""One finding of a report, its statuses, and how it says a prediction of the link model (no torch): what
kvpages.analysis.findings makes the report's findings of, and kvpages.analysis.hybrid those on a hybrid model's sends."""

from __future__ import annotations

from dataclasses import dataclass

from kvpages.analysis.cite import sig
from kvpages.analysis.predict import Prediction
from kvpages.core.links import LinkProfile

MEASURED, NEEDS_GPU = "measured here", "needs a GPU run"
GPU_COMMAND = "make gpu-check"  # measures on a CUDA machine what a CPU run's model predicts (bench/gpu_check.sh)
MODEL = f"model: confirm with a GPU run (`{GPU_COMMAND}`)"


@dataclass(frozen=True)
class Finding:
    question: str
    answer: str
    figure: str  # with its interval and coverage, as the row behind it gives it ('-': none)
    id: str  # the ratios.csv or scenarios.csv row id behind the figure ('-': none)
    status: str
    timed: bool = True  # the figure rests on the row's times (False: metered bytes, exact whatever the timing noise)


def profile_name(profile: LinkProfile) -> str:
    if profile.origin != "built-in":
        return f"{profile.label} ({'fitted' if profile.fitted else 'your'} profile {profile.name})"
    return f"{profile.label}{' (what-if)' if profile.pinned else ''}"


def bounded(p: Prediction) -> str:
    """'1.36 [1.21 if launch 0.5x, 1.58 if all 2x]': a predicted ratio and its range over the profile's variations."""
    if sig(p.low) == sig(p.high):
        return f"{sig(p.ratio)} [at every bound]"
    return f"{sig(p.ratio)} [{sig(p.low)} if {p.low_by}, {sig(p.high)} if {p.high_by}]"


def predicted_range(predictions: tuple[Prediction, ...]) -> str:
    """'1.05-1.52x (0.93-2.1x at the terms' bounds)': over the profiles, then over their variations too."""
    def span(low: float, high: float) -> str:
        return f"{sig(low)}x" if sig(low) == sig(high) else f"{sig(low)}-{sig(high)}x"
    return (f"{span(min(p.ratio for p in predictions), max(p.ratio for p in predictions))} "
            f"({span(min(p.low for p in predictions), max(p.high for p in predictions))} at the terms' bounds)")
