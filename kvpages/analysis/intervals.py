"""A row's repetitions are its blocks (samples.csv), each block's level the log of its median (`levels`); a variant
against the baseline pairs their levels repetition by repetition (`paired_logs`), each with its process (no torch)."""

from __future__ import annotations

import numpy as np

from kvpages.core.stats import Levels, block_medians
from kvpages.schema.reader import Run


def levels(run: Run, key: tuple, latency: str | None = None) -> Levels | None:
    """The log block medians of a row key (or a (scenario, variant)'s `latency`), with their processes, once per run."""
    def compute() -> Levels | None:
        blocks = run.samples.get(key) if latency is None else (run.scenario_samples or {}).get(key, {}).get(latency)
        if blocks is None:
            return None
        return Levels(np.log(block_medians(blocks)), run.block_processes(key, len(blocks)))

    return run.cached(("levels", key, latency), compute)


def paired_logs(run: Run, baseline_key: tuple, variant_key: tuple, latency: str | None = None) -> Levels | None:
    """Per repetition, log(variant / baseline) of the block medians, with each repetition's process; None without
    samples of as many repetitions for both (keys as `levels`'). Computed once per pair and run."""
    def compute() -> Levels | None:
        base, other = levels(run, baseline_key, latency), levels(run, variant_key, latency)
        if base is None or other is None or base.values.size != other.values.size:
            return None
        return Levels(other.values - base.values, base.processes)

    return run.cached(("paired", baseline_key, variant_key, latency), compute)
