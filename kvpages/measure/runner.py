"""The runner: one loop over the planned blocks of every target (kvpages.measure.targets).

Every (variant, target) is checked against the reference and metered in its first block (and
cross-checked against the profiler, when that is on), then timed in interleaved, seeded
repetitions dealt to passes; its row is written when the target's last block finishes. A case
that cannot run, or runs wrong, is recorded once with its status and runs no further blocks.
Data flows one way: block -> workload -> variant (checked, metered, timed) -> samples -> rows.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import pytest
import torch

from kvpages.core.options import BenchOptions
from kvpages.measure.crosscheck import CheckAnswer
from kvpages.measure.inputs import Workload
from kvpages.measure.meter import D2HMeasurement
from kvpages.measure.schedule import Block
from kvpages.measure.targets import Context, Target, measure
from kvpages.measure.timer import WARMUP_FIRST_S, WARMUP_LATER_S, rounds_for, time_block, warm_up
from kvpages.schema.rows import Row, Samples, ScenarioRow, Table


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA or CPU allocation failure (torch raises a plain RuntimeError for the CPU allocator)."""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(exc)
    )


@dataclass
class CaseState:
    """What the runner knows of one (variant, target) while its blocks run."""

    measured: D2HMeasurement | None = None
    failed: str | None = None  # the status of a row already recorded for it (mismatch, skipped, ...)
    note: str = ""  # the note of its ok row (e.g. the cross-check could not confirm the meter)
    blocks: list[Samples] = field(default_factory=list)


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

    def phase(self, name: str) -> AbstractContextManager[None]: ...
    def variants_of(self, target: Target) -> Sequence[str]: ...
    def crosscheck_answer(self, block: Block) -> CheckAnswer | None: ...
    def after_timed_block(self, record: bool) -> None: ...
    def write(self, table: Table, rows: Sequence[Row | ScenarioRow], samples: Sequence[Samples] = ()) -> None: ...


class Runner:
    """Runs blocks for a session (kvpages.measure.session): the one loop every target goes through."""

    def __init__(self, session: Host) -> None:
        self.session = session
        self.cases: dict[str, CaseState] = {}
        self._workload: tuple[Target, Workload] | None = None
        self._built: dict[Target, Workload] = {}

    def run(self, benchmark, block: Block) -> None:
        """Check and meter (first block of a case), time and collect one block; called by bench/."""
        state = self.cases.setdefault(block.case_id, CaseState())
        record = not benchmark.disabled
        try:
            self._run(benchmark, block, state, record)
        except Stop as stop:
            state.failed = stop.status
            state.blocks.clear()
            if record:
                self.session.write(block.point.table, [self.row(block.point, block.variant, state, stop.status,
                                                                stop.note)])
            message = f"{block.case_id}: {stop.note}"
            if stop.fail:
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        finally:
            if block.last_of_point:
                self._built.pop(block.point, None)
                if record:
                    self._flush(block.point)

    def workload(self, target: Target) -> Workload:
        """The workload of `target`: generated and validated once, then re-copied into fresh memory for every
        pass over the targets, so each pass samples another placement of the inputs (as a new process would)."""
        if self._workload is None or self._workload[0] != target:
            self._workload = None  # free the previous pass's copy first
            with self.session.phase("generate"):
                built = self._built.get(target)
                if built is None:
                    built = target.build(self.session.device)
                    if self.session.passes > 1:
                        self._built[target] = built
                    self._workload = (target, built)
                else:
                    self._workload = (target, built.fresh_copy())
        return self._workload[1]

    def _run(self, benchmark, block: Block, state: CaseState, record: bool) -> None:
        target, variant = block.point, block.variant
        if state.failed is not None:
            pytest.skip(f"{block.case_id}: recorded as {state.failed} in an earlier repetition")
        reason = target.unavailable_reason(variant, self.session.device)
        if reason is not None:
            raise Stop("skipped", reason, fail=False)
        if state.measured is None:
            self._crosscheck(block, state)
        try:
            workload = self.workload(target)
            if state.measured is None:
                with self.session.phase("check"):
                    for inputs, expected in zip(target.inputs_for(variant, workload), workload.expected, strict=True):
                        problem = target.check(target.call_here(variant, inputs), expected)
                        if problem:
                            raise Stop("mismatch", f"wrong output: {problem}", fail=True)
        except (RuntimeError, MemoryError) as exc:
            if not is_out_of_memory(exc):
                raise
            self._workload = None
            self._built.pop(target, None)
            raise Stop("out_of_memory", f"out of memory: {str(exc).splitlines()[0]}", fail=False) from None
        if state.measured is None:
            self._meter(target, variant, workload, state)
        assert state.measured is not None
        benchmark.group = target.id
        benchmark.extra_info.update(device_name=self.session.context.device_name,
                                    **target.extra_info(variant, state.measured),
                                    repetition=block.repetition, order=block.order)
        self._time(benchmark, block, workload, state, record)

    def _crosscheck(self, block: Block, state: CaseState) -> None:
        answer: CheckAnswer | None = self.session.crosscheck_answer(block)
        if answer is None:
            if self.session.crosscheck_unavailable is not None:
                state.note = f"cross-check unavailable: {self.session.crosscheck_unavailable}"
        elif answer.outcome == "mismatch":
            raise Stop("mismatch", f"profiler cross-check: {answer.detail}", fail=True)
        elif answer.outcome == "lost_records":
            state.note = f"cross-check inconclusive: {answer.detail}"

    def _meter(self, target: Target, variant: str, workload: Workload, state: CaseState) -> None:
        with self.session.phase("meter"):
            state.measured = measured = measure(target, variant, target.inputs_for(variant, workload)[0])
        expected_bytes, transfers = target.expected_d2h(variant)
        if transfers is None and measured.d2h_bytes != expected_bytes:
            raise Stop("mismatch", f"measured {measured.d2h_bytes} D2H bytes, expected {expected_bytes}", fail=True)
        if transfers is not None and (measured.d2h_bytes, measured.d2h_transfers) != (expected_bytes, transfers):
            raise Stop("mismatch", f"measured {measured.d2h_bytes} D2H bytes in {measured.d2h_transfers} transfers, "
                                   f"expected {expected_bytes} in {transfers}", fail=True)

    def _time(self, benchmark, block: Block, workload: Workload, state: CaseState, record: bool) -> None:
        target, session = block.point, self.session
        timer = target.timer(block.variant, session.context)
        inputs = target.inputs_for(block.variant, workload)  # with the variant's extras, if it declares any
        with session.phase("timing"):
            rounds = 1  # timing disabled: pytest-benchmark calls it once
            if not benchmark.disabled:
                sweep = session.options.sweep
                per_call_s = warm_up(timer.fn, inputs, target.page_size, timer.before_round,
                                     WARMUP_FIRST_S if block.repetition == 0 else WARMUP_LATER_S)
                rounds = rounds_for(per_call_s, target.budget_s(session.options) / session.repetitions,
                                    sweep.min_rounds, sweep.max_rounds)
            timer.start()
            result = time_block(benchmark, timer.fn, inputs, target.page_size, timer.before_round,
                                rounds)
        session.after_timed_block(record)
        problem = target.check(result.output, workload.expected[result.input_index])
        if problem:
            raise Stop("mismatch", f"wrong output in a timed round: {problem}", fail=True)
        if record:
            state.blocks.append(target.samples(block.variant, block, timer.series(benchmark, rounds)))

    def _flush(self, target: Target) -> None:
        """Write the rows (and samples) of `target`'s cases that timed every repetition."""
        rows, samples = [], []
        for variant in self.session.variants_of(target):
            state = self.cases.get(f"{variant}-{target.id}")
            if state is None or state.failed is not None or len(state.blocks) != self.session.repetitions:
                continue
            blocks = sorted(state.blocks, key=lambda b: b.repetition)
            rows.append(self.row(target, variant, state, "ok", state.note, blocks))
            samples += blocks
            state.blocks.clear()
        if rows:
            self.session.write(target.table, rows, samples)

    def row(self, target: Target, variant: str, state: CaseState, status: str, note: str,
            blocks: list[Samples] | None = None):
        return target.row(variant, self.session.context, state.measured, status, note, blocks or [],
                          self.repro(target, variant))

    def repro(self, target: Target, variant: str) -> str:
        """The command that re-runs just this case, with this run's options: rendered from the options table."""
        bench, options = target.narrowed(variant, self.session.options, self.session.device)
        return shlex.join(("pytest", bench, "--benchmark-only") + options.to_args())
