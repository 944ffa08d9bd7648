"""`kvpages compare`'s output in each format: text for a terminal, a markdown table for a pull-request comment,
and a JSON document for CI (kvpages.schema.compare); `FORMATS` is the one list of them (no torch)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvpages.analysis.cite import coverage_text, percent, sig
from kvpages.analysis.compare import ABSOLUTE, RELATIVE, Family, PointComparison, RunComparison
from kvpages.analysis.verdicts import FASTER, SLOWER
from kvpages.render.text import bracket, table
from kvpages.schema.compare import (
    COMPARE_SCHEMA_VERSION,
    ComparedPoint,
    ComparisonDocument,
    Gate,
    PointKey,
    RelativeShift,
    RunInfo,
    finite,
)
from kvpages.schema.reader import Run


@dataclass(frozen=True)
class Compared:
    """A comparison with the two runs it compared and its gate (None without --fail-above)."""

    a: Run
    b: Run
    result: RunComparison
    fail_above_pct: float | None

    @property
    def regressions(self) -> list[PointComparison]:
        return [] if self.fail_above_pct is None else self.result.regressions(self.fail_above_pct)

    def gate_line(self) -> str | None:
        """'OK: ...' or 'FAIL: ...' with --fail-above; None without."""
        if self.fail_above_pct is None:
            return None
        pct, base = self.fail_above_pct, self.result.baseline
        if self.regressions:
            return (f"FAIL: {len(self.regressions)} point(s) slower relative to {base} by more than {pct:g}% beyond "
                    f"noise (whole CI above {1 + pct / 100:g})")
        return f"OK: no point slower relative to {base} by more than {pct:g}% beyond noise"

    def titles(self) -> dict[str, str]:
        return {RELATIVE: f"Relative (gated): each variant / {self.result.baseline} within its run, B over A; each run's "
                          "over every process that timed it (its report's ratio, ratios.csv's, may leave a disturbed "
                          "process out of its centre: `left_out`)",
                ABSOLUTE: "Absolute (not gated: absolute times move between processes and machines): µs per call, the "
                          "geometric mean of block medians over every process, B over A"}

    def families(self) -> dict[str, Family]:
        return {RELATIVE: self.result.relative, ABSOLUTE: self.result.absolute}

    def judged_line(self, family: Family) -> str:
        counts = ", ".join(f"{n} {v}" for v, n in family.counts().items())
        return (f"{len(family.points)} points: {counts} (minimum effect {percent(family.min_effect)}; family corrected, "
                "kvpages.analysis.verdicts.judge)")

    def notes(self) -> tuple[str | None, ...]:
        """The notes under the tables, each None where it does not apply: the intervals' caveat, where the runs ran,
        and a shift of every ratio."""
        return self.result.caveat(), self.result.machine_note(), self.result.shift_note()

    def unit_line(self) -> str:
        unit = "processes" if self.result.unit == "process" else "repetitions within a process"
        return (f"intervals between the runs sample {unit} (A: {self.result.processes[0]}, B: "
                f"{self.result.processes[1]} processes)")


def _header(points: list[PointComparison]) -> str:
    known = [p.interval for p in points if p.interval.known]
    return f"{coverage_text(known[0].confidence)} CI" if known else "CI"


def text(c: Compared) -> str:
    """What a terminal shows (the gate's OK line included; a FAIL line is the caller's, on stderr)."""
    lines = [f"A = {c.a.run_id} ({c.a.device_name})", f"B = {c.b.run_id} ({c.b.device_name})"]
    what = {RELATIVE: "ratio", ABSOLUTE: "µs"}
    for name, family in c.families().items():
        lines += ["", c.titles()[name],
                  f"{'variant':<24} {'dtype':<6} {'layout':<11} {'seq_len':>8} {'page':>5} {'A ' + what[name]:>10} "
                  f"{'B ' + what[name]:>10} {'B/A':>7}  {_header(family.points):<17} verdict"]
        for p in family.points:
            variant, dtype, layout, seq_len, page_size = p.key
            lines.append(f"{variant:<24} {dtype:<6} {layout:<11} {seq_len:>8} {page_size:>5} {sig(p.a_value):>10} "
                         f"{sig(p.b_value):>10} {sig(p.interval.ratio):>7}  {bracket(p.interval):<17} {p.verdict}")
    for label, keys in (("only in A", c.result.only_a), ("only in B", c.result.only_b)):
        lines += [f"{label}: {' '.join(str(k) for k in key)}" for key in keys]
    lines += [f"{name}: {c.judged_line(family)}" for name, family in c.families().items()]
    lines += [c.unit_line(), *filter(None, c.notes())]
    gate = c.gate_line()
    if gate is not None and not c.regressions:
        lines.append(gate)
    return "\n".join(lines)


def markdown(c: Compared) -> str:
    """A pull-request comment: the gated relative table first, the absolute one folded away."""

    def verdict(p: PointComparison) -> str:
        return f"**{p.verdict}**" if p.verdict in (FASTER, SLOWER) else p.verdict

    def rows(family: Family, unit: str) -> str:
        return table(["variant", "dtype", "layout", "seq_len", "page size", f"A {unit}", f"B {unit}", "B/A",
                      _header(family.points), "verdict"],
                     [[f"`{p.key[0]}`", *p.key[1:], sig(p.a_value), sig(p.b_value), sig(p.interval.ratio),
                       bracket(p.interval), verdict(p)] for p in family.points])

    gate = c.gate_line()
    parts = [f"### kvpages compare: B `{c.b.run_id}` against A `{c.a.run_id}`",
             f"A: `{c.a.run_id}` ({c.a.device_name}); B: `{c.b.run_id}` ({c.b.device_name}). Verdicts: *faster* or "
             "*slower* only when B/A's interval excludes 1, the effect reaches the family's minimum effect and the "
             f"Benjamini-Hochberg step keeps it; {c.unit_line()}.",
             *([f"**{gate}**"] if gate else []),
             f"#### {c.titles()[RELATIVE]}", rows(c.result.relative, "ratio"),
             f"{RELATIVE}: {c.judged_line(c.result.relative)}",
             f"<details><summary>{c.titles()[ABSOLUTE]}</summary>\n\n{rows(c.result.absolute, 'µs')}\n\n"
             f"{ABSOLUTE}: {c.judged_line(c.result.absolute)}\n\n</details>"]
    only = [f"- only in {side}: `{' '.join(str(k) for k in key)}`"
            for side, keys in (("A", c.result.only_a), ("B", c.result.only_b)) for key in keys]
    parts += ["\n".join(only)] if only else []
    parts += [f"> {note}" for note in c.notes() if note]
    return "\n\n".join(parts)


def document(c: Compared) -> ComparisonDocument:
    """The JSON document's typed form."""
    gated = {p.key for p in c.regressions}

    def point(family: str, p: PointComparison) -> ComparedPoint:
        i = p.interval
        beyond = (p.key in gated) if family == RELATIVE and c.fail_above_pct is not None else None
        return ComparedPoint(family, PointKey(*p.key), p.a_value, p.b_value, i.ratio, finite(i.ci_low) if i.known
                             else None, finite(i.ci_high), finite(i.confidence), i.unit, p.p_value, p.q_value,
                             p.verdict, beyond)

    families = c.families()
    gate = None if c.fail_above_pct is None else Gate(c.fail_above_pct, 1 + c.fail_above_pct / 100,
                                                      len(c.regressions), not c.regressions)
    a, b = (RunInfo(r.run_id, r.device_name, r.process_count, None if m is None else m.describe(), boot)
            for r, m, boot in zip((c.a, c.b), c.result.machines, c.result.boots, strict=True))
    moved = c.result.shift
    return ComparisonDocument(
        COMPARE_SCHEMA_VERSION, a, b, c.result.baseline, c.result.unit, c.result.caveat(), c.result.machine_note(),
        {n: f.min_effect for n, f in families.items()}, {n: f.counts() for n, f in families.items()}, gate,
        RelativeShift(moved.factor, moved.up, moved.down, moved.sign_p(), c.result.shift_note()),
        [point(n, p) for n, f in families.items() for p in f.points],
        [PointKey(*k) for k in c.result.only_a], [PointKey(*k) for k in c.result.only_b])


FORMATS: dict[str, Callable[[Compared], str]] = {"text": text, "markdown": markdown,
                                                 "json": lambda c: document(c).to_json()}
"""`kvpages compare --format`: the first is the default."""
