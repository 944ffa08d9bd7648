"""A row's repetitions are its blocks (samples.csv), each block's level the log of its median (`levels`); a variant
against the baseline pairs their levels repetition by repetition (`paired_logs`), each with its process (no torch)."""

from __future__ import annotations

from kvpages.core.stats import Levels, block_medians, logs, paired
from kvpages.schema.reader import Run


def levels(run: Run, key: tuple, latency: str | None = None) -> Levels | None:
    """The log block medians of a row key (or a (scenario, variant)'s `latency`), with their processes, once per run."""
    def compute() -> Levels | None:
        blocks = run.samples.get(key) if latency is None else (run.scenario_samples or {}).get(key, {}).get(latency)
        if blocks is None:
            return None
        return Levels(logs(block_medians(blocks)), run.block_processes(key, len(blocks)),
                      run.block_repetitions(key, len(blocks)))

    return run.cached(("levels", key, latency), compute)


def paired_logs(run: Run, baseline_key: tuple, variant_key: tuple, latency: str | None = None) -> Levels | None:
    """Per repetition both timed, log(variant / baseline) of the block medians, with each repetition's process
    (kvpages.core.stats.paired); None without samples of a common repetition (keys as `levels`'). Once per pair."""
    def compute() -> Levels | None:
        base, other = levels(run, baseline_key, latency), levels(run, variant_key, latency)
        return None if base is None or other is None else paired(base, other)

    return run.cached(("paired", baseline_key, variant_key, latency), compute)
