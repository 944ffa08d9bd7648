"""The design-review report: `REPORT.md` and `APPENDIX.md` in the run folder, from one `Analysis` (no torch); every
ratio and interval in it is a row of the `ratios.csv` or `scenario_ratios.csv` that `write_report` writes beside it."""

from __future__ import annotations

from pathlib import Path

from kvpages.analysis.cite import fraction, percent, percent_up, sig
from kvpages.analysis.findings import OUTSIDE, findings
from kvpages.analysis.gpu_answer import GpuAnswer, on_answer
from kvpages.analysis.noise import components_text, efficiency
from kvpages.analysis.pairs import DISTURBED, FRAGILE
from kvpages.analysis.ratios import NOISY_SPREAD, Analysis
from kvpages.analysis.verdicts import FDR, MIN_EFFECT_FLOOR, holm_sentence
from kvpages.analysis.wording import verdict_text
from kvpages.core.links import SCALES
from kvpages.core.names import BASELINE, CANDIDATE, STEP_CANDIDATE, called, label, per_request_of
from kvpages.core.payloads import DEFAULT_PAYLOADS
from kvpages.render.appendix import groups, link_model_section, ratio_cell, same_latencies, scenarios_section, variants_section
from kvpages.render.breakdown import breakdown_section, breakdown_summary, floor_section
from kvpages.render.captions import caption
from kvpages.render.evidence import crossover_table, model_section, per_call_table, predictions_section, scenario_table
from kvpages.render.hybrid import hybrid_table
from kvpages.render.kept import REPORT_MD, Files, charts_in, write_files
from kvpages.render.ranks import render_ranks
from kvpages.render.recommend import RECOMMENDATIONS_CSV, recommendations_text, what_to_do
from kvpages.render.stability import left_out_section, remeasure_paragraph, stability_paragraph
from kvpages.render.text import NAMES, ci_text, count, coverage, markdown_page, table
from kvpages.schema.ranks import CONTENTION_COLUMNS, CONTENTION_CSV
from kvpages.schema.reader import Run
from kvpages.schema.rows import NOISY_CSV, PARTIAL, RATIO_COLUMNS, RATIOS_CSV, SCENARIO_RATIO_COLUMNS, SCENARIO_RATIOS_CSV
from kvpages.schema.writer import table_text

APPENDIX_MD = "APPENDIX.md"
STABILITY_SAID = {FRAGILE: "; **fragile**: another verdict without one of its processes (see Method)",
                  DISTURBED: "; **disturbed**: more than a minority of its processes stand apart (see Method)"}
NOISY_COLUMNS = ("variant", "dtype", "layout", "seq_len", "page_size", "rep_spread", "median_us")

def method_text(analysis: Analysis) -> str:
    """How the run was timed and judged; the family sizes are the run's own."""
    families = f"{len(analysis.ratios)} ratios per call and {len(analysis.scenario_ratios)} scenario ratios"
    return (
        "Each (variant, point) was timed in R repetitions (a timed block of rounds each), dealt to P fresh processes that ran "
        "one after another (repetition r in process r % P: a process's address-space layout, allocator state and code "
        "placement are fixed for its life), the point's variants back to back in a fresh seeded order per repetition "
        "(samples.csv: `repetition`, `order`, `process`), so drift hits them alike. **One estimator everywhere** "
        "(`kvpages.core.estimator.paired_ratio`): a variant's time is the geometric mean of its per-repetition block "
        "medians; a ratio is the ratio of the two printed times, which is also the mean of the paired per-repetition "
        "log-ratios, so drift shared by a repetition cancels; its interval is the percentile interval of that same "
        "statistic over a two-stage bootstrap of (process, repetition) pairs (Kalibera and Jones, ISMM 2013), drawn "
        "alike for both variants and widened for few processes (expanded percentile, Student's t); each chart band "
        "is the variant's own interval from the same resamples. **Verdicts** (`kvpages.analysis.verdicts.judge`): "
        "*faster* or *slower* only when the interval excludes 1, the effect reaches the run's minimum effect, and the "
        f"comparison survives the Benjamini-Hochberg step at a false-discovery rate of {FDR:.0%} over its family "
        f"({families}), p-values from the same bootstrap; *same*: the whole interval within the minimum effect either "
        f"side of 1; *unclear*: neither shown (an effect beyond it whose interval reaches 1 or which the correction "
        f"drops, an interval reaching past it, or no interval). {holm_sentence(len(analysis.ratios))} "
        f"**Efficiency**: {efficiency(analysis)} (meta.json `timing`: each phase summed over the processes)."
    )


def environment_paragraph(run: Run) -> str:
    if run.meta is None:
        return f"Run {run.run_id} on {run.device_name}; no meta.json beside the CSV, so the environment is unknown."
    m, e = run.meta, run.meta.environment
    cuda = ""
    if e.device == "cuda":
        loaded = f", under load {e.pcie_link_loaded}" if e.pcie_link_loaded else ""
        loaded += f", SM clock under load {e.sm_clock_mhz_loaded} MHz" if e.sm_clock_mhz_loaded else ""
        cuda = f", CUDA {e.cuda_version}, driver {e.driver_version}, PCIe {e.pcie_link}{loaded}"
    git = f"commit {e.git_commit[:12]}{' (dirty tree)' if e.git_dirty else ''}" if e.git_commit else "no git checkout"
    return (
        f"Run `{m.run_id}` measured on **{e.device}** ({e.device_name}{cuda})"
        f"{f' on host {e.hostname}' if e.hostname else ''}; CPU {e.cpu_model}{f' ({e.cpu_id})' if e.cpu_id else ''}, "
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
    same = sum(r.verdict == "same" for r in analysis.ratios)
    return (
        f"Block medians of one (variant, point) vary between repetitions by {n.median_spread:.1%} (median over rows; "
        f"at most {percent_up(n.max_spread)}; every process pooled). A ratio's {coverage(analysis)} reaches "
        f"±{n.median_ci_half_width:.1%} of the ratio at the median point: that is this run's noise floor, and its "
        f"**minimum effect is {percent(n.min_effect)}** (the noise floor, at least {MIN_EFFECT_FLOOR:.0%}); {same} of "
        f"{len(analysis.ratios)} ratios are *same* within it. By level: {components_text(n)}. Compare runs with "
        "`kvpages compare`, which gates on ratios."
    )


def caveats(analysis: Analysis) -> list[str]:
    run = analysis.run
    out = []
    if not run.link_crossed:
        out.append("CPU run: no PCIe link was crossed. `.cpu()` is a no-op here, so every latency is host-side work "
                   "(numpy, dispatch, the device-side ops run on the CPU), not a transfer; the bytes are what each "
                   "variant hands to the host. Transfer costs need a CUDA run (or the link model, a model).")
    if run.meta is not None and not run.meta.completed:
        out.append(f"The run did not complete: {run.meta.end_note}.")
    partial = run.rows[run.rows["status"] == PARTIAL]
    if not partial.empty:
        out.append(f"{len(partial)} row(s) are partial: the run was interrupted after some of their repetitions "
                   "(`repetitions` says how many). A ratio whose rows hold different repetitions, or fewer processes "
                   "than the interval needs, has an unknown interval.")
    ok = run.ok_rows()
    noisy = ok[ok["rep_spread"] >= NOISY_SPREAD]
    if not noisy.empty:
        out.append(f"{len(noisy)} of {len(ok)} rows are noisy (block medians vary by >= {NOISY_SPREAD:.0%} between "
                   f"repetitions); the 90th percentile of that spread over all rows is "
                   f"{ok['rep_spread'].quantile(0.9):.0%}. The list is `{NOISY_CSV}`.")
    for status in ("skipped", "out_of_memory", "mismatch"):
        rows = run.rows[run.rows["status"] == status]
        for (variant, note), group in rows.groupby(["variant", "note"]):
            out.append(f"{variant}: {len(group)} point(s) {status.replace('_', ' ')}: {note}")
    return out


def findings_section(analysis: Analysis, gpu: GpuAnswer | None = None) -> str:
    rows: list[list[object]] = [[f.question, f.answer, f.figure, f"`{f.id}`" if f.id != "-" else "-",
                                 f.status + (STABILITY_SAID.get(analysis.stability_of(f.id), "") if f.timed else "")]
                                for f in findings(analysis, gpu)]
    model = ("" if analysis.run.link_crossed else "On this CPU run no link was crossed: a time figure is the model's "
             "predicted ratio per link profile (see The link model), and the measured host-side work is evidence. In "
             f"brackets: the ratio's range when the assumed terms (launch, kernel, sync, fixed cost per copy) move to "
             f"their bounds ({SCALES[0]:g}-{SCALES[1]:g}x, or a fitted profile's intervals), one at a time and all "
             "together (which variation gives each end: APPENDIX.md). ")
    if gpu is not None:
        model += (f"Beside each prediction, the figure {gpu.machine} measured at the same row id in run `{gpu.run_id}` "
                  "(results/ holds it; `--gpu-run` names another); an id only that run has is cited there "
                  f"(`kvpages cite results/{gpu.run_id} <id>`). ")
        if any(OUTSIDE in f.status for f in findings(analysis, gpu)):
            model += (f"A status '{OUTSIDE} P' says that measured figure's interval lies wholly outside what the "
                      "fitted profile P predicts even at its terms' bounds: the model does not carry over there, most "
                      "likely because the host work it adds is this CPU's, not that box's (the link model per row: "
                      "APPENDIX.md). ")
    return (f"{model}Measured ratios are variant / {called(analysis.baseline)} with their {coverage(analysis)} (see "
            "Method); each id is a row of "
            f"`{RATIOS_CSV}` (`r-...`), `scenarios.csv` / `{SCENARIO_RATIOS_CSV}` (`req-...`, `step-...`) or "
            f"`{RECOMMENDATIONS_CSV}` (`rec-...`: a candidate against what it would replace, as its finding sets it); "
            "`kvpages cite <run> <id>` prints it in one line with its command.\n\n"
            + table(["question", "answer", "figure", "row id", "status"], rows))


def results_section(analysis: Analysis) -> str:
    b = called(analysis.baseline)
    header = ["seq_len", f"{b} bytes", "merged PR bytes", "bytes ratio", f"{b} µs", "merged PR µs", "time ratio",
              coverage(analysis), "verdict", "fastest (≈: tied)", "id"]
    parts = []
    for (dtype, layout, page_size), _ in groups(analysis):
        rows = [[r.seq_len, count(r.baseline_d2h_bytes), count(r.variant_d2h_bytes), fraction(r.bytes_ratio),
                 sig(r.baseline_median_us), sig(r.variant_median_us), sig(r.ratio), ci_text(r),
                 verdict_text(r.verdict, r.stability),
                 " ≈ ".join(analysis.fastest.get((dtype, layout, page_size, r.seq_len), ())), f"`{r.id}`"]
                for r in analysis.ratios_of(CANDIDATE) if (r.dtype, r.layout, r.page_size) == (dtype, layout, page_size)]
        if rows:
            parts.append(f"### page_size {page_size} ({dtype}, {layout})\n\n{table(header, rows)}")
    return "\n\n".join(parts) if parts else f"No point has both {analysis.baseline} and {CANDIDATE} timed."


def crossover_section(analysis: Analysis) -> str:
    if not analysis.crossovers:
        return "No crossover can be computed: no point has both variants timed."
    rows = [[c.page_size, c.dtype, c.layout, c.describe()] for c in analysis.crossovers]
    return (f"Smallest swept seq_len at which the merged PR is judged *faster* than {called(analysis.baseline)} (interval below 1, "
            f"beyond the {percent(analysis.noise.min_effect)} minimum effect, kept by the family correction).\n\n"
            + table(["page_size", "dtype", "layout", "crossover"], rows))


def scenario_main(analysis: Analysis) -> str:
    """One line per whole request or step: pre-PR against the merged PR, bytes and time, with the row ids."""
    frame = analysis.run.scenarios
    if frame is None or frame.empty:
        return ""
    ok = frame[(frame["status"] == "ok") & (frame["variant"] == STEP_CANDIDATE)]
    base = frame[frame["variant"] == analysis.scenario_baseline].set_index("scenario")
    rows = []
    for _, r in ok.sort_values(["kind", "side", "page_size", "busy_us", "requests", "tokens"]).iterrows():
        b = {**base.loc[r["scenario"]].to_dict(), "scenario": r["scenario"]}
        size = f"{r['tokens']} tokens" if r["kind"] == "request" else f"{r['requests']} requests"
        size += "" if r["payloads"] == DEFAULT_PAYLOADS else f", payloads {r['payloads']}"  # kvpages.core.payloads
        rows.append([r["kind"], r["side"], r["page_size"], size, f"{count(b['d2h_bytes'])} → {count(r['d2h_bytes'])}",
                     f"{sig(analysis.scenario_time(b))} → {sig(analysis.scenario_time(r))}",
                     ratio_cell(analysis, r["scenario"], STEP_CANDIDATE, "blocked"), f"`{r['id']}`"])
    what = "blocked = ready µs" if same_latencies(analysis) else "blocked µs"
    lead = (f"Measured over whole requests (every call, prefill chunks of the chunk size; decode one call and "
            f"`.astype(np.int32)`) and whole steps (a step's requests), never multiplied from points: "
            f"`{STEP_CANDIDATE}` ({label(CANDIDATE)}) against `{analysis.scenario_baseline}` "
            f"({label(per_request_of(analysis.scenario_baseline) or BASELINE)}). "
            "Every step variant, ready times and the batched hypotheses: APPENDIX.md, \"Every step variant, per "
            "request and per step\".")
    if same_latencies(analysis):
        lead += (" On this CPU run blocked equals ready for every row (no device queue, no worker-thread wait), so "
                 "they are one column.")
    named = called(analysis.scenario_baseline)
    return lead + "\n\n" + table(["kind", "side", "page_size", "size", f"bytes {named} → PR", f"{what} {named} → PR",
                                  f"ratio [{coverage(analysis)}] verdict", "id"], rows)


def charts_section(analysis: Analysis) -> str:
    order = ("bytes", "link_model", "latency", "ratio", "scenario_requests", "scenario_steps", "scenario_busy")
    charts = sorted((p.name for p in analysis.run.path.glob("*.png")),  # the questions' order
                    key=lambda n: (next((i for i, o in enumerate(order) if n.startswith(o)), len(order)), n))
    return "\n\n".join(f"![{name}]({name})\n*{caption(analysis, name)}*" for name in charts)


def render(analysis: Analysis, gpu: GpuAnswer | None = None) -> str:
    run = analysis.run
    if run.ranks is not None:
        return render_ranks(analysis, environment_paragraph(run))
    command = run.meta.command if run.meta else "(unknown: no meta.json)"
    where = "CPU run: no link crossed" if not run.link_crossed else "CUDA run"
    names = NAMES
    if analysis.baseline != BASELINE:
        names += f" **Baseline** (--kv-baseline): `{analysis.baseline}`; every ratio is against it."
    word = "host-side work (no transfer)" if not run.link_crossed else "time"
    time_goes = breakdown_summary(analysis)  # a few lines beside the chart; the table is in the appendix
    return markdown_page(f"# kvpages report: {run.run_id} ({run.device_name}; {where})\n\n{names}", [
        ("## Findings", findings_section(analysis, gpu)),
        ("## What to do", what_to_do(analysis, gpu)),
        ("## Charts", charts_section(analysis)),
        (f"## Evidence\n\n### Per call: merged PR vs {called(analysis.baseline)}, {word}",
         per_call_table(analysis) + "\n\n### Crossover\n\n" + crossover_table(analysis)),
        ("### Per request and per step", scenario_table(analysis)),
        ("### A hybrid model's payloads", hybrid_table(analysis)),
        ("### Where the time goes",
         time_goes and f"{time_goes} The table is in [{APPENDIX_MD}]({APPENDIX_MD}#where-the-time-goes)."),
        ("### The link model", model_section(analysis)),
        ("## Method and caveats", method_text(analysis) + "\n\n" + stability_paragraph(analysis)
         + remeasure_paragraph(analysis) + noise_paragraph(analysis) + "\n\n"
         + ("\n".join(f"- {c}" for c in caveats(analysis)) or "- no caveats")),
        ("## Environment and reproduce", environment_paragraph(run) + f"\n\n```\n{command}\n```\n\nEach row of "
         f"`results.csv` re-runs one variant (`repro`); each row of `{RATIOS_CSV}` and `{SCENARIO_RATIOS_CSV}` re-runs "
         f"its pair, interleaved as in the run. Every table in full: [{APPENDIX_MD}]({APPENDIX_MD})."),
    ])


def render_appendix(analysis: Analysis, gpu: GpuAnswer | None = None) -> str:
    """APPENDIX.md: the long tables the report links to (`gpu`: the report's, whose findings it cites)."""
    base = called(analysis.baseline)
    return markdown_page(f"# Appendix to [{REPORT_MD}]({REPORT_MD}): run {analysis.run.run_id}", [
        (f"## Merged PR vs {base} at every point", "Fastest: the lowest time at the point, and every variant not "
         "judged slower than it.\n\n" + results_section(analysis)),
        ("## Measured crossover", crossover_section(analysis)),
        ("## Per request and per step: the merged PR", scenario_main(analysis)),
        ("## Host mirror", floor_section(analysis)),
        ("## Processes left out", left_out_section(analysis)),
        ("## Where the time goes", breakdown_section(analysis)),
        (f"## The other variants vs {base}", "`spread`: how much the row's block medians vary between repetitions "
         "(results.csv `rep_spread`).\n\n" + variants_section(analysis)),
        ("## Predictions behind the findings", predictions_section(analysis, gpu)),
        ("## Link model per row", link_model_section(analysis)),
        ("## Every step variant, per request and per step", scenarios_section(analysis)),
    ])


def report_files(analysis: Analysis, gpu: GpuAnswer | None = None) -> Files:
    """Every file `write_report` writes, as (name, text), REPORT.md last."""
    run = analysis.run
    files = [(RATIOS_CSV, table_text(RATIO_COLUMNS, analysis.ratios)),
             (SCENARIO_RATIOS_CSV, table_text(SCENARIO_RATIO_COLUMNS, [r.row() for r in analysis.scenario_ratios]))]
    if run.ranks is not None:
        files.append((CONTENTION_CSV, table_text(CONTENTION_COLUMNS, list(analysis.contention))))
    ok = run.ok_rows()
    noisy = ok[ok["rep_spread"] >= NOISY_SPREAD].sort_values("rep_spread", ascending=False)
    files.append((NOISY_CSV, table_text(NOISY_COLUMNS, noisy[list(NOISY_COLUMNS)].to_dict("records"))))
    if run.ranks is None:
        files.append((APPENDIX_MD, render_appendix(analysis, gpu)))
    recommended = recommendations_text(analysis)
    if recommended is not None:
        files.append((RECOMMENDATIONS_CSV, recommended))
    return (*files, (REPORT_MD, render(analysis, gpu)))


def made_report(analysis: Analysis, gpu: GpuAnswer | None = None) -> Files:
    """`report_files`, made once per run, GPU answer and charts in the folder (the report links the charts there), and
    kept with the analysis (kvpages.analysis.cache): a report on a folder that did not change writes what the last one
    made (an answer not kept: made afresh)."""
    charts = charts_in(analysis.run.path)
    return on_answer(analysis.run, ("report files", analysis.baseline, charts), gpu, lambda: report_files(analysis, gpu))


def write_report(analysis: Analysis, gpu: GpuAnswer | None = None) -> Path:
    """Write ratios.csv, scenario_ratios.csv, recommendations.csv, noisy.csv, APPENDIX.md and REPORT.md into the run
    folder (a multi-rank run: contention.csv, and no appendix; `gpu`: a CPU run's GPU answer,
    kvpages.analysis.gpu_answer), as `made_report` made them; return the report's path."""
    return write_files(analysis.run.path, made_report(analysis, gpu))
