"""A CPU run's GPU answer (no torch): the CUDA run of the same points whose measured figures each CPU finding gives
beside its predictions, with that run's machine and the row id (the same in every run). Found in the CPU run's own
results folder (the newest CUDA run of the same preset sharing the most of its ratio ids), or given
(`kvpages report RUN --gpu-run CUDA_RUN`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from kvpages.analysis.cache import Loaded, Pickled, made_ahead
from kvpages.analysis.families import ScenarioRatio
from kvpages.analysis.ratios import Analysis
from kvpages.analysis.wording import short
from kvpages.schema.beside import gpu_run_beside
from kvpages.schema.reader import Run, RunError
from kvpages.schema.rows import RatioRow

T = TypeVar("T")


@dataclass(frozen=True)
class GpuAnswer:
    """The CUDA run whose measurements answer a CPU run's predictions, as loaded (kvpages.analysis.cache)."""

    loaded: Loaded

    @property
    def analysis(self) -> Analysis:
        return self.loaded.analysis

    @property
    def identity(self) -> str | None:
        """What the CPU run's findings on this answer are memoised under: its cache entry's name (the key of every input
        of its analysis); None where it is not kept (then they are not memoised)."""
        return self.loaded.entry_name

    @property
    def run_id(self) -> str:
        return self.analysis.run.run_id

    @property
    def machine(self) -> str:
        return self.analysis.run.device_name

    def ratio(self, row_id: str) -> RatioRow | ScenarioRatio | None:
        return self._index.get(row_id)

    @property
    def _index(self) -> dict[str, RatioRow | ScenarioRatio]:
        return self.analysis.run.cached(("gpu index",), lambda: {
            **{r.id: r for r in self.analysis.scenario_ratios if r.latency == "blocked"},
            **{r.id: r for r in self.analysis.ratios}})

    def said(self, row_id: str, *more: tuple[str, str]) -> str:
        """' Measured on NVIDIA H200: 2.31 [1.92, 2.48] slower (run 2026...).' ('' where the run has no such row);
        `more`: (row id, what it is) of further rows, each said where the run has it, the first then as 'per call'
        (' Measured on NVIDIA H200: 2.31 [1.92, 2.48] slower per call, 1.80 [1.61, 2.02] slower per step (run ...).')."""
        rows = ((row_id, "per call" if more else ""), *more)
        found = [f"{short(r)} {what}".rstrip() for i, what in rows if (r := self.ratio(i)) is not None]
        return "" if not found else f" Measured on {self.machine}: {', '.join(found)} (run {self.run_id})."


def find_gpu_run(cpu: Analysis) -> Path | None:
    """The newest CUDA run beside `cpu`'s folder of the same preset and points (kvpages.schema.beside)."""
    return None if cpu.run.link_crossed else gpu_run_beside(cpu.run.path)


def answer_ahead(run: Path) -> Pickled | None:
    """The analysis of the GPU answer beside the run folder `run` (`gpu_run_beside`), made ahead of its report, which
    reads it kept (`made_ahead`; `kvpages plot` has it made beside its own work: kvpages.render.drawing.draw_run);
    None where there is none, or nothing to make. What goes wrong is raised: the report says it."""
    folder = gpu_run_beside(run)  # None for a results CSV, as for a CUDA run
    return None if folder is None else made_ahead(folder)


def on_answer(run: Run, key: tuple, gpu: GpuAnswer | None, compute: Callable[[], T]) -> T:
    """`compute()`, once per `key` and GPU answer for the CPU run `run` (its memo: the report's findings and files): the
    answer named by its cache entry, so another answer in the same folder is answered afresh; an answer not kept has no
    key to memoise anything under, and is answered afresh each time."""
    if gpu is None:
        return run.cached((*key, ()), compute)
    if gpu.identity is None:
        return compute()
    return run.cached((*key, (gpu.run_id, str(gpu.analysis.run.path), gpu.analysis.baseline, gpu.identity)), compute)


def gpu_answer(cpu: Analysis, given: Path | None = None) -> GpuAnswer | None:
    """The GPU answer of a CPU run: `given`, else `find_gpu_run`'s; None for a CUDA run, or none found."""
    if cpu.run.link_crossed:
        return None
    folder = given or find_gpu_run(cpu)
    if folder is None:
        return None
    loaded = Loaded.of(folder)  # kept between commands
    if not loaded.analysis.run.link_crossed:
        raise RunError(f"--gpu-run {folder}: a CPU run; give a CUDA run of the same points")
    return GpuAnswer(loaded)
