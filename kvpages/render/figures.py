"""How every chart makes, titles and saves a figure (no torch); kvpages.render.drawing says how `kvpages plot` draws
on two CPUs.
Matplotlib's object-oriented API on the Agg canvas, without pyplot: no backend to choose, no global list of open
figures to close, and nothing of it imported by the commands that draw nothing."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator

DPI = 110


def new_figure(width: float, height: float) -> Figure:
    """An empty figure of `width` x `height` inches on its own Agg canvas."""
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def set_title(ax: Axes, text: str, **kwargs) -> None:
    """`ax.set_title` at y=1.0, where the automatic placement puts it on these charts (no tick labels or offset text
    above the axes), without its laying out every tick label once more per draw (a fifth of `kvpages plot`'s drawing)."""
    ax.set_title(text, y=1.0, **kwargs)


def log_y(ax: Axes) -> None:
    """A log y axis with plain tick numbers, minor ticks only at 2 and 5 (hundreds of unlabelled minor ticks cost a
    grid of 20 panels seconds of layout)."""
    ax.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    ax.yaxis.set_minor_formatter(plain)


_RAISED = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_label(value: float, _position: object = None) -> str:
    """A log axis' tick as matplotlib labels a power of ten, 10 and its exponent raised ('10⁴'), but in plain text,
    not math text ('$\\mathdefault{10^{4}}$'), which the charts then parse and lay out per font size (the per-point
    charts of the reference run: 1.14-1.35 -> 1.03-1.19 s of CPU); any other value as a plain number."""
    if value > 0:
        exponent = round(math.log10(value))
        if math.isclose(value, 10.0**exponent, rel_tol=1e-9):
            return "10" + str(exponent).translate(_RAISED)
    return f"{value:g}"


def powers(axis: Axis) -> None:
    """`axis`'s major ticks labelled by `power_label` (on a log scale: set it first)."""
    axis.set_major_formatter(FuncFormatter(power_label))


def log_x(ax: Axes) -> None:
    """A log x axis, its ticks labelled by `power_label`."""
    ax.set_xscale("log")
    powers(ax.xaxis)


PNG_LEVEL = 3
"""zlib's level for a PNG: the same pixels as its default 6, in two thirds of the time (PNG encoding was an eighth of
`kvpages plot`'s drawing) and, on these charts, a file 1% smaller."""


RASTER: dict[Any, str] = {"text.hinting": "none"}  # (Any: matplotlib types the keys as a Literal of every rcParam)
"""How a chart's text is rasterised: the glyphs' outlines unhinted, instead of matplotlib's default of running
FreeType's hinter on every glyph of every label (the seven charts of the reference run: 1.59-1.68 -> 1.32 s of CPU; the
text a little softer when zoomed in). Set around each draw only (`rendering`): a user's own figures keep their
rcParams."""


def rendering() -> AbstractContextManager:
    """The rcParams a chart is drawn with (RASTER), for the span of one draw."""
    return matplotlib.rc_context(RASTER)


def save(fig: Figure, stem: Path, formats: tuple[str, ...]) -> list[Path]:
    """Write `fig` as `stem`.<format> for each format; returns the files written."""
    written = [stem.with_suffix(f".{fmt}") for fmt in formats]
    for path in written:
        savefig(fig, path)
    return written


def savefig(fig: Figure, path: Path) -> None:
    """`fig.savefig` at DPI, `rendering()`, a PNG at zlib level PNG_LEVEL."""
    with rendering():
        if path.suffix == ".png":
            fig.savefig(path, dpi=DPI, pil_kwargs={"compress_level": PNG_LEVEL})
        else:
            fig.savefig(path, dpi=DPI)


def warm_up() -> None:
    """Lay out and draw a figure holding text, so that the charts drawn after it (here or in a process forked from
    here) find matplotlib's font loaded; nothing is written. (No chart holds math text: `power_label`.)"""
    fig = new_figure(1.0, 1.0)
    fig.text(0.1, 0.5, "0.5 µs 10³")
    with rendering():
        fig.canvas.draw()
