"""Times one block of a variant with pytest-benchmark: warm up, then one call per round, each on an idle device
(docs/method.md, "How a block is measured", step 5)."""

from __future__ import annotations

import itertools
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
    """Time `rounds` rounds of one call each with `benchmark.pedantic`, rotating inputs; `sync` runs in the untimed
    setup before every round (it may also queue device work)."""
    order = itertools.cycle(range(len(inputs)))
    last = [0]

    def setup():
        sync()
        last[0] = next(order)
        return call_args(inputs[last[0]], page_size)

    output = benchmark.pedantic(fn, setup=setup, rounds=rounds, warmup_rounds=0, iterations=1)
    return BlockResult(output, last[0])


def rounds_for(per_call_s: float, budget_s: float, min_rounds: int, max_rounds: int) -> int:
    return max(min_rounds, min(max_rounds, int(budget_s / max(per_call_s, 1e-9))))
