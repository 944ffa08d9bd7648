"""REPORT.md's "What to do" and recommendations.csv (no torch): kvpages.analysis.recommend's rows, printed."""

from __future__ import annotations

from kvpages.analysis.cite import wholly_outside
from kvpages.analysis.gpu_answer import GpuAnswer
from kvpages.analysis.ratios import Analysis
from kvpages.analysis.recommend import CANDIDATES, MEASURED, Recommendation, recommendations
from kvpages.render.text import table
from kvpages.schema.rows import columns
from kvpages.schema.writer import table_text

RECOMMENDATIONS_CSV = "recommendations.csv"
RULE = ("Each candidate is set against what it would replace, at the setting named (kvpages.analysis.recommend, "
        "docs/method.md \"What to do\"): on a run that crossed a link it is *recommended* when judged faster there "
        "(interval below 1, beyond the minimum effect, kept by the Benjamini-Hochberg step over these comparisons); on "
        "a CPU run, when every pageable prediction profile puts it below (predicted). Gain: candidate / replaced "
        "time, below 1 a saving.")


def what_to_do(analysis: Analysis, gpu: GpuAnswer | None = None) -> str:
    """The section: the rule, then one row per candidate, recommended first (on a CPU run, the GPU run's beside)."""
    found = tuple(r for r in recommendations(analysis) if not r.of)
    if not found:
        return ""
    measured = {} if gpu is None else {r.id: r for r in recommendations(gpu.analysis)}
    rows = []
    for r in sorted(found, key=lambda r: not r.recommended):
        beside = [] if gpu is None else [measured_cell(r, measured.get(r.id))]
        rows.append([f"**{r.action}**" if r.recommended else r.action, r.where, f"`{r.candidate}` / `{r.against}`",
                     r.gain, ("recommended" if r.recommended else "not recommended") + f" ({r.verdict})", *beside,
                     f"`{r.id}`"])
    lead = RULE
    if found[0].basis != MEASURED:
        lead += (" **On this CPU run the section is predicted** (the gain is the middle pageable profile's prediction, "
                 "its interval the range over those profiles and their bounds; `kvpages cite` of a row gives each "
                 "profile's), and the measured column is the GPU run's where one of the same points exists.")
    header = ["what to do", "where", "candidate / replaced", "gain", "status",
              *([] if gpu is None else [f"measured on {gpu.machine} ({gpu.run_id})"]), "row id"]
    return f"{lead}\n\n{table(header, rows)}{_other_sizes(analysis)}{_unset(analysis, found)}"


def measured_cell(predicted: Recommendation, measured: Recommendation | None) -> str:
    """The GPU run's figure beside a CPU run's predicted row: its gain and verdict, and 'outside the predicted range'
    where its interval misses the prediction's range at the terms' bounds wholly; '-' where it has no such row."""
    if measured is None:
        return "-"
    missed = wholly_outside(measured.ci_low, measured.ci_high, predicted.ci_low, predicted.ci_high)
    return f"{measured.gain} {measured.verdict}{measured.others}{'; outside the predicted range' if missed else ''}"


def _other_sizes(analysis: Analysis) -> str:
    """Where the other sizes' rows are (their verdicts are the "where" cells' "other sizes")."""
    other = next((r for r in recommendations(analysis) if r.of), None)
    if other is None:
        return ""
    across = ", and per size of the other kind (per step, per call) at its page size" if any(
        r.across for r in recommendations(analysis)) else ""
    return (f"\n\nrecommendations.csv also holds a row per other size of each setting{across}, its `of` the candidate's "
            f"row id (e.g. `{other.id}`: {other.setting}, {other.gain}, {other.verdict}).")


def _unset(analysis: Analysis, found: tuple[Recommendation, ...]) -> str:
    """The candidates the section leaves out, each with why: a run without their rows (a variant not swept, or one
    this device cannot run) says so instead of dropping them silently."""
    made = {r.id for r in found}
    why = ("no rows of it here", "its setting neither measured nor predicted here")
    missing = [f"{c.action} ({why[bool(c.settings(analysis))]})" for c in CANDIDATES if f"rec-{c.key}" not in made]
    return f"\n\nNot set against what it would replace in this run: {'; '.join(missing)}." if missing else ""


def recommendations_text(analysis: Analysis) -> str | None:
    """recommendations.csv's text; None where there is nothing to recommend (no file)."""
    found = recommendations(analysis)
    return table_text(columns(Recommendation), list(found)) if found else None
