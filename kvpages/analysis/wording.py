"""How a finding says its figure (no torch): a measured ratio with its interval and verdict, a prediction per link
profile with its range, a GPU run's measured figure beside a CPU run's prediction. Each cell of a finding stays within
CELL_CHARS; the detail behind it goes to the appendix."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvpages.analysis.cite import fraction, interval_of, interval_text, percent, sig
from kvpages.analysis.families import ScenarioRatio
from kvpages.analysis.pairs import STABLE
from kvpages.analysis.predict import Prediction
from kvpages.analysis.verdicts import SAME
from kvpages.core.links import LinkProfile
from kvpages.core.stats import Interval
from kvpages.schema.meta import REMEASURE
from kvpages.schema.reader import Run
from kvpages.schema.rows import RatioRow

CELL_CHARS = 300
MEASURED, NEEDS_GPU = "measured here", "needs a GPU run"
GPU_COMMAND = "make gpu-check"  # runs, on a CUDA machine, the quick grid: it reaches L=131072 (bench/gpu_check.sh)
MODEL = f"model: confirm with a GPU run (`{GPU_COMMAND}`)"


@dataclass(frozen=True)
class Finding:
    question: str
    answer: str
    figure: str  # with its interval and coverage, as the row behind it gives it ('-': none)
    id: str  # the ratios.csv or scenarios.csv row id behind the figure ('-': none)
    status: str
    timed: bool = True  # the figure rests on the row's times (False: metered bytes, exact whatever the timing noise)
    predictions: tuple[Prediction, ...] = ()  # what a predicted figure quotes, per profile (APPENDIX.md lists them)


def verdicts_along(sized: Iterable[tuple[int, str]], prefix: str) -> str:
    """'slower at B=1; faster at B=8, 32': each verdict with its sizes, shortest first (`prefix`: 'L=' or 'B=')."""
    sizes: dict[str, list[str]] = {}
    for size, verdict in sorted(sized):
        sizes.setdefault(verdict, []).append(str(size))
    return "; ".join(f"{verdict} at {prefix}{', '.join(each)}" for verdict, each in sizes.items())


def bytes_figure(r: RatioRow) -> str:
    return f"{r.variant_d2h_bytes:,} / {r.baseline_d2h_bytes:,} bytes = {fraction(r.bytes_ratio)} (metered, exact)"


def ratio_interval(r: RatioRow | ScenarioRatio) -> Interval:
    """A per-call or a scenario ratio's interval."""
    return r.interval if isinstance(r, ScenarioRatio) else interval_of(r)


def figure(r: RatioRow | ScenarioRatio) -> str:
    """A ratio with its interval and verdict; 'same' says within what; a centre that leaves processes out names them
    (the interval still covers every process: the Method section)."""
    interval = ratio_interval(r)
    said = f"same (interval within the {percent(r.min_effect)} minimum effect)" if r.verdict == SAME else r.verdict
    apart = f"; centre without {left_out_text(r.left_out)}" if r.left_out else ""
    return f"{interval_text(interval)}: {said}{apart}"


def left_out_text(left_out: str) -> str:
    """ratios.csv's `left_out` ('5 (0.779x)', '4 (0.712x); 5 (0.776x)') in words: 'process 5 (at 0.779x the
    others)', each process so; '' for none."""
    return ", ".join(f"process {p} (at {f} the others)" for p, f in left_out_parts(left_out))


def left_out_parts(left_out: str) -> list[tuple[str, str]]:
    """ratios.csv's `left_out` ('4 (0.712x); 5 (0.776x)') as (process, factor) pairs: [('4', '0.712x'), ...]."""
    return [(p, f.rstrip(")")) for p, _, f in (s.partition(" (") for s in left_out.split("; ") if s)]


def short(r: RatioRow | ScenarioRatio) -> str:
    """'2.31 [1.92, 2.48] slower': a ratio as a sentence quotes it (`verdict_text`)."""
    interval = ratio_interval(r)
    bounds = f" [{sig(interval.ci_low)}, {sig(interval.ci_high)}]" if interval.known else ""
    return f"{sig(interval.ratio)}{bounds} {verdict_text(r.verdict, r.stability)}"


def verdict_text(verdict: str, stability: str) -> str:
    """A row's verdict as a table cell, a quote or a citation prints it: 'slower', and 'slower, *fragile*' where
    another verdict comes without one of its processes ('*disturbed*': more than a minority apart; docs/method.md)."""
    return verdict if stability == STABLE else f"{verdict}, *{stability}*"


def profile_name(profile: LinkProfile, run_id: str = "") -> str:
    """How a prediction names its profile; `run_id`: the run priced, so a profile fitted from it says *in-sample*."""
    own = in_sample(profile, run_id)
    if profile.origin != "built-in":
        return f"{profile.label} ({'fitted' if profile.fitted else 'your'} profile {profile.name}){own}"
    return f"{profile.label}{' (what-if)' if profile.pinned else ''}{own}"


def bounded(p: Prediction) -> str:
    """'1.36 [1.21 if launch 0.5x, 1.58 if all 2x]': a predicted ratio and its range over the profile's variations."""
    if sig(p.low) == sig(p.high):
        return f"{sig(p.ratio)} [at every bound]"
    return f"{sig(p.ratio)} [{sig(p.low)} if {p.low_by}, {sig(p.high)} if {p.high_by}]"


def span(p: Prediction) -> str:
    """'1.48 [1.28-1.89]': a predicted ratio and its range at the terms' bounds."""
    return f"{sig(p.ratio)} [{sig(p.low)}-{sig(p.high)}]"


def in_sample(profile: LinkProfile, run_id: str) -> str:
    """' (in-sample: fitted from this run)' where `profile` was fitted from run `run_id`, else ''."""
    return " (in-sample: fitted from this run)" if run_id and profile.in_sample(run_id) else ""


def predicted_figure(predictions: tuple[Prediction, ...], run_id: str = "") -> str:
    """'model: pcie5_pageable 1.48 [1.28-1.89]; nvlink_c2c 1.27 [1.1-1.6]; ...': each profile's predicted ratio and
    its range at the terms' bounds, by the profile's name (its label, and the variation at each end: the appendix)."""
    def one(p: Prediction) -> str:
        what = p.profile.name + (" (what-if)" if p.profile.pinned else "")
        what += " (in-sample)" if run_id and p.profile.in_sample(run_id) else ""
        return f"{what} {span(p)}"

    return "model: " + "; ".join(one(p) for p in predictions) if predictions else "not priced here"


def predicted_range(predictions: tuple[Prediction, ...], bounds: bool = True) -> str:
    """'1.05-1.52x (0.93-2.1x at the terms' bounds)': over the profiles, then (`bounds`) over their variations too."""
    if not predictions:
        return "not priced"
    over = spread([p.ratio for p in predictions])
    return f"{over} ({spread([p.low for p in predictions] + [p.high for p in predictions])} at the terms' bounds)" \
        if bounds else over


def spread(values: list[float]) -> str:
    """'1.17-2.31x' (or '2.31x' for one), as an answer quotes a range of ratios."""
    low, high = sig(min(values)), sig(max(values))
    return f"{low}x" if low == high else f"{low}-{high}x"


def repetitions_text(run: Run) -> str:
    """'6 interleaved repetition(s) per (variant, point) in 6 process(es), and 1 re-measurement process(es) that added
    repetitions to 37 of 168 per-call rows': the run's plan, then what a re-measurement added (a row's `repetitions`)."""
    ok = run.ok_rows()
    known = ok["repetitions"].dropna()
    if run.meta is None:
        return f"{int(known.max()) if len(known) else 1} interleaved repetition(s) per (variant, point)"
    more = sum(p.role == REMEASURE for p in run.meta.processes)
    said = (f"{run.meta.repetitions} interleaved repetition(s) per (variant, point) in "
            f"{max(len(run.meta.processes) - more, 1)} process(es)")
    if more:
        added = int((known > run.meta.repetitions).sum())
        said += f", and {more} re-measurement process(es) that added repetitions to {added} of {len(ok)} per-call rows"
    return said
