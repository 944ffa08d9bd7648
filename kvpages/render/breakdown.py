"""Where the time goes: the stacked chart (shares of one call's wall time, kvpages.schema.breakdown.stack) and the
report sections, from breakdown.csv (no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kvpages.analysis.cite import sig
from kvpages.analysis.ratios import Analysis
from kvpages.core.names import BASELINE, CANDIDATE, FLOOR, variant_sort_key
from kvpages.render.text import coverage, table
from kvpages.schema.breakdown import STACK_PARTS, BreakdownRow, shares, stack

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def profiled(rows: tuple[BreakdownRow, ...]) -> str:
    """How the rows were profiled, from the rows themselves (an older run profiled 3 passes of 3 calls)."""
    calls = sorted({r.calls for r in rows})
    return (f"The call of median wall time of {'/'.join(map(str, calls))} profiled calls per case kept, after the "
            "timing: the profiler's overhead inflates every absolute time, so the shares are the result, and the timed "
            "medians above are the times.")
PART_COLORS = ("tab:blue", "tab:orange", "tab:red", "tab:purple", "tab:gray")


def plot_breakdown(analysis: Analysis, out_dir: Path, formats: tuple[str, ...]) -> list[Path]:
    """breakdown_<dtype>_<layout> in each format; nothing for a run without breakdown rows."""
    if not analysis.breakdown:
        return []
    from kvpages.render.figures import save  # matplotlib where a chart is drawn: `kvpages report` needs none

    row = analysis.breakdown[0]
    return save(breakdown_figure(analysis), out_dir / f"breakdown_{row.dtype}_{row.layout}", formats)


def breakdown_figure(analysis: Analysis) -> Figure:
    """The stacked shares, a panel per page size: per panel one collection of every bar's parts (part by part) and,
    as texts, each bar's profiled µs above it and its variant and length under it (not tick labels: 96 tick objects
    were a fifth of the chart's drawing)."""
    rows = analysis.breakdown
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Rectangle
    from matplotlib.transforms import offset_copy

    from kvpages.render.figures import new_figure, set_title

    device, dtype, layout = rows[0].device, rows[0].dtype, rows[0].layout
    parts = STACK_PARTS["cuda" if device == "cuda" else "cpu"]
    page_sizes = sorted({r.page_size for r in rows})
    variants = sorted({r.variant for r in rows}, key=variant_sort_key)
    lengths = {p: sorted({r.seq_len for r in rows if r.page_size == p}) for p in page_sizes}
    width = max(4.5, 0.32 * len(variants) * max(len(v) for v in lengths.values()) + 1.5)
    ncols = min(2, len(page_sizes))
    nrows = -(-len(page_sizes) // ncols)
    total, height = width * ncols + 1.0, 5.4 * nrows + 1.0  # per row: 3 inches of bars, 2.4 of labels and title
    fig = new_figure(total, height)
    grid = fig.subplots(nrows, ncols, squeeze=False)
    fig.subplots_adjust(left=1.0 / total, right=1 - 0.2 / total, bottom=2.0 / height, top=1 - 1.2 / height,
                        wspace=0.15, hspace=2.4 / 3.0)
    for spare in grid.flat[len(page_sizes):]:
        spare.set_visible(False)
    by_key = {(r.variant, r.seq_len, r.page_size): r for r in rows}
    for ax, page_size in zip(grid.flat, page_sizes, strict=False):
        ticks, labels, x = [], [], 0.0
        above = offset_copy(ax.transData, fig=fig, y=2, units="points")  # 2 points above a bar's top
        below = offset_copy(ax.get_xaxis_transform(), fig=fig, y=-3.5, units="points")  # under the axis, as tick labels
        bars: list[list[float]] = []  # per bar: its parts' shares
        for seq_len in lengths[page_size]:
            for v in variants:
                row = by_key.get((v, seq_len, page_size))
                if row is not None:
                    bars.append([share for _, share in shares(row)])
                    ax.text(x, 1.0, sig(row.wall_us), transform=above, ha="center", va="bottom", fontsize=6,
                            rotation=90)
                    ticks.append(x)
                    labels.append(f"{v}  s{seq_len}")
                x += 1
            x += 0.8
        heights = np.array(bars)
        bottoms = np.cumsum(heights, axis=1) - heights
        left, right = np.array(ticks) - 0.4, np.array(ticks) + 0.4  # bars 0.8 wide, centred on their ticks
        boxes = [[(x0, y0), (x0, y1), (x1, y1), (x1, y0)] for k in range(heights.shape[1])
                 for x0, x1, y0, y1 in zip(left, right, bottoms[:, k], bottoms[:, k] + heights[:, k], strict=True)]
        colors = [color for color in PART_COLORS[:heights.shape[1]] for _ in ticks]  # part by part, as `boxes`
        ax.add_collection(PolyCollection(boxes, facecolors=colors, edgecolors="white", linewidths=0.5))
        ax.autoscale_view()  # the x range over the bars, with the margins ax.bar had (matplotlib < 3.11 does not by itself)
        ax.set_xticks([])
        for at, label in zip(ticks, labels, strict=True):
            ax.text(at, 0, label, transform=below, ha="center", va="top", fontsize=6, rotation=90)
        ax.set_ylim(0, 1.25)
        ax.set_yticks(np.linspace(0, 1, 6), [f"{t:.0%}" for t in np.linspace(0, 1, 6)])
        set_title(ax, f"page_size={page_size}", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    for ax in grid[:, 0]:
        ax.set_ylabel("share of one call's wall time")
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in PART_COLORS[:len(parts)]]
    fig.legend(handles, parts, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.55 / height), fontsize=7,
               ncol=len(parts), frameon=False)
    crossed = "" if device == "cuda" else " (CPU run: no PCIe link crossed)"
    fig.suptitle(f"Where the time goes: the median of {max(r.calls for r in rows)} profiled calls (shares; µs per call "
                 "above the bars, "
                 "profiler-inflated)\n"
                 f"{dtype} {layout}{crossed} | {analysis.run.device_name} | run {analysis.run.run_id}", fontsize=9)
    return fig


def breakdown_section(analysis: Analysis) -> str:
    rows = sorted(analysis.breakdown, key=lambda r: (r.page_size, r.seq_len, variant_sort_key(r.variant)))
    if not rows:
        return ""
    cuda = rows[0].device == "cuda"
    parts = [label for label, _ in stack(rows[0])]
    header = ["page_size", "seq_len", "variant", "profiled µs/call"] + parts
    if cuda:
        header += ["GPU kernel µs", "GPU copy µs", "copy bytes", "direction"]
    lines = [[r.page_size, r.seq_len, f"`{r.variant}`", sig(r.wall_us)] + [f"{s:.0%}" for _, s in shares(r)]
             + ([sig(r.kernel_us or 0), sig(r.memcpy_us or 0), r.memcpy_bytes or 0, r.memcpy_direction or "-"]
                if cuda else [])
             for r in rows]
    what = ("On CUDA the wall time splits into the host's wait in synchronize calls and in copies to pageable memory "
            "(with the GPU kernels' and copies' share of it), the CUDA API calls that only queue work (launches, "
            "an asynchronous copy into pinned memory), and host time outside them: Python, numpy "
            "(host_stride's stride and divide on the host), dispatch." if cuda else
            "On this CPU run the wall time splits into the self time of aten copies, of every other aten op "
            "(slicing views, divide, shift), and host time outside aten: Python and numpy (host_stride's stride "
            "and divide on the host).")
    host = [r for r in rows if r.variant == BASELINE and r.seq_len == max(x.seq_len for x in rows)]
    if host:
        listed = ", ".join(f"{sig(r.host_us)} µs ({r.host_us / r.wall_us:.0%}) at page size {r.page_size}"
                           for r in sorted(host, key=lambda r: r.page_size))
        what += (f" `{BASELINE}`'s host time outside {'CUDA calls' if cuda else 'aten'} at {host[0].seq_len} tokens, "
                 f"where its numpy stride and divide run (none at page size 1, which returns early): {listed}.")
    return (f"{profiled(analysis.breakdown)} {what} `breakdown.csv` has every figure, with a stable `id` per row.\n\n"
            + table(header, lines))


def breakdown_summary(analysis: Analysis) -> str:
    """The report's lines beside the breakdown chart: what it shows, and pre-PR's host share at the longest length."""
    rows = analysis.breakdown
    if not rows:
        return ""
    cuda = rows[0].device == "cuda"
    longest = max(r.seq_len for r in rows)
    host = sorted((r for r in rows if r.variant == BASELINE and r.seq_len == longest), key=lambda r: r.page_size)
    listed = ", ".join(f"{r.host_us / r.wall_us:.0%} at p={r.page_size}" for r in host)
    outside = "CUDA calls" if cuda else "aten"
    return (f"Shares of one call's wall time from the profiled passes (the profiler inflates absolute times: the timed "
            f"figures above are the times). `{BASELINE}`'s time outside {outside} (Python and numpy: its stride and "
            f"divide on the host, and at p=1, which strides nothing, the rest of its host side) at L={longest}: "
            f"{listed}.")


def floor_section(analysis: Analysis) -> str:
    """The zero-D2H floor (host_mirror) beside device_stride and host_stride, at up to three points per page size."""
    floor = analysis.floor
    if not floor:
        return ""
    lines = []
    for page_size in sorted({r.page_size for r in floor}):
        at = sorted((r for r in floor if r.page_size == page_size), key=lambda r: r.seq_len)
        for r in sorted({at[0], at[len(at) // 2], at[-1]}, key=lambda r: r.seq_len):
            candidate = analysis.ratio_at(CANDIDATE, r.dtype, r.layout, r.page_size, r.seq_len)
            lines.append([page_size, r.seq_len,
                          sig(candidate.variant_median_us) if candidate else "", sig(r.baseline_median_us),
                          sig(r.variant_median_us), f"{sig(r.ratio)} [{sig(r.ci_low)}, {sig(r.ci_high)}]"])
    header = ["page_size", "seq_len", f"{CANDIDATE} µs", f"{BASELINE} µs", f"{FLOOR} µs",
              f"{FLOOR} / {BASELINE} [{coverage(analysis)}]"]
    return (f"`{FLOOR}` reads the page indices from a host-side page table (as vLLM's and TensorRT-LLM's schedulers "
            "do) and moves 0 D2H bytes in 0 transfers: what no copy at all would cost per call (a grey dotted line in the "
            "per-call charts). Keeping such a table is not free: in whole requests and "
            f"steps, `per_request[{FLOOR}]` adds its upkeep, one batched D2H per step of the pages allocated in it "
            "(see Per request and per step).\n\n" + table(header, lines))
