"""The scheduler's order in a step (docs/method.md, "The scheduler's order in a step"): one request or step of a step
variant (kvpages.measure.steps) run as SGLang runs it, its device work before the next forward (a staged variant's),
the forward, then the readback, any `Pending` waited on the transfer thread; stamped per round."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from kvpages.measure.steps import Arrays, Pending, StepVariant


@dataclass
class Stamps:
    """Per round of the block being timed: its start (time.perf_counter), blocked and ready seconds."""

    blocked: list[float] = field(default_factory=list)
    ready: list[float] = field(default_factory=list)
    started: list[float] = field(default_factory=list)

    def clear(self) -> None:
        for stamps in (self.blocked, self.ready, self.started):
            stamps.clear()


def step_call(variant: StepVariant, finish: Callable[[Arrays], Arrays], transfer_thread: ThreadPoolExecutor,
              stamps: Stamps, forward: Callable[[], None]) -> Callable[[Sequence[torch.Tensor], int], Arrays]:
    """One request or step in the scheduler's order (module doc), stamping when it is unblocked and when the data
    is ready, less the forward's launch."""

    def wait_in_thread(pending: Pending) -> tuple[Arrays, float]:
        arrays = finish(pending.wait())
        return arrays, time.perf_counter()

    def run(slices: Sequence[torch.Tensor], page_size: int, **extras: Any) -> Arrays:
        t0 = time.perf_counter()
        readback = variant.stage(slices, page_size, **extras)
        launch = time.perf_counter()
        forward()
        launch = time.perf_counter() - launch
        out = readback()
        if isinstance(out, Pending):
            t1 = time.perf_counter()
            arrays, t2 = transfer_thread.submit(wait_in_thread, out).result()
        else:
            arrays = finish(out)
            t1 = t2 = time.perf_counter()
        stamps.blocked.append(t1 - t0 - launch)
        stamps.ready.append(t2 - t0 - launch)
        stamps.started.append(t0)
        return arrays

    return run
