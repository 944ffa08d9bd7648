"""The report and summary of a multi-rank run (kvpages.measure.ranks): what a step pays when every rank converts
at once, against rank 0 alone in the same run (no torch)."""

from __future__ import annotations

from pathlib import Path

from kvpages.analysis.cite import coverage_text
from kvpages.analysis.ratios import Analysis
from kvpages.core.names import label
from kvpages.render.style import legend_label, style
from kvpages.render.text import ci_text, table, us
from kvpages.schema.ranks import ALONE, CONTENTION_CSV, RANK

CONTENTION_CHART = "contention"

METHOD = (
    "torchrun started one pytest session per rank, each on its own device, joined in one gloo process group "
    "(host-side: no collective kernel runs on a timed device). Every rank ran the same blocks in the same order. "
    "Each timed round starts together: the ranks of a host meet at a spin barrier in shared memory, which "
    "releases them within microseconds (ranks on several hosts: gloo's barrier), and the rounds "
    "alternate, rank 0 converting alone while the others wait, then every rank at once. The step's cost per "
    "round is the maximum over the ranks, since a scheduler step waits for its slowest rank. The contention of a "
    "(scenario, step variant) is the median of the paired per-repetition ratios of block medians, step over "
    "rank 0 alone (both from the same blocks), with the order-statistic interval of the median over the "
    "repetitions (`interval_unit`): it covers what varies within this run's processes, not what a rerun in "
    "fresh processes adds. `skew`: per round, the last rank's start minus the first's (median), what 'at once' "
    "achieved."
)


def contention_table(analysis: Analysis, latency: str = "ready") -> str:
    rows = [[c.scenario, f"`{c.variant}`", c.world_size, us(c.alone_median_us), us(c.step_median_us),
             f"{c.ratio:.3f}", ci_text(c), "" if c.skew_median_us is None else us(c.skew_median_us), f"`{c.id}`"]
            for c in analysis.contention if c.latency == latency]
    level = {coverage_text(c.confidence) for c in analysis.contention}
    return table(["scenario", "step variant", "ranks", "rank 0 alone µs", "step µs (max over ranks)", "contention",
                  f"{', '.join(sorted(level))} interval", "skew µs", "id"], rows)


def per_rank_table(analysis: Analysis) -> str:
    frame = analysis.run.ranks
    if frame is None:
        return ""
    ok = frame[(frame["status"] == "ok") & frame["role"].isin([RANK, ALONE])]
    rows = [[r["scenario"], f"`{r['variant']}`", "alone" if r["role"] == ALONE else f"rank {r['rank']}", r["device"],
             us(float(r["ready_median_us"])), us(float(r["ready_q1_us"])), us(float(r["ready_q3_us"]))]
            for r in ok.to_dict("records")]
    return table(["scenario", "step variant", "who", "device", "ready median µs", "q1", "q3"], rows)


def render_ranks(analysis: Analysis, environment: str) -> str:
    """REPORT.md of a multi-rank run; `environment`: rank 0's, in words."""
    run, meta = analysis.run, analysis.run.meta
    group = meta.ranks if meta is not None else None
    size = group.world_size if group is not None else "?"
    devices = ", ".join(f"rank {r.rank}: {r.device} ({r.device_name}) on {r.hostname}, pid {r.pid}"
                        for r in (group.ranks if group is not None else ()))
    skipped = [] if run.ranks is None else [
        f"- `{r['variant']}` on {r['scenario']}: {r['status']}: {r['note']}"
        for r in run.ranks[run.ranks["status"] != "ok"].to_dict("records")]
    cpu = run.meta is not None and run.meta.environment.device == "cpu"
    sections = [
        f"# kvpages report: {run.run_id} ({size} ranks at once)",
        f"## Findings: what a scheduler step pays when {size} ranks convert at once\n\nReady latency (the page "
        "indices on the host), per step: rank 0 converting alone, the step with every rank converting at once, and "
        f"their ratio (`{CONTENTION_CSV}`; blocked latency there too). Above 1: the ranks slow each other down."
        + (" CPU run: the ranks share the host's cores and memory, no link was crossed." if cpu else "")
        + "\n\n" + contention_table(analysis),
        *([f"![{CONTENTION_CHART}.png]({CONTENTION_CHART}.png)\n\n*Each step variant's contention (ready latency, the "
            "step over rank 0 alone) against B, per page size, with its interval; 1 = the ranks cost each other "
            "nothing.*"] if (run.path / f"{CONTENTION_CHART}.png").exists() else []),
        "## Per rank\n\nReady latency of each rank's own calls when every rank converted, and of rank 0 alone "
        "(`ranks.csv`).\n\n" + per_rank_table(analysis),
        "## Method\n\n" + METHOD,
        "## Caveats\n\n" + ("\n".join(skipped) or "- none"),
        f"## Environment\n\nProcess group: {group.backend if group else '?'}, timeout "
        f"{group.timeout_s if group else '?'} s; {devices}. " + environment,
        f"## Reproduce\n\n```\n{meta.command if meta else ''}\n```\n\nEach row of `ranks.csv` and "
        f"`{CONTENTION_CSV}` re-runs its case (`repro`).",
    ]
    return "\n\n".join(sections) + "\n"


def contention_summary(analysis: Analysis) -> list[str]:
    """Terminal lines: the contention of each (scenario, step variant), ready latency."""
    if not analysis.contention:
        return []
    lines = [f"{analysis.contention[0].world_size} ranks at once (ready µs per step; contention = step, the maximum "
             "over the ranks, over rank 0 alone, with its interval):"]
    for c in analysis.contention:
        if c.latency == "ready":
            lines.append(f"  {c.scenario}  {label(c.variant)}: alone {us(c.alone_median_us)}, step "
                         f"{us(c.step_median_us)}, contention {c.ratio:.3f} {ci_text(c)}")
    return lines


def plot_contention(analysis: Analysis, out_dir: Path, formats: tuple[str, ...]) -> list[Path]:
    """contention.png: per page size, each step variant's contention (ready; step over rank 0 alone) against B,
    with its interval; 1 = the ranks cost each other nothing."""
    rows = [c for c in analysis.contention if c.latency == "ready"]
    frame = analysis.run.ranks
    if not rows or frame is None:
        return []
    from kvpages.render.figures import new_figure, save, set_title

    shape = {str(s): (int(b), int(p)) for s, b, p in zip(frame["scenario"], frame["requests"], frame["page_size"],
                                                          strict=True)}
    """Per step scenario: (requests B, page size), from ranks.csv."""
    pages = sorted({shape[c.scenario][1] for c in rows})
    variants = list(dict.fromkeys(c.variant for c in rows))
    legend_in = 4.6
    fig = new_figure(4.2 * len(pages) + legend_in, 3.8)
    batches = sorted({shape[c.scenario][0] for c in rows})
    axes = fig.subplots(1, len(pages), squeeze=False, sharey=True)[0]
    for ax, page in zip(axes, pages, strict=True):
        for k, v in enumerate(variants):
            at = sorted(((shape[c.scenario][0], c) for c in rows if c.variant == v and shape[c.scenario][1] == page),
                        key=lambda found: found[0])
            if not at:
                continue
            look = style(v)
            xs = [b * (1 + 0.04 * (k - len(variants) / 2)) for b, _ in at]  # side by side at each B
            ys = [c.ratio for _, c in at]
            ax.errorbar(xs, ys, yerr=[[y - c.ci_low for y, (_, c) in zip(ys, at, strict=True)],
                                      [c.ci_high - y for y, (_, c) in zip(ys, at, strict=True)]],
                        color=look.color, marker=look.marker, ls="none", ms=5, capsize=2, label=legend_label(v))
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlim(batches[0] / 1.6, batches[-1] * 1.6)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.set(xlabel="requests per step B", ylabel="step / rank 0 alone (ready)")
        set_title(ax, f"decode step, page_size={page}")
    size = rows[0].world_size
    coverage = ", ".join(sorted({coverage_text(c.confidence) for c in rows}))
    fig.legend(*axes[0].get_legend_handles_labels(), loc="center right", fontsize=7,
               title=f"step variant ({coverage} interval)", title_fontsize=7)
    fig.suptitle(f"{analysis.run.run_id}: {size} ranks converting at once, against rank 0 alone", fontsize=10)
    fig.subplots_adjust(left=0.07, right=1 - legend_in / (4.2 * len(pages) + legend_in) - 0.01, bottom=0.14,
                        top=0.85, wspace=0.08)
    return save(fig, out_dir / CONTENTION_CHART, formats)
