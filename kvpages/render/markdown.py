"""Markdown pieces shared by the report's sections (no torch)."""

from __future__ import annotations

from kvpages.analysis.cite import sig


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def us_text(value: float) -> str:
    """Microseconds as a table shows them: 3 significant figures (kvpages.analysis.cite.sig)."""
    return sig(value)
