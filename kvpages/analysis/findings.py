"""The answers a design review asks for, each with its figure, the id of the row behind it, and a status (no torch).
On a run that crossed no link, a time finding is the model's prediction per link profile, status `MODEL`: measured
host-side ratios are evidence, never a finding; a CUDA run's findings are measured, one against the model."""

from __future__ import annotations

import difflib

import pandas as pd

from kvpages.analysis.cite import CiteError, commit_text, fraction, interval_of, interval_text, sig
from kvpages.analysis.finding import MEASURED, MODEL, NEEDS_GPU, Finding, bounded, predicted_range, profile_name
from kvpages.analysis.hybrid import hybrid_findings
from kvpages.analysis.predict import Prediction, crossover, point_predictions, scenario_predictions
from kvpages.analysis.ratios import Analysis, ScenarioRatio
from kvpages.analysis.verdicts import FASTER, SAME, SLOWER
from kvpages.core.links import device_ops, profile_for
from kvpages.core.names import BASELINE, CANDIDATE, STEP_CANDIDATE, called, label, per_request_name
from kvpages.core.payloads import DEFAULT_PAYLOADS
from kvpages.core.sglang import PREFIX
from kvpages.schema.rows import RatioRow

BATCHED = "batched_device_stride"


def bytes_figure(r: RatioRow) -> str:
    return f"{r.variant_d2h_bytes:,} / {r.baseline_d2h_bytes:,} bytes = {fraction(r.bytes_ratio)} (metered, exact)"


def figure(r: RatioRow | ScenarioRatio) -> str:
    """A ratio with its interval and verdict; 'same' says within what."""
    interval = r.interval if isinstance(r, ScenarioRatio) else interval_of(r)
    said = f"same (within the {sig(100 * r.min_effect)}% minimum effect)" if r.verdict == SAME else r.verdict
    return f"{interval_text(interval)}: {said}"


def predicted_figure(predictions: tuple[Prediction, ...], baseline: str = BASELINE) -> str:
    """'PCIe Gen5 x16, pageable 1.05 [0.98 if ..., 1.2 if ...]; ... (model: predicted time / pre-PR's; ...)'."""
    parts = "; ".join(f"{profile_name(p.profile)} {bounded(p)}" for p in predictions)
    return f"{parts} (model: predicted time / {called(baseline)}'s [its range at the terms' bounds])"


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


def _page1(analysis: Analysis) -> Finding | None:
    rows = [r for r in analysis.ratios_of(CANDIDATE) if r.page_size == 1]
    if not rows:
        return None
    if not analysis.run.link_crossed:
        worst = max(rows, key=lambda r: max(p.ratio for p in point_predictions(analysis, r)))
        every = [p for r in rows for p in point_predictions(analysis, r)]
        answer = (f"At page size 1 the bytes are equal, and the merged PR launches one device op before the same copy: "
                  f"predicted at {predicted_range(tuple(every))} pre-PR's time (model) over the {len(rows)} swept "
                  f"lengths and {len(every) // len(rows)} link profiles; the page_size == 1 shortcut launches none, "
                  f"so the model prices it as pre-PR's copy.")
        return Finding("Page size 1 regression", answer, predicted_figure(point_predictions(analysis, worst)), worst.id, MODEL)
    worst = max(rows, key=lambda r: r.ratio)
    slower = sum(r.verdict == "slower" for r in rows)
    shortcut = [r for r in analysis.ratios if r.variant == "device_stride_shortcut" and r.page_size == 1]
    back = (f"; with the page_size == 1 shortcut restored it is the same at {sum(r.verdict == 'same' for r in shortcut)}"
            f" of {len(shortcut)}") if shortcut else ""
    unstable = sum(r.unstable for r in rows)
    held = f" ({unstable} of {len(rows)} lengths still unstable after re-measurement, so not judged)" if unstable else ""
    answer = (f"At page size 1 the bytes are equal, and the merged PR is slower than pre-PR at {slower} of {len(rows)} "
              f"lengths{held}, up to {sig(worst.ratio)}x at L={worst.seq_len}{back}.")
    return Finding("Page size 1 regression", answer, figure(worst), worst.id, MEASURED)


def _predicted_crossover(analysis: Analysis, rows: list[RatioRow]) -> Finding:
    parts, first = [], None
    for page_size in sorted({r.page_size for r in rows}):
        at = [r for r in rows if r.page_size == page_size]
        found = [crossover(analysis, at, p) for p in analysis.predicting]
        parts.append(f"p={page_size}: " + ", ".join(f"{profile_name(c.profile)} {c.at(c.seq_len)} ({c.hangs_on()})"
                                                      for c in found))
        if first is None and any(c.seq_len for c in found):
            first = min((r for r in at if r.seq_len == min(c.seq_len for c in found if c.seq_len)), key=lambda r: r.seq_len)
    cited = first or max(rows, key=lambda r: (r.page_size, r.seq_len))
    answer = ("Predicted crossover (model: the smallest swept L at which the merged PR's predicted time is below "
              f"pre-PR's), per page size and link profile, with the terms it hangs on: {'; '.join(parts)}.")
    return Finding("Crossover", answer, predicted_figure(point_predictions(analysis, cited)), cited.id, MODEL)


def _crossover(analysis: Analysis) -> Finding | None:
    rows = [r for r in analysis.ratios_of(CANDIDATE) if r.page_size > 1]
    if not rows:
        return None
    if not analysis.run.link_crossed:
        return _predicted_crossover(analysis, rows)
    found = [c for c in analysis.crossovers if c.seq_len is not None and c.page_size > 1]
    if found:
        c = min(found, key=lambda c: (c.seq_len, c.page_size))
        cited = analysis.ratio_at(CANDIDATE, c.dtype, c.layout, c.page_size, int(c.seq_len or 0))
        assert cited is not None
        answer = (f"The merged PR is faster than pre-PR from L={c.seq_len} at page size {c.page_size}"
                  f" ({len(found)} of {len(analysis.crossovers)} page sizes cross within the sweep).")
    elif below := [r for r in rows if r.unstable and r.ci_high < 1]:  # faster by its interval, but never judged so
        cited = min(below, key=lambda r: (r.seq_len, r.page_size))
        answer = (f"Not judged: the merged PR's interval lies below pre-PR's time at {len(below)} of {len(rows)} "
                  f"swept points (p > 1), the shortest L={cited.seq_len} at p={cited.page_size}, but each is still "
                  f"unstable after re-measurement, so none is judged faster (see Method).")
    else:
        cited = min(rows, key=lambda r: r.ratio)
        answer = (f"No crossover: at no swept point (p > 1) is the merged PR faster than pre-PR beyond the noise "
                  f"floor; closest at L={cited.seq_len}, p={cited.page_size}.")
    return Finding("Crossover", answer, figure(cited), cited.id, MEASURED)


def _moved(row, base: bool = False) -> str:
    """A scenario row's D2H per request or step, and its host syncs where the meter counted them."""
    moved = f"{row['d2h_bytes']:,} {'in' if base else 'bytes in'} {row['d2h_transfers']}"
    if pd.isna(row["host_syncs"]):
        return moved if base else f"{moved} D2H"
    return f"{moved} D2H and {row['host_syncs']} host sync(s)"


def _scenario(analysis: Analysis, question: str, kind: str, variant: str, side: str | None) -> Finding | None:
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
    what = f"L={size}" if kind == "request" else f"B={size} requests"
    moved = f"{what} at page size {page_size}, payloads {row['payloads']}: {_moved(row)} against {_moved(base_row, base=True)}"
    named = called(analysis.scenario_baseline)
    if not analysis.run.link_crossed:
        predictions = scenario_predictions(analysis, ratio)
        ops = device_ops(variant, page_size, int(row["calls"]), analysis.host_side(variant))
        syncs = row["d2h_transfers"] if pd.isna(row["host_syncs"]) else row["host_syncs"]
        answer = (f"{moved}, {ops} device op(s) and {syncs} sync(s); predicted per {kind} at "
                  f"{predicted_range(predictions)} {named}'s time (model).")
        return Finding(question, answer, predicted_figure(predictions, ratio.baseline), ratio.id, MODEL)
    answer = f"{moved}; per {kind} {sig(ratio.variant_us)} µs against {named}'s {sig(ratio.baseline_us)} µs."
    return Finding(question, answer, figure(ratio), ratio.id, MEASURED)


def _blocked(analysis: Analysis) -> Finding:
    frame = analysis.run.scenarios
    assert frame is not None  # `findings` asks only a run with scenarios
    busy = frame[frame["busy_us"] > 0]
    ok = busy[busy["status"] == "ok"]
    if not analysis.run.link_crossed or ok.empty:
        candidate = busy[busy["variant"] == STEP_CANDIDATE]
        cited = "-" if candidate.empty else str(candidate["id"].iloc[0])
        return Finding("Scheduler thread blocked", "Not measurable here: without a device queue the scheduler thread is "
                       "blocked exactly as long as the data takes to be ready; the busy-queue scenario needs CUDA.",
                       "-", cited, NEEDS_GPU)
    ratios = [r for r in analysis.scenario_ratios if r.latency == "blocked" and r.scenario in set(ok["scenario"])]
    if not ratios:  # every busy-queue ratio needs pre-PR's row of the same scenario, which did not come out ok
        base = busy[busy["variant"] == analysis.scenario_baseline]
        why = "; ".join(sorted({f"{s}" + (f" ({n})" if n else "") for s, n in zip(base["status"], base["note"], strict=True)
                                if s != "ok"})) or "no row"
        return Finding("Scheduler thread blocked", f"No ratio: the baseline `{analysis.scenario_baseline}` is "
                       f"missing behind the busy queue ({why}), so no variant can be set against it.",
                       "-", "-", "baseline missing")
    best = min(ratios, key=lambda r: r.interval.ratio)
    answer = (f"Behind a busy device queue, {label(best.variant)} blocks the scheduler thread "
              f"{sig(best.interval.ratio)}x as long as {called(best.baseline)}.")
    return Finding("Scheduler thread blocked", answer, figure(best), best.id, MEASURED)


def _model_check(analysis: Analysis) -> Finding | None:
    """The model's merged PR time per call against the measured one, at every point whose link has a profile."""
    pcie = analysis.run.meta.environment.pcie_link if analysis.run.meta else None
    rows = analysis.run.ok_rows()
    pairs = []
    for r in analysis.ratios_of(CANDIDATE):
        link = rows[(rows["variant"] == CANDIDATE) & (rows["seq_len"] == r.seq_len) & (rows["page_size"] == r.page_size)]
        profile = profile_for(pcie, str(link["link"].iloc[0]), analysis.profiles) if not link.empty else None
        if profile is not None:
            modeled = profile.predicted_us(CANDIDATE, r.page_size, 1, r.variant_d2h_bytes,
                                           int(link["d2h_transfers"].iloc[0]), r.variant_median_us)
            pairs.append((modeled / r.variant_median_us, r, profile))
    if not pairs:
        return None
    low, high = min(p[0] for p in pairs), max(p[0] for p in pairs)
    ratio, cited, profile = max(pairs, key=lambda p: (p[1].page_size, p[1].seq_len))
    answer = (f"The link model ({profile.label}) against the merged PR's measured time per call at the same "
              f"{len(pairs)} points: model / measured {sig(low)}-{sig(high)}; at L={cited.seq_len}, p={cited.page_size} "
              f"{sig(ratio * cited.variant_median_us)} µs modelled against {sig(cited.variant_median_us)} µs measured.")
    return Finding("Model vs measurement", answer, f"model / measured {sig(ratio)}", cited.id, MEASURED)


def _faster(analysis: Analysis, variant: str) -> Finding | None:
    """Is `variant` faster than the baseline: measured on a run that crossed a link, else the model's prediction."""
    rows = analysis.ratios_of(variant)
    if not rows:
        return None
    base, largest = called(analysis.baseline), max(rows, key=lambda r: (r.page_size, r.seq_len))
    question = f"{variant} vs {analysis.baseline}"
    low, high = (fraction(f(r.bytes_ratio for r in rows)) for f in (min, max))
    moved = f"it hands the host {low if low == high else f'{low}-{high}'}x {base}'s bytes (metered)"
    if not analysis.run.link_crossed:
        every = [p for r in rows for p in point_predictions(analysis, r)]
        answer = (f"Is {variant} faster than the baseline {base}? Predicted (model) at {predicted_range(tuple(every))} "
                  f"{base}'s time per call, below it at {sum(p.ratio < 1 for p in every)} of {len(every)} (point, link "
                  f"profile) pairs over {len(rows)} swept points; {moved}.")
        return Finding(question, answer, predicted_figure(point_predictions(analysis, largest), analysis.baseline),
                       largest.id, MODEL)
    count = {v: sum(r.verdict == v for r in rows) for v in (FASTER, SLOWER)}
    cited = min(rows, key=lambda r: r.ratio) if count[FASTER] else largest
    answer = (f"Is {variant} faster than the baseline {base}? Faster at {count[FASTER]} of {len(rows)} swept points, "
              f"slower at {count[SLOWER]}, the same or unclear at the rest; {moved}.")
    return Finding(question, answer, figure(cited), cited.id, MEASURED)


def findings(analysis: Analysis) -> tuple[Finding, ...]:
    """The report's findings, in the order a review asks: the merged PR against pre-PR, else each subject."""
    if analysis.baseline == BASELINE:
        made = [_bytes(analysis), _page1(analysis), _crossover(analysis),
                _scenario(analysis, "Per request: prefill chunks", "request", STEP_CANDIDATE, "prefill"),
                _scenario(analysis, "Per request: decode", "request", STEP_CANDIDATE, "decode"),
                _scenario(analysis, "Per step, one D2H per request", "step", STEP_CANDIDATE, None),
                _scenario(analysis, "Per step, batched (one D2H)", "step", BATCHED, None), *hybrid_findings(analysis)]
    else:  # against another baseline: SGLang's own functions, then the merged PR and pre-PR
        timed = {r.variant for r in analysis.ratios}
        subjects = sorted(v for v in timed if v.startswith(PREFIX)) + [v for v in (CANDIDATE, BASELINE) if v in timed]
        made = [f for v in subjects for f in (
            _faster(analysis, v), _scenario(analysis, f"Per step: {v}", "step", per_request_name(v), None))]
    if analysis.run.scenarios is not None:
        made.append(_blocked(analysis))
    if analysis.run.link_crossed:
        made.append(_model_check(analysis))
    return tuple(f for f in made if f is not None)


def all_ids(analysis: Analysis) -> list[str]:
    return [r.id for r in analysis.ratios] + [r.id for r in analysis.scenario_ratios if r.latency == "blocked"]


def _machine(analysis: Analysis) -> str:
    run = analysis.run
    where = run.meta.environment.device_name if run.meta else run.device_name
    if not run.link_crossed:
        return f"{where}, CPU run: no link crossed"
    link = run.meta.environment.pcie_link if run.meta else None
    return f"{where}, PCIe {link or 'unknown'}"


def cite(analysis: Analysis, row_id: str) -> str:
    """The one-line citation of a ratios.csv or scenarios.csv row id: its figure, interval and coverage, machine, commit
    and command; CiteError names how to list the valid ones."""
    meta = analysis.run.meta
    where = f"{_machine(analysis)}; commit {(commit_text(meta.environment) if meta else None) or 'unknown'}"
    for r in analysis.ratios:
        if r.id == row_id:
            what = (f"{label(r.variant)} / {label(r.baseline)}, L={r.seq_len} p={r.page_size} {r.dtype} {r.layout}: "
                    f"{bytes_figure(r)}; latency = {interval_text(interval_of(r))}")
            return f"{r.id}: {what} ({r.verdict}); {where}; repro: {r.repro}"
    for s in analysis.scenario_ratios:
        if s.id == row_id and s.latency == "blocked":
            what = f"{s.scenario}: {label(s.variant)} / {label(s.baseline)}, blocked = {interval_text(s.interval)}"
            return f"{s.id}: {what} ({s.verdict}); {where}; repro: {s.repro}"
    ids = all_ids(analysis)
    close = difflib.get_close_matches(row_id, ids, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise CiteError(f"{row_id!r} is not a row id of run {analysis.run.run_id}; {hint}"
                    f"`kvpages cite {analysis.run.path} --list` lists its {len(ids)} ids")
