"""How the report writes numbers, tables and interval headers (no torch)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvpages.analysis.cite import coverage_text, sig
from kvpages.analysis.ratios import Analysis
from kvpages.analysis.wording import verdict_text
from kvpages.core.names import BASELINE, CANDIDATE, LABELS
from kvpages.core.stats import Interval
from kvpages.schema.ranks import ContentionRow
from kvpages.schema.rows import RatioRow

NAMES = f"Names: **pre-PR** = `{BASELINE}`, {LABELS[BASELINE]}; **merged PR** = `{CANDIDATE}`, {LABELS[CANDIDATE]}."
"""What a report or a fleet report says first: the two variants its questions are about."""


def table(header: list[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_page(title: str, sections: Sequence[tuple[str, str]]) -> str:
    """A markdown page: the title, then each (heading, text) section that has text."""
    return "\n\n".join([title, *(f"{heading}\n\n{text}" for heading, text in sections if text)]) + "\n"


def count(value: object) -> str:
    """Bytes or any count with thousands separators ('' when missing)."""
    return "" if value is None or value != value else f"{int(value):,}"  # type: ignore[call-overload]


def ci_text(r: RatioRow | ContentionRow | Interval) -> str:
    """A ratio's interval as the report prints it (its ratios.csv or contention.csv row, rounded)."""
    if not math.isfinite(r.ci_high):
        return "[n/a: 1 repetition]"
    return f"[{sig(r.ci_low)}, {sig(r.ci_high)}]"


def bracket(i: Interval) -> str:
    """'[1.10, 1.30]', or '[n/a]' where there is no interval."""
    return f"[{sig(i.ci_low)}, {sig(i.ci_high)}]" if i.known else "[n/a]"


def interval_cell(i: Interval, verdict: str, stability: str) -> str:
    """A ratio in one table cell: '1.23 [1.10, 1.30] slower' (`bracket`; `verdict_text`)."""
    return f"{sig(i.ratio)} {bracket(i)} {verdict_text(verdict, stability)}"


def coverage(analysis: Analysis) -> str:
    """The exact coverage of the run's intervals for a header ('95% interval'); per row when they differ."""
    levels = {round(r.confidence, 6) for r in analysis.ratios} | {round(r.interval.confidence, 6)
                                                                   for r in analysis.scenario_ratios}
    levels = {c for c in levels if c == c}
    if len(levels) == 1:
        return f"{coverage_text(levels.pop())} interval"
    return "interval (coverage per row: `confidence` in ratios.csv)"
