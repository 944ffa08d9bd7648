"""How every chart makes, titles and saves a figure, and how `kvpages plot` draws on two CPUs (no torch).
Matplotlib's object-oriented API on the Agg canvas, without pyplot: no backend to choose, no global list of open
figures to close, and nothing of it imported by the commands that draw nothing."""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
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


def save(fig: Figure, stem: Path, formats: tuple[str, ...]) -> list[Path]:
    """Write `fig` as `stem`.<format> for each format; returns the files written."""
    written = [stem.with_suffix(f".{fmt}") for fmt in formats]
    for path in written:
        fig.savefig(path, dpi=DPI)
    return written


Drawing = Callable[[], list[Path]]
"""Draws some charts; returns the files it wrote."""


def cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def side_by_side(here: Drawing, there: Drawing, processes: int = 1) -> list[Path]:
    """`here() + there()`. With `processes` >= 2 on Linux with two CPUs, `there` is drawn in a forked child at the
    same time (drawing is most of `kvpages plot`'s time, and no chart needs another); its exception, if any, is
    raised here once `here` is done, and an exception of `here` wins. Only `kvpages plot` asks for this: a benchmark
    session (torch, its threads) and the notebook draw in their own process, and elsewhere (macOS: fork is unsafe
    with some system libraries; Windows: none) it draws one after the other."""
    if processes < 2 or cpus() < 2 or not sys.platform.startswith("linux"):
        return here() + there()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: draw, send back the result or the exception, and leave without any exit handler
        try:
            os.close(read)
            try:
                payload = pickle.dumps((True, there()))
            except BaseException as exc:
                try:
                    payload = pickle.dumps((False, exc))
                except Exception:
                    payload = pickle.dumps((False, RuntimeError(f"{type(exc).__name__}: {exc}")))
            with os.fdopen(write, "wb") as pipe:
                pipe.write(payload)
        finally:
            os._exit(0)
    os.close(write)
    try:
        mine = here()
    finally:  # the child is waited for even when `here` fails
        with os.fdopen(read, "rb") as pipe:
            payload = pipe.read()
        os.waitpid(pid, 0)
    result: tuple[bool, Any] = pickle.loads(payload) if payload else (False, RuntimeError("the chart process died"))
    done, value = result
    if not done:
        raise value
    return mine + value
