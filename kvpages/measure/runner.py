"""The runner: one loop over the planned blocks of every target (kvpages.measure.targets).

Every (variant, target) is checked against the reference and metered in its first block of each
process (and cross-checked against the profiler, when that is on), then timed in interleaved,
seeded repetitions dealt to processes and passes; its row is written when the target's last
block finishes. A case that cannot run, or runs wrong, is recorded once with its status and runs
no further blocks. In a worker process (kvpages.measure.workers) the runner logs its blocks
instead of writing rows, and the session folds the logs in (`merge`) before its own share.
Data flows one way: block -> workload -> variant (checked, metered, timed) -> samples -> rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest
import torch

from kvpages.measure.crosscheck import CheckAnswer
from kvpages.measure.group import Group, RankFailure
from kvpages.measure.inputs import Workload
from kvpages.measure.records import CaseState, Host, Records, Stop
from kvpages.measure.schedule import Block
from kvpages.measure.targets import Target, measure
from kvpages.measure.timer import WARMUP_FIRST_S, WARMUP_LATER_S, rounds_for, time_block, warm_up

T = TypeVar("T")
ERROR = "error"
"""What a rank answers when its step raised (not a Stop): the multi-rank run stops."""


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA or CPU allocation failure (torch raises a plain RuntimeError for the CPU allocator)."""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(exc)
    )


def together(group: Group | None, block: Block, when: str, step: Callable[[], T]) -> T:
    """`step()`; in a multi-rank run every rank then agrees: a Stop on any rank stops the case on every rank, and
    an error on any rank stops the run on every rank, each naming the rank (kvpages.measure.group)."""
    if group is None:
        return step()
    result: T | None = None
    mine: tuple[str, str, bool] | None = None
    try:
        result = step()
    except Stop as stop:
        mine = (stop.status, stop.note, stop.fail)
    except Exception as exc:
        if isinstance(exc, pytest.exit.Exception):
            raise
        mine = (ERROR, f"{block.id}: {type(exc).__name__}: {exc}", True)
    agreed = group.agree(f"{block.id}: {when}", mine)
    if agreed is not None and agreed[0] == ERROR:
        group.stop(agreed[1])
    if agreed is not None:
        raise Stop(*agreed)
    assert result is not None
    return result


def check_metered(target: Target, variant: str, state: CaseState, device: str) -> None:
    """The D2H and the host syncs the meter counted must be what the variant declares (a note names every
    difference), and the D2H what every earlier process counted."""
    measured = state.measured
    assert measured is not None
    problems = []
    expected_bytes, transfers = target.expected_d2h(variant)
    if transfers is None and measured.d2h_bytes != expected_bytes:
        problems.append(f"measured {measured.d2h_bytes} D2H bytes, expected {expected_bytes}")
    if transfers is not None and (measured.d2h_bytes, measured.d2h_transfers) != (expected_bytes, transfers):
        problems.append(f"measured {measured.d2h_bytes} D2H bytes in {measured.d2h_transfers} transfers, "
                        f"expected {expected_bytes} in {transfers}")
    syncs = target.expected_syncs(variant, device)
    if measured.host_syncs != syncs:
        problems.append(f"measured {measured.host_syncs} host syncs on the calling thread, expected {syncs}")
    if problems:
        raise Stop("mismatch", "; ".join(problems), fail=True)
    for process, seen in sorted(state.seen.items()):
        if seen != (measured.d2h_bytes, measured.d2h_transfers):
            raise Stop("mismatch", f"process {process} measured {seen[0]} D2H bytes in {seen[1]} transfers, this "
                                   f"one {measured.d2h_bytes} in {measured.d2h_transfers}", fail=True)


class Runner:
    """Runs blocks for a session (kvpages.measure.session): the one loop every target goes through."""

    def __init__(self, session: Host) -> None:
        self.session = session
        self.records = Records(session)
        self._workload: tuple[Target, Workload] | None = None
        self._built: dict[Target, Workload] = {}
        self.first_block_at: float | None = None  # time.time() when this process's first block started
        self.blocks_run = 0

    def run(self, benchmark, block: Block) -> None:
        """Check and meter (first block of a case), time and collect one block; called by bench/."""
        state = self.records.case(block.case_id)
        record = not benchmark.disabled
        if self.first_block_at is None:
            self.first_block_at = time.time()
        self.blocks_run += 1
        try:
            self._run(benchmark, block, state, record)
        except Stop as stop:
            if record:
                self.records.stop(block.point, block.variant, state, stop)
            message = f"{block.case_id}: {stop.note}"
            if stop.fail:
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        except Exception as exc:  # a rank that cannot go on stops the multi-rank run (the others would wait for it)
            group = self.session.context.group
            if group is None or isinstance(exc, pytest.exit.Exception):
                raise
            group.stop(str(exc) if isinstance(exc, RankFailure) else f"{block.id}: {type(exc).__name__}: {exc}")
        finally:
            if block.last_in_process:
                self._built.pop(block.point, None)
            if block.last_of_point and record and self.session.log is None:
                self.records.flush(block.point)

    def workload(self, target: Target) -> Workload:
        """The workload of `target`: generated and validated once, then re-copied into fresh memory for every
        pass over the targets, so each pass samples another placement of the inputs (as a new process would)."""
        if self._workload is None or self._workload[0] != target:
            self._workload = None  # free the previous pass's copy first
            with self.session.phase("generate"):
                built = self._built.get(target)
                if built is None:
                    built = target.build(self.session.device, cache=self.session.pool_cache)
                    if self.session.passes > 1:
                        self._built[target] = built
                    self._workload = (target, built)
                else:
                    self._workload = (target, built.fresh_copy())
        return self._workload[1]

    def _run(self, benchmark, block: Block, state: CaseState, record: bool) -> None:
        target, variant = block.point, block.variant
        if state.pending_failure is not None:
            message, state.pending_failure = state.pending_failure, None
            pytest.fail(message, pytrace=False)
        if state.failed is not None:
            pytest.skip(f"{block.case_id}: recorded as {state.failed} in an earlier repetition")
        first_here = state.measured is None  # this case's first block in this process: check and meter it
        workload = together(self.session.context.group, block, "before its timing", lambda: self._prepare(block, state, first_here))
        assert state.measured is not None
        benchmark.group = target.id
        benchmark.extra_info.update(device_name=self.session.context.device_name,
                                    **target.extra_info(variant, state.measured),
                                    repetition=block.repetition, order=block.order)
        self._time(benchmark, block, workload, state, record, first_here)

    def _prepare(self, block: Block, state: CaseState, first_here: bool) -> Workload:
        """The block's workload; the case checked against the reference and metered in its first block here."""
        target, variant = block.point, block.variant
        reason = target.unavailable_reason(variant, self.session.device)
        if reason is not None:
            raise Stop("skipped", reason, fail=False)
        if first_here:
            self._crosscheck(block, state)
        try:
            workload = self.workload(target)
            if first_here:
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
        if first_here:
            self._meter(target, variant, workload, state)
        return workload

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
            state.measured = measure(target, variant, target.inputs_for(variant, workload)[0])
        check_metered(target, variant, state, self.session.device)

    def _time(self, benchmark, block: Block, workload: Workload, state: CaseState, record: bool,
              first_here: bool) -> None:
        target, session = block.point, self.session
        timer = target.timer(block.variant, session.context)
        inputs = target.inputs_for(block.variant, workload)  # with the variant's extras, if it declares any
        with session.phase("timing"):
            rounds = 1  # timing disabled: pytest-benchmark calls it once
            if not benchmark.disabled:
                sweep = session.options.sweep
                per_call_s = warm_up(timer.fn, inputs, target.page_size, timer.before_round,
                                     WARMUP_FIRST_S if first_here else WARMUP_LATER_S)
                rounds = timer.agree_rounds(rounds_for(per_call_s, target.budget_s(session.options) / session.repetitions,
                                                       sweep.min_rounds, sweep.max_rounds))
            timer.start()
            result = time_block(benchmark, timer.fn, inputs, target.page_size, timer.before_round,
                                rounds)
        session.after_timed_block(record)

        def checked() -> bool:
            problem = target.check(result.output, workload.expected[result.input_index])
            if problem:
                raise Stop("mismatch", f"wrong output in a timed round: {problem}", fail=True)
            return True

        together(session.context.group, block, "after its timing", checked)
        if record:
            made = target.samples(block.variant, block, timer.series(benchmark, rounds))
            for samples in made if isinstance(made, tuple) else (made,):
                state.blocks.append(samples)
                if session.log is not None and state.measured is not None:
                    session.log.block(block.case_id, target.table, samples, state.measured.d2h_bytes,
                                      state.measured.d2h_transfers)

