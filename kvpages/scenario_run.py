"""Runs whole requests and scheduler steps (kvpages.scenarios) with the step variants (kvpages.steps).

Like the points, every (scenario, step variant) is checked against the reference and metered in
its first repetition, then timed in interleaved, seeded repetitions dealt to passes, and its row is
written when its last repetition finishes. Each timed round converts every call of the request or
step, and records two latencies: `blocked`, until the calling thread gets control back, and `ready`,
until the page indices are usable on the host. A variant that returns a `Pending` hands its wait to
a worker thread, as SGLang's transfer worker does; on CUDA, a busy scenario queues a sleeping
kernel before each round, so a blocking copy waits for it and a non-blocking one does not.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from kvpages.harness import is_out_of_memory, outputs_match
from kvpages.inputs import ScenarioWorkload, make_scenario_workload
from kvpages.meter import D2HMeasurement, D2HMeter
from kvpages.results import ScenarioRow, ScenarioSampleSet
from kvpages.scenarios import SCENARIO_ROTATION, Scenario
from kvpages.schedule import Block, plan
from kvpages.stats import quartiles
from kvpages.steps import Arrays, Pending, StepVariant, get_step_variant
from kvpages.sweep import ITEMSIZE
from kvpages.timer import WARMUP_FIRST_S, WARMUP_LATER_S, rounds_for, synchronizer, time_block, warm_up


def finish_for(scenario: Scenario) -> Callable[[Arrays], Arrays]:
    """What follows the conversion on the host: the decode side's `.astype(np.int32)` (for ZMQ)."""
    if scenario.kind == "step" or scenario.side == "decode":
        return lambda arrays: [a.astype(np.int32) for a in arrays]
    return lambda arrays: arrays


SPIN_UP_MS = 30.0
"""Before calibrating, keep the GPU busy this long, so its clock has boosted (an idle H200 reads 345 MHz, 1980 MHz
under load: a kernel calibrated at idle would run about 5x shorter once the clock boosts)."""
PROBE_CYCLES = 1_000_000
PROBES = 5


def cycles_for(busy_us: float, probe_cycles: int, probe_elapsed_us: list[float]) -> int:
    """Sleep cycles that keep the device busy `busy_us` at the fastest clock the probes saw (their minimum time)."""
    return int(busy_us * probe_cycles / min(probe_elapsed_us))


class BusyQueue:
    """Queues `busy_us` of device work (a sleeping kernel) on the current stream, without waiting for it.

    Calibrated once, after a spin-up, from the fastest of several probes; each queued kernel is
    bracketed by CUDA events (in the untimed setup of a round), so `measured_us()` gives the busy
    time each round actually had, which scenarios.csv records.
    """

    def __init__(self, busy_us: int) -> None:
        self.cycles = 0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        if busy_us:
            self.cycles = cycles_for(busy_us, PROBE_CYCLES, self._probe())

    @staticmethod
    def _elapsed_us(cycles: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3

    def _probe(self) -> list[float]:
        spun_us, cycles = 0.0, PROBE_CYCLES
        while spun_us < SPIN_UP_MS * 1e3:  # spin up the clock first
            spun_us += self._elapsed_us(cycles)
            cycles = min(cycles * 2, 50_000_000)
        return [self._elapsed_us(PROBE_CYCLES) for _ in range(PROBES)]

    def __call__(self) -> None:
        if self.cycles:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(self.cycles)
            end.record()
            self._events.append((start, end))

    def reset(self) -> None:
        self._events.clear()

    def measured_us(self) -> list[float]:
        """The busy time each round since `reset()` actually had (waits for the device)."""
        if not self._events:
            return []
        self._events[-1][1].synchronize()
        return [start.elapsed_time(end) * 1e3 for start, end in self._events]


@dataclass
class Timed:
    """Per round of the block being timed: blocked and ready seconds."""

    blocked: list[float] = field(default_factory=list)
    ready: list[float] = field(default_factory=list)


def step_call(variant: StepVariant, finish: Callable[[Arrays], Arrays], worker: ThreadPoolExecutor,
              timed: Timed) -> Callable[[Sequence[torch.Tensor], int], Arrays]:
    """One request or step as the scheduler makes it, stamping when it is unblocked and when the data is ready."""

    def wait_on_worker(pending: Pending) -> tuple[Arrays, float]:
        arrays = finish(pending.wait())
        return arrays, time.perf_counter()

    def run(slices: Sequence[torch.Tensor], page_size: int) -> Arrays:
        t0 = time.perf_counter()
        out = variant.fn(slices, page_size)
        if isinstance(out, Pending):
            t1 = time.perf_counter()
            arrays, t2 = worker.submit(wait_on_worker, out).result()
        else:
            arrays = finish(out)
            t1 = t2 = time.perf_counter()
        timed.blocked.append(t1 - t0)
        timed.ready.append(t2 - t0)
        return arrays

    return run


def call_here(variant: StepVariant, finish, slices: Sequence[torch.Tensor], page_size: int) -> Arrays:
    """One request or step with any wait in this thread (for the check and the meter, not the timing)."""
    out = variant.fn(slices, page_size)
    return finish(out.wait() if isinstance(out, Pending) else out)


def measure_step(variant: StepVariant, finish, slices: Sequence[torch.Tensor], page_size: int) -> D2HMeasurement:
    """What one request or step hands to the host (the wait too, in this thread)."""
    with D2HMeter(tuple(slices)) as meter:
        call_here(variant, finish, slices, page_size)
    return D2HMeasurement(tuple(meter.transfers))


def arrays_match(out: object, expected: Sequence[np.ndarray]) -> str | None:
    if not isinstance(out, list):
        return f"returned {type(out).__name__}, expected a list of numpy.ndarray"
    if len(out) != len(expected):
        return f"returned {len(out)} arrays for {len(expected)} calls"
    for i, (o, e) in enumerate(zip(out, expected, strict=True)):
        problem = outputs_match(o, e)
        if problem:
            return f"call {i}: {problem}"
    return None


@dataclass
class ScenarioState:
    measured: D2HMeasurement | None = None
    failed: str | None = None
    blocks: list[ScenarioSampleSet] = field(default_factory=list)


class ScenarioRunner:
    """The scenarios of one pytest session; records into the session's run folder (kvpages.harness.KvSession)."""

    def __init__(self, session, scenarios: Sequence[Scenario], first_order: int) -> None:
        self.session = session
        self.device = session.device
        sweep = session.options.sweep
        self.repetitions: int = session.repetitions
        self.passes = session.passes
        requests = [s for s in scenarios if s.kind == "request"]
        steps = [s for s in scenarios if s.kind == "step"]
        names = session.step_variant_names
        per_request = [n for n in names if not get_step_variant(n).batched]
        self.blocks: tuple[Block, ...] = plan(per_request, requests, self.repetitions, sweep.seed, self.passes, first_order)
        self.blocks += plan(names, steps, self.repetitions, sweep.seed + 1, self.passes,
                            first_order + len(self.blocks))
        self.planned = len({(b.variant, b.point.id) for b in self.blocks})
        self._state: dict[str, ScenarioState] = defaultdict(ScenarioState)
        self._built: dict[str, ScenarioWorkload] = {}
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvpages-transfer-worker")
        self._busy: dict[int, BusyQueue] = {}

    def workload(self, scenario: Scenario) -> ScenarioWorkload:
        built = self._built.get(scenario.id)
        if built is None:
            with self.session.phase("generate"):
                built = make_scenario_workload(scenario, self.device, SCENARIO_ROTATION)
            self._built[scenario.id] = built
        return built

    def run(self, benchmark, block: Block) -> None:
        scenario: Scenario = block.point
        state = self._state[block.case_id]
        record = not benchmark.disabled
        try:
            self._run(benchmark, block, scenario, get_step_variant(block.variant), state, record)
        finally:
            if block.last_of_point:
                self._built.pop(scenario.id, None)
                if record:
                    self._flush(scenario)

    def _run(self, benchmark, block: Block, scenario: Scenario, variant: StepVariant, state: ScenarioState,
             record: bool) -> None:
        if state.failed is not None:
            pytest.skip(f"{block.case_id}: recorded as {state.failed} in an earlier repetition")
        reason = variant.unavailable_reason(self.device)
        if reason is None and scenario.busy_us and self.device != "cuda":
            reason = "a busy-queue scenario needs CUDA: a CPU run has no device queue to wait behind"
        if reason is not None:
            self._stop(block, state, record, "skipped", reason, pytest.skip)
        finish = finish_for(scenario)
        try:
            workload = self.workload(scenario)
            if state.measured is None:
                with self.session.phase("check"):
                    for slices, expected in zip(workload.slices, workload.expected, strict=True):
                        problem = arrays_match(call_here(variant, finish, slices, scenario.page_size), finish(list(expected)))
                        if problem:
                            self._stop(block, state, record, "mismatch", f"wrong output: {problem}", _fail)
        except (RuntimeError, MemoryError) as exc:
            if not is_out_of_memory(exc):
                raise
            self._built.pop(scenario.id, None)
            self._stop(block, state, record, "out_of_memory", f"out of memory: {str(exc).splitlines()[0]}", pytest.skip)
        calls = scenario.calls()
        if state.measured is None:
            with self.session.phase("meter"):
                measured = measure_step(variant, finish, workload.slices[0], scenario.page_size)
            state.measured = measured
            expected_bytes = self._expected_bytes(variant, scenario)
            transfers = variant.expected_transfers(len(calls))
            if (measured.d2h_bytes, measured.d2h_transfers) != (expected_bytes, transfers):
                self._stop(block, state, record, "mismatch",
                           f"measured {measured.d2h_bytes} D2H bytes in {measured.d2h_transfers} transfers, expected "
                           f"{expected_bytes} in {transfers}", _fail)
        benchmark.group = scenario.id
        benchmark.extra_info.update(scenario=scenario.id, variant=variant.name, kind=scenario.kind,
                                    repetition=block.repetition, order=block.order, calls=len(calls),
                                    d2h_bytes=state.measured.d2h_bytes, d2h_transfers=state.measured.d2h_transfers)
        timed = Timed()
        fn = step_call(variant, finish, self._worker, timed)
        sync = synchronizer(self.device)
        if scenario.busy_us not in self._busy:  # calibrated once per duration
            self._busy[scenario.busy_us] = BusyQueue(scenario.busy_us if self.device == "cuda" else 0)
        busy = self._busy[scenario.busy_us]

        def before_round() -> None:
            sync()
            busy()

        with self.session.phase("timing"):
            rounds = 1
            if not benchmark.disabled:
                sweep = self.session.options.sweep
                per_call_s = warm_up(fn, workload.slices, scenario.page_size, before_round,
                                     WARMUP_FIRST_S if block.repetition == 0 else WARMUP_LATER_S)
                rounds = rounds_for(per_call_s, self.session.options.scenario_budget_s / self.repetitions,
                                    sweep.min_rounds, sweep.max_rounds)
            timed.blocked.clear()
            timed.ready.clear()
            busy.reset()
            result = time_block(benchmark, fn, workload.slices, scenario.page_size, before_round, rounds)
            busy_us = tuple(busy.measured_us()[-rounds:])
        problem = arrays_match(result.output, finish(list(workload.expected[result.input_index])))
        if problem:
            self._stop(block, state, record, "mismatch", f"wrong output in a timed round: {problem}", _fail)
        if record:
            state.blocks.append(ScenarioSampleSet(scenario.id, variant.name, block.repetition, block.order,
                                                  tuple(t * 1e6 for t in timed.blocked[-rounds:]),
                                                  tuple(t * 1e6 for t in timed.ready[-rounds:]), busy_us))

    def _expected_bytes(self, variant: StepVariant, scenario: Scenario) -> int:
        return variant.expected_d2h_bytes([c.tokens for c in scenario.calls()], scenario.page_size,
                                          ITEMSIZE[scenario.dtype])

    def _stop(self, block: Block, state: ScenarioState, record: bool, status: str, note: str, how) -> None:
        state.failed = status
        state.blocks.clear()
        if record:
            self.session.write_scenarios([self._row(block.point, get_step_variant(block.variant), state, status, note)])
        how(f"{block.case_id}: {note}")

    def _flush(self, scenario: Scenario) -> None:
        rows, samples = [], []
        for name in self.session.step_variant_names:
            state = self._state.get(f"{name}-{scenario.id}")
            if state is None or state.failed is not None or len(state.blocks) != self.repetitions:
                continue
            blocks = sorted(state.blocks, key=lambda b: b.repetition)
            rows.append(self._row(scenario, get_step_variant(name), state, "ok", "", blocks))
            samples += blocks
            state.blocks.clear()
        if rows:
            self.session.write_scenarios(rows, samples)

    def _row(self, scenario: Scenario, variant: StepVariant, state: ScenarioState, status: str, note: str,
             blocks: list[ScenarioSampleSet] | None = None) -> ScenarioRow:
        stats: dict[str, float | int | None] = dict.fromkeys(
            ("blocked_median_us", "blocked_q1_us", "blocked_q3_us", "ready_median_us", "ready_q1_us", "ready_q3_us",
             "rounds", "repetitions", "busy_measured_us"))
        if blocks:
            for what in ("blocked", "ready"):
                stats.update(quartiles([np.asarray(getattr(b, f"{what}_us")) for b in blocks], f"{what}_"))
            stats.update(rounds=sum(len(b.blocked_us) for b in blocks), repetitions=len(blocks))
            busy = [t for b in blocks for t in b.busy_us]
            stats["busy_measured_us"] = float(np.median(busy)) if busy else None
        measured = state.measured
        return ScenarioRow(
            scenario=scenario.id, kind=scenario.kind, side=scenario.side, variant=variant.name,
            device=self.device, dtype=scenario.dtype, layout=scenario.layout, requests=scenario.requests,
            tokens=sum(c.tokens for c in scenario.calls()), chunk_size=scenario.chunk_size,
            page_size=scenario.page_size, busy_us=scenario.busy_us, calls=len(scenario.calls()),
            expected_d2h_bytes=self._expected_bytes(variant, scenario),
            d2h_bytes=None if measured is None else measured.d2h_bytes,
            d2h_transfers=None if measured is None else measured.d2h_transfers,
            link="" if measured is None else measured.link, status=status, note=note,
            repro=self.session.scenario_repro(scenario, variant.name), **stats,  # type: ignore[arg-type]
        )

    def close(self) -> None:
        self._worker.shutdown(wait=True)


def _fail(message: str) -> None:
    pytest.fail(message, pytrace=False)

