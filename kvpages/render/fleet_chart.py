"""The fleet chart: every point's ratio to pre-PR, per machine, as a dot with its interval (no torch); a row of
panels per variant (and dtype, layout), a panel per page size; CHART_CAPTION says the rest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.lines import Line2D

from kvpages.analysis.fleet import Fleet, point_order
from kvpages.analysis.verdicts import FASTER, SLOWER
from kvpages.core.names import BASELINE
from kvpages.render.figures import log_y, new_figure, savefig
from kvpages.render.style import style

CHART_PNG = "fleet_ratios.png"
CHART_CAPTION = ("Each point's time ratio to pre-PR on every machine (one colour each, side by side at each length): "
                 "the dot is the ratio, the bar its interval; filled where that machine's verdict is faster or slower, "
                 "hollow where it is same or unclear. The dashed line is 1. Only points every machine timed are drawn.")
MACHINE_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
                  "#7f7f7f")
"""One colour per machine, in member order (repeating beyond ten machines)."""
SPAN = 0.72
"""The share of one length's slot that its machines' dots spread over."""


def plot_fleet(fleet: Fleet, path: Path) -> Path:
    """Write the chart to `path` (PNG) and return it."""
    keys = sorted((m.key for m in fleet.ratios), key=point_order)
    rows = list(dict.fromkeys((variant, baseline, dtype, layout) for variant, baseline, dtype, layout, _, _ in keys))
    page_sizes = sorted({k[5] for k in keys}) or [0]
    seq_lens = sorted({k[4] for k in keys})
    several = len({(dtype, layout) for _, _, dtype, layout in rows}) > 1
    legend_in = 0.3 + 0.2 * -(-(len(fleet.members) + 3) // 2)
    width, height = 3.1 * len(page_sizes) + 1.3, 2.3 * max(1, len(rows)) + legend_in + 1.0
    fig = new_figure(width, height)
    grid = fig.subplots(max(1, len(rows)), len(page_sizes), squeeze=False, sharey="row")
    fig.subplots_adjust(left=1.1 / width, right=1 - 0.2 / width, bottom=0.6 / height, top=1 - (legend_in + 0.5) / height,
                        wspace=0.08, hspace=0.35)
    fig.suptitle(f"Time ratio to pre-PR per point, per machine: {len(fleet.members)} machines, {fleet.run_count} runs",
                 fontsize=10, y=1 - 0.15 / height)
    handles = [Line2D([], [], color=MACHINE_COLORS[i % len(MACHINE_COLORS)], marker="o", ls="-", label=m.label)
               for i, m in enumerate(fleet.members)]
    handles += [Line2D([], [], color="black", marker="o", ls="none", label="faster / slower (that machine's verdict)"),
                Line2D([], [], color="black", marker="o", mfc="white", ls="none", label="same / unclear"),
                Line2D([], [], color="black", ls="--", lw=0.8, label=f"1: as fast as {BASELINE} (pre-PR)")]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.4 / height), ncol=2, fontsize=7,
               frameon=False)
    if not rows:
        grid[0][0].text(0.5, 0.5, "no ratio is on every machine (FLEET.md lists them)", ha="center", va="center")
        grid[0][0].set_axis_off()
    by_key = {m.key: m for m in fleet.ratios}
    offsets = (np.arange(len(fleet.members)) - (len(fleet.members) - 1) / 2) * SPAN / max(1, len(fleet.members))
    for i, (variant, baseline, dtype, layout) in enumerate(rows):
        marker = style(variant).marker.replace(".", "o")  # a point marker is too small to show hollow from filled
        for j, page_size in enumerate(page_sizes):
            ax = grid[i][j]
            ax.axhline(1.0, color="black", lw=0.8, ls="--", zorder=1)
            at = [(x, by_key[key]) for x, seq_len in enumerate(seq_lens)
                  if (key := (variant, baseline, dtype, layout, seq_len, page_size)) in by_key]
            if not at:
                ax.text(0.5, 0.5, "not on every machine\n(FLEET.md lists it)", transform=ax.transAxes, ha="center",
                        va="center", fontsize=7, color="gray")
            # One artist per machine for its bars and one per kind of dot (filled, hollow), not one per bar and dot:
            # a two-machine fleet of the reference run, 0.82-0.87 -> 0.67-0.69 s a chart (medians of 5, alternating
            # 3 times, 2026-12-05), the PNG byte-identical.
            for k, offset in enumerate(offsets):
                color = MACHINE_COLORS[k % len(MACHINE_COLORS)]
                rows_k = [(x + offset, matched.rows[k]) for x, matched in at]
                bars = [(x, r) for x, r in rows_k if np.isfinite(r.ci_high)]
                if bars:
                    ax.vlines([x for x, _ in bars], [r.ci_low for _, r in bars], [r.ci_high for _, r in bars],
                              color=color, lw=1.2, zorder=2, capstyle="projecting")
                for filled in (True, False):
                    dots = [(x, r.ratio) for x, r in rows_k if (r.verdict in (FASTER, SLOWER)) == filled]
                    if dots:
                        ax.plot([x for x, _ in dots], [y for _, y in dots], ls="none", marker=marker, ms=4.5,
                                color=color, zorder=3, mfc=color if filled else "white")
            log_y(ax)
            ax.tick_params(axis="y", which="both", labelsize=7)
            ax.grid(True, axis="y", which="both", alpha=0.25)
            ax.set_xticks(range(len(seq_lens)), [f"{s // 1024}K" if s >= 1024 and s % 1024 == 0 else str(s)
                                                 for s in seq_lens], fontsize=7)
            ax.set_xlim(-0.6, len(seq_lens) - 0.4)
            if i == 0:
                ax.set_title(f"page_size={page_size}", fontsize=9)
            if i == len(rows) - 1:
                ax.set_xlabel("seq_len (tokens)", fontsize=8)
        where = f"\n{dtype} {layout}" if several else ""
        vs = "" if baseline == BASELINE else f" / {baseline}"
        grid[i][0].set_ylabel(f"{variant}{vs}{where}", fontsize=8)
    savefig(fig, path)
    return path
