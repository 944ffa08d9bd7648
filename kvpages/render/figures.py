"""How every chart makes, titles and saves a figure (no torch): matplotlib's object-oriented API on the Agg canvas,
without pyplot (no backend to choose, no global list of open figures to close)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 110


def new_figure(width: float, height: float) -> Figure:
    """An empty figure of `width` x `height` inches on its own Agg canvas."""
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def set_title(ax: Axes, text: str, **kwargs) -> None:
    """`ax.set_title` at y=1.0, where the automatic placement puts it on these charts (nothing above the axes), without
    laying out every tick label once more per draw to find that out."""
    ax.set_title(text, y=1.0, **kwargs)


def save(fig: Figure, stem: Path, formats: tuple[str, ...]) -> list[Path]:
    """Write `fig` as `stem`.<format> for each format; returns the files written."""
    written = []
    for fmt in formats:
        out = stem.with_suffix(f".{fmt}")
        fig.savefig(out, dpi=DPI)
        written.append(out)
    return written
