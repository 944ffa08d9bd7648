"""The design-review report: `REPORT.md` in the run folder, rendered from one `Analysis` (no torch).

Every ratio and interval in it is a row of the run's `ratios.csv`, which `write_report` writes beside it.
"""

from __future__ import annotations

import math
from pathlib import Path

from kvpages.analysis.ratios import NOISY_SPREAD, Analysis, variant_order, with_link_model
from kvpages.core.links import LINK_PROFILES, profile_for
from kvpages.core.names import CANDIDATE
from kvpages.core.stats import CONFIDENCE
from kvpages.render.breakdown import breakdown_section, floor_section
from kvpages.render.markdown import markdown_table
from kvpages.schema.rows import RatioRow
from kvpages.schema.writer import write_atomic, write_ratios

REPORT_MD = "REPORT.md"

METHOD = (
    "Each (variant, point) was timed in R repetitions (blocks of rounds), dealt to several passes over the whole "
    "sweep, so a point's repetitions are spread over the run. Within a repetition the point's variants ran back "
    "to back in a fresh order drawn from a seeded generator (each block's `repetition` and `order` are in "
    "samples.csv), so drift of the machine hits the variants of a repetition alike, and every pass re-copies the "
    "inputs into fresh memory. A ratio is the median over repetitions of the paired ratios of block medians, "
    "variant/baseline; its interval is the distribution-free order-statistic interval of that median (the sign-test "
    f"interval, at {CONFIDENCE:.0%} or the nearest coverage above it; with 5 or fewer repetitions, the range, at "
    "the coverage it has). The repetition, not the round, is the independent unit (Kalibera and Jones, \"Rigorous "
    "Benchmarking in Reasonable Time\", ISMM 2013), and rank-based intervals are not dragged along by a few "
    "disturbed repetitions. A ratio is within noise when its interval contains 1."
)


_table = markdown_table


def _us(value: float) -> str:
    return f"{value:.3g}" if value >= 100 else f"{value:.2f}"


def ci_text(r: RatioRow) -> str:
    """A ratio's interval as the report prints it (the ratios.csv row, rounded)."""
    if not math.isfinite(r.ci_high):
        return "[n/a: 1 repetition]"
    return f"[{r.ci_low:.3f}, {r.ci_high:.3f}]"


def ratio_text(r: RatioRow) -> str:
    return f"{r.ratio:.3f}"


def environment_paragraph(analysis: Analysis) -> str:
    run = analysis.run
    if run.meta is None:
        return f"Run {run.run_id} on {run.device_name}; no meta.json beside the CSV, so the environment is unknown."
    m, e = run.meta, run.meta.environment
    cuda = ""
    if e.device == "cuda":
        loaded = f", under load {e.pcie_link_loaded}" if e.pcie_link_loaded else ""
        cuda = f", CUDA {e.cuda_version}, driver {e.driver_version}, PCIe {e.pcie_link}{loaded}"
    git = f"commit {e.git_commit[:12]}{' (dirty tree)' if e.git_dirty else ''}" if e.git_commit else "no git checkout"
    return (
        f"Run `{m.run_id}` measured on **{e.device}** ({e.device_name}{cuda}); CPU {e.cpu_model}, "
        f"{e.cpu_count} cores, {e.torch_threads} torch threads; Python {e.python_version}, torch {e.torch_version}, "
        f"numpy {e.numpy_version}, pytest-benchmark {e.pytest_benchmark_version}, kvpages {e.kvpages_version} at {git}. "
        f"Preset `{m.preset}`, {m.repetitions} interleaved repetition(s), order seed {m.order_seed}, profiler "
        f"cross-check {m.crosscheck}; started {m.started_utc}, finished {m.finished_utc}; "
        f"{'completed' if m.completed else 'NOT completed'} ({m.end_note}). {e.link_note}"
    )


def noise_paragraph(analysis: Analysis) -> str:
    n = analysis.noise
    if n.repetitions < 2:
        return ("This run has 1 repetition per (variant, point), so it has no repetition-level spread: its ratios "
                "carry no interval, and no difference in it can be told from noise.")
    below = sum(r.verdict == "within noise" for r in analysis.ratios)
    return (
        f"Block medians of one (variant, point) vary between repetitions by {n.median_spread:.1%} (median over rows; "
        f"at most {n.max_spread:.1%}), as the log-sd of the block medians. A ratio's {CONFIDENCE:.0%} interval "
        f"reaches ±{n.median_ci_half_width:.1%} of the ratio at the median point, so differences smaller than that "
        f"are below this run's noise floor: {below} of {len(analysis.ratios)} ratios here are within noise "
        "(their interval contains 1). Absolute medians of identical code can move more than that between "
        "processes; compare runs with `kvpages compare`, which gates on ratios."
    )


def caveats(analysis: Analysis) -> list[str]:
    run = analysis.run
    out = []
    if not run.link_crossed:
        out.append("This is a CPU run: no PCIe link was crossed. `.cpu()` is a no-op here, so the latencies "
                   "measure only the device-side work and Python overhead; the bytes are what each variant "
                   "would hand across the link. Use the link model or a CUDA run for transfer costs.")
    if run.meta is not None and not run.meta.completed:
        out.append(f"The run did not complete: {run.meta.end_note}.")
    ok = run.ok_rows()
    noisy = ok[ok["rep_spread"] >= NOISY_SPREAD]
    if not noisy.empty:
        listed = ", ".join(f"{r.variant} s{r.seq_len} p{r.page_size} ({r.rep_spread:.0%})" for r in noisy.itertuples())
        out.append(f"Noisy rows (block medians vary by >= {NOISY_SPREAD:.0%} between repetitions): {listed}.")
    for status in ("skipped", "out_of_memory", "mismatch"):
        rows = run.rows[run.rows["status"] == status]
        for (variant, note), group in rows.groupby(["variant", "note"]):
            out.append(f"{variant}: {len(group)} point(s) {status.replace('_', ' ')}: {note}")
    return out


def _groups(analysis: Analysis):
    ok = analysis.run.ok_rows()
    return ok.groupby(["dtype", "layout", "page_size"], sort=True)


def results_section(analysis: Analysis) -> str:
    parts = []
    for (dtype, layout, page_size), _ in _groups(analysis):
        rows = []
        for r in analysis.ratios_of(CANDIDATE):
            if (r.dtype, r.layout, r.page_size) != (dtype, layout, page_size):
                continue
            best = analysis.fastest.get((dtype, layout, page_size, r.seq_len), ())
            rows.append([r.seq_len, r.baseline_d2h_bytes, r.variant_d2h_bytes, f"{r.bytes_ratio:.4g}",
                         _us(r.baseline_median_us), _us(r.variant_median_us), ratio_text(r), ci_text(r),
                         r.verdict, " ≈ ".join(best)])
        if rows:
            header = ["seq_len", f"{analysis.baseline} B", f"{CANDIDATE} B", "bytes ratio", f"{analysis.baseline} µs",
                      f"{CANDIDATE} µs", "latency ratio", f"{CONFIDENCE:.0%} CI", "verdict", "fastest (≈: tied)"]
            parts.append(f"### page_size {page_size} ({dtype}, {layout})\n\n{_table(header, rows)}")
    return "\n\n".join(parts) if parts else f"No point has both {analysis.baseline} and {CANDIDATE} timed."


def variants_section(analysis: Analysis) -> str:
    """Per page size: every timed variant's bytes and latency against the baseline, the fastest marked."""
    parts = []
    for (dtype, layout, page_size), group in _groups(analysis):
        rows = []
        for seq_len, at in group.groupby("seq_len"):
            quickest = analysis.fastest.get((dtype, layout, page_size, seq_len), ())
            for _, row in at.sort_values("variant", key=variant_order).iterrows():
                r = analysis.ratio_at(row["variant"], dtype, layout, page_size, seq_len)
                is_base = row["variant"] == analysis.baseline
                rows.append([seq_len, f"`{row['variant']}`", row["d2h_bytes"],
                             f"{r.bytes_ratio:.4g}" if r else ("1" if is_base else ""), _us(row["median_us"]),
                             f"{row['rep_spread']:.1%}" if row["rep_spread"] == row["rep_spread"] else "",
                             ratio_text(r) if r else ("1" if is_base else ""), ci_text(r) if r else "",
                             r.verdict if r else "", "yes" if row["variant"] in quickest else ""])
        header = ["seq_len", "variant", "D2H B", f"bytes / {analysis.baseline}", "median µs", "spread",
                  f"latency / {analysis.baseline}", f"{CONFIDENCE:.0%} CI", "verdict", "fastest"]
        parts.append(f"### page_size {page_size} ({dtype}, {layout})\n\n{_table(header, rows)}")
    return "\n\n".join(parts)


def crossover_section(analysis: Analysis) -> str:
    if not analysis.crossovers:
        return "No crossover can be computed: no point has both variants timed."
    rows = [[c.page_size, c.dtype, c.layout, c.describe()] for c in analysis.crossovers]
    return (f"Smallest swept seq_len at which `{CANDIDATE}` beats `{analysis.baseline}`: the upper end of the "
            f"{CONFIDENCE:.0%} interval of the latency ratio is below 1.\n\n"
            + _table(["page_size", "dtype", "layout", "crossover"], rows))


def link_model_section(analysis: Analysis) -> str:
    run = analysis.run
    modeled = with_link_model(run.ok_rows())
    modeled = modeled[modeled["variant"].isin([analysis.baseline, CANDIDATE])]
    longest = modeled.groupby(["dtype", "layout", "page_size"])["seq_len"].transform("max")
    chosen = modeled[modeled["seq_len"] == longest].sort_values(["page_size", "variant"])
    header = ["page_size", "seq_len", "variant", "bytes", "transfers", "measured µs"] + [p.label + " µs" for p in LINK_PROFILES]
    rows = [[r["page_size"], r["seq_len"], r["variant"], r["d2h_bytes"], r["d2h_transfers"], _us(r["median_us"])]
            + [_us(r[p.column]) for p in LINK_PROFILES] for _, r in chosen.iterrows()]
    lead = ("**Model, not measurement**: `transfers x fixed latency + bytes / bandwidth` per link profile "
            "(sources in `kvpages/links.py`), at the longest swept seq_len. ")
    if run.link_crossed:
        lead += "This run crossed a real link, so its measured median sits beside the model for comparison."
    else:
        lead += "This CPU run crossed no link: its measured column contains no transfer time at all."
    sources = "\n".join(f"- {p.label}: {p.latency_us:g} µs + bytes / {p.bandwidth_gb_s:g} GB/s. {p.source}" for p in LINK_PROFILES)
    return f"{lead}\n\n{_table(header, rows)}\n\n{sources}" + model_vs_measurement(analysis)


def model_vs_measurement(analysis: Analysis) -> str:
    """On a run that crossed a link: each row's median beside the model of the link it crossed
    (the PCIe generation the link trains to, from meta.json); the difference is what the model leaves out."""
    run = analysis.run
    if not run.link_crossed:
        return ""
    pcie = run.meta.environment.pcie_link if run.meta else None
    rows = []
    for _, r in run.ok_rows().sort_values(["page_size", "seq_len", "variant"], key=variant_order).iterrows():
        profile = profile_for(pcie, r["link"])
        if profile is None:
            continue
        modeled = profile.modeled_us(r["d2h_bytes"], r["d2h_transfers"])
        rows.append([r["page_size"], r["seq_len"], f"`{r['variant']}`", r["link"], profile.label, _us(r["median_us"]),
                     _us(modeled), f"{r['median_us'] - modeled:+.2f}"])
    if not rows:
        return f"\n\nNo link profile matches this run's link (PCIe: {pcie}), so the model is not compared with it."
    header = ["page_size", "seq_len", "variant", "link", "profile", "measured µs", "modeled µs", "measured - modeled µs"]
    return ("\n\n### Model vs measurement\n\nEach timed row beside the model of the link it crossed. The "
            "difference is what the model leaves out (device kernels, Python, synchronisation) or gets wrong "
            "(the profile's latency and bandwidth).\n\n" + _table(header, rows))


def _ratio_cell(analysis: Analysis, scenario: str, variant: str, latency: str) -> str:
    if variant == analysis.scenario_baseline:
        return "1"
    r = analysis.scenario_ratio(scenario, variant, latency)
    if r is None:
        return ""
    i = r.interval
    ci = f"[{i.ci_low:.3f}, {i.ci_high:.3f}]" if i.known else "[n/a]"
    return f"{i.ratio:.3f} {ci}"


def scenarios_section(analysis: Analysis) -> str:
    """Per request and per step: measured over whole requests and steps, against the per-request baseline."""
    frame = analysis.run.scenarios
    if frame is None or frame.empty:
        return ""
    lead = (f"Each row is measured over a whole request (every call it makes) or a whole scheduler step (all its "
            f"requests), never multiplied from points. `blocked`: until the calling (scheduler) thread got control "
            f"back; `ready`: until the page indices were usable on the host. Ratios are paired over repetitions "
            f"against `{analysis.scenario_baseline}` (what SGLang does today), with {CONFIDENCE:.0%} intervals as in "
            f"Method. D2H bytes and transfers are per request or step, as the meter counted them.")
    if not analysis.run.link_crossed:
        lead += (" On this CPU run there is no device queue and no worker-thread wait: blocked equals ready for "
                 "every variant, and the busy-queue scenarios are skipped.")
    parts = [lead]
    ok = frame[frame["status"] == "ok"]
    for kind, title in (("request", "Per request"), ("step", "Per step")):
        rows = []
        chosen = ok[ok["kind"] == kind].sort_values(["side", "page_size", "busy_us", "requests", "tokens", "variant"],
                                                    key=variant_order)
        for _, r in chosen.iterrows():
            rows.append([r["side"], r["page_size"], r["tokens"] if kind == "request" else r["requests"],
                         r["chunk_size"] if kind == "request" else r["busy_us"], f"`{r['variant']}`", r["calls"],
                         r["d2h_bytes"], r["d2h_transfers"], _us(r["blocked_median_us"]), _us(r["ready_median_us"]),
                         _ratio_cell(analysis, r["scenario"], r["variant"], "blocked"),
                         _ratio_cell(analysis, r["scenario"], r["variant"], "ready")])
        if rows:
            header = ["side", "page_size", "L (tokens)" if kind == "request" else "B (requests)",
                      "C (chunk)" if kind == "request" else "busy µs", "variant", "calls", "D2H B", "transfers",
                      "blocked µs", "ready µs", f"blocked / baseline [{CONFIDENCE:.0%} CI]",
                      f"ready / baseline [{CONFIDENCE:.0%} CI]"]
            parts.append(f"### {title}\n\n" + _table(header, rows))
    others = frame[frame["status"] != "ok"]
    notes = [f"- {variant}: {len(group)} scenario(s) {group['status'].iloc[0].replace('_', ' ')}: {note}"
             for (variant, note), group in others.groupby(["variant", "note"])]
    if notes:
        parts.append("\n".join(notes))
    return "\n\n".join(parts)


def render(analysis: Analysis) -> str:
    run = analysis.run
    command = run.meta.command if run.meta else "(unknown: no meta.json)"
    charts = sorted(p.name for p in run.path.glob("*.png"))
    sections = [
        f"# kvpages report: {run.run_id}",
        "## Environment\n\n" + environment_paragraph(analysis),
        f"## Reproduce\n\n```\n{command}\n```\n\nEach row of `results.csv` carries its own `repro` command.",
        "## Method and noise floor\n\n" + METHOD + "\n\n" + noise_paragraph(analysis),
        "## Caveats\n\n" + ("\n".join(f"- {c}" for c in caveats(analysis)) or "- none"),
        f"## {CANDIDATE} vs {analysis.baseline}\n\nBytes and median latency per call (all rounds); latency ratio = "
        f"{CANDIDATE} / {analysis.baseline} (paired over repetitions, see Method), from `ratios.csv`.\n\n"
        + results_section(analysis),
        "## Crossover\n\n" + crossover_section(analysis),
        f"## Every variant vs {analysis.baseline}\n\n`spread`: how much the row's block medians vary between "
        "repetitions; `fastest`: the lowest median, and every variant whose paired ratio to it has an interval "
        "that reaches 1.\n\n" + variants_section(analysis),
        "## Link model\n\n" + link_model_section(analysis),
    ]
    scenarios = scenarios_section(analysis)
    if scenarios:
        sections.append("## Per request and per step\n\n" + scenarios)
    for title, text in (("Zero-D2H floor", floor_section(analysis)), ("Where the time goes", breakdown_section(analysis))):
        if text:
            sections.append(f"## {title}\n\n{text}")
    if charts:
        sections.append("## Charts\n\n" + "\n".join(f"![{name}]({name})" for name in charts))
    return "\n\n".join(sections) + "\n"


def write_report(analysis: Analysis) -> Path:
    """Write ratios.csv and REPORT.md into the run folder; return the report's path."""
    write_ratios(analysis.run.path, list(analysis.ratios))
    path = analysis.run.path / REPORT_MD
    write_atomic(path, render(analysis))
    return path
