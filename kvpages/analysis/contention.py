"""What converting at once costs the ranks of a multi-rank run (no torch): per cycle, the maximum over the ranks at
once against the maximum over the ranks alone, both a maximum of world_size draws, so that bias cancels and the ratio
is 1 when the ranks do not slow each other down (docs/method.md, "The contention's estimator and its coverage")."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvpages.core.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CONFIDENCE, Interval, block_medians, unknown
from kvpages.schema.ranks import ALONE, ALONE_MAX, RANK, STEP, ContentionRow, contention_id
from kvpages.schema.reader import Run, RunError

LATENCIES = ("ready", "blocked")  # ready first: the page indices on the host is what the step waits for


def paired_ratio(at_once: np.ndarray, alone: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """median(at_once) / median(alone) of per-repetition block medians, with the percentile interval of a seeded
    bootstrap drawing repetitions, each with its two medians (tests/test_ranks.py measures its coverage)."""
    if at_once.shape != alone.shape:
        raise ValueError(f"at-once and alone pair by repetition: {at_once.size} vs {alone.size} repetitions")
    ratio = float(np.median(at_once) / np.median(alone))
    n = at_once.size
    if n < 2:
        return unknown(ratio, n)
    drawn = np.random.default_rng(BOOTSTRAP_SEED).integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
    ratios = np.median(at_once[drawn], axis=1) / np.median(alone[drawn], axis=1)
    lo, hi = np.percentile(ratios, [50 * (1 - confidence), 50 * (1 + confidence)])
    return Interval(ratio, float(lo), float(hi), n, confidence)


def contention(run: Run) -> tuple[ContentionRow, ...]:
    """Every ok (scenario, step variant) of a multi-rank run, for each latency: the step's row, then each rank's."""
    if run.ranks is None or run.rank_samples is None:
        return ()
    ok = run.ranks[run.ranks["status"] == "ok"]
    present = {(s, v, role, -1 if pd.isna(rank) else int(rank))
               for s, v, role, rank in zip(ok["scenario"], ok["variant"], ok["role"], ok["rank"], strict=True)}
    out = []
    for r in ok[ok["role"] == STEP].to_dict("records"):
        scenario, variant, size = str(r["scenario"]), str(r["variant"]), int(r["world_size"])
        skews = [t for b in run.rank_samples[scenario, variant, STEP, -1] for t in b.skew_us if math.isfinite(t)]
        pairs = [(None, (STEP, -1), (ALONE_MAX, -1))] + [(k, (RANK, k), (ALONE, k)) for k in range(size)]
        if (scenario, variant, ALONE_MAX, -1) not in present:
            raise RunError(f"{run.path}: {scenario} {variant} has no {ALONE_MAX} row in ranks.csv: a multi-rank run "
                           "from before every rank ran alone in turn (only rank 0 did), which this kvpages does not "
                           "analyse; re-make it with torchrun")
        for rank, at_key, alone_key in pairs:
            keys = (scenario, variant, *at_key), (scenario, variant, *alone_key)
            at_once, alone = (run.rank_samples[key] for key in keys)
            if [b.repetition for b in at_once] != [b.repetition for b in alone]:
                raise RunError(f"{run.path}: {' '.join(map(str, keys[0][:3]))} and its alone rounds come from "
                               "different repetitions in rank_samples.csv")
            for latency in LATENCIES:
                at_us, alone_us = (block_medians([np.asarray(getattr(b, f"{latency}_us")) for b in blocks])
                                   for blocks in (at_once, alone))
                i = paired_ratio(at_us, alone_us)
                out.append(ContentionRow(
                    contention_id(scenario, variant, size, latency, rank), scenario, variant, size, rank, latency,
                    i.ratio, i.ci_low, i.ci_high, i.confidence, len(at_once), sum(len(b.ready_us) for b in at_once),
                    i.unit, float(np.median(at_us)), float(np.median(alone_us)),
                    float(np.median(skews)) if skews and rank is None else None, str(r["repro"])))
    return tuple(out)
