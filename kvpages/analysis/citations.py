"""`kvpages cite RUN ID`: one row of a run in one line, with its figure, interval and coverage, machine, commit and
the command that re-runs it (no torch); a row of ratios.csv, scenario_ratios.csv or recommendations.csv."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable

from kvpages.analysis.cite import CiteError, commit_text, interval_of, interval_text, sig
from kvpages.analysis.gpu_answer import GpuAnswer, gpu_answer
from kvpages.analysis.predict import Prediction, model_over_measured, point_predictions, scenario_predictions
from kvpages.analysis.ratios import Analysis
from kvpages.analysis.recommend import recommendation_predictions, recommendation_repro, recommendations
from kvpages.analysis.wording import bytes_figure, predicted_figure, verdict_text
from kvpages.core.names import CANDIDATE, label


def all_ids(analysis: Analysis) -> list[str]:
    return ([r.id for r in analysis.ratios] + [r.id for r in analysis.scenario_ratios if r.latency == "blocked"]
            + [r.id for r in recommendations(analysis)])


def _machine(analysis: Analysis) -> str:
    run = analysis.run
    where = run.meta.environment.device_name if run.meta else run.device_name
    if not run.link_crossed:
        return f"{where}, CPU run: no link crossed"
    link = run.meta.environment.pcie_link if run.meta else None
    return f"{where}, PCIe {link or 'unknown'}"


def _modelled(analysis: Analysis, predictions: Callable[[], tuple[Prediction, ...]]) -> str:
    """On a run that crossed no link, what its report quotes beside the row's id: the same ratio predicted per link
    profile ('; on a GPU box, model: pcie5_pageable 1.63 [1.37-2.08]; ...'); nothing on a run that crossed one."""
    if analysis.run.link_crossed:
        return ""
    return f"; on a GPU box, {predicted_figure(predictions(), analysis.run.run_id)}"


def _quoted_gpu_run(analysis: Analysis) -> GpuAnswer | None:
    """The CUDA run a CPU run's report quotes by its rows' ids, for a hint; None where there is none or it cannot be
    read (the hint must not turn a mistyped id into another folder's error)."""
    try:
        return gpu_answer(analysis)
    except (OSError, ValueError, EOFError):  # a RunError is a ValueError
        return None


def cite(analysis: Analysis, row_id: str) -> str:
    """The one-line citation of a row id (module doc); CiteError names how to list the valid ones."""
    meta = analysis.run.meta
    where = f"{_machine(analysis)}; commit {(commit_text(meta.environment) if meta else None) or 'unknown'}"
    for r in analysis.ratios:
        if r.id == row_id:
            what = (f"{label(r.variant)} / {label(r.baseline)}, L={r.seq_len} p={r.page_size} {r.dtype} {r.layout}: "
                    f"{bytes_figure(r)}; latency = {interval_text(interval_of(r))}")
            model = _modelled(analysis, functools.partial(point_predictions, analysis, r))
            checked = model_over_measured(analysis, r) if analysis.run.link_crossed and r.variant == CANDIDATE else None
            if checked is not None:  # what the report's "Model vs measurement" quotes of this row
                model += f"; {checked[1].name} model / measured time of the merged PR per call {sig(checked[0])}"
            return f"{r.id}: {what} ({verdict_text(r.verdict, r.stability)}){model}; {where}; repro: {r.repro}"
    for s in analysis.scenario_ratios:
        if s.id == row_id and s.latency == "blocked":
            what = f"{s.scenario}: {label(s.variant)} / {label(s.baseline)}, blocked = {interval_text(s.interval)}"
            model = _modelled(analysis, functools.partial(scenario_predictions, analysis, s))
            ready = analysis.scenario_ratio(s.scenario, s.variant, "ready")  # another figure where a queue was behind it
            also = "" if ready is None or (ready.interval, ready.verdict) == (s.interval, s.verdict) else (
                f"; ready = {interval_text(ready.interval)} ({verdict_text(ready.verdict, ready.stability)})")
            return f"{s.id}: {what} ({verdict_text(s.verdict, s.stability)}){also}{model}; {where}; repro: {s.repro}"
    for rec in recommendations(analysis):
        if rec.id == row_id:
            done = "recommended" if rec.recommended else "not recommended"
            model = _modelled(analysis, functools.partial(recommendation_predictions, analysis, rec.id))
            repro = recommendation_repro(analysis, rec.id)
            return (f"{rec.id}: {rec.action}: {label(rec.candidate)} / {label(rec.against)} {rec.where} = "
                    f"{rec.gain}, {rec.basis} ({rec.verdict}): {done}{model}; "
                    f"rows {rec.cites}{f'; another size of {rec.of}' if rec.of else ''}; {where}"
                    f"{f'; repro: {repro}' if repro else ''}")
    ids = all_ids(analysis)
    gpu = _quoted_gpu_run(analysis)
    if gpu is not None and row_id in all_ids(gpu.analysis):
        raise CiteError(f"{row_id!r} is not a row of run {analysis.run.run_id}; it is a row of {gpu.run_id}, the GPU run "
                        f"its report quotes: `kvpages cite {gpu.analysis.run.path} {row_id}`")
    close = difflib.get_close_matches(row_id, ids, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise CiteError(f"{row_id!r} is not a row id of run {analysis.run.run_id}; {hint}"
                    f"`kvpages cite {analysis.run.path} --list` lists its {len(ids)} ids")
