"""Markdown pieces shared by the report's sections (no torch)."""

from __future__ import annotations


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def us_text(value: float) -> str:
    """Microseconds as a table shows them: 3 significant digits, whole numbers from 1000 up (never 7.9e+03)."""
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"
