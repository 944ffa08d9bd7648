"""The rows `kvpages calibrate` fits (no torch): each timed per-call row of a device variant that crossed a PCIe
link, and each block of a bandwidth probe (bandwidth.csv), from one run or several runs of one kind of machine, as
one equation each:

    time_us = ops x (launch + kernel) + copies x fixed cost + host syncs x sync + bytes / bandwidth

with a fixed cost and a bandwidth per kind of memory the copies land in; and how to resample them: each row's own
processes (its probe blocks), drawn with replacement."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvpages.analysis.intervals import levels
from kvpages.analysis.ratios import Analysis
from kvpages.core.links import MEMORIES, carries_host_work, device_ops
from kvpages.core.names import case_id, point_id
from kvpages.core.stats import exps, logs
from kvpages.schema.probe import read_probe
from kvpages.schema.reader import RunError, row_key

RESAMPLES = 400
LINKS = {"pcie pageable": "pageable", "pcie pinned": "pinned"}  # results.csv `link` -> the memory its copies land in


@dataclass(frozen=True)
class Equation:
    """One fitted row: its counts per term, its time, its units (log levels per process, or per probe block), where
    it came from."""

    id: str
    run: int  # its run's index among the fitted runs
    memory: str
    ops: float
    syncs: float
    copies: float
    bytes: float
    units: np.ndarray
    repetitions: int  # the blocks behind it (a re-measured row has more than the plan's)
    probe: bool = False

    @property
    def time_us(self) -> float:
        return math.exp(float(self.units.mean()))


@dataclass(frozen=True)
class Design:
    names: tuple[str, ...]  # a coefficient per column: per_op, sync, copy_<memory>, per_byte_<memory>
    equations: tuple[Equation, ...]
    memories: tuple[str, ...]
    runs: int
    repetitions: int  # the most any row has (a re-measured row has more than the plan's)

    @property
    def matrix(self) -> np.ndarray:
        return np.array([[self._count(e, n) for n in self.names] for e in self.equations], dtype=float)

    @property
    def times(self) -> np.ndarray:
        return np.array([e.time_us for e in self.equations])

    @staticmethod
    def _count(e: Equation, name: str) -> float:
        return {"per_op": e.ops, "sync": e.syncs, f"copy_{e.memory}": e.copies, f"per_byte_{e.memory}": e.bytes}.get(name, 0.0)

    def resampled(self, rng: np.random.Generator) -> np.ndarray:
        """RESAMPLES x rows: each row's time over its own units drawn with replacement (independently per row)."""
        out = np.empty((RESAMPLES, len(self.equations)))
        for i, e in enumerate(self.equations):
            out[:, i] = exps(e.units[rng.integers(0, e.units.size, (RESAMPLES, e.units.size))].mean(axis=1))
        return out

    def of_run(self, k: int) -> Design:
        """The equations of run `k` alone."""
        own = tuple(e for e in self.equations if e.run == k)
        return Design(self.names, own, self.memories, 1, max(e.repetitions for e in own))


def _units(values: np.ndarray, processes: np.ndarray) -> np.ndarray:
    ids = np.unique(processes)
    return values if ids.size < 2 else np.array([values[processes == p].mean() for p in ids])


def _point_equations(analysis: Analysis, k: int, prefix: str) -> list[Equation]:
    run = analysis.run
    found = []
    for r in run.ok_rows().to_dict("records"):
        variant, memory = str(r["variant"]), LINKS.get(str(r["link"]))
        got = levels(run, row_key(r))
        if memory is None or got is None or carries_host_work(variant, analysis.host_side(variant)):
            continue
        syncs = r["d2h_transfers"] if pd.isna(r["host_syncs"]) else r["host_syncs"]  # not metered: one per copy
        found.append(Equation(prefix + case_id(variant, point_id(r["seq_len"], r["page_size"], r["dtype"], r["layout"])),
                              k, memory, device_ops(variant, int(r["page_size"]), 1, False), float(syncs),
                              float(r["d2h_transfers"]), float(r["d2h_bytes"]), _units(got.values, got.processes),
                              int(got.values.size)))
    return found


def _probe_equations(analysis: Analysis, k: int, prefix: str) -> list[Equation]:
    try:
        probe = read_probe(analysis.run.path)
    except ValueError as exc:
        raise RunError(str(exc)) from None
    blocks: dict[tuple[str, int], list[float]] = {}
    for row in probe:
        blocks.setdefault((row.memory, row.bytes), []).append(row.median_us)
    return [Equation(f"{prefix}probe-{memory}-{size >> 20}MiB", k, memory, 0.0, 1.0, 1.0, float(size),
                     logs(medians), len(medians), probe=True) for (memory, size), medians in sorted(blocks.items())]


def design(analyses: Sequence[Analysis]) -> Design:
    """The equations of every run (their ids prefixed by the run's where there are several); RunError without any."""
    equations: list[Equation] = []
    for k, analysis in enumerate(analyses):
        prefix = f"{analysis.run.run_id}:" if len(analyses) > 1 else ""
        equations += _point_equations(analysis, k, prefix) + _probe_equations(analysis, k, prefix)
    if not any(not e.probe for e in equations):
        paths = ", ".join(str(a.run.path) for a in analyses)
        raise RunError(f"{paths}: no timed row of a device variant crossed a PCIe link, so there is nothing to fit")
    memories = tuple(m for m in MEMORIES if m in {e.memory for e in equations})
    names = ("per_op", "sync") + tuple(f"{kind}_{m}" for m in memories for kind in ("copy", "per_byte"))
    return Design(names, tuple(equations), memories, len(analyses), max(e.repetitions for e in equations))
