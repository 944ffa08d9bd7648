"""The recorder: where every block's outcome goes, from this process or from a worker's log, as it arrives, so an
interrupted run keeps every block it finished (what it writes when: docs/guide.md#how-a-block-travels).
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvpages.core.names import case_id
from kvpages.core.stats import block_medians
from kvpages.measure.outcome import BlockOutcome, MeterReading
from kvpages.measure.signals import deferred_interruption
from kvpages.measure.targets import Context, Target
from kvpages.schema.rows import KEY_COLUMNS, OK, PARTIAL, POINTS, SCENARIO_KEY, RankRow, Row, Samples, ScenarioRow, timed_us
from kvpages.schema.writer import RunWriter


@dataclass
class Case:
    """What the recorder knows of one (variant, target): its blocks, each process's meter reading, its row's status
    (None: none yet), and a failure another process saw, to fail this process's next test of the case."""

    target: Target
    variant: str
    blocks: list[Samples] = field(default_factory=list)
    medians_us: list[float] = field(default_factory=list)
    """Each block's median timed round, taken as it is recorded (during its process's turn), so the re-measurement's
    first look, between the last planned block and the spare's turn, does not convert every block again."""
    repetitions: set[int] = field(default_factory=set)
    readings: dict[int, MeterReading] = field(default_factory=dict)
    note: str = ""
    status: str | None = None
    failure: str | None = None
    extra: int = 0  # repetitions beyond the plan's, for the re-measurement of an unstable point
    written: bool = False  # its row is in the run folder (a re-measured case's is then replaced)


class Recorder:
    """Records the outcomes of a run's blocks into its run folder (`writer`; None: a rank that writes nothing)."""

    def __init__(self, writer: RunWriter | None, cases: Sequence[tuple[Target, str]], context: Context,
                 repetitions: int, process: int, launcher: tuple[str, ...]) -> None:
        """`cases`: the (target, variant)s this run selected, each target's in variant order."""
        self.writer, self.context, self.repetitions, self.process = writer, context, repetitions, process
        self.launcher = launcher
        self.cases: dict[str, Case] = {}
        self.by_target: dict[Target, list[Case]] = {}
        for target, variant in cases:
            case = self.cases[case_id(variant, target.id)] = Case(target, variant)
            self.by_target.setdefault(target, []).append(case)
        self.recorded = 0  # cases with a row written
        self.partial = 0
        self.held: list[Callable[[], None]] | None = None  # writes held back while this process times (`hold`)

    def hold(self) -> None:
        """Hold back the rows that blocks recorded from now on complete (the statistics of every repetition, the
        costly part of recording), and the compression of their samples, until `release`: this process times its own
        share next, the last planned, so each of its blocks completes a case. Its samples are still appended as each
        block ends (a process killed meanwhile keeps them); its rows follow once another process times
        (kvpages.measure.session) or at the end. What is recorded in memory (each case's blocks, status and readings)
        is not held."""
        if self.held is None:
            self.held = []

    def release(self) -> None:
        """Do the held writes, in the order they were recorded (an interruption waits until they are done; a write
        that fails leaves the later ones held)."""
        with deferred_interruption():
            while self.held:
                self.held.pop(0)()
            self.held = None

    def _then(self, write: Callable[[], None]) -> None:
        if self.held is None:
            write()
        else:
            self.held.append(write)

    def record(self, outcome: BlockOutcome) -> None:
        """One block's outcome, from this process or a worker's log; an interruption (SIGINT, SIGTERM) waits until
        it is recorded, so once its case's rows are written (held ones at `release`) a block is in samples.csv
        exactly when it is in its row."""
        if self.held is not None and outcome.process != self.process:  # another process times: write what was held
            self.release()
        case = self.cases.get(outcome.case_id)
        if case is None or case.status is not None:  # not selected, or already recorded as stopped
            return
        with deferred_interruption():
            if outcome.reading is not None:
                case.readings.setdefault(outcome.process, outcome.reading)
            if outcome.stopped:
                note = outcome.note if outcome.process == self.process else f"{outcome.note} (in process {outcome.process})"
                if outcome.fail and outcome.process != self.process:
                    case.failure = f"{outcome.case_id}: {note}"
                self._write(case.target, [case], outcome.status, note)
            else:
                case.note = outcome.note or case.note
                case.blocks += outcome.samples
                case.medians_us += block_medians([np.asarray(timed_us(s)) for s in outcome.samples]).tolist()
                case.repetitions |= {s.repetition for s in outcome.samples}
                if self.writer is not None:  # on disk now; compressed now, or once released (`hold`)
                    data = self.writer.add_samples(outcome.table, outcome.samples, compress=False)
                    self._then(functools.partial(self.writer.compress, outcome.table, data))
            cases = self.by_target[case.target]
            if all(c.status is not None or self._complete(c) for c in cases):
                self._write(case.target, [c for c in cases if c.status is None], OK)

    def expect_more(self, case_ids: Sequence[str]) -> None:
        """One more repetition of each of these recorded ok cases (a re-measurement round): their rows are written
        again, in place, once it arrives."""
        for key in case_ids:
            case = self.cases[key]
            if case.status == OK:
                case.status, case.extra = None, case.extra + 1

    def first_readings(self) -> dict[str, MeterReading]:
        return {case_id: case.readings[0] for case_id, case in self.cases.items() if 0 in case.readings}

    def finish(self) -> None:
        """Write what the run left unwritten: a case interrupted after some of its repetitions is `partial` (a
        second interruption waits until it is written)."""
        with deferred_interruption():
            self.release()
            for target, cases in self.by_target.items():  # a re-measured case has its planned repetitions: ok
                self._write(target, [c for c in cases if c.status is None and self._complete(c, planned=True)], OK)
                partial = [c for c in cases if c.status is None and c.blocks]
                self.partial += len(partial)
                self._write(target, partial, PARTIAL)

    def _complete(self, case: Case, planned: bool = False) -> bool:
        return len(case.repetitions) >= self.repetitions + (0 if planned else case.extra)

    def _write(self, target: Target, cases: list[Case], status: str, note: str | None = None) -> None:
        """The cases' status now; their rows, from what they hold now, written now or when released (`hold`)."""
        again = any(case.written for case in cases)
        self.recorded += sum(not case.written for case in cases)
        now: list[tuple[str, MeterReading | None, str, list[Samples]]] = []
        for case in cases:
            case.written = True
            case.status = status
            blocks = sorted(case.blocks, key=lambda b: b.repetition) if status in (OK, PARTIAL) else []
            text = case.note if note is None else note
            if status == PARTIAL:
                text = f"{len(case.repetitions)} of {self.repetitions} repetitions: the run was interrupted"
            now.append((case.variant, next(iter(case.readings.values()), None), text, blocks))

        def write() -> None:
            rows: list[Row | ScenarioRow | RankRow] = []
            for variant, reading, text, blocks in now:
                bench, narrowed = target.narrowed(variant, self.context.options, self.context.device)
                repro = shlex.join(self.launcher + (bench, "--benchmark-only") + narrowed.to_args())  # re-runs the case
                rows += target.rows(variant, self.context, reading, status, text, blocks, repro)
            if rows and self.writer is not None and again:
                self.writer.replace_rows(target.table, rows, KEY_COLUMNS if target.table is POINTS else SCENARIO_KEY)
            elif rows and self.writer is not None:
                self.writer.add_rows(target.table, rows)

        self._then(write)
