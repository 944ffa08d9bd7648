"""What the runner records of its cases (kvpages.measure.runner): their state, rows, stops and workers' logs.

A case's row is written once: `ok` when its target's last block has finished with every
repetition timed (`flush`), or its failure status when it stops (`stop`). In a worker process
(kvpages.measure.workers) stops go to the worker's log instead; the session folds each worker's
log in (`merge`) before it times its own share.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from kvpages.core.options import BenchOptions
from kvpages.measure.crosscheck import CheckAnswer
from kvpages.measure.inputs import PoolCache
from kvpages.measure.meter import D2HMeasurement
from kvpages.measure.schedule import Block
from kvpages.measure.targets import Context, Target
from kvpages.measure.workers import BlockRecord, StopRecord, WorkerLog, WorkerRun
from kvpages.schema.rows import RankRow, Row, Samples, ScenarioRow, Table


@dataclass
class CaseState:
    """What the runner knows of one (variant, target) while its blocks run."""

    measured: D2HMeasurement | None = None
    failed: str | None = None  # the status of a row already recorded for it (mismatch, skipped, ...)
    note: str = ""  # the note of its ok row (e.g. the cross-check could not confirm the meter)
    blocks: list[Samples] = field(default_factory=list)
    pending_failure: str | None = None  # a worker's failure, to fail this process's next test of the case
    seen: dict[int, tuple[int | None, int | None]] = field(default_factory=dict)
    """What the meters of earlier processes measured: process -> (D2H bytes, transfers)."""


class Stop(Exception):
    """A case is recorded as `status` now and runs no further blocks; the test is skipped or failed."""

    def __init__(self, status: str, note: str, fail: bool) -> None:
        super().__init__(note)
        self.status, self.note, self.fail = status, note, fail


class Host(Protocol):
    """What the runner needs of its session (kvpages.measure.session.KvSession)."""

    device: str
    options: BenchOptions
    context: Context
    repetitions: int
    passes: int
    crosscheck_unavailable: str | None
    log: WorkerLog | None
    """A worker's log (blocks go there, no rows are written); None in the session that writes the run folder."""
    pool_cache: PoolCache | None
    """Where the processes of a run share the pools they built (None: one process)."""
    launcher: tuple[str, ...]
    """What a repro command starts with: ("pytest",), or torchrun's command for a multi-rank run."""

    def phase(self, name: str) -> AbstractContextManager[None]: ...
    def variants_of(self, target: Target) -> Sequence[str]: ...
    def crosscheck_answer(self, block: Block) -> CheckAnswer | None: ...
    def after_timed_block(self, record: bool) -> None: ...
    def write(self, table: Table, rows: Sequence[Row | ScenarioRow | RankRow], samples: Sequence[Samples] = (),
              cases: int | None = None) -> None: ...


class Records:
    """The cases of one process, and how their rows are written (or, in a worker, logged)."""

    def __init__(self, session: Host) -> None:
        self.session = session
        self.cases: dict[str, CaseState] = {}

    def case(self, case_id: str) -> CaseState:
        return self.cases.setdefault(case_id, CaseState())

    def stop(self, target: Target, variant: str, state: CaseState, stop: Stop) -> None:
        state.failed = stop.status
        state.blocks.clear()
        log = self.session.log
        if log is not None:
            log.stop(f"{variant}-{target.id}", stop.status, stop.note, stop.fail)
        else:
            self.session.write(target.table, self.row(target, variant, state, stop.status, stop.note), cases=1)

    def merge(self, worker: WorkerRun, targets: dict[str, tuple[Target, str]]) -> None:
        """Fold a finished worker's log in: its blocks join their cases, and a case it stopped is recorded now
        (a failure it saw fails this process's next test of that case). `targets`: case id -> (target, variant)."""
        for record in worker.records:
            if isinstance(record, BlockRecord):
                state = self.case(record.case_id)
                if state.failed is None:
                    state.blocks.append(record.samples)
                    state.seen[worker.process] = (record.d2h_bytes, record.d2h_transfers)
            elif isinstance(record, StopRecord):
                state = self.case(record.case_id)
                if state.failed is None:
                    target, variant = targets[record.case_id]
                    note = f"{record.note} (in process {worker.process})"
                    self.stop(target, variant, state, Stop(record.status, note, record.fail))
                    if record.fail:
                        state.pending_failure = f"{record.case_id}: {note}"

    def flush(self, target: Target) -> None:
        """Write the rows (and samples) of `target`'s cases that timed every repetition."""
        rows, samples, cases = [], [], 0
        for variant in self.session.variants_of(target):
            state = self.cases.get(f"{variant}-{target.id}")
            if (state is None or state.failed is not None
                    or len({b.repetition for b in state.blocks}) != self.session.repetitions):
                continue
            blocks = sorted(state.blocks, key=lambda b: b.repetition)
            rows += self.row(target, variant, state, "ok", state.note, blocks)
            samples += blocks
            cases += 1
            state.blocks.clear()
        if rows:
            self.session.write(target.table, rows, samples, cases)

    def row(self, target: Target, variant: str, state: CaseState, status: str, note: str,
            blocks: list[Samples] | None = None) -> list[Row | ScenarioRow | RankRow]:
        """A case's rows: one, or one per rank and role of a multi-rank step."""
        made = target.row(variant, self.session.context, state.measured, status, note, blocks or [],
                          self.repro(target, variant))
        return list(made) if isinstance(made, tuple) else [made]

    def repro(self, target: Target, variant: str) -> str:
        """The command that re-runs just this case, with this run's options: rendered from the options table."""
        bench, options = target.narrowed(variant, self.session.options, self.session.device)
        return shlex.join(self.session.launcher + (bench, "--benchmark-only") + options.to_args())
