"""The answers a design review of the merged PR asks for, each setting the merged PR against pre-PR, per call and per
step, with its figure, the id of the row behind it and a status (no torch). On a run that crossed no link, a time
finding is the model's prediction per link profile (status MODEL), with the measured figure of a CUDA run of the same
points beside it where there is one (kvpages.analysis.gpu_answer); a CUDA run's findings are measured, one set against
the model. The best alternative is a recommendation (kvpages.analysis.recommend), not a finding."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pandas as pd

from kvpages.analysis.cite import sig, wholly_outside
from kvpages.analysis.families import ScenarioRatio
from kvpages.analysis.gpu_answer import GpuAnswer, on_answer
from kvpages.analysis.hybrid import hybrid_findings
from kvpages.analysis.predict import crossover, fitted_check, model_over_measured, point_predictions, scenario_predictions
from kvpages.analysis.ratios import Analysis, Crossover
from kvpages.analysis.recommend import PINNED, SHORTCUT, staging_row_ids
from kvpages.analysis.verdicts import DISTURBED, FASTER, SAME, SLOWER
from kvpages.analysis.wording import (
    MEASURED,
    MODEL,
    NEEDS_GPU,
    Finding,
    bytes_figure,
    figure,
    predicted_figure,
    predicted_range,
    ratio_interval,
    short,
    spread,
    verdicts_along,
)
from kvpages.core.names import BASELINE, CANDIDATE, STEP_CANDIDATE, called, per_request_name
from kvpages.core.payloads import DEFAULT_PAYLOADS
from kvpages.core.sglang import PREFIX
from kvpages.schema.rows import RatioRow


def _status(analysis: Analysis, gpu: GpuAnswer | None, row_id: str) -> str:
    if analysis.run.link_crossed:
        return MEASURED
    return MODEL if gpu is None or gpu.ratio(row_id) is None else f"model; measured on {gpu.machine} (answer)"


def _gpu(gpu: GpuAnswer | None, row_id: str, *more: tuple[str, str]) -> str:
    return "" if gpu is None else gpu.said(row_id, *more)


def _bytes(analysis: Analysis) -> Finding | None:
    rows = analysis.ratios_of(CANDIDATE)
    if not rows:
        return None
    exact = all(r.variant_d2h_bytes * r.seq_len == -(-r.seq_len // r.page_size) * r.baseline_d2h_bytes for r in rows)
    top = max(rows, key=lambda r: (r.page_size, r.seq_len))
    pages = ", ".join(str(p) for p in sorted({r.page_size for r in rows}))
    answer = (f"The merged PR hands the host one index per page: ceil(L/p) instead of L indices, "
              f"{'exactly, at every' if exact else 'NOT exactly, at some'} swept point (p = {pages}).")
    return Finding("Bytes per call", answer, bytes_figure(top), top.id, MEASURED, timed=False)


def _step_at(analysis: Analysis, variant: str, page_size: int) -> tuple[ScenarioRatio, int] | None:
    """`variant`'s ratio on the largest idle-queue step of `page_size`, and that step's B."""
    frame = analysis.run.scenarios
    if frame is None:
        return None
    steps = frame[(frame["kind"] == "step") & (frame["busy_us"] == 0) & (frame["page_size"] == page_size)
                  & (frame["variant"] == variant) & (frame["payloads"] == DEFAULT_PAYLOADS)].sort_values("requests")
    found = [(r, int(b)) for s, b in zip(steps["scenario"], steps["requests"], strict=True)
             if (r := analysis.scenario_ratio(str(s), variant, "blocked")) is not None]
    return found[-1] if found else None


def _page1(analysis: Analysis, gpu: GpuAnswer | None) -> Finding | None:
    rows = [r for r in analysis.ratios_of(CANDIDATE) if r.page_size == 1]
    if not rows:
        return None
    step = _step_at(analysis, STEP_CANDIDATE, 1)
    if not analysis.run.link_crossed:
        priced = [(r, found) for r in rows if (found := point_predictions(analysis, r))]
        worst = max(priced, key=lambda t: max(p.ratio for p in t[1]))[0] if priced else rows[0]
        on_step = "" if step is None else (f", a B={step[1]} step "
                                           f"{predicted_range(scenario_predictions(analysis, step[0]), False)}")
        answer = (f"One kernel more before the same copy: predicted "
                  f"{predicted_range(tuple(p for _, f in priced for p in f), False)} pre-PR's time per call{on_step} "
                  f"(model).{_gpu(gpu, worst.id, *([] if step is None else [(step[0].id, 'per step')]))}")
        quoted = point_predictions(analysis, worst)
        return Finding("Page size 1: per call and per step", answer, predicted_figure(quoted), worst.id,
                       _status(analysis, gpu, worst.id), predictions=quoted)
    worst = max(rows, key=lambda r: r.ratio)
    slower = [r for r in rows if r.verdict == SLOWER]
    others = Counter(r.verdict for r in rows if r.verdict != SLOWER)  # same, unclear or disturbed: each said
    shortcut = [r for r in analysis.ratios if r.variant == SHORTCUT and r.page_size == 1]
    back = (f"; the shortcut restored: {spread([r.ratio for r in shortcut])}, same at "
            f"{sum(r.verdict == SAME for r in shortcut)} of {len(shortcut)}") if shortcut else ""
    per_step = "" if step is None else f"; a B={step[1]} step, one D2H per request: {short(step[0])}"
    answer = (f"Bytes equal; the merged PR is slower than pre-PR at {len(slower)} of {len(rows)} lengths "
              f"({spread([r.ratio for r in rows])}){''.join(f', {n} {v}' for v, n in sorted(others.items()))}{per_step}{back}.")
    return Finding("Page size 1: per call and per step", answer, figure(worst), worst.id, MEASURED)


NAMED = 2
"""The shorter points a crossover finding names that are not judged slower (the rest counted: CELL_CHARS)."""


def _crossover(analysis: Analysis, gpu: GpuAnswer | None) -> Finding | None:
    rows = [r for r in analysis.ratios_of(CANDIDATE) if r.page_size > 1]
    if not rows:
        return None
    if not analysis.run.link_crossed:
        parts, first = [], None
        for page_size in sorted({r.page_size for r in rows}):
            at = [r for r in rows if r.page_size == page_size]
            predicted = [crossover(analysis, at, p) for p in analysis.predicting if not p.pinned]
            lengths = sorted({c.seq_len for c in predicted if c.seq_len})
            said = "none" if not lengths else f"L={lengths[0]}" + (f"-{lengths[-1]}" if len(lengths) > 1 else "")
            parts.append(f"p={page_size}: {said}" + (" or none" if lengths and None in {c.seq_len for c in predicted}
                                                     else ""))
            if first is None and any(c.seq_len for c in predicted):
                first = min((r for r in at if r.seq_len == min(c.seq_len for c in predicted if c.seq_len)),
                            key=lambda r: r.seq_len)
        cited = first or max(rows, key=lambda r: (r.page_size, r.seq_len))
        measured = [] if gpu is None else [c for c in gpu.analysis.crossovers if c.page_size > 1 and c.seq_len]
        said = _crossings(measured, len({(c.dtype, c.layout) for c in measured}) > 1)
        answer = (f"Predicted first below pre-PR (model, pageable profiles) at {'; '.join(parts)}."
                  f"{f' Measured on {gpu.machine}: {said}.' if gpu and said else ''}")
        quoted = point_predictions(analysis, cited)
        return Finding("Crossover", answer, predicted_figure(quoted), cited.id, _status(analysis, gpu, cited.id),
                       predictions=quoted)
    found = [c for c in analysis.crossovers if c.seq_len is not None and c.page_size > 1]
    if found:
        c = min(found, key=lambda c: (c.seq_len, c.page_size))
        cited_row = analysis.ratio_at(CANDIDATE, c.dtype, c.layout, c.page_size, int(c.seq_len or 0))
        assert cited_row is not None
        kinds = len({(r.dtype, r.layout) for r in rows}) > 1  # then each point names its dtype and layout
        each = _crossings(found, kinds)
        crossing = {(x.dtype, x.layout, x.page_size): x.seq_len or 0 for x in found}
        shorter = [r for r in rows if r.seq_len < crossing.get((r.dtype, r.layout, r.page_size), 0)]
        other = [r for r in shorter if r.verdict != SLOWER]
        said = "no shorter length was swept" if not shorter else "slower at every shorter swept length" if not other else (
            f"slower at {len(shorter) - len(other)} of the {len(shorter)} shorter swept points; {_verdicts_at(other, kinds)}")
        at_one = [x for x in analysis.crossovers if x.page_size == 1]  # SGLang's default: the finding above says it
        one = "" if not at_one else "; p=1 does not" if all(x.seq_len is None for x in at_one) else "; p=1 does too"
        after = [r for r in rows if r.seq_len > crossing.get((r.dtype, r.layout, r.page_size), math.inf)
                 and r.verdict != FASTER]  # "from" holds only where every longer length is faster too
        but = f" (not at every longer length: {_verdicts_at(after, kinds)})" if after else ""
        answer = (f"The merged PR is judged faster than pre-PR from {each}{but}; {said} "
                  f"({len(found)} of {len([x for x in analysis.crossovers if x.page_size > 1])} page sizes above 1 "
                  f"cross{one}).")
        return Finding("Crossover", answer, figure(cited_row), cited_row.id, MEASURED)
    if below := [r for r in rows if r.verdict == DISTURBED and r.ci_high < 1]:  # below 1, but never judged so
        cited = min(below, key=lambda r: (r.seq_len, r.page_size))
        answer = (f"Not judged: the merged PR's interval lies below pre-PR's time at {len(below)} of {len(rows)} "
                  f"swept points (p > 1), the shortest L={cited.seq_len} at p={cited.page_size}, but each is "
                  f"disturbed (more than a minority of its processes apart), so none is judged faster (see Method).")
    else:
        cited = min(rows, key=lambda r: r.ratio)
        answer = (f"No crossover: at no swept point (p > 1) is the merged PR faster than pre-PR beyond the noise "
                  f"floor; closest at L={cited.seq_len}, p={cited.page_size}.")
    return Finding("Crossover", answer, figure(cited), cited.id, MEASURED)


def _verdicts_at(rows: list[RatioRow], kinds: bool) -> str:
    """'unclear at p=16, L=8192, same at p=64, L=2048' (the first NAMED, then how many more are in APPENDIX.md); each
    point names its dtype and layout with `kinds`."""
    named = [f"{r.verdict} at {f'{r.dtype} {r.layout} ' if kinds else ''}p={r.page_size}, L={r.seq_len}"
             for r in rows[:NAMED]]
    return ", ".join(named) + (f" and {len(rows) - NAMED} more (APPENDIX.md)" if len(rows) > NAMED else "")


def _crossings(found: list[Crossover], kinds: bool) -> str:
    """'L=32768 at p=16, 64, 128, each crossing in (8192, 32768]': where each page size (of each dtype and layout, with
    `kinds`) is first judged faster, and where between the swept lengths it crosses 1 (the sweep's grid bounds it):
    one interval said once, several left to the tables; "" for none."""
    if not found:
        return ""
    by: dict[int | None, list[str]] = {}
    for c in sorted(found, key=lambda c: (c.seq_len or 0, c.dtype, c.layout, c.page_size)):
        by.setdefault(c.seq_len, []).append(f"{c.dtype} {c.layout} p={c.page_size}" if kinds else str(c.page_size))
    said = "; ".join(f"L={length} at {'' if kinds else 'p='}{', '.join(names)}" for length, names in by.items())
    brackets = {c.bracket() for c in found}
    each = "each " if len(found) > 1 else ""
    if len(brackets) == 1:
        return f"{said}, {each}crossing {brackets.pop()}"
    return f"{said}, each crossing 1 where APPENDIX.md's crossover table places it"


def _moved(row, base: bool = False) -> str:
    """A scenario row's D2H per request or step, and its host syncs where the meter counted them."""
    moved = f"{row['d2h_bytes']:,} {'in' if base else 'bytes in'} {row['d2h_transfers']}"
    return moved if pd.isna(row["host_syncs"]) else f"{moved} D2H, {row['host_syncs']} sync(s)"


def _scenario(analysis: Analysis, gpu: GpuAnswer | None, question: str, kind: str, variant: str,
              side: str | None) -> Finding | None:
    base = analysis.run.scenarios
    if base is None:
        return None
    rows = base[(base["kind"] == kind) & (base["busy_us"] == 0) & (base["variant"] == variant)
                & (base["status"] == "ok") & (base["payloads"] == DEFAULT_PAYLOADS)]  # several: kvpages.analysis.hybrid
    if side is not None:
        rows = rows[rows["side"] == side]
    size_column = "tokens" if kind == "request" else "requests"
    found = [(int(row["page_size"]), int(row[size_column]), row, ratio) for _, row in rows.iterrows()
             if (ratio := analysis.scenario_ratio(str(row["scenario"]), variant, "blocked")) is not None]
    if not found:
        return None
    page_size, size, row, ratio = sorted(found, key=lambda t: (t[0], t[1]))[-1]  # the largest page size, then size
    base_row = base[(base["scenario"] == row["scenario"]) & (base["variant"] == analysis.scenario_baseline)].iloc[0]
    prefix = "L=" if kind == "request" else "B="
    what = f"{prefix}{size}"
    moved = f"{what}, p={page_size}: {_moved(row)} against {_moved(base_row, base=True)}"
    named = called(analysis.scenario_baseline)
    if not analysis.run.link_crossed:
        predictions = scenario_predictions(analysis, ratio)
        answer = f"{moved}; predicted {predicted_range(predictions, False)} {named}'s time (model).{_gpu(gpu, ratio.id)}"
        return Finding(question, answer, predicted_figure(predictions), ratio.id, _status(analysis, gpu, ratio.id),
                       predictions=predictions)
    answer = (f"{moved}; {sig(ratio.variant_us)} µs against {named}'s {sig(ratio.baseline_us)} µs."
              f"{_along(found, page_size, prefix)}")
    return Finding(question, answer, figure(ratio), ratio.id, MEASURED)


def _along(found: list[tuple[int, int, pd.Series, ScenarioRatio]], page_size: int, prefix: str) -> str:
    """' At p=64: slower at L=2048, 8192; faster at L=32768, 131072.': the verdict at each swept size of the page size
    the finding cites, so that its one point (the largest) is not read as every size's ('' where all agree)."""
    sized = [(size, ratio.verdict) for p, size, _, ratio in found if p == page_size]
    return f" At p={page_size}: {verdicts_along(sized, prefix)}." if len({v for _, v in sized}) > 1 else ""


def _blocked(analysis: Analysis, gpu: GpuAnswer | None) -> Finding:
    """The merged PR behind a busy device queue: how long it blocks the scheduler thread against pre-PR."""
    frame = analysis.run.scenarios
    assert frame is not None  # `findings` asks only a run with scenarios
    busy = frame[(frame["busy_us"] > 0) & (frame["payloads"] == DEFAULT_PAYLOADS)]  # several: kvpages.analysis.hybrid
    ok = busy[busy["status"] == "ok"]
    question = "Scheduler thread blocked (busy queue)"
    candidate = busy[busy["variant"] == STEP_CANDIDATE]
    cited = "-" if candidate.empty else str(candidate["id"].iloc[0])
    if not analysis.run.link_crossed or ok.empty:
        return Finding(question, "Not measurable here: without a device queue the scheduler thread is blocked exactly "
                       f"as long as the data takes to be ready; the busy-queue scenario needs CUDA.{_gpu(gpu, cited)}",
                       "-", cited, NEEDS_GPU if gpu is None or gpu.ratio(cited) is None else
                       f"needs a GPU run; measured on {gpu.machine} (answer)")
    ratio = next((r for r in analysis.scenario_ratios if r.latency == "blocked" and r.variant == STEP_CANDIDATE
                  and r.scenario in set(ok["scenario"])), None)
    if ratio is None:  # the ratio needs pre-PR's row of the same scenario, which did not come out ok
        base = busy[busy["variant"] == analysis.scenario_baseline]
        why = "; ".join(sorted({f"{s}" + (f" ({n})" if n else "") for s, n in zip(base["status"], base["note"], strict=True)
                                if s != "ok"})) or "no row"
        return Finding(question, f"No ratio: `{analysis.scenario_baseline}` or the merged PR is missing behind the "
                       f"busy queue ({why}).", "-", "-", "baseline missing")
    answer = (f"Behind a busy device queue the merged PR blocks the scheduler thread {sig(ratio.variant_us)} µs a step "
              f"against pre-PR's {sig(ratio.baseline_us)} µs (the busy queue's own wait included in both).")
    return Finding(question, answer, figure(ratio), ratio.id, MEASURED)


def _pinned(analysis: Analysis, gpu: GpuAnswer | None) -> Finding | None:
    """SGLang 0.5.23's per-request pinned copy against pre-PR, per call, at the shortest and longest length."""
    source = analysis if analysis.run.link_crossed else (gpu.analysis if gpu else None)
    pinned = () if source is None else source.ratios_of(PINNED)
    if source is None or not pinned:
        return None
    rows = [r for r in pinned if r.page_size == max(x.page_size for x in pinned)]
    short_at, long_at = min(rows, key=lambda r: r.seq_len), max(rows, key=lambda r: r.seq_len)
    where = "" if source is analysis else f" (measured on {source.run.device_name}, run {source.run.run_id})"
    answer = (f"SGLang 0.5.23's non-blocking copy into pinned memory, waited on an event, against pre-PR at "
              f"p={short_at.page_size}: {short(short_at)} at L={short_at.seq_len}, {short(long_at)} at "
              f"L={long_at.seq_len}{where}.")
    status = MEASURED if source is analysis else f"needs a GPU run; measured on {source.run.device_name}"
    return Finding("SGLang 0.5.23's pinned copy", answer, figure(short_at), short_at.id, status)


def _model_check(analysis: Analysis) -> Finding | None:
    """The model's merged PR time per call against the measured one, at every point whose link has a profile, and
    the fitted profile's merged PR / pre-PR at page size 1 against the measured ratio."""
    pairs = [(found[0], r, found[1]) for r in analysis.ratios_of(CANDIDATE) if (found := model_over_measured(analysis, r))]
    if not pairs:
        return None
    low, high = min(p[0] for p in pairs), max(p[0] for p in pairs)
    ratio, cited, profile = max(pairs, key=lambda p: (p[1].page_size, p[1].seq_len))
    check = fitted_check(analysis, CANDIDATE)
    off = ""
    if check is not None:
        own = ", in-sample: it was fitted from this run" if check.profile.in_sample(analysis.run.run_id) else ""
        off = (f"; {check.profile.name}'s merged PR / pre-PR at p=1 within {check.within} of the measured at "
               f"every length{own}")
    answer = (f"{profile.label} model / measured time of the merged PR per call: {sig(low)}-{sig(high)} over "
              f"{len(pairs)} points{off} (APPENDIX.md).")
    return Finding("Model vs measurement", answer, f"model / measured {sig(ratio)}", cited.id, MEASURED)


def _faster(analysis: Analysis, variant: str) -> Finding | None:
    """Is `variant` faster than the baseline: measured on a run that crossed a link, else the model's prediction."""
    rows = analysis.ratios_of(variant)
    if not rows:
        return None
    base, largest = called(analysis.baseline), max(rows, key=lambda r: (r.page_size, r.seq_len))
    question = f"{variant} vs {analysis.baseline}"
    low, high = (f(r.bytes_ratio for r in rows) for f in (min, max))
    moved = f"bytes {sig(low) if sig(low) == sig(high) else f'{sig(low)}-{sig(high)}'}x {base}'s (metered)"
    if not analysis.run.link_crossed:
        every = tuple(p for r in rows for p in point_predictions(analysis, r))
        blind = ("; priced at one device op per call (sglang@), blind to a path it skips: measured in APPENDIX.md"
                 if variant.startswith(PREFIX) else "")
        answer = (f"Predicted (model) at {predicted_range(every)} {base}'s time per call, below it at "
                  f"{sum(p.ratio < 1 for p in every)} of {len(every)} (point, profile) pairs; {moved}{blind}.")
        quoted = point_predictions(analysis, largest)
        return Finding(question, answer, predicted_figure(quoted), largest.id, MODEL, predictions=quoted)
    count = {v: sum(r.verdict == v for r in rows) for v in (FASTER, SLOWER)}
    cited = min(rows, key=lambda r: r.ratio) if count[FASTER] else largest
    answer = (f"Faster than {base} at {count[FASTER]} of {len(rows)} swept points, slower at {count[SLOWER]}, the same "
              f"or unclear at the rest; {moved}.")
    return Finding(question, answer, figure(cited), cited.id, MEASURED)


def findings(analysis: Analysis, gpu: GpuAnswer | None = None) -> tuple[Finding, ...]:
    """The report's findings, in the order a review asks: the merged PR against pre-PR, else each subject; `gpu`: a
    CPU run's GPU answer (kvpages.analysis.gpu_answer). Made once per run, baseline and GPU answer kept in the cache (the
    report and its appendix both cite them; an answer not kept has no key to memoise them under)."""
    return on_answer(analysis.run, ("findings", analysis.baseline), gpu, lambda: _findings(analysis, gpu))


def _findings(analysis: Analysis, gpu: GpuAnswer | None) -> tuple[Finding, ...]:
    if analysis.baseline == BASELINE:
        made = [_bytes(analysis), _page1(analysis, gpu), _crossover(analysis, gpu),
                _scenario(analysis, gpu, "Per request: prefill chunks", "request", STEP_CANDIDATE, "prefill"),
                _scenario(analysis, gpu, "Per request: decode", "request", STEP_CANDIDATE, "decode"),
                _scenario(analysis, gpu, "Per step, one D2H per request", "step", STEP_CANDIDATE, None),
                *hybrid_findings(analysis, staging_row_ids(analysis))]
    else:  # against another baseline: SGLang's own functions, then the merged PR and pre-PR
        timed = {r.variant for r in analysis.ratios}
        subjects = sorted(v for v in timed if v.startswith(PREFIX)) + [v for v in (CANDIDATE, BASELINE) if v in timed]
        made = [f for v in subjects for f in (
            _faster(analysis, v), _scenario(analysis, gpu, f"Per step: {v}", "step", per_request_name(v), None))]
    if analysis.run.scenarios is not None:
        made.append(_blocked(analysis, gpu))
    if analysis.baseline == BASELINE:
        made.append(_pinned(analysis, gpu))
    if analysis.run.link_crossed:
        made.append(_model_check(analysis))
    return tuple(_against_answer(f, gpu) for f in made if f is not None)


def _against_answer(f: Finding, gpu: GpuAnswer | None) -> Finding:
    """`f`, its status naming each fitted profile whose predicted range (at the terms' bounds) the GPU run's measured
    interval at its row lies wholly outside: a profile fitted from that run that misses it says the model does not
    carry over there (most likely its host work, this CPU's; docs/method.md, "The link model")."""
    if gpu is None or (measured := gpu.ratio(f.id)) is None:
        return f
    found, run_id = ratio_interval(measured), gpu.run_id
    missed = [p.profile.name + (" (fitted from that run)" if p.profile.in_sample(run_id) else "")
              for p in f.predictions if p.profile.fitted and wholly_outside(found.ci_low, found.ci_high, p.low, p.high)]
    return dataclasses.replace(f, status=f"{f.status}; {OUTSIDE} {' and '.join(missed)}") if missed else f


OUTSIDE = "outside the range of"
"""How a CPU run's finding's status says that the GPU run's measured figure misses a fitted profile's range."""

