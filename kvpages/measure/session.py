"""The sweep session: wires the options, the plan of blocks, the runner, the cross-check and the run folder.

One session per pytest session (kvpages.plugin). It plans the blocks of the sweep's points and of
the whole requests and steps as frozen data (kvpages.measure.schedule), hands them to one
runner (kvpages.measure.runner), creates the run folder when the first row is recorded, and
closes it with the run's completion and phase timings.
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from kvpages.core.options import BenchOptions, crosscheck_enabled
from kvpages.measure import breakdown as where_time_goes
from kvpages.measure import crosscheck as profiler_check
from kvpages.measure import environment
from kvpages.measure.runner import Runner
from kvpages.measure.schedule import Block, plan
from kvpages.measure.steps import get_step_variant, step_variant_names
from kvpages.measure.targets import Context, PointTarget, ScenarioTarget, Target
from kvpages.measure.variants import variant_names
from kvpages.schema.rows import Row, RunMeta, Samples, ScenarioRow, Table
from kvpages.schema.writer import RunWriter, create_run_dir, utc_now


def resolve_device(choice: str) -> str:
    """'auto' becomes 'cuda' when CUDA is available, else 'cpu'."""
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


class KvSession:
    """The state of one pytest session of the sweep: options, device, plan, runner, cross-check, run folder."""

    def __init__(self, options: BenchOptions, rootdir: Path, invocation_args: tuple[str, ...],
                 timing: bool = True) -> None:
        self.options = options
        self.device = resolve_device(options.device_choice)
        self.rootdir = rootdir
        self.results_dir = Path(options.results_dir) if options.results_dir else rootdir / "results"
        self.context = Context(self.device, environment.device_name(self.device), options)
        self.command = shlex.join(("pytest",) + tuple(invocation_args))
        self.started_utc = utc_now()
        self.phase_s: dict[str, float] = defaultdict(float)
        self.writer: RunWriter | None = None
        sweep = options.sweep
        self.repetitions = sweep.repetitions if timing else 1
        self.passes = min(sweep.passes, self.repetitions)
        self.variants = options.variants or variant_names()
        self.step_variants = options.step_variants or step_variant_names()
        points = [PointTarget(p) for p in sweep.points(self.device)]
        self.point_blocks = plan(self.variants, points, self.repetitions, sweep.seed, self.passes)
        per_request = [n for n in self.step_variants if not get_step_variant(n).batched]
        requests = [ScenarioTarget(s) for s in options.scenario_set if s.kind == "request"]
        steps = [ScenarioTarget(s) for s in options.scenario_set if s.kind == "step"]
        first = len(self.point_blocks)
        self.scenario_blocks = plan(per_request, requests, self.repetitions, sweep.seed, self.passes, first)
        self.scenario_blocks += plan(self.step_variants, steps, self.repetitions, sweep.seed + 1, self.passes,
                                     first + len(self.scenario_blocks))
        self.planned: set[str] = set()  # the cases whose benchmarks were collected
        self.runner = Runner(self)
        self.crosscheck = crosscheck_enabled(options.crosscheck_mode, self.device)
        self.crosscheck_unavailable: str | None = None  # why the cross-check could not run (it is never retried)
        self._crosscheck_answers: dict[str, profiler_check.CheckAnswer] | None = None
        self._trace_dir: Path | None = None  # where the cross-check process leaves its profile
        self._pcie_loaded: str | None = None

    def collected(self, blocks: Sequence[Block]) -> Sequence[Block]:
        """`blocks`, for a benchmark's parametrization; their cases count as planned rows."""
        self.planned |= {b.case_id for b in blocks}
        return blocks

    def variants_of(self, target: Target) -> Sequence[str]:
        return self.variants if isinstance(target, PointTarget) else self.step_variants

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phase_s[name] += time.perf_counter() - start

    # ------------------------------------------------------------------ the profiler cross-check

    def crosscheck_answer(self, block: Block) -> profiler_check.CheckAnswer | None:
        """The profiler cross-check's answer for this case; None when it is off or unavailable.

        The check process runs once, before any timing, over every planned case; when it fails, the
        failure is remembered and the session goes on timing, with the reason in every row's note
        (it never starts it again).
        """
        return self._run_crosscheck().get(block.case_id) if self.crosscheck else None

    def _run_crosscheck(self) -> dict[str, profiler_check.CheckAnswer]:
        if self._crosscheck_answers is None:
            cases = [profiler_check.CheckCase(b.variant, b.point) for b in self.point_blocks + self.scenario_blocks
                     if b.repetition == 0 and b.case_id in self.planned
                     and b.point.unavailable_reason(b.variant, self.device) is None]
            self._crosscheck_answers = {}
            if not cases:
                return self._crosscheck_answers
            self._trace_dir = Path(tempfile.mkdtemp(prefix="kvpages-crosscheck-"))
            with self.phase("crosscheck"):
                try:
                    self._crosscheck_answers = profiler_check.run_crosscheck(
                        cases, self.device, trace_out=self._trace_dir / profiler_check.TRACE_FILE)
                except profiler_check.CrosscheckError as exc:
                    self.crosscheck_unavailable = str(exc)
        return self._crosscheck_answers

    def crosscheck_status(self) -> str:
        if not self.crosscheck:
            return "off"
        if self.crosscheck_unavailable is not None:
            return f"unavailable: {self.crosscheck_unavailable}"
        return "on (own process)"

    def after_timed_block(self, record: bool) -> None:
        """Right after a timed loop: read the PCIe link once, while it is loaded (an idle link downshifts)."""
        if self.device == "cuda" and self._pcie_loaded is None and record:
            self._pcie_loaded = environment.pcie_link_now() or "unknown"

    # ------------------------------------------------------------------ the run folder

    def _writer(self) -> RunWriter:
        """The run folder, created when the first row is recorded."""
        if self.writer is None:
            if self.crosscheck:  # before the environment says whether it confirmed the meter
                self._run_crosscheck()
            env = environment.capture(self.device, self.rootdir, self.crosscheck and not self.crosscheck_unavailable)
            label = "cpu" if self.device == "cpu" else f"cuda-{self.context.device_name}"
            path = create_run_dir(self.results_dir, label)
            meta = RunMeta(
                run_id=path.name,
                preset=self.options.preset_name,
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

    def write(self, table: Table, rows: Sequence[Row | ScenarioRow], samples: Sequence[Samples] = ()) -> None:
        with self.phase("write"):
            self._writer().add(table, rows, samples)

    def finish(self, exitstatus: int, total_s: float) -> None:
        """Close the run folder: completed only if every planned case ran and the session passed."""
        self.context.worker.shutdown(wait=True)
        if self._trace_dir is not None:
            shutil.rmtree(self._trace_dir, ignore_errors=True)
        if self.writer is None:
            return
        done, planned = self.writer.recorded, len(self.planned)
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            completed, note = False, f"interrupted after {done} of {planned} rows"
        elif done < planned:
            completed, note = False, f"only {done} of {planned} rows were recorded (deselected or failed cases)"
        elif exitstatus != pytest.ExitCode.OK:
            completed, note = False, f"all {done} rows recorded, but the session failed (exit status {int(exitstatus)})"
        else:
            completed, note = True, f"all {done} rows recorded"
        if self.options.breakdown != "off":
            self.writer.meta.breakdown = breakdown_note(self, exitstatus)
        if self._pcie_loaded is not None:
            self.writer.meta.environment = dataclasses.replace(self.writer.meta.environment,
                                                               pcie_link_loaded=self._pcie_loaded)
        timing = {f"{name}_s": value for name, value in sorted(self.phase_s.items())}
        timing["session_s"] = total_s
        self.writer.finish(completed, note, timing)


def breakdown_note(session: KvSession, exitstatus: int) -> str:
    """Where the time goes, after the last timed block, in a process of its own: meta.json's note of it."""
    if exitstatus == pytest.ExitCode.INTERRUPTED or session.writer is None:
        return "not run: the session was interrupted"
    with session.phase("breakdown"):
        cases = where_time_goes.planned_cases(session.point_blocks, session.planned, session.device)
        return where_time_goes.write_breakdown_into(session.writer.path, cases, session.device)
