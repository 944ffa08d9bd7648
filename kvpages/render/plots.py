"""Charts of a run, regenerated from its files alone (no torch import).

`plot_run(run)` writes, per (dtype, layout) of the run:
1. `latency_<dtype>_<layout>.png`: median latency vs seq_len, a panel per page size, IQR bands;
2. `bytes_<dtype>_<layout>.png`: measured D2H bytes vs seq_len with the ideal ceil(seq_len/page_size)*itemsize;
3. `ratio_<dtype>_<layout>.png`: heatmap of the device_stride/host_stride latency ratio (paired over
   repetitions, from the analysis) over seq_len x page_size, cells within noise marked;
4. `link_model_<dtype>_<layout>.png`: modeled transfer time per link profile (a model, not a measurement);
and, from the scenarios of the run:
5. `scenario_requests.png`: blocked time per whole request against the prompt length, a panel per side and page size;
6. `scenario_steps.png`: blocked time per whole step against the requests per step;
7. `scenario_busy.png` (CUDA runs only): the busy-queue scenarios, blocked (scheduler thread) against ready (data
   on host) per step variant, medians with IQR bars, a panel per scenario, the queued busy time as a reference
   line (measured when scenarios.csv has `busy_measured_us`, else the nominal `busy_us`).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from kvpages.analysis.ratios import Analysis, with_link_model
from kvpages.core.links import LINK_PROFILES
from kvpages.core.names import CANDIDATE, FLOOR, STEP_FLOOR, variant_sort_key
from kvpages.core.sweep import ITEMSIZE
from kvpages.render.breakdown import plot_breakdown
from kvpages.schema.reader import Run


def _variants(frame) -> list[str]:
    return sorted(frame["variant"].unique(), key=variant_sort_key)


def _colors(variants: list[str]) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {v: cycle[i % len(cycle)] for i, v in enumerate(variants)}


FLOOR_STYLE = {"color": "black", "ls": "--", "lw": 1.2, "zorder": 4}
"""The zero-D2H floor (host_mirror, per_request[host_mirror]) is drawn as a reference line, not as a contender."""


def _line(ax, x, y, variant: str, color: str) -> None:
    if variant in (FLOOR, STEP_FLOOR):
        ax.plot(x, y, label=f"{variant}: zero-D2H floor", **FLOOR_STYLE)
    else:
        ax.plot(x, y, marker="o", ms=3, color=color, label=variant)


def _panels(n: int, width: float = 4.2, height: float = 3.6):
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    fig.subplots_adjust(left=0.9 / (width * n), right=1 - 0.15 / (width * n), bottom=0.15, top=0.78, wspace=0.3)
    return fig, list(axes[0])


def _log_axes(ax) -> None:
    """Log-log axes with plain numbers (1, 2, 5, 10, 20, 50) rather than 2x10^1 on the y ticks.

    Minor ticks only at 2 and 5 on y, none on x: a grid of 20 log panels otherwise spends
    seconds laying out hundreds of unlabelled minor ticks.
    """
    ax.set(xscale="log", yscale="log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    ax.yaxis.set_minor_formatter(plain)
    ax.grid(True, which="both", alpha=0.3)


def _title(run: Run, what: str, dtype: str, layout: str) -> str:
    crossed = "" if run.link_crossed else " (CPU run: no PCIe link crossed)"
    return f"{what}, {dtype} {layout}{crossed}\n{run.device_name} | run {run.run_id}"


def _save(fig, path: Path, formats: tuple[str, ...]) -> list[Path]:
    written = []
    for fmt in formats:
        out = path.with_suffix(f".{fmt}")
        fig.savefig(out, dpi=110)
        written.append(out)
    plt.close(fig)
    return written


def plot_latency(analysis: Analysis, frame, dtype: str, layout: str, stem: Path, formats) -> list[Path]:
    page_sizes = sorted(frame["page_size"].unique())
    variants = _variants(frame)
    colors = _colors(variants)
    fig, axes = _panels(len(page_sizes))
    for ax, page_size in zip(axes, page_sizes, strict=True):
        for v in variants:
            rows = frame[(frame["page_size"] == page_size) & (frame["variant"] == v)].sort_values("seq_len")
            if rows.empty:
                continue
            _line(ax, rows["seq_len"], rows["median_us"], v, colors[v])
            ax.fill_between(rows["seq_len"], rows["q1_us"], rows["q3_us"], color="gray" if v == FLOOR else colors[v],
                            alpha=0.2, lw=0)
        _log_axes(ax)
        ax.set(title=f"page_size={page_size}", xlabel="seq_len (tokens)", ylabel="median latency per call (µs)")
    axes[0].legend(fontsize=8, title="variant (band: IQR)", title_fontsize=8)
    fig.suptitle(_title(analysis.run, "D2H page-index latency", dtype, layout), fontsize=10)
    return _save(fig, stem, formats)


def plot_bytes(analysis: Analysis, frame, dtype: str, layout: str, stem: Path, formats) -> list[Path]:
    page_sizes = sorted(frame["page_size"].unique())
    variants = _variants(frame)
    colors = _colors(variants)
    fig, axes = _panels(len(page_sizes))
    markers = "os^Dvx*"
    for ax, page_size in zip(axes, page_sizes, strict=True):
        seq = np.array(sorted(frame["seq_len"].unique()))
        for i, v in enumerate(variants):  # hollow markers shrinking in turn, so equal values stay visible
            rows = frame[(frame["page_size"] == page_size) & (frame["variant"] == v) & (frame["d2h_bytes"] > 0)]
            rows = rows.sort_values("seq_len")  # 0 bytes (the zero-D2H floor) has no place on a log axis
            if not rows.empty:
                ax.plot(rows["seq_len"], rows["d2h_bytes"], marker=markers[i % len(markers)], ms=max(3, 10 - 2 * i),
                        mfc="none", lw=1, color=colors[v], label=v)
        ax.plot(seq, np.ceil(seq / page_size) * ITEMSIZE[dtype], color="black", ls="--", lw=1, zorder=5,
                label="ideal ceil(seq_len/page_size)*itemsize")
        ax.set(xscale="log", yscale="log", title=f"page_size={page_size}", xlabel="seq_len (tokens)",
               ylabel="measured D2H bytes per call (B)")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_minor_locator(NullLocator())
        ax.grid(True, which="major", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(_title(analysis.run, "Measured D2H bytes", dtype, layout), fontsize=10)
    return _save(fig, stem, formats)


def plot_ratio(analysis: Analysis, frame, dtype: str, layout: str, stem: Path, formats) -> list[Path]:
    ratios = [r for r in analysis.ratios_of(CANDIDATE) if (r.dtype, r.layout) == (dtype, layout)]
    if not ratios:
        return []
    page_sizes = sorted({r.page_size for r in ratios})
    seq_lens = sorted({r.seq_len for r in ratios})
    values = np.full((len(page_sizes), len(seq_lens)), np.nan)
    noise = np.zeros_like(values, dtype=bool)
    for r in ratios:
        i, j = page_sizes.index(r.page_size), seq_lens.index(r.seq_len)
        values[i, j] = r.ratio
        noise[i, j] = r.verdict == "within noise"
    log = np.log2(values)
    span = max(float(np.nanmax(np.abs(log))), 0.1)
    width, height = 1.2 * len(seq_lens) + 2.5, 0.7 * len(page_sizes) + 2
    fig, ax = plt.subplots(figsize=(width, height))
    fig.subplots_adjust(left=1.0 / width, right=1 - 1.4 / width, bottom=1.1 / height, top=1 - 0.75 / height)
    image = ax.imshow(log, cmap="RdBu_r", norm=TwoSlopeNorm(vcenter=0.0, vmin=-span, vmax=span), aspect="auto")
    for (i, j), value in np.ndenumerate(values):
        if np.isfinite(value):
            ax.text(j, i, f"{value:.2f}" + ("~" if noise[i, j] else ""), ha="center", va="center", fontsize=8,
                    color="white" if abs(np.log2(value)) > 0.6 * span else "black")
    ax.set_xticks(range(len(seq_lens)), [str(s) for s in seq_lens], rotation=45)
    ax.set_yticks(range(len(page_sizes)), [str(p) for p in page_sizes])
    ax.set(xlabel="seq_len (tokens)", ylabel="page_size (tokens)")
    bar = fig.colorbar(image, ax=ax)
    ticks = np.linspace(-span, span, 5)
    bar.set_ticks(list(ticks), labels=[f"{2 ** t:.2g}" for t in ticks])
    bar.set_label(f"latency ratio (<1: {CANDIDATE} faster; ~: within noise)")
    ax.set_title(_title(analysis.run, f"{CANDIDATE} / {analysis.baseline} latency", dtype, layout), fontsize=10)
    return _save(fig, stem, formats)


def plot_link_model(analysis: Analysis, frame, dtype: str, layout: str, stem: Path, formats) -> list[Path]:
    modeled = with_link_model(frame)
    page_sizes = sorted(frame["page_size"].unique())
    variants = _variants(frame)
    colors = _colors(variants)
    width, height = 3.6 * len(LINK_PROFILES), 3.0 * len(page_sizes) + 1.0
    fig, grid = plt.subplots(len(page_sizes), len(LINK_PROFILES), figsize=(width, height), squeeze=False,
                             sharex=True, sharey=True)
    fig.subplots_adjust(left=1.0 / width, right=1 - 0.2 / width, bottom=0.6 / height, top=1 - 1.2 / height,
                        wspace=0.08, hspace=0.12)
    for r, page_size in enumerate(page_sizes):
        for c, profile in enumerate(LINK_PROFILES):
            ax = grid[r][c]
            for v in variants:
                rows = modeled[(modeled["page_size"] == page_size) & (modeled["variant"] == v)
                               & (modeled["d2h_bytes"] > 0)].sort_values("seq_len")
                if not rows.empty:
                    ax.plot(rows["seq_len"], rows[profile.column], marker="o", ms=3, color=colors[v], label=v)
            _log_axes(ax)
            if r == 0:
                ax.set_title(f"{profile.label}\n{profile.latency_us:g} µs + bytes / {profile.bandwidth_gb_s:g} GB/s", fontsize=9)
            if c == 0:
                ax.set_ylabel(f"page_size={page_size}\nmodeled transfer time (µs)")
            if r == len(page_sizes) - 1:
                ax.set_xlabel("seq_len (tokens)")
    grid[0][0].legend(fontsize=7)
    fig.suptitle(_title(analysis.run, "MODEL: transfers x latency + measured bytes / bandwidth", dtype, layout),
                 fontsize=10)
    return _save(fig, stem, formats)


def _scenario_panels(analysis: Analysis, kind: str, x: str, xlabel: str, what: str, stem: Path, formats) -> list[Path]:
    frame = analysis.run.scenarios
    if frame is None:
        return []
    ok = frame[(frame["status"] == "ok") & (frame["kind"] == kind) & (frame["busy_us"] == 0)]
    if ok.empty:
        return []
    panels = sorted({(str(side), int(p)) for side, p in zip(ok["side"], ok["page_size"], strict=True)})
    variants = _variants(ok)
    colors = _colors(variants)
    fig, axes = _panels(len(panels))
    for ax, (side, page_size) in zip(axes, panels, strict=True):
        for v in variants:
            rows = ok[(ok["side"] == side) & (ok["page_size"] == page_size) & (ok["variant"] == v)].sort_values(x)
            if rows.empty:
                continue
            _line(ax, rows[x], rows["blocked_median_us"], v, colors[v])
            ax.fill_between(rows[x], rows["blocked_q1_us"], rows["blocked_q3_us"], color=colors[v], alpha=0.2, lw=0)
        _log_axes(ax)
        chunks = sorted({int(c) for c in ok["chunk_size"] if int(c)})
        chunk = f", C={'/'.join(map(str, chunks))}" if kind == "request" and chunks else ""
        ax.set(title=f"{side}, page_size={page_size}{chunk}", xlabel=xlabel, ylabel=f"blocked µs per {what} (median)")
    axes[0].legend(fontsize=7, title="step variant (band: IQR)", title_fontsize=7)
    fig.suptitle(_title(analysis.run, f"Whole {what}s: scheduler-thread time", str(ok["dtype"].iloc[0]),
                        str(ok["layout"].iloc[0])), fontsize=10)
    return _save(fig, stem, formats)


def _busy_reference(rows) -> tuple[float, str]:
    """The busy time queued before each call: measured (median over the panel's variants) when recorded, else nominal."""
    if "busy_measured_us" in rows.columns:
        measured = pd.to_numeric(rows["busy_measured_us"], errors="coerce").dropna()
        if not measured.empty:
            return float(measured.median()), "measured busy queue"
    return float(rows["busy_us"].iloc[0]), "nominal busy queue"


def _busy_panel_title(row) -> str:
    if row["kind"] == "step":
        where = f"step, B={int(row['requests'])}"
    else:
        where = f"{row['side']} request, L={int(row['tokens'])}, C={int(row['chunk_size'])}"
    return f"{where}, page_size={int(row['page_size'])}\n{int(row['busy_us'])} µs kernel queued before each call"


def plot_busy_queue(analysis: Analysis, stem: Path, formats) -> list[Path]:
    """Blocked against ready per step variant in the busy-queue scenarios (`busy_us` > 0), a panel per scenario.

    Only CUDA runs have them: on a CPU run those rows are 'skipped', and no chart is written.
    """
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
    fig, axes = plt.subplots(1, len(scenarios), figsize=(width, height), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    fig.subplots_adjust(left=0.9 / width, right=1 - (legend_width + 0.1) / width, bottom=0.22, top=0.78, wspace=0.3)
    bar = 0.38
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        rows = ok[ok["scenario"] == scenario]
        rows = rows.set_index("variant").loc[_variants(rows)].reset_index()
        x = np.arange(len(rows))
        for offset, what, style in ((-bar / 2, "blocked", {"color": "tab:blue"}),
                                    (bar / 2, "ready", {"color": "white", "edgecolor": "tab:orange", "hatch": "//"})):
            median = rows[f"{what}_median_us"].to_numpy(dtype=float)
            errors = np.vstack([median - rows[f"{what}_q1_us"].to_numpy(dtype=float),
                                rows[f"{what}_q3_us"].to_numpy(dtype=float) - median])
            label = "blocked: scheduler thread" if what == "blocked" else "ready: data on host"
            ax.bar(x + offset, median, bar, yerr=np.clip(errors, 0, None), capsize=3, ecolor="black", lw=1,
                   label=f"{label} (median, IQR)", **style)
            for xi, value in zip(x + offset, median, strict=True):
                ax.annotate(f"{value:.0f}", (xi, value), xytext=(0, 4), textcoords="offset points", ha="center",
                            va="bottom", fontsize=7)
        reference, label = _busy_reference(rows)
        ax.axhline(reference, color="black", ls="--", lw=1, label=f"{label} ({reference:.0f} µs)")
        ax.set_xticks(x, list(rows["variant"]), rotation=20, ha="right", fontsize=8)
        ax.set_xlim(-0.6, len(rows) - 0.4)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_title(_busy_panel_title(rows.iloc[0]), fontsize=9)
        ax.set_ylabel(f"µs per {rows['kind'].iloc[0]}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8, frameon=False)
    device = run.meta.environment.device_name if run.meta else run.device_name
    fig.suptitle(f"Behind a busy device queue: blocked (scheduler thread) vs ready (data on host), "
                 f"{ok['dtype'].iloc[0]} {ok['layout'].iloc[0]}\n{device} | run {run.run_id}", fontsize=10)
    return _save(fig, stem, formats)


def plot_scenarios(analysis: Analysis, out_dir: Path, formats) -> list[Path]:
    """Per-request cost against L (a panel per side and page size), per-step cost against B, and (CUDA runs) the
    busy-queue scenarios' blocked against ready time."""
    return (_scenario_panels(analysis, "request", "tokens", "prompt length L (tokens)", "request",
                             out_dir / "scenario_requests", formats)
            + _scenario_panels(analysis, "step", "requests", "requests per step B", "step",
                               out_dir / "scenario_steps", formats)
            + plot_busy_queue(analysis, out_dir / "scenario_busy", formats))


CHARTS = (("latency", plot_latency), ("bytes", plot_bytes), ("ratio", plot_ratio), ("link_model", plot_link_model))


def plot_run(analysis: Analysis, formats: tuple[str, ...] = ("png",), out_dir: Path | None = None) -> list[Path]:
    """Write every chart of the analysed run into `out_dir` (default: the run folder); returns the files written."""
    out_dir = out_dir or analysis.run.path
    ok = analysis.run.ok_rows()
    written: list[Path] = []
    for key, frame in ok.groupby(["dtype", "layout"], sort=True):
        dtype, layout = str(key[0]), str(key[1])
        for name, chart in CHARTS:
            written += chart(analysis, frame, dtype, layout, out_dir / f"{name}_{dtype}_{layout}", formats)
    return written + plot_scenarios(analysis, out_dir, formats) + plot_breakdown(analysis, out_dir, formats)
