"""What the report says of the run's spread between processes, its disturbed processes, the re-measurement and the
fragile verdicts (no torch): the box's spread as a label, never a veto (docs/method.md#disturbed-processes)."""

from __future__ import annotations

import math

from kvpages.analysis.pairs import DISTURBED, FRAGILE, STABLE
from kvpages.analysis.ratios import Analysis
from kvpages.analysis.wording import left_out_text
from kvpages.render.appendix import same_latencies
from kvpages.render.text import table
from kvpages.schema.rows import RATIOS_CSV, SCENARIO_RATIOS_CSV

SHOWN = 6  # pairs named in the report's paragraph; every one is in ratios.csv and APPENDIX.md


def box_spread(analysis: Analysis) -> str:
    """'this box's processes differ by 14% in block medians, 9.8% in ratios' ('' with one process)."""
    n = analysis.noise
    if n.processes < 2 or not math.isfinite(n.time_between_process):
        return ""
    parts = [f"{100 * n.time_between_process:.2g}% in block medians"]
    if math.isfinite(n.ratio_between_process):
        parts.append(f"{100 * n.ratio_between_process:.2g}% in ratios")
    return f"this box's processes differ by {', '.join(parts)} (between-process standard deviations, median over rows)"


def remeasure_paragraph(analysis: Analysis) -> str:
    """What the re-measurement of disturbed pairs did, from meta.json's `remeasure` ('' for a run without it)."""
    r = None if analysis.run.meta is None else analysis.run.meta.remeasure
    if r is None:
        return ""
    if r.rounds == 0:
        found = len(r.found) if r.stable_spread is None else 0  # a run before 2026-12-05 recorded no pair rule
        why = r.note if found == 0 else f"{len(r.found)} target(s) had a disturbed pair; {r.note}"
        return f"**Re-measurement** of disturbed pairs: no round ran ({why}).\n\n"
    still = ", ".join(f"`{t}`" for t in r.unstable) or "none"
    spare = " (the first in the spare started beside the planned workers)" if r.spare else ""
    return (f"**Re-measurement** of disturbed pairs: {len(r.found)} target(s) with a disturbed pair after the "
            f"{r.planned_processes} planned processes; {r.rounds} extra process(es){spare} re-timed "
            f"{len(r.remeasured)} of them, worst first ({r.extra_blocks} blocks, {r.spent_s:.1f} s of a "
            f"{r.budget_s:.1f} s budget, {r.timed_s:.1f} s timed); {r.note}. Still with a disturbed pair: {still}.\n\n")


def stability_paragraph(analysis: Analysis) -> str:
    """The processes left out of pairs' centres, the fragile and the disturbed verdicts, named (the first SHOWN)."""
    rows = [r for r in analysis.ratios if r.left_out or r.stability != STABLE]
    latencies = ("blocked",) if same_latencies(analysis) else ("blocked", "ready")  # a CPU run's ready is its blocked
    scenarios = [r for r in analysis.scenario_ratios if r.latency in latencies and (r.left_out or r.stability != STABLE)]
    box = box_spread(analysis)
    lead = (f"**Spread and disturbances.** {box[0].upper() + box[1:]}: a label, not a veto; it stays in every interval "
            "and in the minimum effect. " if box else "**Spread and disturbances.** ")
    if not rows and not scenarios:
        return lead + "No process stood apart from the others in any pair, and no verdict hangs on one process.\n\n"
    counts = {what: sum(r.stability == what for r in rows) + sum(r.stability == what for r in scenarios)
              for what in (FRAGILE, DISTURBED)}
    named = [f"`{r.id}`: {said(r.left_out, r.stability)}" for r in rows[:SHOWN]]
    named += [f"`{r.id}`{'' if len(latencies) == 1 else f' ({r.latency})'}: {said(r.left_out, r.stability)}"
              for r in scenarios[:max(0, SHOWN - len(named))]]
    more = len(rows) + len(scenarios) - len(named)
    each = "" if len(latencies) == 1 else " (blocked and ready each a pair)"
    where = f"`{RATIOS_CSV}` and `{SCENARIO_RATIOS_CSV}` (`left_out`, `stability`) and APPENDIX.md"
    left = [sum(bool(r.left_out) for r in found) for found in (rows, scenarios)]  # a fragile verdict may leave none out
    return (f"{lead}{left[0]} per-call and {left[1]} scenario pair(s){each} left a process out of their centre "
            "(it lay further from the median of the pair's processes than 3 robust standard deviations of this run's "
            "spread, or than the disturb factor), "
            f"{counts[FRAGILE]} verdict(s) are *fragile* (another verdict without one of the processes behind them) "
            f"and {counts[DISTURBED]} *disturbed* (more than a minority apart: no verdict): "
            f"{'; '.join(named)}{f'; {more} more in {where}' if more else ''}"
            ".\n\n")


def said(left_out: str, stability: str) -> str:
    """'process 5 (at 0.779x the others) left out' and what the stability adds."""
    parts = [f"{left_out_text(left_out)} left out"] if left_out else []
    if stability == FRAGILE:
        parts.append("fragile")
    elif stability == DISTURBED:
        parts.append("disturbed: no verdict")
    return ", ".join(parts)


def left_out_section(analysis: Analysis) -> str:
    """APPENDIX.md: every pair whose centre left a process out, or whose verdict is fragile or disturbed, and why."""
    rows = [[f"`{r.id}`", r.processes, r.left_out or "-", r.stability, r.verdict] for r in analysis.ratios
            if r.left_out or r.stability != STABLE]
    rows += [[f"`{r.id}` ({r.latency})", r.processes, r.left_out or "-", r.stability, r.verdict]
             for r in analysis.scenario_ratios if r.left_out or r.stability != STABLE]
    if not rows:
        return "No pair left a process out, and every verdict holds without any one process."
    return ("Each pair's level in a process is its paired log-ratio there; a process further from the median of the "
            "others than 3 robust standard deviations of this run's spread, or than the disturb factor, is left out of "
            "that pair's centre (its figure and both times), named here with its level over the others'. "
            "`processes`: the processes behind the centre.\n\n"
            + table(["id", "processes", "left out (process: level over the others)", "stability", "verdict"], rows))
