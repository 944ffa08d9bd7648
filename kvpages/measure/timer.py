"""Times one block of a variant with pytest-benchmark: warm up, then one call per round, each on an idle device
(docs/method.md, "How a block is measured", step 5)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvpages.measure.variants import call_args

WARMUP_FIRST_S = 0.001
"""A (variant, point)'s first block in a process warms up on every input, and for at least this long (untimed)..."""
WARMUP_LATER_S = 0.0005
"""...its later blocks for at least this long and one call: their inputs' first-time allocations are behind them,
and one call of a long point warms it."""
US_DECIMALS = 3
"""Samples are kept in microseconds to the nanosecond, the clocks' resolution (short reprs: samples.csv a third the size)."""


def to_us(seconds: Iterable[float]) -> tuple[float, ...]:
    """Seconds as microseconds, to `US_DECIMALS` (numpy's rounding: a tenth of `round`'s time)."""
    return tuple(np.round(np.fromiter(seconds, float) * 1e6, US_DECIMALS).tolist())


def synchronizer(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def warm_up(fn: Callable, inputs: Sequence, page_size: int, sync: Callable[[], None],
            min_s: float, every_input: bool = True) -> float:
    """Call `fn` on every input (`every_input`; else at least once), and for at least `min_s`, untimed; return the
    mean seconds per call. Each result is held until the next call returns, as the timed loop holds round N's
    result while round N+1 runs, so no first-time allocation (a pinned host buffer, say) falls in a timed round."""
    calls, start = 0, time.perf_counter()
    while calls < (len(inputs) if every_input else 1) or time.perf_counter() - start < min_s:
        sync()
        args, kwargs = call_args(inputs[calls % len(inputs)], page_size)
        held = fn(*args, **kwargs)  # noqa: F841 (held on purpose, see above)
        calls += 1
    sync()
    return (time.perf_counter() - start) / calls


@dataclass(frozen=True)
class BlockResult:
    """The last timed round's output and the index of its input."""

    output: object
    input_index: int


def time_block(benchmark, fn: Callable, inputs: Sequence, page_size: int,
               sync: Callable[[], None], rounds: int) -> BlockResult:
    """Time `rounds` rounds of one call each, rotating inputs; `sync` runs untimed before every round (it may also
    queue device work). The first round is `benchmark.pedantic`'s (it opens pytest-benchmark's record of the block, and
    profiles it under --benchmark-cprofile); the others run in a loop of this module's that appends each round to that
    record as pedantic does, timed by the same timer around the call alone, with its garbage collection setting, but
    without pedantic's per-round set-up (two closures, an object, a tracer check: 1.6 us a round in the dev box's
    sweep, a quarter of a short call's time; docs/method.md, "Where a run's time goes")."""
    prepared = [call_args(x, page_size) for x in inputs]

    def setup():
        sync()
        return prepared[0]

    held = benchmark.pedantic(fn, setup=setup, rounds=1, warmup_rounds=0, iterations=1)
    if benchmark.disabled or rounds <= 1:
        return BlockResult(held, 0)
    data = benchmark.stats.stats.data
    timer = getattr(benchmark, "_timer", time.perf_counter)
    collecting = gc.isenabled()
    if getattr(benchmark, "_disable_gc", False):
        gc.disable()
    try:
        count = len(prepared)
        for i in range(1, rounds):
            sync()
            args, kwargs = prepared[i % count]
            start = timer()
            held = fn(*args, **kwargs)  # the last round's output is held until this one returns, as pedantic does
            end = timer()
            data.append(end - start)
    finally:
        if collecting:
            gc.enable()
    return BlockResult(held, (rounds - 1) % len(prepared))


def rounds_for(per_call_s: float, budget_s: float, min_rounds: int, max_rounds: int) -> int:
    return max(min_rounds, min(max_rounds, int(budget_s / max(per_call_s, 1e-9))))
