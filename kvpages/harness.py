"""The sweep session: wires the schedule, the inputs, the checks, the meter and the timer to the run folder.

Data flows one way: sweep -> schedule of blocks -> workload -> variant (checked against
the reference and metered in the first block of each case, then timed in every block)
-> Rows when a point's last block finishes -> run folder.
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from kvpages import crosscheck as profiler_check
from kvpages import environment
from kvpages.inputs import Workload, make_workload, validate_page_layout
from kvpages.meter import D2HMeasurement, measure_d2h
from kvpages.options import BenchOptions
from kvpages.results import Row, RunMeta, RunWriter, SampleSet, create_run_dir, utc_now
from kvpages.schedule import Block, plan
from kvpages.stats import row_statistics
from kvpages.steps import step_variant_names
from kvpages.sweep import Point
from kvpages.timer import WARMUP_FIRST_S, WARMUP_LATER_S, rounds_for, synchronizer, time_block, warm_up
from kvpages.variants import Variant, get_variant, variant_names

if TYPE_CHECKING:
    from kvpages.scenario_run import ScenarioRunner

EXTRA_INFO = ("variant", "device", "device_name", "dtype", "layout", "seq_len", "page_size", "num_pages", "rotation",
              "expected_d2h_bytes", "d2h_bytes", "d2h_transfers", "link")
"""Row fields copied into each benchmark's pytest-benchmark `extra_info` (with `repetition` and `order`)."""


def resolve_device(choice: str) -> str:
    """'auto' becomes 'cuda' when CUDA is available, else 'cpu'."""
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def outputs_match(out: object, expected: np.ndarray) -> str | None:
    """None when `out` equals `expected` exactly (type, dtype, shape, values), else what differs."""
    if not isinstance(out, np.ndarray):
        return f"returned {type(out).__name__}, expected numpy.ndarray"
    if out.dtype != expected.dtype or out.shape != expected.shape:
        return f"returned {out.dtype}{list(out.shape)}, expected {expected.dtype}{list(expected.shape)}"
    differ = np.flatnonzero(out != expected)
    if differ.size:
        i = int(differ[0])
        return f"{differ.size} page indices differ; first at {i}: got {out[i]}, expected {expected[i]}"
    return None


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA or CPU allocation failure (torch raises a plain RuntimeError for the CPU allocator)."""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(exc)
    )


@dataclass
class CaseState:
    """What the session knows of one (variant, point) while its blocks run."""

    measured: D2HMeasurement | None = None
    failed: str | None = None  # the status of a row already recorded for it (mismatch, skipped, ...)
    note: str = ""  # the note of its ok row (e.g. the cross-check could not confirm the meter)
    blocks: list[SampleSet] = field(default_factory=list)


class KvSession:
    """The state of one pytest session of the sweep: options, device, schedule, current workload, run folder."""

    def __init__(self, options: BenchOptions, rootdir: Path, invocation_args: tuple[str, ...],
                 timing: bool = True) -> None:
        self.options = options
        self.device = resolve_device(options.device)
        self.rootdir = rootdir
        self.results_dir = Path(options.results_dir) if options.results_dir else rootdir / "results"
        self.device_name = environment.device_name(self.device)
        self.command = shlex.join(("pytest",) + tuple(invocation_args))
        self.started_utc = utc_now()
        self.phase_s: dict[str, float] = defaultdict(float)
        self.writer: RunWriter | None = None
        self.repetitions = options.sweep.repetitions if timing else 1
        names = options.variants or variant_names()
        self.variants: dict[str, Variant] = {name: get_variant(name) for name in names}
        self.passes = min(options.sweep.passes, self.repetitions)
        self.blocks = plan(tuple(self.variants), list(options.sweep.points(self.device)), self.repetitions,
                           options.sweep.seed, self.passes)
        self.planned = 0  # rows, once the points' benchmarks are collected (points_blocks)
        self.crosscheck = profiler_check.enabled(options.crosscheck, self.device)
        self._crosscheck_answers: dict[str, profiler_check.CheckAnswer] | None = None
        self.crosscheck_unavailable: str | None = None  # why the cross-check could not run (it is never retried)
        self._trace_dir: Path | None = None  # where the cross-check process leaves its profile
        self._cases: dict[str, CaseState] = defaultdict(CaseState)
        self._workload: Workload | None = None
        self._built: dict[Point, Workload] = {}
        self.step_variant_names: tuple[str, ...] = options.step_variants or step_variant_names()
        self._scenarios: ScenarioRunner | None = None
        self._pcie_loaded: str | None = None

    def points_blocks(self) -> tuple[Block, ...]:
        """The points' blocks, for the benchmarks in bench/test_d2h.py; their rows count as planned."""
        self.planned = len(self.blocks) // self.repetitions
        return self.blocks

    def scenario_runner(self) -> ScenarioRunner:
        """The runner of this session's scenarios, planned (after the points' blocks) on first use."""
        if self._scenarios is None:
            from kvpages.scenario_run import ScenarioRunner

            self._scenarios = ScenarioRunner(self, self.options.scenarios, first_order=len(self.blocks))
        return self._scenarios

    # ------------------------------------------------------------------ run

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phase_s[name] += time.perf_counter() - start

    def workload(self, point: Point) -> Workload:
        """The workload of `point`: generated and validated once, then re-copied into fresh memory for every
        pass over the points, so each pass samples another placement of the inputs (as a new process would)."""
        if self._workload is None or self._workload.point != point:
            self._workload = None  # free the previous pass's copy first
            with self.phase("generate"):
                built = self._built.get(point)
                if built is None:
                    built = make_workload(point)
                    for kv in built.kv_indices:
                        validate_page_layout(kv, point.page_size)
                    if self.passes > 1:
                        self._built[point] = built
                    self._workload = built
                else:
                    self._workload = built.fresh_copy()
        return self._workload

    def crosscheck_answer(self, block: Block) -> profiler_check.CheckAnswer | None:
        """The profiler cross-check's answer for this case (None: unavailable, see `crosscheck_unavailable`).

        The check process runs once, before any timing; when it fails, the failure is remembered and
        the session goes on timing, with the reason in every row's note (it never starts it again).
        """
        return self._run_crosscheck().get(block.case_id)

    def _run_crosscheck(self) -> dict[str, profiler_check.CheckAnswer]:
        if self._crosscheck_answers is None:
            cases = [profiler_check.CheckCase(b.variant, b.point) for b in self.blocks
                     if b.repetition == 0 and self.variants[b.variant].unavailable_reason(self.device) is None]
            self._crosscheck_answers = {}
            if not cases:
                return self._crosscheck_answers
            self._trace_dir = Path(tempfile.mkdtemp(prefix="kvpages-crosscheck-"))
            with self.phase("crosscheck"):
                try:
                    self._crosscheck_answers = profiler_check.run_crosscheck(
                        cases, trace_out=self._trace_dir / profiler_check.TRACE_FILE)
                except profiler_check.CrosscheckError as exc:
                    self.crosscheck_unavailable = str(exc)
        return self._crosscheck_answers

    def run(self, benchmark, block: Block) -> None:
        """Check and meter (first block of a case), time and collect one block; called by bench/."""
        point, variant = block.point, self.variants[block.variant]
        state = self._cases[block.case_id]
        record = not benchmark.disabled
        try:
            self._run(benchmark, block, variant, state, record)
        finally:
            if block.last_of_point:
                self._built.pop(point, None)
                if record:
                    self._flush(point)

    def _run(self, benchmark, block: Block, variant: Variant, state: CaseState, record: bool) -> None:
        point = block.point
        if state.failed is not None:
            pytest.skip(f"{block.case_id}: recorded as {state.failed} in an earlier repetition")
        reason = variant.unavailable_reason(point.device)
        if reason is not None:
            self._stop(block, state, record, "skipped", reason, pytest.skip)
        if self.crosscheck and state.measured is None:
            answer = self.crosscheck_answer(block)
            if answer is None:
                state.note = f"cross-check unavailable: {self.crosscheck_unavailable}"
            elif answer.outcome == "mismatch":
                self._stop(block, state, record, "mismatch", f"profiler cross-check: {answer.detail}", _fail)
            elif answer.outcome == "lost_records":
                state.note = f"cross-check inconclusive: {answer.detail}"
        try:
            workload = self.workload(point)
            if state.measured is None:
                with self.phase("check"):
                    for kv, expected in zip(workload.kv_indices, workload.expected, strict=True):
                        problem = outputs_match(variant.fn(kv, point.page_size), expected)
                        if problem:
                            self._stop(block, state, record, "mismatch", f"wrong output: {problem}", _fail)
        except (RuntimeError, MemoryError) as exc:
            if not is_out_of_memory(exc):
                raise
            self._workload = None
            self._built.pop(point, None)
            note = f"out of memory: {str(exc).splitlines()[0]}"
            self._stop(block, state, record, "out_of_memory", note, pytest.skip)

        if state.measured is None:
            with self.phase("meter"):
                measured = measure_d2h(variant.fn, workload.kv_indices[0], point.page_size)
            expected_bytes = variant.expected_d2h_bytes(point.seq_len, point.page_size, point.itemsize)
            if measured.d2h_bytes != expected_bytes:
                state.measured = measured
                self._stop(block, state, record, "mismatch",
                           f"measured {measured.d2h_bytes} D2H bytes, expected {expected_bytes} "
                           f"({variant.moves.value} x {point.itemsize} bytes)", _fail)
            state.measured = measured

        benchmark.group = point.id
        row = self._row(block, state.measured, status="ok", note="", rotation=workload.rotation)
        benchmark.extra_info.update({k: getattr(row, k) for k in EXTRA_INFO if getattr(row, k) is not None})
        benchmark.extra_info.update(repetition=block.repetition, order=block.order)
        with self.phase("timing"):
            sync = synchronizer(point.device)
            rounds = 1  # timing disabled: pytest-benchmark calls it once
            if not benchmark.disabled:
                sweep = self.options.sweep
                per_call_s = warm_up(variant.fn, workload.kv_indices, point.page_size, sync,
                                     WARMUP_FIRST_S if block.repetition == 0 else WARMUP_LATER_S)
                rounds = rounds_for(per_call_s, sweep.time_budget_s / sweep.repetitions, sweep.min_rounds,
                                    sweep.max_rounds)
            result = time_block(benchmark, variant.fn, workload.kv_indices, point.page_size, sync, rounds)
        if point.device == "cuda" and self._pcie_loaded is None and record:  # right after a timed loop
            self._pcie_loaded = environment.pcie_link_now() or "unknown"
        problem = outputs_match(result.output, workload.expected[result.input_index])
        if problem:
            self._stop(block, state, record, "mismatch", f"wrong output in a timed round: {problem}", _fail)
        if record:
            state.blocks.append(SampleSet(
                variant.name, point.dtype, point.layout, point.seq_len, point.page_size, block.repetition,
                block.order, tuple(t * 1e6 for t in benchmark.stats.stats.data),
            ))

    # ------------------------------------------------------------------ record

    def _stop(self, block: Block, state: CaseState, record: bool, status: str, note: str, how) -> None:
        """Record the case's row as `status` now (it runs no further blocks), then skip or fail the test."""
        state.failed = status
        state.blocks.clear()
        if record:
            self._write([self._row(block, state.measured, status=status, note=note)])
        how(f"{block.case_id}: {note}")

    def _flush(self, point: Point) -> None:
        """Write the rows (and samples) of `point`'s cases that timed every repetition."""
        rows, samples = [], []
        for name in self.variants:
            block_id = f"{name}-{point.id}"
            state = self._cases.get(block_id)
            if state is None or state.failed is not None or len(state.blocks) != self.repetitions:
                continue
            blocks = sorted(state.blocks, key=lambda b: b.repetition)
            stats = row_statistics([np.asarray(b.samples_us) for b in blocks])
            template = Block(name, point, 0, 0, False)
            rows.append(self._row(template, state.measured, status="ok", note=state.note, rotation=point.rotation,
                                  rounds=sum(len(b.samples_us) for b in blocks), iterations=1,
                                  repetitions=len(blocks), **stats))
            samples += blocks
            state.blocks.clear()
        if rows:
            self._write(rows, samples)

    def _row(self, block: Block, measured: D2HMeasurement | None, *, status: str, note: str, rotation: int = 0,
             **timings) -> Row:
        point, variant = block.point, self.variants[block.variant]
        empty = dict.fromkeys(("median_us", "iqr_us", "q1_us", "q3_us", "min_us", "max_us", "mean_us", "stddev_us",
                               "rounds", "iterations", "repetitions", "rep_spread"))
        return Row(
            variant=variant.name,
            device=point.device,
            device_name=self.device_name,
            dtype=point.dtype,
            layout=point.layout,
            seq_len=point.seq_len,
            page_size=point.page_size,
            num_pages=point.num_pages,
            rotation=rotation,
            expected_d2h_bytes=variant.expected_d2h_bytes(point.seq_len, point.page_size, point.itemsize),
            d2h_bytes=None if measured is None else measured.d2h_bytes,
            d2h_transfers=None if measured is None else measured.d2h_transfers,
            link="" if measured is None else measured.link,
            **{**empty, **timings},
            status=status,
            note=note,
            repro=self.repro(block),
        )

    def repro(self, block: Block) -> str:
        """The command that re-runs just this case, with this run's repetitions."""
        point = block.point
        return shlex.join([
            "pytest", "bench/", "--benchmark-only",
            "--kv-device", point.device,
            "--kv-variants", block.variant,
            "--kv-seq-lens", str(point.seq_len),
            "--kv-page-sizes", str(point.page_size),
            "--kv-dtypes", point.dtype,
            "--kv-layouts", point.layout,
            "--kv-seed", str(point.seed),
            "--kv-time-budget", repr(self.options.sweep.time_budget_s),
            "--kv-repetitions", str(self.options.sweep.repetitions),
        ])

    def scenario_repro(self, scenario, variant: str) -> str:
        """The command that re-runs just this (scenario, step variant)."""
        common = ["pytest", "bench/test_steps.py", "--benchmark-only", "--kv-device", self.device,
                  "--kv-step-variants", variant, "--kv-page-sizes", str(scenario.page_size), "--kv-dtypes", scenario.dtype,
                  "--kv-repetitions", str(self.options.sweep.repetitions),
                  "--kv-time-budget", repr(self.options.scenario_budget_s)]
        if scenario.kind == "step":
            return shlex.join([*common, "--kv-step-sizes", str(scenario.batch), "--kv-step-lens", scenario.lengths_spec])
        return shlex.join([*common, "--kv-request-lens", str(scenario.prompt_len), "--kv-chunk-size",
                           str(scenario.chunk_size), "--kv-prefix", str(scenario.prefix)])

    def _writer(self) -> RunWriter:
        """The run folder, created when the first row is recorded."""
        if self.writer is None:
            if self.crosscheck:  # before the environment says whether it confirmed the meter
                self._run_crosscheck()
            env = environment.capture(self.device, self.rootdir, self.crosscheck and not self.crosscheck_unavailable)
            label = "cpu" if self.device == "cpu" else f"cuda-{self.device_name}"
            path = create_run_dir(self.results_dir, label)
            meta = RunMeta(
                run_id=path.name,
                preset=self.options.preset,
                options=self.options.as_strings(),
                command=self.command,
                started_utc=self.started_utc,
                environment=env,
                repetitions=self.repetitions,
                order_seed=self.options.sweep.seed,
                crosscheck=self.crosscheck_status(),
            )
            self.writer = RunWriter(path, meta)
            if self._trace_dir is not None and (self._trace_dir / profiler_check.TRACE_FILE).exists():
                shutil.move(self._trace_dir / profiler_check.TRACE_FILE, path / profiler_check.TRACE_FILE)
        return self.writer

    def crosscheck_status(self) -> str:
        if not self.crosscheck:
            return "off"
        if self.crosscheck_unavailable is not None:
            return f"unavailable: {self.crosscheck_unavailable}"
        return "on (own process)"

    def _write(self, rows: list[Row], samples: list[SampleSet] | None = None) -> None:
        with self.phase("write"):
            self._writer().add(rows, samples or ())

    def write_scenarios(self, rows, samples=()) -> None:
        with self.phase("write"):
            self._writer().add_scenarios(rows, samples)

    def finish(self, exitstatus: int, total_s: float) -> None:
        """Close the run folder: completed only if every planned case ran and the session passed."""
        if self._scenarios is not None:
            self._scenarios.close()
        if self._trace_dir is not None:
            shutil.rmtree(self._trace_dir, ignore_errors=True)
        if self.writer is None:
            return
        done = len(self.writer.rows) + len(self.writer.scenario_rows)
        planned = self.planned + (self._scenarios.planned if self._scenarios is not None else 0)
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            completed, note = False, f"interrupted after {done} of {planned} rows"
        elif done < planned:
            completed, note = False, f"only {done} of {planned} rows were recorded (deselected or failed cases)"
        elif exitstatus != pytest.ExitCode.OK:
            completed, note = False, f"all {done} rows recorded, but the session failed (exit status {int(exitstatus)})"
        else:
            completed, note = True, f"all {done} rows recorded"
        if self._pcie_loaded is not None:
            self.writer.meta.environment = dataclasses.replace(self.writer.meta.environment,
                                                               pcie_link_loaded=self._pcie_loaded)
        timing = {f"{name}_s": value for name, value in sorted(self.phase_s.items())}
        timing["session_s"] = total_s
        self.writer.finish(completed, note, timing)


def _fail(message: str) -> None:
    pytest.fail(message, pytrace=False)

