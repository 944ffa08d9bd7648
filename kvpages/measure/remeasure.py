"""Re-measuring unstable points: after the planned repetitions, more of them, in fresh processes, within a budget.

A point is unstable while one of its timed variants is not settled (kvpages.core.stability: a disturbed process, or
block medians that spread more than --kv-stable-spread). Each round is one fresh worker process (P, P + 1, ...) that
times one more repetition (R, R + 1, ...) of every point still unstable, all the point's variants interleaved in a
seeded order as in the plan. A round starts only while its estimated cost fits what is left of the budget
(--kv-remeasure-budget x the sweep's planned timed seconds); it is charged its process's whole wall. The session
records each round's blocks as they come (an interruption keeps them) and meta.json's `remeasure` says what was done
(docs/method.md#re-measuring-unstable-points). No torch import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kvpages.core.names import case_id
from kvpages.core.stability import settled
from kvpages.core.stats import Levels, block_medians
from kvpages.measure.recorder import Case, Recorder
from kvpages.measure.schedule import Block, round_blocks
from kvpages.measure.targets import Target
from kvpages.measure.workers import Worker
from kvpages.measure.worklog import round_path
from kvpages.schema.meta import Remeasurement
from kvpages.schema.rows import OK, POINTS, SampleSet


@dataclass(frozen=True)
class Round:
    """One re-measurement round, as the session hands it to its worker (a JSON file in the workers' folder)."""

    process: int
    repetition: int
    first_order: int
    cases: tuple[str, ...]  # the case ids it times: every ok variant of each point still unstable

    def write(self, folder: Path) -> None:
        round_path(folder, self.process).write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, folder: Path, process: int) -> Round:
        data = json.loads(round_path(folder, process).read_text())
        return cls(**{**data, "cases": tuple(data["cases"])})

    def blocks(self, variants: Sequence[str], points: Sequence[object], seed: int) -> tuple[Block, ...]:
        """Its blocks, the same in the session and the worker."""
        found = round_blocks(variants, points, self.repetition, self.process, seed, self.first_order)
        return tuple(b for b in found if b.case_id in self.cases)


def levels_of(case: Case) -> Levels:
    """A point case's log block medians, with their processes."""
    blocks = [b for b in case.blocks if isinstance(b, SampleSet)]
    return Levels(np.log(block_medians([np.asarray(b.samples_us) for b in blocks])), np.array([b.process for b in blocks]))


def unstable_points(recorder: Recorder, planned_processes: int, stable_spread: float) -> list[tuple[Target, list[str]]]:
    """The points not settled, in run order, each with the ids of its ok cases (those a round times again)."""
    found: list[tuple[Target, list[str]]] = []
    for target, cases in recorder.by_target.items():
        timed = [c for c in cases if c.status in (OK, None) and c.blocks]
        if target.table is POINTS and timed and not all(settled(levels_of(c), planned_processes, stable_spread)
                                                        for c in timed):
            found.append((target, [case_id(c.variant, target.id) for c in timed]))
    return found


@dataclass
class Remeasurer:
    """The re-measurement of one run: `run_round(round) -> Worker` starts, times and records one round's process."""

    recorder: Recorder
    planned_processes: int
    repetitions: int
    first_order: int  # the planned blocks' count: the rounds' orders follow
    stable_spread: float
    budget_fraction: float
    planned_s: float  # the sweep's planned timed seconds (its points' time budgets)
    block_s: float  # the planned timed seconds of one block (a time budget over the repetitions)
    overhead_s: float = 0.0  # the first round's untimed cost: a planned worker's start-up and inputs
    workers: list[Worker] = field(default_factory=list)
    record: Remeasurement | None = None

    @property
    def budget_s(self) -> float:
        return self.budget_fraction * self.planned_s

    def run(self, run_round: Callable[[Round], Worker], say: Callable[[str], None]) -> Remeasurement:
        """Rounds until every point is settled or the budget would be passed; `record` holds what was done so far
        (an interruption leaves it there)."""
        unstable = unstable_points(self.recorder, self.planned_processes, self.stable_spread)
        remeasured = tuple(t.id for t, _ in unstable)
        spent = timed = 0.0
        blocks = repetitions = 0
        overhead = self.overhead_s  # a round's untimed cost: as the planned workers', then as the last round showed it
        note = "every point settled within the planned repetitions"

        def record(said: str) -> Remeasurement:
            return Remeasurement(self.stable_spread, self.budget_fraction, self.budget_s, self.planned_processes, said,
                                 remeasured, len(self.workers), repetitions, blocks, spent, timed,
                                 tuple(t.id for t, _ in unstable))

        while unstable:
            cases = tuple(c for _, ids in unstable for c in ids)
            self.record = record("interrupted during a round")
            if spent + overhead + len(cases) * self.block_s > self.budget_s:
                note = f"stopped: a further round would pass the budget of {self.budget_s:.1f} s"
                break
            k = len(self.workers)
            say(f"kvpages: re-measuring {len(unstable)} unstable point(s) in a fresh process, round {k + 1}")
            self.recorder.expect_more(cases)
            worker = run_round(Round(self.planned_processes + k, self.repetitions + k,
                                     self.first_order + blocks, cases))
            self.workers.append(worker)
            info = worker.info()
            spent, timed = spent + info.wall_s, timed + (info.timed_s or 0.0)
            overhead = info.wall_s - (info.timed_s or 0.0)
            blocks, repetitions = blocks + len(cases), repetitions + len(unstable)
            still = unstable_points(self.recorder, self.planned_processes, self.stable_spread)
            unstable = [(t, ids) for t, ids in still if t in {t for t, _ in unstable}]
            note = "every re-measured point settled"
        self.record = record(note)
        return self.record


def off(stable_spread: float, budget_fraction: float, planned_processes: int, why: str) -> Remeasurement:
    """meta.json's record of a run that re-measures nothing, and why."""
    return Remeasurement(stable_spread, budget_fraction, 0.0, planned_processes, f"off: {why}")
