"""The schedule: which repetition of which variant runs in which process, and when; planned once as frozen data.

Repetition r of a point goes to process r % processes (run one after another), and within a process to one of
`passes` sweeps over the points; it runs all the point's variants back to back in a fresh seeded order, so
drift hits every variant of a repetition alike (google/benchmark's random interleaving). Every process plans the
same blocks and runs its own. No torch import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvpages.core.names import case_id
from kvpages.core.payloads import runs_on


@dataclass(frozen=True)
class Block:
    """One timed block: repetition `repetition` of `variant` at `target`, the `order`-th block of the run,
    timed in process `process`; `last_in_process`: the target's last block in its process."""

    variant: str
    target: Any  # a kvpages.measure.targets.Target (which imports this module)
    repetition: int
    order: int
    process: int = 0
    last_in_process: bool = True

    @property
    def case_id(self) -> str:
        return case_id(self.variant, self.target.id)

    @property
    def id(self) -> str:
        return f"{self.case_id}-r{self.repetition}"


def plan(variants: Sequence[str], points: Sequence[Any], repetitions: int, seed: int,
         passes: int = 1, processes: int = 1) -> tuple[Block, ...]:
    """Every block of the run, in run order (the module doc says how repetitions are dealt)."""
    if repetitions < 1:
        raise ValueError(f"repetitions must be >= 1, got {repetitions}")
    if not 1 <= processes <= repetitions:
        raise ValueError(f"processes must be between 1 and the repetitions ({repetitions}), got {processes}")
    if not 1 <= passes <= repetitions:
        raise ValueError(f"passes must be between 1 and the repetitions ({repetitions}), got {passes}")
    if not variants:
        raise ValueError("no variants to schedule")
    rng = np.random.default_rng(seed)
    blocks: list[Block] = []
    for process in range(processes):
        own = list(range(process, repetitions, processes))
        own_passes = min(passes, len(own))
        for pass_index in range(own_passes):
            reps = own[pass_index::own_passes]
            for point in points:
                per_point = [(variants[i], r) for r in reps for i in rng.permutation(len(variants))]
                for k, (name, r) in enumerate(per_point):
                    last_here = pass_index == own_passes - 1 and k == len(per_point) - 1
                    blocks.append(Block(name, point, r, len(blocks), process=process, last_in_process=last_here))
    return tuple(blocks)


def plan_scenarios(variants: Sequence[str], targets: Sequence[Any], repetitions: int, seed: int, passes: int = 1,
                   processes: int = 1, also: tuple[str, ...] = ()) -> tuple[Block, ...]:
    """`plan` of whole requests or steps, each target with the step variants that run on its payloads
    (kvpages.core.payloads.runs_on; `also`: the run's per_request[baseline]), the targets of one such set together in
    the order their first comes."""
    groups: dict[tuple[str, ...], list[Any]] = {}
    for target in targets:
        names = tuple(v for v in variants if runs_on(v, target.scenario.payloads, also))
        if names:
            groups.setdefault(names, []).append(target)
    return tuple(b for names, own in groups.items() for b in plan(names, own, repetitions, seed, passes, processes))


def in_run_order(*families: tuple[Block, ...]) -> tuple[tuple[Block, ...], ...]:
    """The families (points, requests, steps, ...) with `order` renumbered as the run runs them: process by
    process, and within a process each family's blocks in turn (pytest runs bench/'s files in that order)."""
    keyed = sorted((block.process, f, i) for f, family in enumerate(families) for i, block in enumerate(family))
    orders = {(f, i): n for n, (_, f, i) in enumerate(keyed)}
    return tuple(tuple(replace(block, order=orders[f, i]) for i, block in enumerate(family))
                 for f, family in enumerate(families))


def round_blocks(variants: Sequence[str], points: Sequence[Any], repetition: int, process: int, seed: int,
                 first_order: int) -> tuple[Block, ...]:
    """A re-measurement round (kvpages.measure.remeasure): repetition `repetition` of every variant at `points`, in
    fresh process `process`, each point's variants in a fresh order drawn from a generator seeded with (`seed`,
    `process`), numbered on from `first_order`."""
    blocks = plan(variants, points, 1, hash_seed(seed, process))
    return tuple(replace(b, repetition=repetition, process=process, order=first_order + b.order) for b in blocks)


def hash_seed(*parts: int) -> int:
    """One seed from several (numpy's SeedSequence mixes them), so a round's order depends on the run's seed and the round."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])
