"""Charts of a run, regenerated from its files alone (no torch): `plot_run` writes the per-point charts per (dtype,
layout) (`CHARTS`), then the scenario, breakdown and contention charts; kvpages.render.captions says what each shows."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.patches import Rectangle

from kvpages.analysis.cite import percent, sig
from kvpages.analysis.families import Record, records
from kvpages.analysis.predict import point_predictions
from kvpages.analysis.ratios import Analysis
from kvpages.analysis.verdicts import SAME, UNCLEAR
from kvpages.analysis.wording import profile_name
from kvpages.core.names import CANDIDATE, called, variant_sort_key
from kvpages.core.payloads import DEFAULT_PAYLOADS
from kvpages.core.stats import Interval
from kvpages.core.sweep import ITEMSIZE, paged_bytes
from kvpages.render.breakdown import plot_breakdown
from kvpages.render.captions import time_label
from kvpages.render.figures import log_x, log_y, new_figure, powers, save, set_title
from kvpages.render.ranks import plot_contention
from kvpages.render.style import legend_label, style
from kvpages.render.text import coverage
from kvpages.schema.reader import Run
from kvpages.schema.rows import RatioRow


def _variants(frame) -> list[str]:
    return sorted(frame["variant"].unique(), key=variant_sort_key)


def _lines(frame: pd.DataFrame, panel: tuple[str, ...], x: str) -> dict[tuple, list[Record]]:
    """The rows of each line, keyed (values of the `panel` columns, variant), in order of `x` (stable)."""
    lines: dict[tuple, list[Record]] = {}
    for row in sorted(records(frame), key=lambda r: r[x]):
        lines.setdefault((tuple(row[c] for c in panel), row["variant"]), []).append(row)
    return lines


def _panels(n: int, labels=()):
    """A row of `n` panels and room right of them for a legend of `labels` at 7 pt, so it never covers data (0.055 in
    a character of the longest, plus the handle; at least 3.2 in)."""
    legend = max(3.2, 0.055 * max((len(s) for s in labels), default=0) + 0.8)
    total = 4.2 * n + legend
    fig = new_figure(total, 3.6)
    axes = fig.subplots(1, n, squeeze=False)
    fig.subplots_adjust(left=0.9 / total, right=1 - (legend + 0.1) / total, bottom=0.15, top=0.78, wspace=0.3)
    return fig, list(axes[0])


def _finish(fig, axes, legend: str, title: str, stem: Path, formats) -> list[Path]:
    """One legend right of the panels (every panel's entries, once each) titled `legend`, the title, and the files."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(text, handle)
    fig.legend(list(entries.values()), list(entries.keys()), loc="center right", fontsize=7, title=legend,
               title_fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=10)
    return save(fig, stem, formats)


def _own(ax, lines: dict[tuple, list[Record]], panel: tuple, variants: list[str], x: str,
         band: Callable[[Record, str], Interval | None]) -> None:
    """Each variant's times in a panel (markers) inside its own intervals (the band), from the one estimator."""
    for v in variants:
        rows = lines.get((panel, v), [])
        bands = [band(r, v) for r in rows]
        if rows:
            xs, look = [r[x] for r in rows], style(v)
            ax.plot(xs, [b.ratio if b is not None else np.nan for b in bands], ms=4, mfc="none", label=legend_label(v),
                    **look.kwargs())
            low = np.array([b.ci_low if b is not None and b.known else np.nan for b in bands])
            high = np.array([b.ci_high if b is not None and b.known else np.nan for b in bands])
            ax.fill_between(xs, low, high, color=look.color, alpha=0.2, lw=0)


def _log_axes(ax) -> None:
    """Log-log axes with plain tick numbers and no minor ticks on x."""
    log_x(ax)
    ax.xaxis.minorticks_off()
    log_y(ax)
    ax.grid(True, which="both", alpha=0.3)


def _title(run: Run, what: str, dtype: str, layout: str) -> str:
    crossed = "" if run.link_crossed else " (CPU run: no PCIe link crossed)"
    return f"{what}, {dtype} {layout}{crossed}\n{run.device_name} | run {run.run_id}"


def plot_latency(analysis: Analysis, frame, dtype: str, layout: str, stem: Path, formats) -> list[Path]:
    page_sizes = sorted(frame["page_size"].unique())
    variants = _variants(frame)
    fig, axes = _panels(len(page_sizes))
    lines = _lines(frame, ("page_size",), "seq_len")
    for ax, page_size in zip(axes, page_sizes, strict=True):
        _own(ax, lines, (page_size,), variants, "seq_len",
             lambda r, v: analysis.time_band(v, dtype, layout, int(r["page_size"]), int(r["seq_len"])))
        _log_axes(ax)
        set_title(ax, f"page_size={page_size}")
        ax.set(xlabel="seq_len (tokens)", ylabel=f"{time_label(analysis)} per call (µs)")
    return _finish(fig, axes, f"variant (band: its own\n{coverage(analysis)})",
                   _title(analysis.run, f"{time_label(analysis).capitalize()} per call", dtype, layout), stem, formats)


def plot_bytes(analysis: Analysis, frame, dtype: str, layout: str, stem: Path, formats) -> list[Path]:
    page_sizes = sorted(frame["page_size"].unique())
    variants = _variants(frame)
    fig, axes = _panels(len(page_sizes), [legend_label(v) for v in variants])
    lines = _lines(frame, ("page_size",), "seq_len")
    seq = np.array(sorted(frame["seq_len"].unique()))
    for ax, page_size in zip(axes, page_sizes, strict=True):
        for i, v in enumerate(variants):  # hollow markers shrinking in turn, so equal values stay visible
            every = lines.get(((page_size,), v), [])
            rows = [r for r in every if r["d2h_bytes"] > 0]
            if rows:
                ax.plot([r["seq_len"] for r in rows], [r["d2h_bytes"] for r in rows], ms=max(3, 10 - 2 * i), mfc="none",
                        lw=1, label=legend_label(v), **style(v).kwargs())
            zero = [r["seq_len"] for r in every if r["d2h_bytes"] == 0]
            if zero:  # 0 bytes has no place on a log axis: marked on its floor (the axis' lower edge)
                ax.plot(zero, [0.0] * len(zero), ls="none", marker="v", ms=6, color=style(v).color, clip_on=False,
                        transform=ax.get_xaxis_transform(), label=f"{v}: 0 bytes (on the axis floor)")
        ax.plot(seq, paged_bytes(seq, page_size, ITEMSIZE[dtype]), color="black", ls="--", lw=1, zorder=5,
                label="ideal ceil(seq_len/page_size)*itemsize")
        log_x(ax)
        ax.set_yscale("log")
        powers(ax.yaxis)
        ax.set(xlabel="seq_len (tokens)", ylabel="metered D2H bytes per call")
        set_title(ax, f"page_size={page_size}")
        ax.minorticks_off()
        ax.grid(True, which="major", alpha=0.3)
    return _finish(fig, axes, "variant", _title(analysis.run, "Metered D2H bytes", dtype, layout), stem, formats)


RATIO_CAP = 4.0
"""The heatmap's colour scale runs from 1/RATIO_CAP to RATIO_CAP, centred on 1; cells beyond are marked."""


def _cell_text(r: RatioRow) -> str:
    beyond = "▲" if r.ratio > RATIO_CAP else "▼" if r.ratio < 1 / RATIO_CAP else ""
    if r.verdict == SAME:
        return f"{beyond}{sig(r.ratio)} ~"
    if r.verdict == UNCLEAR:
        return f"{beyond}{sig(r.ratio)} ?\n[{sig(r.ci_low)}, {sig(r.ci_high)}]"
    interval = f"\n[{sig(r.ci_low)}, {sig(r.ci_high)}]" if math.isfinite(r.ci_high) else ""
    return f"{beyond}{sig(r.ratio)}{interval}"


def plot_ratio(analysis: Analysis, frame, dtype: str, layout: str, stem: Path, formats) -> list[Path]:
    ratios = [r for r in analysis.ratios_of(CANDIDATE) if (r.dtype, r.layout) == (dtype, layout)]
    if not ratios:
        return []
    page_sizes = sorted({r.page_size for r in ratios})
    seq_lens = sorted({r.seq_len for r in ratios})
    values = np.full((len(page_sizes), len(seq_lens)), np.nan)
    cap = math.log2(RATIO_CAP)
    width, height = 1.25 * len(seq_lens) + 2.8, 0.8 * len(page_sizes) + 2.2
    fig = new_figure(width, height)
    ax = fig.subplots()
    fig.subplots_adjust(left=1.0 / width, right=1 - 1.6 / width, bottom=1.1 / height, top=1 - 0.8 / height)
    for r in ratios:
        values[page_sizes.index(r.page_size), seq_lens.index(r.seq_len)] = np.log2(r.ratio)
    image = ax.imshow(np.clip(values, -cap, cap), cmap="RdBu_r", norm=TwoSlopeNorm(vcenter=0.0, vmin=-cap, vmax=cap),
                      aspect="auto")
    for r in ratios:
        i, j = page_sizes.index(r.page_size), seq_lens.index(r.seq_len)
        if r.verdict == UNCLEAR:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.35", lw=0))
        ax.text(j, i, _cell_text(r), ha="center", va="center", fontsize=7,
                color="0.4" if r.verdict == SAME else "white" if abs(values[i, j]) > 0.6 * cap else "black")
    ax.set_xticks(range(len(seq_lens)), [str(s) for s in seq_lens], rotation=45)
    ax.set_yticks(range(len(page_sizes)), [str(p) for p in page_sizes])
    ax.set(xlabel="seq_len (tokens)", ylabel="page_size (tokens)")
    bar = fig.colorbar(image, ax=ax)
    ticks = np.arange(-cap, cap + 1)
    bar.set_ticks(list(ticks), labels=[f"{2 ** t:g}" if t >= 0 else f"1/{2 ** -t:g}" for t in ticks])
    base = called(analysis.baseline, "")
    bar.set_label(f"merged PR / {base} (red: higher; capped, ▲▼ beyond;\n[ ]: {coverage(analysis)}; ~ grey: same, "
                  f"interval within {percent(analysis.noise.min_effect)}; ? hatched: unclear)", fontsize=8)
    set_title(ax, _title(analysis.run, f"merged PR / {base} {time_label(analysis)} per call", dtype,
                     layout), fontsize=10)
    return save(fig, stem, formats)


def plot_link_model(analysis: Analysis, frame, dtype: str, layout: str, stem: Path, formats) -> list[Path]:
    """A panel per page size: the predicted merged PR / pre-PR time per call on each prediction profile (a model);
    on a run that crossed a link, the measured ratio with its interval over it."""
    ratios = [r for r in analysis.ratios_of(CANDIDATE) if (r.dtype, r.layout) == (dtype, layout)]
    if not ratios:
        return []
    page_sizes = sorted({r.page_size for r in ratios})
    fig, axes = _panels(len(page_sizes))
    palette = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, page_size in zip(axes, page_sizes, strict=True):
        at = sorted((r for r in ratios if r.page_size == page_size), key=lambda r: r.seq_len)
        priced = [(r.seq_len, found) for r in at if (found := point_predictions(analysis, r))]
        for n, profile in enumerate(analysis.predicting):
            color = palette[n % len(palette)]
            seq = [L for L, _ in priced]
            ax.plot(seq, [p[n].ratio for _, p in priced], color=color, marker="osD^v"[n % 5], ms=4, mfc="none",
                    ls=":" if profile.pinned else "-", label=profile_name(profile, analysis.run.run_id))
            ax.fill_between(seq, [p[n].low for _, p in priced], [p[n].high for _, p in priced], color=color, alpha=0.1,
                            lw=0)
        if analysis.run.link_crossed:
            ax.errorbar([r.seq_len for r in at], [r.ratio for r in at],
                        yerr=[[r.ratio - r.ci_low for r in at], [r.ci_high - r.ratio for r in at]], color="black",
                        marker="o", ms=4, ls="none", capsize=2, label=f"measured here [{coverage(analysis)}]", zorder=5)
        ax.axhline(1.0, color="black", lw=1, ls="--", label="1: same time")
        _log_axes(ax)
        set_title(ax, f"page_size={page_size}")
        ax.set(xlabel="seq_len (tokens)", ylabel=f"time, merged PR / {called(analysis.baseline, '')}")
    what = ("model per link profile, measured ratio in black" if analysis.run.link_crossed else
            "MODEL, not measurement: predicted time per call on a GPU box")
    return _finish(fig, axes, "link profile (model)", _title(analysis.run, what, dtype, layout), stem, formats)


def _scenario_panels(analysis: Analysis, kind: str, x: str, xlabel: str, what: str, stem: Path, formats) -> list[Path]:
    frame = analysis.run.scenarios
    if frame is None:
        return []
    ok = frame[(frame["status"] == "ok") & (frame["kind"] == kind) & (frame["busy_us"] == 0)
               & (frame["payloads"] == DEFAULT_PAYLOADS)]  # several payloads per send: the report's hybrid table
    if ok.empty:
        return []
    panels = sorted({(str(side), int(p)) for side, p in zip(ok["side"], ok["page_size"], strict=True)})
    variants = _variants(ok)
    fig, axes = _panels(len(panels), [legend_label(v) for v in variants])
    lines = _lines(ok, ("side", "page_size"), x)
    for ax, (side, page_size) in zip(axes, panels, strict=True):
        _own(ax, lines, (side, page_size), variants, x, lambda r, v: analysis.scenario_band(str(r["scenario"]), v))
        _log_axes(ax)
        here = [r for (at, _), rows in lines.items() if at == (side, page_size) for r in rows]
        chunks = sorted({int(r["chunk_size"]) for r in here if int(r["chunk_size"])})
        chunk = f", chunks of {'/'.join(map(str, chunks))}" if side == "prefill" and kind == "request" and chunks else ""
        where = side if kind == "request" else "decode step"
        set_title(ax, f"{where}, page_size={page_size}{chunk}")
        ax.set(xlabel=xlabel, ylabel=f"{time_label(analysis)} per {what} (µs)")
        swept = sorted({int(r[x]) for r in here})
        ax.set_xticks(swept, [str(v) for v in swept])
    return _finish(fig, axes, f"step variant (band: its own\n{coverage(analysis)})",
                   _title(analysis.run, f"Whole {what}s: {time_label(analysis)}", str(ok["dtype"].iloc[0]),
                          str(ok["layout"].iloc[0])), stem, formats)


def _busy_reference(rows) -> tuple[float, str]:
    """The busy time queued before each call: measured (median over the panel's variants) when recorded, else nominal."""
    measured = pd.to_numeric(rows["busy_measured_us"], errors="coerce").dropna()
    if not measured.empty:
        return float(measured.median()), "measured busy queue"
    return float(rows["busy_us"].iloc[0]), "nominal busy queue"


def plot_busy_queue(analysis: Analysis, stem: Path, formats) -> list[Path]:
    """Blocked against ready per step variant in the busy-queue scenarios (`busy_us` > 0; CUDA runs only)."""
    run = analysis.run
    frame = run.scenarios
    if frame is None:
        return []
    ok = frame[(frame["status"] == "ok") & (frame["busy_us"] > 0)]
    if ok.empty:
        return []
    scenarios = list(ok.sort_values(["kind", "busy_us", "requests", "tokens", "page_size"])["scenario"].unique())
    widths = [1.4 * ok[ok["scenario"] == s]["variant"].nunique() + 1.2 for s in scenarios]
    legend_width = 2.6
    width, height = max(sum(widths) + legend_width + 1.0, 9.0), 5.0
    fig = new_figure(width, height)
    axes = fig.subplots(1, len(scenarios), squeeze=False, gridspec_kw={"width_ratios": widths})
    fig.subplots_adjust(left=0.9 / width, right=1 - (legend_width + 0.1) / width, bottom=0.22, top=0.78, wspace=0.3)
    bar = 0.38
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        rows = ok[ok["scenario"] == scenario]
        rows = rows.set_index("variant").loc[_variants(rows)].reset_index()
        x = np.arange(len(rows))
        for offset, what, label, bar_style in (
                (-bar / 2, "blocked", "blocked: scheduler thread", {"color": "tab:blue"}),
                (bar / 2, "ready", "ready: data on host", {"color": "white", "edgecolor": "tab:orange", "hatch": "//"})):
            median = rows[f"{what}_median_us"].to_numpy(dtype=float)
            errors = np.vstack([median - rows[f"{what}_q1_us"].to_numpy(dtype=float),
                                rows[f"{what}_q3_us"].to_numpy(dtype=float) - median])
            ax.bar(x + offset, median, bar, yerr=np.clip(errors, 0, None), capsize=3, ecolor="black", lw=1,
                   label=f"{label} (median, IQR)", **bar_style)
            for xi, value in zip(x + offset, median, strict=True):
                ax.annotate(f"{value:.0f}", (xi, value), xytext=(0, 4), textcoords="offset points", ha="center",
                            va="bottom", fontsize=7)
        reference, label = _busy_reference(rows)
        ax.axhline(reference, color="black", ls="--", lw=1, label=f"{label} ({reference:.0f} µs)")
        ax.set_xticks(x, list(rows["variant"]), rotation=20, ha="right", fontsize=8)
        ax.set_xlim(-0.6, len(rows) - 0.4)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
        ax.grid(True, axis="y", alpha=0.3)
        first = rows.iloc[0]
        where = (f"step, B={int(first['requests'])}" if first["kind"] == "step" else
                 f"{first['side']} request, L={int(first['tokens'])}, C={int(first['chunk_size'])}")
        ax.set_title(f"{where}, page_size={int(first['page_size'])}\n{int(first['busy_us'])} µs kernel queued before "
                     "each call", fontsize=9)
        ax.set_ylabel(f"µs per {rows['kind'].iloc[0]}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8, frameon=False)
    device = run.meta.environment.device_name if run.meta else run.device_name
    fig.suptitle(f"Behind a busy device queue: blocked (scheduler thread) vs ready (data on host), "
                 f"{ok['dtype'].iloc[0]} {ok['layout'].iloc[0]}\n{device} | run {run.run_id}", fontsize=10)
    return save(fig, stem, formats)


CHARTS = (("latency", plot_latency), ("bytes", plot_bytes), ("ratio", plot_ratio), ("link_model", plot_link_model))


def plot_run(analysis: Analysis, formats: tuple[str, ...] = ("png",), out_dir: Path | None = None) -> list[Path]:
    """Write every chart of the analysed run into `out_dir` (default: the run folder); returns the files written:
    `point_charts`, then `other_charts` (`kvpages plot` draws the two at once: kvpages.render.drawing)."""
    return point_charts(analysis, formats, out_dir) + other_charts(analysis, formats, out_dir)


def point_charts(analysis: Analysis, formats: tuple[str, ...], out_dir: Path | None = None) -> list[Path]:
    """The per-point charts (`CHARTS`) of each (dtype, layout)."""
    folder = out_dir or analysis.run.path
    written: list[Path] = []
    for key, frame in analysis.run.ok_rows().groupby(["dtype", "layout"], sort=True):
        dtype, layout = str(key[0]), str(key[1])
        for name, chart in CHARTS:
            written += chart(analysis, frame, dtype, layout, folder / f"{name}_{dtype}_{layout}", formats)
    return written


def other_charts(analysis: Analysis, formats: tuple[str, ...], out_dir: Path | None = None) -> list[Path]:
    """The whole requests and steps, the busy queue, where the time goes and the contention."""
    folder = out_dir or analysis.run.path
    return (_scenario_panels(analysis, "request", "tokens", "prompt length L (tokens)", "request",
                             folder / "scenario_requests", formats)
            + _scenario_panels(analysis, "step", "requests", "requests per step B", "step",
                               folder / "scenario_steps", formats)
            + plot_busy_queue(analysis, folder / "scenario_busy", formats) + plot_breakdown(analysis, folder, formats)
            + plot_contention(analysis, folder, formats))
