"""Re-measuring disturbed pairs: after the planned repetitions, more of them, in fresh processes, within a budget.

A pair (a variant against the baseline at a point, or a step variant against the baseline's on a scenario) is not
settled while one of its processes stands apart from the run's own spread beyond what can be left out, or leaving it
out leaves fewer processes than the plan had (kvpages.core.stability). Each round is one fresh worker process (P, P + 1,
...) that times one more repetition (R, R + 1, ...) of the worst targets first, as many as fit what is left of the
budget (--kv-remeasure-budget x the sweep's planned timed seconds): at each, the baseline and the variants not settled
there, interleaved in a seeded order as in the plan. It is charged its process's wall from its turn (a spare started
beside the planned workers has its start-up behind it) or from its launch. A round after the first, in a fresh process,
runs only when it would time at least what its start costs (the last round's untimed wall): a round costs its timed
work, not a process start. The session records each round's blocks as
they come (an interruption keeps them) and meta.json's `remeasure` says what was done
(docs/method.md#disturbed-processes). No torch import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kvpages.core.names import case_id
from kvpages.core.stability import disturbance, run_spread
from kvpages.core.stats import Levels, logs, paired
from kvpages.measure.recorder import Case, Recorder
from kvpages.measure.schedule import Block, round_blocks
from kvpages.measure.targets import Target
from kvpages.measure.workers import Worker
from kvpages.measure.worklog import round_path
from kvpages.schema.meta import Remeasurement
from kvpages.schema.rows import OK, POINTS, timed_us


@dataclass(frozen=True)
class Round:
    """One re-measurement round, as the session hands it to its worker (a JSON file in the workers' folder)."""

    process: int
    repetition: int
    first_order: int
    cases: tuple[str, ...]  # the case ids it times: at each target, the baseline and the variants not settled there

    def write(self, folder: Path) -> None:
        round_path(folder, self.process).write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, folder: Path, process: int) -> Round:
        data = json.loads(round_path(folder, process).read_text())
        return cls(**{**data, "cases": tuple(data["cases"])})

    def blocks(self, variants: Sequence[str], targets: Sequence[object], seed: int, after: int = 0) -> tuple[Block, ...]:
        """Its blocks among `targets` (points, or requests and steps with their step `variants`), the same in the
        session and the worker, numbered on from its first order (`after`: the blocks of a family before)."""
        found = round_blocks(variants, targets, self.repetition, self.process, seed, self.first_order + after)
        return tuple(b for b in found if b.case_id in self.cases)


def levels_of(case: Case) -> Levels:
    """A case's log block medians (a scenario's blocked ones), with their processes and repetitions."""
    blocks = case.blocks
    return Levels(logs(case.medians_us), np.array([b.process for b in blocks]),
                  np.array([b.repetition for b in blocks]))


@dataclass(frozen=True)
class Need:
    """A target with a pair not settled: the cases a round times there (the baseline first), and how far its worst
    disturbed process lies, in cuts (kvpages.core.stability.Disturbance.worst)."""

    target: Target
    cases: tuple[str, ...]
    worst: float


def needs(recorder: Recorder, baselines: tuple[str, str], planned: int, factor: float) -> list[Need]:
    """The targets with a pair not settled, worst first; `baselines`: the points' and the scenarios' baseline."""
    families: dict[bool, list[tuple[Target, str, str, Levels]]] = {True: [], False: []}
    for target, cases in recorder.by_target.items():
        point = target.table is POINTS
        timed = {c.variant: c for c in cases if c.status in (OK, None) and c.blocks}
        base = timed.get(baselines[0 if point else 1])
        if base is None:
            continue
        levels = {variant: levels_of(case) for variant, case in timed.items()}  # the baseline's once, for every pair
        for case in timed.values():
            logs = None if case is base else paired(levels[base.variant], levels[case.variant])
            if logs is not None:
                families[point].append((target, base.variant, case.variant, logs))
    found: dict[Target, tuple[list[str], float]] = {}
    for family in families.values():
        spread = run_spread(logs for *_, logs in family)
        for target, baseline, variant, logs in family:
            d = disturbance(logs, spread, factor)
            if not d.settled(planned):
                ids, worst = found.get(target, ([case_id(baseline, target.id)], 0.0))
                found[target] = (ids + [case_id(variant, target.id)], max(worst, d.worst or 1.0))
    return sorted((Need(t, tuple(ids), worst) for t, (ids, worst) in found.items()), key=lambda n: -n.worst)


@dataclass
class Remeasurer:
    """The re-measurement of one run: `run_round(round, workers) -> Worker` starts, times and records one round's
    process, added to `workers` once its turn has begun (so that meta.json's processes hold a round a signal cut
    short, whose blocks may be recorded)."""

    recorder: Recorder
    baselines: tuple[str, str]  # the points' and the scenarios' baseline
    planned_processes: int
    repetitions: int
    first_order: int  # the planned blocks' count: the rounds' orders follow
    factor: float  # --kv-disturb-factor
    budget_fraction: float
    planned_s: float  # the sweep's planned timed seconds (its points' time budgets)
    block_s: Callable[[Target], float]  # a target's planned timed seconds per block (its budget over the repetitions)
    overhead_s: float = 0.0  # the first round's untimed cost: a spare's inputs, or a fresh worker's start-up and inputs
    fresh_s: float = 0.0  # a fresh worker's start-up and inputs, before a round has shown it (after the spare's)
    workers: list[Worker] = field(default_factory=list)
    record: Remeasurement | None = None

    @property
    def budget_s(self) -> float:
        return self.budget_fraction * self.planned_s

    def _timed_s(self, case_id: str) -> float:
        """A case's timed seconds per block so far (the sum of a block's rounds, averaged over its blocks)."""
        blocks = self.recorder.cases[case_id].blocks
        return float(np.mean([np.sum(timed_us(b)) for b in blocks])) / 1e6 if blocks else 0.0

    def pick(self, found: list[Need], left_s: float, overhead_s: float) -> list[Need]:
        """The worst targets first, as many as fit `left_s` with a round's untimed cost."""
        chosen, cost = [], overhead_s
        for need in found:
            more = len(need.cases) * self.block_s(need.target)
            if cost + more <= left_s:
                chosen.append(need)
                cost += more
        return chosen

    def run(self, run_round: Callable[[Round, list[Worker]], Worker], say: Callable[[str], None]) -> Remeasurement:
        """Rounds until every pair is settled or no target fits what is left of the budget; `record` holds what was
        done so far (an interruption leaves it there)."""
        found = needs(self.recorder, self.baselines, self.planned_processes, self.factor)
        first = tuple(n.target.id for n in found)
        remeasured: dict[str, None] = {}
        spent = timed = 0.0
        blocks = repetitions = 0
        overhead = self.overhead_s
        note = "every pair settled within the planned repetitions"

        def record(said: str) -> Remeasurement:
            return Remeasurement(self.budget_fraction, self.budget_s, self.planned_processes, said, tuple(remeasured),
                                 len(self.workers), repetitions, blocks, spent, timed, tuple(n.target.id for n in found),
                                 disturb_factor=self.factor, found=first,
                                 spare=bool(self.workers) and self.workers[0].spare)

        while found:
            chosen = self.pick(found, self.budget_s - spent, overhead)
            self.record = record("interrupted during a round")
            if not chosen:
                note = (f"stopped: the next round's worst target would pass what is left of the {self.budget_s:.1f} s "
                        "budget")
                break
            expected = sum(self._timed_s(c) for n in chosen for c in n.cases)
            if self.workers and expected < overhead:  # a round costs its timed work, not a process start
                note = (f"stopped: the next round would time about {expected:.2f} s in a fresh process whose start and "
                        f"inputs cost {overhead:.1f} s; its {len(found)} target(s) keep every process, their intervals "
                        "stretched")
                break
            cases = tuple(c for n in chosen for c in n.cases)
            k = len(self.workers)
            left = f" ({len(found) - len(chosen)} more wait)" if len(chosen) < len(found) else ""
            say(f"kvpages: re-measuring {len(chosen)} target(s) with a disturbed pair in a fresh process, round "
                f"{k + 1}{left}")
            self.recorder.expect_more(cases)
            try:
                worker = run_round(Round(self.planned_processes + k, self.repetitions + k, self.first_order + blocks,
                                         cases), self.workers)
            except BaseException:  # a round cut short is counted where its worker is in meta.json's processes
                self.record = record("interrupted during a round")
                raise
            info = worker.info()
            spent, timed = spent + worker.charged_s, timed + (info.timed_s or 0.0)
            # the next round's: a fresh worker's, start-up and all (the spare's started beside the planned workers)
            overhead = self.fresh_s if worker.spare else info.wall_s - (info.timed_s or 0.0)
            blocks, repetitions = blocks + len(cases), repetitions + len(chosen)
            remeasured.update((n.target.id, None) for n in chosen)
            found = needs(self.recorder, self.baselines, self.planned_processes, self.factor)
            note = "every disturbed pair settled" if not found else note
        self.record = record(note)
        return self.record


def off(budget_fraction: float, factor: float, planned_processes: int, why: str) -> Remeasurement:
    """meta.json's record of a run that re-measures nothing, and why."""
    return Remeasurement(budget_fraction, 0.0, planned_processes, f"off: {why}", disturb_factor=factor)
