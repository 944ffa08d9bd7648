"""The answers a design review asks for, each with its figure, the id of the row behind it, and a status (no torch).

`findings(analysis)` gives one `Finding` per question (bytes per call, the page size 1 regression, the
crossover, per request, per step, the scheduler thread's blocked time). On a run that crossed no link,
a latency finding says so in its status and is worded as host-side work, never as a transfer. `cite`
gives the one-line citation of any ratios.csv or scenarios.csv row id.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import pandas as pd

from kvpages.analysis.cite import Citation, CiteError, fraction, interval_of, interval_text
from kvpages.analysis.ratios import Analysis, ScenarioRatio
from kvpages.analysis.verdicts import SAME
from kvpages.core.names import CANDIDATE, STEP_CANDIDATE, label
from kvpages.schema.rows import RatioRow

MEASURED, CPU_ONLY, NEEDS_GPU = "measured here", "CPU only: no link crossed", "needs a GPU run"
BATCHED = "batched_device_stride"


@dataclass(frozen=True)
class Finding:
    question: str
    answer: str
    figure: str
    """The figure with its interval and coverage, as the row behind it gives it ('-' when there is none)."""
    id: str
    """The ratios.csv or scenarios.csv row id behind the figure ('-' when there is none)."""
    status: str


def _latency_status(analysis: Analysis) -> str:
    return MEASURED if analysis.run.link_crossed else CPU_ONLY


def _work(analysis: Analysis) -> str:
    """What a latency measures on this run: a transfer only where a link was crossed."""
    return "time" if analysis.run.link_crossed else "host-side time (no transfer)"


def bytes_figure(r: RatioRow) -> str:
    return f"{r.variant_d2h_bytes:,} / {r.baseline_d2h_bytes:,} bytes = {fraction(r.bytes_ratio)} (metered, exact)"


def verdict_text(verdict: str, min_effect: float) -> str:
    """A verdict as a figure states it: 'same' says within what."""
    return f"same (within the {min_effect:.1%} minimum effect)" if verdict == SAME else verdict


def latency_figure(r: RatioRow) -> str:
    return f"{interval_text(interval_of(r))}: {verdict_text(r.verdict, r.min_effect)}"


def _bytes(analysis: Analysis) -> Finding | None:
    rows = analysis.ratios_of(CANDIDATE)
    if not rows:
        return None
    exact = all(r.variant_d2h_bytes * r.seq_len == -(-r.seq_len // r.page_size) * r.baseline_d2h_bytes for r in rows)
    top = max(rows, key=lambda r: (r.page_size, r.seq_len))
    pages = ", ".join(str(p) for p in sorted({r.page_size for r in rows}))
    answer = (f"The merged PR hands the host one index per page: ceil(L/p) instead of L indices, "
              f"{'exactly, at every' if exact else 'NOT exactly, at some'} swept point (p = {pages}).")
    return Finding("Bytes per call", answer, bytes_figure(top), top.id, MEASURED)


def _page1(analysis: Analysis) -> Finding | None:
    rows = [r for r in analysis.ratios_of(CANDIDATE) if r.page_size == 1]
    if not rows:
        return None
    worst = max(rows, key=lambda r: r.ratio)
    slower = sum(r.verdict == "slower" for r in rows)
    shortcut = [r for r in analysis.ratios if r.variant == "device_stride_shortcut" and r.page_size == 1]
    back = (f"; with the page_size == 1 shortcut restored it is the same at {sum(r.verdict == 'same' for r in shortcut)}"
            f" of {len(shortcut)}") if shortcut else ""
    early = "" if analysis.run.link_crossed else f" (pre-PR returns early there: {worst.baseline_median_us:.2f} µs)"
    answer = (f"At page size 1 the bytes are equal, and the merged PR's {_work(analysis)} is slower than pre-PR at "
              f"{slower} of {len(rows)} lengths, up to {worst.ratio:.2f}x at L={worst.seq_len}{early}{back}.")
    return Finding("Page size 1 regression", answer, latency_figure(worst), worst.id, _latency_status(analysis))


def _crossover(analysis: Analysis) -> Finding | None:
    rows = [r for r in analysis.ratios_of(CANDIDATE) if r.page_size > 1]
    if not rows:
        return None
    found = [c for c in analysis.crossovers if c.seq_len is not None and c.page_size > 1]
    if found:
        c = min(found, key=lambda c: (c.seq_len, c.page_size))
        cited = analysis.ratio_at(CANDIDATE, c.dtype, c.layout, c.page_size, int(c.seq_len or 0))
        assert cited is not None
        answer = (f"The merged PR's {_work(analysis)} is faster than pre-PR from L={c.seq_len} at page size {c.page_size}"
                  f" ({len(found)} of {len(analysis.crossovers)} page sizes cross within the sweep).")
    else:
        cited = min(rows, key=lambda r: r.ratio)
        answer = (f"No crossover: at no swept point (p > 1) is the merged PR's {_work(analysis)} faster than pre-PR "
                  f"beyond the noise floor; closest at L={cited.seq_len}, p={cited.page_size}.")
    return Finding("Crossover", answer, latency_figure(cited), cited.id, _latency_status(analysis))


def scenario_figure(r: ScenarioRatio) -> str:
    return f"{interval_text(r.interval)}: {verdict_text(r.verdict, r.min_effect)}"


def _scenario_rows(analysis: Analysis, kind: str, variant: str, side: str | None = None) -> list[tuple]:
    frame = analysis.run.scenarios
    if frame is None:
        return []
    rows = frame[(frame["kind"] == kind) & (frame["busy_us"] == 0) & (frame["variant"] == variant)
                 & (frame["status"] == "ok")]
    if side is not None:
        rows = rows[rows["side"] == side]
    out = []
    for _, row in rows.iterrows():
        ratio = analysis.scenario_ratio(str(row["scenario"]), variant, "blocked")
        if ratio is not None:
            out.append((int(row["page_size"]), int(row["tokens"] if kind == "request" else row["requests"]), row, ratio))
    return sorted(out, key=lambda t: (t[0], t[1]))


def _moved(row, base: bool = False) -> str:
    """A scenario row's D2H per request or step, and its host syncs where the run counted them (schema 5)."""
    moved = f"{row['d2h_bytes']:,} {'in' if base else 'bytes in'} {row['d2h_transfers']}"
    if pd.isna(row["host_syncs"]):
        return moved if base else f"{moved} D2H"
    return f"{moved} D2H and {row['host_syncs']} host sync(s)"


def _scenario(analysis: Analysis, question: str, kind: str, variant: str, side: str | None) -> Finding | None:
    found = _scenario_rows(analysis, kind, variant, side)
    if not found:
        return None
    page_size, size, row, ratio = found[-1]  # the largest page size, then the longest request / largest step
    base = analysis.run.scenarios
    assert base is not None
    base_row = base[(base["scenario"] == row["scenario"]) & (base["variant"] == analysis.scenario_baseline)].iloc[0]
    what = f"L={size}" if kind == "request" else f"B={size} requests"
    answer = (f"{what} at page size {page_size}: {_moved(row)} against {_moved(base_row, base=True)}; "
              f"{_work(analysis)} per {kind} "
              f"{row['blocked_median_us']:.0f} µs against pre-PR's {base_row['blocked_median_us']:.0f} µs.")
    return Finding(question, answer, scenario_figure(ratio), ratio.id, _latency_status(analysis))


def _blocked(analysis: Analysis) -> Finding:
    frame = analysis.run.scenarios
    busy = frame[frame["busy_us"] > 0] if frame is not None else None
    ok = busy[busy["status"] == "ok"] if busy is not None else None
    if not analysis.run.link_crossed or ok is None or ok.empty:
        candidate = busy[busy["variant"] == STEP_CANDIDATE] if busy is not None else None
        cited = "-" if candidate is None or candidate.empty else str(candidate["id"].iloc[0])
        return Finding("Scheduler thread blocked", "Not measurable here: without a device queue the scheduler thread is "
                       "blocked exactly as long as the data takes to be ready; the busy-queue scenario needs CUDA.",
                       "-", cited, NEEDS_GPU)
    ratios = [r for r in analysis.scenario_ratios if r.latency == "blocked" and r.scenario in set(ok["scenario"])]
    best = min(ratios, key=lambda r: r.interval.ratio)
    answer = (f"Behind a busy device queue, {label(best.variant)} blocks the scheduler thread "
              f"{best.interval.ratio:.2f}x as long as pre-PR.")
    return Finding("Scheduler thread blocked", answer, scenario_figure(best), best.id, MEASURED)


def findings(analysis: Analysis) -> tuple[Finding, ...]:
    """The findings table of the report, in the order a review asks its questions."""
    made = [_bytes(analysis), _page1(analysis), _crossover(analysis),
            _scenario(analysis, "Per request: prefill chunks", "request", STEP_CANDIDATE, "prefill"),
            _scenario(analysis, "Per request: decode", "request", STEP_CANDIDATE, "decode"),
            _scenario(analysis, "Per step, one D2H per request", "step", STEP_CANDIDATE, None),
            _scenario(analysis, "Per step, batched (one D2H)", "step", BATCHED, None)]
    if analysis.run.scenarios is not None:
        made.append(_blocked(analysis))
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


def _commit(analysis: Analysis) -> str:
    meta = analysis.run.meta
    if meta is None or not meta.environment.git_commit:
        return "commit unknown"
    return f"commit {meta.environment.git_commit[:12]}{' (dirty)' if meta.environment.git_dirty else ''}"


def cite(analysis: Analysis, row_id: str) -> Citation:
    """The one-line citation of a ratios.csv or scenarios.csv row id; CiteError names how to list the valid ones."""
    for r in analysis.ratios:
        if r.id == row_id:
            what = (f"{label(r.variant)} / {label(r.baseline)}, L={r.seq_len} p={r.page_size} {r.dtype} {r.layout}: "
                    f"{bytes_figure(r)}; latency")
            return Citation(r.id, what, interval_of(r), r.verdict, _machine(analysis), _commit(analysis), r.repro)
    for s in analysis.scenario_ratios:
        if s.id == row_id and s.latency == "blocked":
            what = f"{s.scenario}: {label(s.variant)} / {label(s.baseline)}, blocked"
            return Citation(s.id, what, s.interval, s.verdict, _machine(analysis), _commit(analysis), s.repro)
    ids = all_ids(analysis)
    close = difflib.get_close_matches(row_id, ids, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise CiteError(f"{row_id!r} is not a row id of run {analysis.run.run_id}; {hint}"
                    f"`kvpages cite {analysis.run.path} --list` lists its {len(ids)} ids")
