"""What a step pays when every rank converts at once (multi-rank runs, kvpages.measure.ranks; no torch).

Per (scenario, step variant) and latency: per repetition, the log-ratio of two block medians from the
same block, the step (per round the maximum over the ranks, what the scheduler step waits for) over
rank 0 converting alone while the others waited (the one-rank baseline, in the rounds between); the
contention is their median with the interval of kvpages.core.stats.Levels, as every other ratio.
"""

from __future__ import annotations

import math

import numpy as np

from kvpages.core.stats import Levels, block_medians
from kvpages.schema.ranks import ALONE, STEP, ContentionRow, contention_id
from kvpages.schema.reader import Run
from kvpages.schema.rows import RankSampleSet

LATENCIES = ("ready", "blocked")
"""ready first: the page indices on the host is what the step waits for."""


def _logs(blocks: list[RankSampleSet], latency: str) -> np.ndarray:
    return np.log(block_medians([np.asarray(getattr(b, f"{latency}_us")) for b in blocks]))


def contention(run: Run) -> tuple[ContentionRow, ...]:
    """Every ok (scenario, step variant) of a multi-rank run, for each latency; () for any other run."""
    if run.ranks is None or run.rank_samples is None:
        return ()
    ok = run.ranks[run.ranks["status"] == "ok"]
    alone_of = {(a["scenario"], a["variant"]): a for a in ok[ok["role"] == ALONE].to_dict("records")}
    out = []
    for r in ok[ok["role"] == STEP].to_dict("records"):
        scenario, variant, size = str(r["scenario"]), str(r["variant"]), int(r["world_size"])
        step, alone = run.rank_samples[scenario, variant, STEP, -1], run.rank_samples[scenario, variant, ALONE, 0]
        if [b.repetition for b in step] != [b.repetition for b in alone]:
            continue
        skews = [t for b in step for t in b.skew_us if math.isfinite(t)]
        for latency in LATENCIES:
            logs = Levels(_logs(step, latency) - _logs(alone, latency), np.array([b.process for b in step]))
            i = logs.interval()
            out.append(ContentionRow(
                contention_id(scenario, variant, size, latency), scenario, variant, size, latency, i.ratio, i.ci_low,
                i.ci_high, i.confidence, int(logs.values.size), logs.process_count, i.unit,
                float(r[f"{latency}_median_us"]), float(alone_of[scenario, variant][f"{latency}_median_us"]),
                float(np.median(skews)) if skews else None, str(r["repro"])))
    return tuple(out)
