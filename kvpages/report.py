"""The design-review report: `REPORT.md` in the run folder, every number from that run's files (no torch)."""

from __future__ import annotations

from pathlib import Path

from kvpages.analysis import (
    BASELINE, CANDIDATE, CONFIDENCE, NOISY_IQR_FRACTION, RatioPoint, Run, crossovers, fastest, ratio_points, variant_order,
    variant_sort_key, with_link_model,
)
from kvpages.links import LINK_PROFILES, profile_for
from kvpages.results import write_atomic

REPORT_MD = "REPORT.md"


def _table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _us(value: float) -> str:
    return f"{value:.3g}" if value >= 100 else f"{value:.2f}"


def _ci(point: RatioPoint) -> str:
    return f"[{point.ci_low:.3f}, {point.ci_high:.3f}]"


def environment_paragraph(run: Run) -> str:
    if run.meta is None:
        return f"Run {run.run_id} on {run.device_name}; no meta.json beside the CSV, so the environment is unknown."
    m, e = run.meta, run.meta.environment
    cuda = f", CUDA {e.cuda_version}, driver {e.driver_version}, PCIe {e.pcie_link}" if e.device == "cuda" else ""
    git = f"commit {e.git_commit[:12]}{' (dirty tree)' if e.git_dirty else ''}" if e.git_commit else "no git checkout"
    return (
        f"Run `{m.run_id}` measured on **{e.device}** ({e.device_name}{cuda}); CPU {e.cpu_model}, "
        f"{e.cpu_count} cores, {e.torch_threads} torch threads; Python {e.python_version}, torch {e.torch_version}, "
        f"numpy {e.numpy_version}, pytest-benchmark {e.pytest_benchmark_version}, kvpages {e.kvpages_version} at {git}. "
        f"Preset `{m.preset}`; started {m.started_utc}, finished {m.finished_utc}; "
        f"{'completed' if m.completed else 'NOT completed'} ({m.end_note}). {e.link_note}"
    )


def caveats(run: Run) -> list[str]:
    out = []
    if not run.link_crossed:
        out.append("This is a CPU run: no PCIe link was crossed. `.cpu()` is a no-op here, so the latencies "
                   "measure only the device-side work and Python overhead; the bytes are what each variant "
                   "would hand across the link. Use the link model or a CUDA run for transfer costs.")
    out.append("Variants are timed one after another, not interleaved, so a slow drift of the machine between "
               "benchmarks is not cancelled out. Differences smaller than the spread between repeated runs "
               "(`kvpages compare A B`) are not evidence.")
    if run.meta is not None and not run.meta.completed:
        out.append(f"The run did not complete: {run.meta.end_note}.")
    ok = run.ok_rows()
    noisy = ok[ok["iqr_us"] >= NOISY_IQR_FRACTION * ok["median_us"]]
    if not noisy.empty:
        listed = ", ".join(f"{r.variant} s{r.seq_len} p{r.page_size} ({r.iqr_us / r.median_us:.0%})"
                           for r in noisy.itertuples())
        out.append(f"Noisy rows (IQR/median >= {NOISY_IQR_FRACTION:.0%}): {listed}.")
    for status in ("skipped", "out_of_memory", "mismatch"):
        rows = run.rows[run.rows["status"] == status]
        for (variant, note), group in rows.groupby(["variant", "note"]):
            out.append(f"{variant}: {len(group)} point(s) {status.replace('_', ' ')}: {note}")
    return out


def results_section(run: Run, points: tuple[RatioPoint, ...]) -> str:
    ok = run.ok_rows()
    parts = []
    for (dtype, layout, page_size), group in ok.groupby(["dtype", "layout", "page_size"], sort=True):
        best = {seq_len: " ≈ ".join(fastest(rows)) for seq_len, rows in group.groupby("seq_len")}
        rows = []
        for p in points:
            if (p.dtype, p.layout, p.page_size) != (dtype, layout, page_size):
                continue
            rows.append([
                p.seq_len, p.baseline_bytes, p.candidate_bytes, f"{p.bytes_ratio:.4g}",
                _us(p.baseline_us), _us(p.candidate_us), f"{p.ratio:.3f}", _ci(p),
                best.get(p.seq_len, ""),
            ])
        if rows:
            header = ["seq_len", f"{BASELINE} B", f"{CANDIDATE} B", "bytes ratio", f"{BASELINE} µs",
                      f"{CANDIDATE} µs", "latency ratio", f"{CONFIDENCE:.0%} CI", "fastest (≈: within noise)"]
            parts.append(f"### page_size {page_size} ({dtype}, {layout})\n\n{_table(header, rows)}")
    return "\n\n".join(parts) if parts else f"No point has both {BASELINE} and {CANDIDATE} timed."


def variants_section(run: Run) -> str:
    """Per page size: every timed variant's bytes and latency against the baseline, the fastest marked."""
    ok = run.ok_rows()
    others = sorted(set(ok["variant"]) - {BASELINE}, key=variant_sort_key)
    ratios = {(v, p.dtype, p.layout, p.page_size, p.seq_len): p for v in others for p in ratio_points(run, BASELINE, v)}
    parts = []
    for (dtype, layout, page_size), group in ok.groupby(["dtype", "layout", "page_size"], sort=True):
        rows = []
        for seq_len, at in group.groupby("seq_len"):
            quickest = fastest(at)
            for _, r in at.sort_values("variant", key=variant_order).iterrows():
                p = ratios.get((r["variant"], dtype, layout, page_size, seq_len))
                bytes_ratio = f"{p.bytes_ratio:.4g}" if p else ("1" if r["variant"] == BASELINE else "")
                latency = f"{p.ratio:.3f}" if p else ("1" if r["variant"] == BASELINE else "")
                ci = _ci(p) if p else ""
                rows.append([seq_len, f"`{r['variant']}`", r["d2h_bytes"], bytes_ratio, _us(r["median_us"]),
                             _us(r["iqr_us"]), latency, ci, "yes" if r["variant"] in quickest else ""])
        header = ["seq_len", "variant", "D2H B", f"bytes / {BASELINE}", "median µs", "IQR µs",
                  f"latency / {BASELINE}", f"{CONFIDENCE:.0%} CI", "fastest"]
        parts.append(f"### page_size {page_size} ({dtype}, {layout})\n\n{_table(header, rows)}")
    return "\n\n".join(parts)


def crossover_section(points: tuple[RatioPoint, ...]) -> str:
    found = crossovers(points)
    if not found:
        return "No crossover can be computed: no point has both variants timed."
    rows = [[c.page_size, c.dtype, c.layout, c.describe()] for c in found]
    return (f"Smallest swept seq_len at which `{CANDIDATE}` beats `{BASELINE}`: the upper end of the "
            f"{CONFIDENCE:.0%} bootstrap CI of the latency ratio is below 1.\n\n"
            + _table(["page_size", "dtype", "layout", "crossover"], rows))


def link_model_section(run: Run) -> str:
    modeled = with_link_model(run.ok_rows())
    modeled = modeled[modeled["variant"].isin([BASELINE, CANDIDATE])]
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
    return f"{lead}\n\n{_table(header, rows)}\n\n{sources}" + model_vs_measurement(run)


def model_vs_measurement(run: Run) -> str:
    """On a run that crossed a link: each row's median beside the model of the link it crossed
    (PCIe generation from meta.json); the difference is what the model leaves out."""
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



def render(run: Run) -> str:
    command = run.meta.command if run.meta else "(unknown: no meta.json)"
    charts = sorted(p.name for p in run.path.glob("*.png"))
    points = ratio_points(run)
    sections = [
        f"# kvpages report: {run.run_id}",
        "## Environment\n\n" + environment_paragraph(run),
        f"## Reproduce\n\n```\n{command}\n```\n\nEach row of `results.csv` carries its own `repro` command.",
        "## Caveats\n\n" + ("\n".join(f"- {c}" for c in caveats(run)) or "- none"),
        f"## {CANDIDATE} vs {BASELINE}\n\nBytes and median latency per call; ratio = {CANDIDATE} / {BASELINE}, "
        f"with the {CONFIDENCE:.0%} bootstrap confidence interval of the ratio of medians from the raw samples.\n\n"
        + results_section(run, points),
        "## Crossover\n\n" + crossover_section(points),
        f"## Every variant vs {BASELINE}\n\n`fastest`: the lowest median, and any variant within the noise of it "
        "(half the larger IQR/median of the two rows).\n\n" + variants_section(run),
        "## Link model\n\n" + link_model_section(run),
    ]
    if charts:
        sections.append("## Charts\n\n" + "\n".join(f"![{name}]({name})" for name in charts))
    return "\n\n".join(sections) + "\n"


def write_report(run: Run) -> Path:
    """Write REPORT.md into the run folder and return its path."""
    path = run.path / REPORT_MD
    write_atomic(path, render(run))
    return path
