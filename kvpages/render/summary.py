"""The terminal summary of an analysed run: bytes, latency and ratios at a few lengths (no torch)."""

from __future__ import annotations

from kvpages.analysis.cite import interval_of, percent, sig
from kvpages.analysis.families import records
from kvpages.analysis.ratios import Analysis, variant_order
from kvpages.analysis.wording import left_out_parts, left_out_text, repetitions_text
from kvpages.core.names import BASELINE, CANDIDATE, STEP_BASELINE, STEP_CANDIDATE, label, per_request_of
from kvpages.render.appendix import groups, ratio_cell
from kvpages.render.ranks import contention_summary
from kvpages.render.text import coverage, interval_cell


def scenario_summary(analysis: Analysis) -> list[str]:
    """Lines for the whole requests and steps: bytes, transfers, blocked and ready, and blocked vs the baseline."""
    frame = analysis.run.scenarios
    if frame is None:
        return []
    shown = [v for v in frame["variant"].unique() if v in (STEP_BASELINE, STEP_CANDIDATE) or per_request_of(v) is None]
    ok = frame[(frame["status"] == "ok") & frame["variant"].isin(shown)]  # per-request baseline, candidate; batched
    if ok.empty:
        return []
    table = ok[["scenario", "variant", "d2h_transfers", "d2h_bytes"]].copy()
    table["blocked_us"] = [sig(analysis.scenario_time(r)) for r in records(ok)]
    table["ready_us"] = [sig(analysis.scenario_time(r, "ready")) for r in records(ok)]
    table[f"blocked vs baseline [{coverage(analysis)}]"] = [
        ratio_cell(analysis, s, v, "blocked") for s, v in zip(table["scenario"], table["variant"], strict=True)]
    return ["", "whole requests and steps (per request or per step; blocked = ready on a CPU run):",
            table.to_string(index=False)]


def _left_out(left_out: str) -> set[str]:
    """The processes a pair leaves out of its centre (ratios.csv's `left_out`: '5 (0.779x)', '4 (...); 5 (...)')."""
    return {process for process, _ in left_out_parts(left_out)}


def _kept_text(left_out: str) -> str:
    return f"leaves out {left_out_text(left_out)}" if left_out else "keeps every process"


def summary_text(analysis: Analysis) -> str:
    """Per page size: D2H bytes, time per call (the geometric mean of its block medians) and the ratio to the baseline
    (with its CI) at a few lengths; then the whole requests and steps."""
    run = analysis.run
    if run.ok_rows().empty:
        return "\n".join(scenario_summary(analysis) + contention_summary(analysis)) or "no timed rows"
    lines = []
    if not run.link_crossed:
        lines.append("CPU run: no PCIe link was crossed; bytes are those handed to the host boundary.")
    noise = analysis.noise
    level = ("intervals over the processes that timed each pair" if noise.interval_unit == "process"
             else "intervals over the repetitions of one process")
    lines.append(f"{label(BASELINE)}; {label(CANDIDATE)}.")
    lines.append(f"{repetitions_text(run)}; ratios are paired per repetition, {level}, with their "
                 f"{coverage(analysis)}; minimum effect {percent(noise.min_effect)}.")
    for (dtype, layout, page_size), group in groups(analysis):
        lengths = sorted(group["seq_len"].unique())
        shown = {lengths[0], 8192 if 8192 in lengths else lengths[len(lengths) // 2], lengths[-1]}
        chosen = group[group["seq_len"].isin(shown)]
        table = chosen[["seq_len", "variant", "d2h_bytes"]].copy()
        table["time_us"] = [sig(analysis.time_of(r)) for r in records(chosen)]
        cells, apart = [], []
        for s, v in zip(table["seq_len"], table["variant"], strict=True):
            r = analysis.ratio_at(v, dtype, layout, page_size, s)
            cells.append("1" if v == analysis.baseline else (interval_cell(interval_of(r), r.verdict, r.stability) if r else ""))
            merged = analysis.ratio_at(CANDIDATE, dtype, layout, page_size, s)
            merged_out = merged.left_out if merged else ""
            if r and v != CANDIDATE and _left_out(r.left_out) != _left_out(merged_out):
                apart.append(f"{v} at L={s} ({_kept_text(r.left_out)}; the merged PR's pair {_kept_text(merged_out)})")
        table[f"vs_{analysis.baseline} [{coverage(analysis)}]"] = cells
        table = table.sort_values(["seq_len", "variant"], key=variant_order)
        lines.append(f"\npage_size={page_size} ({dtype}, {layout})")
        lines.append(table.to_string(index=False))
        if apart:  # each time is over the processes its variant's pair keeps (Analysis.time_band)
            lines.append(f"ratios that are not the quotient of the times shown (each time_us is over the processes its "
                         f"variant's pair keeps, {analysis.baseline}'s over the merged PR's pair's): {'; '.join(apart)}")
    return "\n".join(lines + scenario_summary(analysis))


