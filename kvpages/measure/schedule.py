"""The schedule: which repetition of which variant runs when, planned once as frozen data.

At every point, each variant is timed in `repetitions` blocks. Repetition r of a point
runs all its variants back to back, in a fresh order drawn from a generator seeded
with the sweep's seed, so drift of the machine hits every variant of a repetition alike
(google/benchmark's random interleaving, asv's interleaved sampling). Points run one
after another, so a point's inputs are built once and its rows are written as soon as
its last block finishes. No torch import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np


class Target(Protocol):
    """What a block measures at: a sweep Point or a Scenario (kvpages.core.scenarios); anything with an id."""

    @property
    def id(self) -> str: ...


T = TypeVar("T", bound=Target)


@dataclass(frozen=True)
class Block(Generic[T]):
    """One timed block: repetition `repetition` of `variant` at `point`, the `order`-th block of the run."""

    variant: str
    point: T
    repetition: int
    order: int
    last_of_point: bool

    @property
    def case_id(self) -> str:
        return f"{self.variant}-{self.point.id}"

    @property
    def id(self) -> str:
        return f"{self.case_id}-r{self.repetition}"


def plan(variants: Sequence[str], points: Sequence[T], repetitions: int, seed: int,
         passes: int = 1, first_order: int = 0) -> tuple[Block[T], ...]:
    """Every block of the run, in run order.

    The repetitions are dealt to `passes` sweeps over the points (repetition r to pass
    r % passes); within a pass, points come in sweep order, and each of their repetitions
    runs every variant in a fresh shuffled order.
    """
    if repetitions < 1:
        raise ValueError(f"repetitions must be >= 1, got {repetitions}")
    if not 1 <= passes <= repetitions:
        raise ValueError(f"passes must be between 1 and the repetitions ({repetitions}), got {passes}")
    if not variants:
        raise ValueError("no variants to schedule")
    rng = np.random.default_rng(seed)
    blocks: list[Block[T]] = []
    for pass_index in range(passes):
        reps = range(pass_index, repetitions, passes)
        for point in points:
            per_point = [(variants[i], r) for r in reps for i in rng.permutation(len(variants))]
            for k, (name, r) in enumerate(per_point):
                last = pass_index == passes - 1 and k == len(per_point) - 1
                blocks.append(Block(name, point, r, first_order + len(blocks), last_of_point=last))
    return tuple(blocks)
