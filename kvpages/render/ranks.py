"""The report and summary of a multi-rank run (kvpages.measure.ranks): what a step pays when every rank converts
at once, against the same ranks converting alone in turn in the same run (no torch)."""

from __future__ import annotations

from pathlib import Path

from kvpages.analysis.cite import coverage_text, sig
from kvpages.analysis.ratios import Analysis
from kvpages.core.names import label
from kvpages.render.style import legend_label, style
from kvpages.render.text import ci_text, markdown_page, table
from kvpages.schema.ranks import CONTENTION_CSV, ContentionRow

CONTENTION_CHART = "contention"

METHOD = (
    "torchrun started one pytest session per rank, each on its own device, joined in one gloo process group "
    "(host-side: no collective kernel runs on a timed device). Every rank ran the same blocks in the same order. "
    "Each timed round starts together: the ranks of a host meet at a spin barrier in shared memory, which "
    "releases them within microseconds (ranks on several hosts: gloo's barrier). The rounds run in cycles: each "
    "rank converts alone in turn while the others wait (the turn starting one rank later in each cycle), then every "
    "rank converts at once. Per cycle, the step at "
    "once costs the maximum over the ranks of their at-once rounds (a scheduler step waits for its slowest rank), "
    "and the step alone the maximum over the ranks of their alone rounds of the same cycle. Both are a maximum "
    "over the same ranks, so neither the maximum-of-N bias nor a rank that is always slower reads as contention: "
    "the contention is 1 when the ranks do not slow each other down. Each repetition's timed block is summarised by its "
    "median; the figures printed are the medians of those over the repetitions, and the contention is their ratio, "
    "with the percentile interval of a bootstrap over the repetitions, each drawn with its at-once and alone "
    "medians together (`kvpages.analysis.contention`: when at-once and alone rounds come from one distribution it "
    "contains 1 at its nominal rate, measured by simulation). It covers what varies within this run's process, "
    "not what a rerun in fresh processes adds. Each rank's own at-once / alone ratio is formed the same way. "
    "`skew`: per round, the last rank's start minus the first's (median), what 'at once' achieved."
)


def _level(rows: list[ContentionRow]) -> str:
    return ", ".join(sorted({coverage_text(c.confidence) for c in rows}))


def contention_table(analysis: Analysis) -> str:
    """The step's contention per (scenario, step variant), ready latency."""
    found = [c for c in analysis.contention if c.latency == "ready" and c.rank is None]
    rows = [[c.scenario, f"`{c.variant}`", c.world_size, sig(c.alone_median_us), sig(c.at_once_median_us),
             f"{c.ratio:.3f}", ci_text(c), "" if c.skew_median_us is None else sig(c.skew_median_us), f"`{c.id}`"]
            for c in found]
    return table(["scenario", "step variant", "ranks", "step alone µs (max over ranks)",
                  "step at once µs (max over ranks)", "contention", f"{_level(found)} interval", "skew µs", "id"], rows)


def per_rank_table(analysis: Analysis) -> str:
    """Each rank's own at-once / alone ratio per (scenario, step variant), ready latency."""
    found = [c for c in analysis.contention if c.latency == "ready" and c.rank is not None]
    rows = [[c.scenario, f"`{c.variant}`", f"rank {c.rank}", sig(c.alone_median_us), sig(c.at_once_median_us),
             f"{c.ratio:.3f}", ci_text(c), f"`{c.id}`"] for c in found]
    return table(["scenario", "step variant", "rank", "alone µs", "at once µs", "at once / alone",
                  f"{_level(found)} interval", "id"], rows)


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
    chart = (f"\n\n![{CONTENTION_CHART}.png]({CONTENTION_CHART}.png)\n\n*Each step variant's contention (ready "
             "latency, the step at once over the step alone) against B, per page size, with its interval, and each "
             "rank's own at-once / alone ratio (hollow); 1 = the ranks cost each other nothing.*"
             if (run.path / f"{CONTENTION_CHART}.png").exists() else "")
    return markdown_page(f"# kvpages report: {run.run_id} ({size} ranks at once)", [
        (f"## Findings: what a scheduler step pays when {size} ranks convert at once", "Ready latency (the page "
         "indices on the host), per step: the step with each rank converting alone in turn, the step with every rank "
         "converting at once (each the maximum over the ranks, per cycle of rounds), and their ratio "
         f"(`{CONTENTION_CSV}`; blocked latency there too). Above 1: the ranks slow each other down."
         + (" CPU run: the ranks share the host's cores and memory, no link was crossed." if cpu else "")
         + "\n\n" + contention_table(analysis) + chart),
        ("## Per rank", "Ready latency of each rank's own calls, alone and when every rank converted at once, and "
         f"their ratio (`{CONTENTION_CSV}`).\n\n" + per_rank_table(analysis)),
        ("## Method", METHOD),
        ("## Caveats", "\n".join(skipped) or "- none"),
        ("## Environment", f"Process group: {group.backend if group else '?'}, timeout "
         f"{group.timeout_s if group else '?'} s; {devices}. " + environment),
        ("## Reproduce", f"```\n{meta.command if meta else ''}\n```\n\nEach row of `ranks.csv` and "
         f"`{CONTENTION_CSV}` re-runs its case (`repro`)."),
    ])


def contention_summary(analysis: Analysis) -> list[str]:
    """Terminal lines: the contention of each (scenario, step variant), ready latency."""
    steps = [c for c in analysis.contention if c.latency == "ready" and c.rank is None]
    if not steps:
        return []
    lines = [f"{steps[0].world_size} ranks at once (ready µs per step, each the maximum over the ranks; contention = "
             "the step at once over the step with each rank alone, with its interval):"]
    lines += [f"  {c.scenario}  {label(c.variant)}: alone {sig(c.alone_median_us)}, at once {sig(c.at_once_median_us)}, "
              f"contention {c.ratio:.3f} {ci_text(c)}" for c in steps]
    return lines


def plot_contention(analysis: Analysis, out_dir: Path, formats: tuple[str, ...]) -> list[Path]:
    """contention.png: per page size, each step variant's contention (ready) against B with its interval, and each
    rank's own at-once / alone ratio (hollow, no interval)."""
    rows = [c for c in analysis.contention if c.latency == "ready"]
    frame = analysis.run.ranks
    steps = [c for c in rows if c.rank is None]
    if not steps or frame is None:
        return []
    from matplotlib.lines import Line2D

    from kvpages.render.figures import new_figure, save, set_title

    shape = {str(s): (int(b), int(p)) for s, b, p in  # per step scenario: (requests B, page size)
             zip(frame["scenario"], frame["requests"], frame["page_size"], strict=True)}
    pages = sorted({shape[c.scenario][1] for c in steps})
    variants = list(dict.fromkeys(c.variant for c in steps))
    legend_in = 4.6
    fig = new_figure(4.2 * len(pages) + legend_in, 3.8)
    batches = sorted({shape[c.scenario][0] for c in steps})
    axes = fig.subplots(1, len(pages), squeeze=False, sharey=True)[0]
    for ax, page in zip(axes, pages, strict=True):
        for k, v in enumerate(variants):
            look = style(v)
            here = sorted((c for c in rows if c.variant == v and shape[c.scenario][1] == page),
                          key=lambda c: shape[c.scenario][0])
            x = {c.scenario: shape[c.scenario][0] * (1 + 0.04 * (k - len(variants) / 2)) for c in here}  # side by side
            at = [c for c in here if c.rank is None]
            ax.errorbar([x[c.scenario] for c in at], [c.ratio for c in at],
                        yerr=[[c.ratio - c.ci_low for c in at], [c.ci_high - c.ratio for c in at]],
                        color=look.color, marker=look.marker, ls="none", ms=5, capsize=2, label=legend_label(v))
            ranks = [c for c in here if c.rank is not None]
            ax.plot([x[c.scenario] for c in ranks], [c.ratio for c in ranks], ls="none", marker=look.marker, ms=4,
                    mfc="none", mec=look.color, mew=0.7)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlim(batches[0] / 1.6, batches[-1] * 1.6)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.set(xlabel="requests per step B", ylabel="at once / alone (ready)")
        set_title(ax, f"decode step, page_size={page}")
    size = steps[0].world_size
    handles, labels = axes[0].get_legend_handles_labels()
    handles.append(Line2D([], [], color="grey", marker="o", mfc="none", ls="none", ms=4))
    labels.append("each rank's own at once / alone")
    fig.legend(handles, labels, loc="center right", fontsize=7,
               title=f"step at once / step alone ({_level(steps)} interval)", title_fontsize=7)
    fig.suptitle(f"{analysis.run.run_id}: {size} ranks converting at once, against each converting alone in turn",
                 fontsize=10)
    fig.subplots_adjust(left=0.07, right=1 - legend_in / (4.2 * len(pages) + legend_in) - 0.01, bottom=0.14,
                        top=0.85, wspace=0.08)
    return save(fig, out_dir / CONTENTION_CHART, formats)
