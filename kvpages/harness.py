"""Runs one (variant, point) case: check, meter, time, record.

Data flows one way: sweep point -> workload -> variant (checked against the
reference, metered in its own pass, then timed by pytest-benchmark) -> Row -> run folder.
"""

from __future__ import annotations

import dataclasses
import itertools
import shlex
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from kvpages import environment
from kvpages.inputs import Workload, make_workload, validate_page_layout
from kvpages.meter import crosscheck, measure_d2h, profiler_d2h
from kvpages.options import BenchOptions
from kvpages.results import Row, RunMeta, RunWriter, SampleSet, create_run_dir, utc_now
from kvpages.sweep import Point
from kvpages.variants import Variant, get_variant, variant_names

WARMUP_MIN_S = 0.005
"""Warm-up runs every rotation input once, and for at least this long (untimed)."""


@dataclass(frozen=True)
class Case:
    """One benchmark: a variant at a point."""

    variant: Variant
    point: Point

    @property
    def id(self) -> str:
        return f"{self.variant.name}-{self.point.id}"


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


EXTRA_INFO = ("variant", "device", "device_name", "dtype", "layout", "seq_len", "page_size", "num_pages", "rotation",
              "expected_d2h_bytes", "d2h_bytes", "d2h_transfers", "link")
"""Row fields copied into each benchmark's pytest-benchmark `extra_info`."""
STAT_FIELDS = ("median", "iqr", "q1", "q3", "min", "max", "mean", "stddev")


def with_stats(row: Row, stats, iterations: int) -> Row:
    """`row` with pytest-benchmark's statistics (seconds per call) in microseconds."""
    times = {f"{name}_us": getattr(stats, name) * 1e6 for name in STAT_FIELDS}
    return dataclasses.replace(row, **times, rounds=stats.rounds, iterations=iterations)


class KvSession:
    """The state of one pytest session of the sweep: options, device, current workload, run folder."""

    def __init__(self, options: BenchOptions, rootdir: Path, invocation_args: tuple[str, ...]) -> None:
        self.options = options
        self.device = resolve_device(options.device)
        self.rootdir = rootdir
        self.results_dir = Path(options.results_dir) if options.results_dir else rootdir / "results"
        self.device_name = environment.device_name(self.device)
        self.command = shlex.join(("pytest",) + tuple(invocation_args))
        self.started_utc = utc_now()
        self.phase_s: dict[str, float] = defaultdict(float)
        self.writer: RunWriter | None = None
        self.planned = 0
        self._workload: Workload | None = None

    # ------------------------------------------------------------------ plan

    def cases(self) -> list[Case]:
        names = self.options.variants or variant_names()
        variants = [get_variant(name) for name in names]
        cases = [Case(v, point) for point in self.options.sweep.points(self.device) for v in variants]
        self.planned = len(cases)
        return cases

    # ------------------------------------------------------------------ run

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phase_s[name] += time.perf_counter() - start

    def workload(self, point: Point) -> Workload:
        """The (cached) workload of `point`, generated and validated once per point."""
        if self._workload is None or self._workload.point != point:
            self._workload = None  # free the previous point's memory first
            with self.phase("generate"):
                workload = make_workload(point)
                for kv in workload.kv_indices:
                    validate_page_layout(kv, point.page_size)
            self._workload = workload
        return self._workload

    def run(self, benchmark, case: Case) -> None:
        """Check, meter, time and record one case; called by the benchmark in bench/."""
        point, variant = case.point, case.variant
        record = not benchmark.disabled
        reason = variant.unavailable_reason(point.device)
        if reason is not None:
            if record:
                self._record(self._row(case, None, status="skipped", note=reason))
            pytest.skip(f"{variant.name}: {reason}")
        try:
            workload = self.workload(point)
        except torch.cuda.OutOfMemoryError as exc:  # an alias of torch.OutOfMemoryError in recent torch
            self._workload = None
            note = f"out of memory generating the inputs: {str(exc).splitlines()[0]}"
            if record:
                self._record(self._row(case, None, status="out_of_memory", note=note))
            pytest.skip(note)

        with self.phase("check"):
            for kv, expected in zip(workload.kv_indices, workload.expected):
                problem = outputs_match(variant.fn(kv, point.page_size), expected)
                if problem:
                    self._fail(case, record, f"wrong output: {problem}")

        with self.phase("meter"):
            measured = measure_d2h(variant.fn, workload.kv_indices[0], point.page_size)
            if point.device == "cuda":
                profiled = profiler_d2h(variant.fn, workload.kv_indices[0], point.page_size)
                crosscheck(measured, profiled, case.id)
        row = self._row(case, measured, status="ok", note="", rotation=workload.rotation)
        if measured.d2h_bytes != row.expected_d2h_bytes:
            self._fail(
                case,
                record,
                f"measured {measured.d2h_bytes} D2H bytes, expected {row.expected_d2h_bytes} "
                f"({variant.moves.value} x {point.itemsize} bytes)",
                measured,
            )

        benchmark.group = point.id
        benchmark.extra_info.update(
            {k: v for k, v in dataclasses.asdict(row).items() if k in EXTRA_INFO and v is not None}
        )
        with self.phase("timing"):
            result, index = self._time(benchmark, variant.fn, workload)
        problem = outputs_match(result, workload.expected[index])
        if problem:
            self._fail(case, record, f"wrong output in the last timed round: {problem}", measured)
        if record:
            stats = benchmark.stats.stats
            samples = SampleSet(
                variant.name, point.dtype, point.layout, point.seq_len, point.page_size,
                tuple(t * 1e6 for t in stats.data),
            )
            self._record(with_stats(row, stats, benchmark.stats.iterations), samples)

    def _time(self, benchmark, fn: Callable, workload: Workload) -> tuple[object, int]:
        """Warm up (untimed), then time one call per round, rotating inputs; returns the last result and its input."""
        page_size = workload.point.page_size
        inputs = workload.kv_indices
        sync = torch.cuda.synchronize if workload.point.device == "cuda" else (lambda: None)
        sweep = self.options.sweep
        rounds = 1
        if not benchmark.disabled:
            calls, start = 0, time.perf_counter()
            while calls < len(inputs) or time.perf_counter() - start < WARMUP_MIN_S:
                sync()
                fn(inputs[calls % len(inputs)], page_size)
                calls += 1
            per_call_s = (time.perf_counter() - start) / calls
            rounds = max(sweep.min_rounds, min(sweep.max_rounds, int(sweep.time_budget_s / per_call_s)))
        order = itertools.cycle(range(len(inputs)))
        last = [0]

        def setup():
            sync()  # nothing queued before a round may leak into it
            last[0] = next(order)
            return (inputs[last[0]], page_size), {}

        result = benchmark.pedantic(fn, setup=setup, rounds=rounds, warmup_rounds=0, iterations=1)
        return result, last[0]

    # ------------------------------------------------------------------ record

    def _fail(self, case: Case, record: bool, note: str, measured=None) -> None:
        if record:
            self._record(self._row(case, measured, status="mismatch", note=note))
        pytest.fail(f"{case.id}: {note}", pytrace=False)

    def _row(self, case: Case, measured, *, status: str, note: str, rotation: int = 0) -> Row:
        """The row of `case` without timings (`with_stats` adds them)."""
        point, variant = case.point, case.variant
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
            median_us=None, iqr_us=None, q1_us=None, q3_us=None, min_us=None, max_us=None, mean_us=None,
            stddev_us=None, rounds=None, iterations=None,
            status=status,
            note=note,
            repro=self.repro(case),
        )

    def repro(self, case: Case) -> str:
        """The command that re-runs just this case."""
        point = case.point
        return shlex.join([
            "pytest", "bench/", "--benchmark-only",
            "--kv-device", point.device,
            "--kv-variants", case.variant.name,
            "--kv-seq-lens", str(point.seq_len),
            "--kv-page-sizes", str(point.page_size),
            "--kv-dtypes", point.dtype,
            "--kv-layouts", point.layout,
            "--kv-seed", str(point.seed),
            "--kv-time-budget", repr(self.options.sweep.time_budget_s),
        ])

    def _record(self, row: Row, samples: SampleSet | None = None) -> None:
        with self.phase("write"):
            if self.writer is None:
                env = environment.capture(self.device, self.rootdir)
                label = "cpu" if self.device == "cpu" else f"cuda-{self.device_name}"
                path = create_run_dir(self.results_dir, label)
                meta = RunMeta(
                    run_id=path.name,
                    preset=self.options.preset,
                    options=self.options.as_strings(),
                    command=self.command,
                    started_utc=self.started_utc,
                    environment=env,
                )
                self.writer = RunWriter(path, meta)
            self.writer.add(row, samples)

    def finish(self, exitstatus: int, total_s: float) -> None:
        """Close the run folder: completed only if every planned case ran and the session passed."""
        if self.writer is None:
            return
        done = len(self.writer.rows)
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            completed, note = False, f"interrupted after {done} of {self.planned} rows"
        elif done < self.planned:
            completed, note = False, f"only {done} of {self.planned} rows were recorded (deselected or failed cases)"
        elif exitstatus != pytest.ExitCode.OK:
            completed, note = False, f"all {done} rows recorded, but the session failed (exit status {int(exitstatus)})"
        else:
            completed, note = True, f"all {done} rows recorded"
        timing = {f"{name}_s": value for name, value in sorted(self.phase_s.items())}
        timing["session_s"] = total_s
        self.writer.finish(completed, note, timing)
