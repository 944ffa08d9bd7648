"""The runner: one loop over the planned blocks of every target (kvpages.measure.targets).

A case is checked and metered in its first block in each process, then timed (docs/method.md#how-a-block-is-measured).
`Runner.run(benchmark, block)` returns the block's `BlockOutcome`, or the stop of a case that cannot run or runs
wrong, which then runs no further blocks here. The runner knows nothing of the session, which hands each outcome on.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest
import torch

from kvpages.core.affinity import usable_cpus
from kvpages.measure import environment
from kvpages.measure.busy import spin_up
from kvpages.measure.crosscheck import CheckAnswer, CheckCase, CrosscheckError, run_crosscheck
from kvpages.measure.disturb import disturbed
from kvpages.measure.group import Group, RankFailure
from kvpages.measure.inputs import PoolCache, PoolSpec, Workload, keep_pools
from kvpages.measure.outcome import BlockOutcome, MeterReading
from kvpages.measure.schedule import Block
from kvpages.measure.targets import Context, Target, measure
from kvpages.measure.timer import WARMUP_FIRST_S, WARMUP_LATER_S, rounds_for, time_block, warm_up
from kvpages.measure.worklog import BlocksSpent
from kvpages.schema.rows import Samples

T = TypeVar("T")


class Stop(Exception):
    """A case is recorded as `status` now and runs no further blocks; the test is skipped or failed."""

    def __init__(self, status: str, note: str, fail: bool) -> None:
        super().__init__(note)
        self.status, self.note, self.fail = status, note, fail


ERROR = "error"  # what a rank answers when its step raised (not a Stop): the multi-rank run stops


def together(group: Group | None, block: Block, when: str, step: Callable[[], T]) -> T:
    """`step()`; in a multi-rank run every rank then agrees: a Stop on any rank stops the case on every rank, and
    an error on any rank stops the run on every rank, each naming the rank (kvpages.measure.group)."""
    if group is None:
        return step()
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
    if agreed is not None:
        if agreed[0] == ERROR:
            group.stop(agreed[1])
        raise Stop(*agreed)
    return result  # set: a rank whose step raised has a problem, so the ranks agreed on one


def check_metered(target: Target, variant: str, reading: MeterReading, device: str) -> None:
    """The meter's D2H, host syncs and (where declared) device ops must be what the variant declares on `device`."""
    problems = []
    expected_bytes, transfers = target.expected_d2h(variant)
    if transfers is None and reading.d2h_bytes != expected_bytes:
        problems.append(f"measured {reading.d2h_bytes} D2H bytes, expected {expected_bytes}")
    if transfers is not None and (reading.d2h_bytes, reading.d2h_transfers) != (expected_bytes, transfers):
        problems.append(f"measured {reading.d2h_bytes} D2H bytes in {reading.d2h_transfers} transfers, "
                        f"expected {expected_bytes} in {transfers}")
    syncs = target.expected_syncs(variant, device)
    if reading.host_syncs != syncs:
        problems.append(f"measured {reading.host_syncs} host syncs on the calling thread, expected {syncs}")
    ops = target.expected_ops(variant)
    if ops is not None and reading.device_ops != ops:
        problems.append(f"measured {reading.device_ops} device ops, expected {ops}")
    if problems:
        raise Stop("mismatch", "; ".join(problems), fail=True)


@dataclass
class Phases:
    """Where a process's time goes, for meta.json: seconds per phase, its timed rounds' sum and its blocks' span."""

    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    timed_s: float = 0.0
    blocks: int = 0
    span: tuple[float, float] | None = None  # perf_counter() at its first block's start, its last one's end
    first_block_at: float | None = None  # time.time() at its first block's start (a worker's start-up)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    @contextmanager
    def block(self) -> Iterator[None]:
        start = time.perf_counter()
        if self.first_block_at is None:
            self.first_block_at = time.time()
        self.blocks += 1
        try:
            yield
        finally:
            self.span = (start if self.span is None else self.span[0], time.perf_counter())

    def spent(self) -> BlocksSpent:
        first, last = self.span or (0.0, 0.0)
        return BlocksSpent(self.blocks, last - first, self.seconds["inputs"], self.seconds["checks"],
                           self.seconds["warmup"], self.timed_s)


@dataclass(frozen=True)
class Crosscheck:
    """The profiler cross-check's answers by case id, run once before the first block; `unavailable`: why it could not."""

    answers: dict[str, CheckAnswer] = field(default_factory=dict)
    unavailable: str | None = None

    @classmethod
    def of(cls, cases: list[CheckCase], device: str, trace_out: Path) -> Crosscheck:
        """The cross-check of `cases` in a process of its own; when it fails, every row's note says why (no retry)."""
        try:
            return cls(run_crosscheck(cases, device, trace_out=trace_out))
        except CrosscheckError as exc:
            return cls(unavailable=str(exc))

    def status(self, on: bool) -> str:
        """meta.json's `crosscheck`."""
        if not on:
            return "off"
        return "on (own process)" if self.unavailable is None else f"unavailable: {self.unavailable}"

    def note(self, case_id: str) -> str:
        """What a case's row notes of its cross-check ("": nothing); a mismatch stops the case."""
        answer = self.answers.get(case_id)
        if answer is None:
            return "" if self.unavailable is None else f"cross-check unavailable: {self.unavailable}"
        if answer.outcome == "mismatch":
            raise Stop("mismatch", f"profiler cross-check: {answer.detail}", fail=True)
        return f"cross-check inconclusive: {answer.detail}" if answer.outcome == "lost_records" else ""


@dataclass
class CaseState:
    """What this process knows of one case while its blocks run: the meter's reading of its first block here (None:
    not metered yet), the status it stopped with here, and its ok row's note (e.g. the cross-check's)."""

    reading: MeterReading | None = None
    stopped: str | None = None
    note: str = ""


@dataclass
class Runner:
    """Runs the blocks of one process: the one loop every target goes through (see the module doc)."""

    context: Context
    repetitions: int
    passes: int
    process: int
    phase: Phases = field(default_factory=Phases)
    crosscheck: Crosscheck = field(default_factory=Crosscheck)
    pool_cache: PoolCache | None = None  # where the processes of a run share the pools they built (None: one process)
    cases: dict[str, CaseState] = field(default_factory=dict)
    loaded: environment.Loaded | None = None  # the link and SM clock after the first timed block, under load
    first_readings: dict[str, MeterReading] = field(default_factory=dict)  # process 0's, in a later process
    benchmark_output: bool = True  # pytest-benchmark shows or keeps each block's statistics (else they go once sampled)
    _workload: tuple[Target, Workload] | None = None
    _built: dict[Target, Workload] = field(default_factory=dict)
    _pools_first: tuple[PoolSpec, ...] = ()  # the first process's pools, built before its first block

    def ready(self, first_readings: dict[str, MeterReading], blocks: Sequence[Block]) -> None:
        """A worker's turn has come: process 0's readings; the first process builds every pool of its `blocks` first
        (kvpages.measure.inputs.keep_pools), the later ones load them."""
        self.first_readings = first_readings
        if self.process == 0 and self.pool_cache is not None:
            self._pools_first = tuple(dict.fromkeys(b.target.pool() for b in blocks  # not those it only records
                                                    if b.target.unavailable_reason(b.variant, self.context.device) is None))

    def run(self, benchmark, block: Block) -> BlockOutcome:
        """One block's outcome (see the module doc)."""
        state = self.cases.setdefault(block.case_id, CaseState())
        try:
            with self.phase.block():
                return self._run(benchmark, block, state)
        except Stop as stop:
            state.stopped = stop.status
            return BlockOutcome(block.case_id, block.target.table, self.process, reading=state.reading,
                                status=stop.status, note=stop.note, fail=stop.fail)
        except Exception as exc:  # a rank that cannot go on stops the multi-rank run (the others would wait for it)
            group = self.context.group
            if group is None or isinstance(exc, pytest.exit.Exception):
                raise
            group.stop(str(exc) if isinstance(exc, RankFailure) else f"{block.id}: {type(exc).__name__}: {exc}")
            raise
        finally:
            if block.last_in_process:
                self._built.pop(block.target, None)

    def workload(self, target: Target) -> Workload:
        """The workload of `target`: generated and validated once, then re-copied into fresh memory for every
        pass over the targets, so each pass samples another placement of the inputs (as a new process would)."""
        if self._workload is None or self._workload[0] != target:
            self._workload = None  # free the previous pass's copy first
            with self.phase("inputs"):
                if self._pools_first and self.pool_cache is not None:
                    first, self._pools_first = self._pools_first, ()
                    with contextlib.suppress(Exception):  # saves time only: each block builds what is missing, and says why
                        keep_pools(first, self.pool_cache, usable_cpus())
                kept = self._built.get(target)
                built = target.build(self.context.device, cache=self.pool_cache) if kept is None else kept.fresh_copy()
                if self.passes > 1:
                    self._built.setdefault(target, built)
                self._workload = (target, built)
        return self._workload[1]

    def _run(self, benchmark, block: Block, state: CaseState) -> BlockOutcome:
        target, variant = block.target, block.variant
        if state.stopped is not None:
            raise Stop(state.stopped, f"recorded as {state.stopped} in an earlier repetition", fail=False)
        first_here = state.reading is None  # this case's first block in this process: check and meter it
        workload = together(self.context.group, block, "before its timing",
                            lambda: self._prepare(block, state, first_here))
        assert state.reading is not None
        benchmark.group = target.id
        benchmark.extra_info.update(device_name=self.context.device_name, **target.extra_info(variant, state.reading),
                                    repetition=block.repetition, order=block.order)
        samples = self._time(benchmark, block, workload, first_here)
        return BlockOutcome(block.case_id, target.table, self.process, samples, state.reading, note=state.note)

    def _prepare(self, block: Block, state: CaseState, first_here: bool) -> Workload:
        """The block's workload; the case checked against the reference (and metered) in its first block here."""
        target, variant = block.target, block.variant
        reason = target.unavailable_reason(variant, self.context.device)
        if reason is not None:
            raise Stop("skipped", reason, fail=False)
        if first_here:
            state.note = self.crosscheck.note(block.case_id) or state.note
        try:
            workload = self.workload(target)
            if first_here:
                with self.phase("checks"):
                    # every input in process 0, one in the later ones (every block checks its last round's output too)
                    pairs = list(zip(target.inputs_for(variant, workload), workload.expected, strict=True))
                    for inputs, expected in pairs if self.process == 0 else pairs[:1]:
                        problem = target.check(target.call_here(variant, inputs), expected)
                        if problem:
                            raise Stop("mismatch", f"wrong output: {problem}", fail=True)
        except (RuntimeError, MemoryError) as exc:  # torch raises a plain RuntimeError for the CPU allocator
            cpu_oom = "DefaultCPUAllocator: can't allocate memory" in str(exc)
            if not (cpu_oom or isinstance(exc, (torch.OutOfMemoryError, MemoryError))):
                raise
            self._workload = None
            self._built.pop(target, None)
            raise Stop("out_of_memory", f"out of memory: {str(exc).splitlines()[0]}", fail=False) from None
        if first_here:  # process 0 meters; a later one takes its reading (the same code on the same pool)
            state.reading = None if self.process == 0 else self.first_readings.get(block.case_id)
            if state.reading is None:
                with self.phase("checks"):
                    state.reading = measure(target, variant, target.inputs_for(variant, workload)[0]).reading()
                check_metered(target, variant, state.reading, self.context.device)
        return workload

    def _time(self, benchmark, block: Block, workload: Workload, first_here: bool) -> tuple[Samples, ...]:
        target, options = block.target, self.context.options
        timer = target.timer(block.variant, self.context)
        inputs = target.inputs_for(block.variant, workload)  # with the variant's extras, if it declares any
        rounds = 1  # timing disabled: pytest-benchmark calls it once
        if not benchmark.disabled:
            with self.phase("warmup"):
                if self.loaded is None and self.context.device == "cuda":  # no block timed here yet
                    spin_up()  # an idle GPU's clock is low (an H200: 345 MHz)
                sweep = options.sweep
                per_call_s = warm_up(timer.fn, inputs, target.page_size, timer.before_round,
                                     WARMUP_FIRST_S if first_here else WARMUP_LATER_S, every_input=first_here)
            rounds = timer.agree_rounds(rounds_for(per_call_s, target.budget_s(options) / self.repetitions,
                                                   sweep.min_rounds, sweep.max_rounds))
        timer.start()
        fn = disturbed(timer.fn, self.process, block.variant)  # timer.fn itself unless a test disturbs it
        result = time_block(benchmark, fn, inputs, target.page_size, timer.before_round, rounds)
        if not benchmark.disabled:
            self.phase.timed_s += math.fsum(benchmark.stats.stats.data)
        if self.context.device == "cuda" and self.loaded is None and not benchmark.disabled:
            self.loaded = environment.loaded_now()

        def checked() -> None:
            problem = target.check(result.output, workload.expected[result.input_index])
            if problem:
                raise Stop("mismatch", f"wrong output in a timed round: {problem}", fail=True)

        together(self.context.group, block, "after its timing", checked)
        if benchmark.disabled:  # nothing timed (--benchmark-disable: a check of every case)
            return ()
        samples = target.samples(block.variant, block, timer.series(benchmark, rounds))
        if not self.benchmark_output:
            benchmark.stats.stats.data.clear()  # its end skips it: 0.4 s of 690 blocks' statistics a process
        return samples
