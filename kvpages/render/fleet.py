"""`FLEET.md`: one sweep's runs from several machines, side by side, rendered from one `Fleet` (no torch); every
figure in a machine's column is that machine's analysis of its pooled runs (kvpages.analysis.ratios.analyze)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from kvpages.analysis.cite import commit_text, interval_of, percent
from kvpages.analysis.findings import findings
from kvpages.analysis.fleet import Fleet, Matched, Missing, sweep_of
from kvpages.analysis.machines import meta_of
from kvpages.analysis.wording import Finding, repetitions_text
from kvpages.core.names import BASELINE
from kvpages.render.fleet_chart import CHART_CAPTION, CHART_PNG, plot_fleet
from kvpages.render.text import NAMES, coverage, interval_cell, markdown_page, table
from kvpages.schema.reader import RunError
from kvpages.schema.rows import RATIOS_CSV, SCENARIO_RATIOS_CSV, RatioRow, ratio_id, scenario_row_id
from kvpages.schema.store import write_atomic

FLEET_MD = "FLEET.md"
ENVIRONMENT: tuple[tuple[str, str], ...] = (
    ("device", "device"), ("device name", "device_name"), ("host", "hostname"), ("driver", "driver_version"),
    ("CUDA", "cuda_version"), ("PCIe link at the start", "pcie_link"), ("PCIe link after the first block", "pcie_link_loaded"),
    ("SM clock after the first block (MHz)", "sm_clock_mhz_loaded"), ("GPU UUID", "gpu_uuid"), ("CPU model", "cpu_model"),
    ("CPU (vendor, family, model, stepping, microcode, L3)", "cpu_id"), ("CPU cores", "cpu_count"),
    ("torch threads", "torch_threads"), ("platform", "platform"), ("Python", "python_version"),
    ("torch", "torch_version"), ("numpy", "numpy_version"), ("pytest-benchmark", "pytest_benchmark_version"),
    ("kvpages", "kvpages_version"),
)
"""The rows of the machines table: (what it says, the meta.json `environment` field it reads)."""

METHOD = (
    "Machines are told apart by meta.json's environment (kvpages.analysis.machines.Machine: device, device name, "
    "driver, the PCIe link the slot trains to, host name, the CPU beyond its model name); runs with equal identities "
    "are one machine, and a run that did not record a part is another machine than one that did. A machine's "
    "runs are **pooled as repetitions of one run**: each run's processes become processes of one two-stage bootstrap "
    "(run k's process p is numbered after the processes of the runs before it), each repetition stays paired with "
    "its baseline within its own run, and a row is pooled only where every run of the machine timed it; two runs of "
    "one process each are two processes. Each machine is then analysed as one run, exactly as `kvpages report` "
    "analyses a run (kvpages.analysis.ratios): a ratio is the median of the paired per-repetition ratios of block "
    "medians, with the percentile interval of the two-stage bootstrap over processes, then repetitions (with one "
    "process, the order-statistic interval of the median), and its verdict uses that machine's own minimum effect "
    "and Benjamini-Hochberg family. A machine of one run shows the figures of its own ratios.csv. Ratios are matched "
    "by point (variant, baseline, dtype, layout, seq_len, page_size; scenario ratios by scenario, variant and "
    "latency); a point some machine lacks is listed, never estimated. Nothing here gates: `kvpages compare A B "
    "--fail-above PCT` is the gate between two runs."
)


def checked_out(out: Path | None) -> Path:
    """--out, by default a new folder `fleet-<UTC time>` here; refused where it is a file or already holds a fleet
    report: finished results are never overwritten."""
    out = out or Path(f"fleet-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}")
    if out.exists() and not out.is_dir():
        raise RunError(f"--out {out}: not a folder")
    for name in (FLEET_MD, CHART_PNG):
        if (out / name).exists():
            raise RunError(f"--out {out}: {out / name} exists, and kvpages fleet never overwrites a finished report; "
                           "give another --out or remove it")
    return out


def _cell(values: list[object]) -> str:
    """One machine's value of a field over its runs: the distinct values, in run order ('-' for none)."""
    shown = dict.fromkeys("-" if v is None else str(v) for v in values)
    return " / ".join(shown)


def machines_section(fleet: Fleet) -> str:
    members = fleet.members
    rows: list[list[str]] = [["runs"] + [", ".join(f"`{r.run_id}`" for r in m.runs) for m in members]]
    rows += [[what] + [_cell([getattr(meta_of(r).environment, name) for r in m.runs]) for m in members]
             for what, name in ENVIRONMENT]
    noise = [m.analysis.noise for m in members]
    rows += [
        ["git commit"] + [_cell([commit_text(meta_of(r).environment) for r in m.runs]) for m in members],
        ["sweep"] + [_cell([sweep_of(meta_of(r)) for r in m.runs]) for m in members],
        ["repetitions, processes"] + [_cell([repetitions_text(r) for r in m.runs]) for m in members],
        ["intervals"] + [coverage(m.analysis) for m in members],
        ["minimum effect"] + [percent(n.min_effect) for n in noise],
        ["completed"] + [_cell(["yes" if meta_of(r).completed else f"NO ({meta_of(r).end_note})" for r in m.runs])
                         for m in members],
    ]
    lead = "\n".join(f"- **{m.label}**" for m in members)
    listed = "; ".join(f"`{run_id}`: {sweep}" for run_id, sweep in fleet.sweeps)
    sweeps = (f"All {fleet.run_count} runs are of one sweep ({fleet.sweeps[0][1]})." if fleet.one_sweep else
              f"**The runs are of different sweeps** ({listed}): the machines are compared on the points every one "
              "of them timed; the others are listed under *Not on every machine*.")
    return f"{lead}\n\n" + table(["", *(m.id for m in members)], rows) + f"\n\n{sweeps}"


def _finding_cell(found: Finding | None) -> str:
    if found is None:
        return "-"
    if found.figure == "-":
        return f"- ({found.status})"
    return found.figure if found.id == "-" else f"{found.figure} (`{found.id}`)"


def findings_section(fleet: Fleet) -> str:
    made = {m.id: {f.question: f for f in findings(m.analysis)} for m in fleet.members}
    questions = list(dict.fromkeys(q for by_question in made.values() for q in by_question))
    rows = [[q] + [_finding_cell(made[m.id].get(q)) for m in fleet.members] for q in questions]
    answers = [f"**{m.label}**\n\n" + "\n".join(f"- {f.question} ({f.status}): {f.answer}" for f in made[m.id].values())
               for m in fleet.members]
    narrowed = [m.id for m in fleet.members if len({sweep_of(meta_of(r)) for r in m.runs}) > 1]
    pooled = (f" ({', '.join(narrowed)}: runs of different sweeps, pooled where every one of its runs timed a row, so "
              "over those points alone, not each run's own)" if narrowed else "")
    return ("Each machine's findings, from its runs pooled (a machine of one run: as its own report states them)"
            f"{pooled}: a figure is a ratio variant / pre-PR with its interval, and the id is its row of that machine's "
            f"`{RATIOS_CSV}` or `{SCENARIO_RATIOS_CSV}`.\n\n"
            + table(["question", *(m.id for m in fleet.members)], rows) + "\n\n" + "\n\n".join(answers))


def _header(fleet: Fleet) -> list[str]:
    return [f"{m.id} [{coverage(m.analysis)}] verdict" for m in fleet.members]


def _agreement(matched: Matched) -> str:
    return "agree" if matched.agree else "**differ**"


def ratios_section(fleet: Fleet) -> str:
    groups: dict[tuple, list[list[object]]] = {}
    for m in fleet.ratios:
        r: RatioRow = m.rows[0]
        cells = [interval_cell(interval_of(x), x.verdict, x.stability) for x in m.rows]
        groups.setdefault((r.page_size, r.dtype, r.layout), []).append([f"`{r.variant}`", r.seq_len, *cells,
                                                                        _agreement(m)])
    parts = [f"### page_size {page_size} ({dtype}, {layout})\n\n"
             + table(["variant", "seq_len", *_header(fleet), "verdicts"], rows)
             for (page_size, dtype, layout), rows in groups.items()]
    differ = sum(not m.agree for m in fleet.ratios)
    lead = (f"Every variant against `{BASELINE}` at every point all {len(fleet.members)} machines timed "
            f"({len(fleet.ratios)} ratios; the verdicts differ at {differ}). A cell is that machine's ratio, its "
            "interval and its verdict.")
    return "\n\n".join([lead, *parts]) if parts else "No ratio is on every machine."


def scenarios_section(fleet: Fleet) -> str:
    if not fleet.scenario_ratios:
        return ""
    rows = []
    for m in fleet.scenario_ratios:
        s = m.rows[0]
        rows.append([f"`{scenario_row_id(s.scenario, s.variant)}`", s.latency,
                     *(interval_cell(x.interval, x.verdict, x.stability) for x in m.rows), _agreement(m)])
    baseline = fleet.members[0].analysis.scenario_baseline
    return (f"Every step variant against `{baseline}` on every whole request and step all machines timed, per "
            "latency (blocked: the scheduler thread; ready: the data on the host).\n\n"
            + table(["scenarios.csv id: scenario:step variant", "latency", *_header(fleet), "verdicts"], rows))


def _missing_table(missing: tuple[Missing, ...], name: Callable[[tuple], str]) -> str:
    return table(["ratio", "on", "not on"], [[f"`{name(m.key)}`", ", ".join(m.on), ", ".join(m.not_on)]
                                               for m in missing])


def missing_section(fleet: Fleet) -> str:
    if not fleet.missing and not fleet.scenario_missing:
        return "Every ratio is on every machine."
    parts = ["A ratio some machine did not time (not in its sweep, skipped there, or not timed in every one of its "
             "runs); it is not estimated."]
    if fleet.missing:
        parts.append(f"Points ({RATIOS_CSV} ids):\n\n" + _missing_table(fleet.missing, lambda k: ratio_id(*k)))
    if fleet.scenario_missing:
        parts.append(f"Whole requests and steps ({SCENARIO_RATIOS_CSV} ids, latency):\n\n" + _missing_table(
            fleet.scenario_missing, lambda k: f"{scenario_row_id(k[0], k[1])} {k[2]}"))
    return "\n\n".join(parts)


def render(fleet: Fleet) -> str:
    return markdown_page(f"# kvpages fleet: {len(fleet.members)} machines, {fleet.run_count} runs\n\n{NAMES}", [
        ("## Machines", machines_section(fleet)),
        ("## Findings per machine", findings_section(fleet)),
        ("## Chart", f"![{CHART_PNG}]({CHART_PNG})\n\n*{CHART_CAPTION}*"),
        ("## Ratios per point, side by side", ratios_section(fleet)),
        ("## Whole requests and steps, side by side", scenarios_section(fleet)),
        ("## Not on every machine", missing_section(fleet)),
        ("## Method", METHOD),
    ])


def write_fleet(fleet: Fleet, out: Path) -> list[Path]:
    """Write the chart and FLEET.md into `out` (made if missing; `checked_out` first); return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    chart = plot_fleet(fleet, out / CHART_PNG)
    path = out / FLEET_MD
    write_atomic(path, render(fleet))
    return [path, chart]
