"""The sweep session: wires the options, the plan of blocks, the runner, the cross-check and the run folder.

One session per pytest session (kvpages.plugin). It plans the blocks of the sweep's points and of
the whole requests and steps as frozen data (kvpages.measure.schedule), hands this process's
share to one runner (kvpages.measure.runner), starts the earlier processes' shares in fresh
worker processes first (`run_workers`, kvpages.measure.workers), creates the run folder when
the first row is recorded, and closes it with the run's completion, processes and phase timings.
In a worker, the session logs its blocks instead and writes no run folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from kvpages.core.options import BenchOptions, crosscheck_enabled
from kvpages.core.scenarios import StepScenario
from kvpages.measure import breakdown as where_time_goes
from kvpages.measure import crosscheck as profiler_check
from kvpages.measure import environment
from kvpages.measure.group import Group, Launch
from kvpages.measure.inputs import PoolCache
from kvpages.measure.ranks import RankTarget
from kvpages.measure.runner import Runner
from kvpages.measure.schedule import Block, in_run_order, plan
from kvpages.measure.steps import get_step_variant, step_variant_names
from kvpages.measure.targets import Context, PointTarget, ScenarioTarget, Target
from kvpages.measure.variants import variant_names
from kvpages.measure.workers import (
    EndRecord,
    WorkerCommand,
    WorkerLog,
    WorkerRun,
    json_path,
    log_path,
    run_worker,
    write_cases,
)
from kvpages.schema.meta import ProcessInfo, RunMeta
from kvpages.schema.rows import RankRow, Row, Samples, ScenarioRow, Table
from kvpages.schema.writer import RunWriter, create_run_dir, utc_now


def resolve_device(choice: str) -> str:
    """'auto' becomes 'cuda' when CUDA is available, else 'cpu'."""
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


class KvSession:
    """The state of one pytest session of the sweep: options, device, plan, runner, cross-check, run folder."""

    def __init__(self, options: BenchOptions, rootdir: Path, invocation_args: tuple[str, ...],
                 timing: bool = True, worker: int | None = None, worker_dir: Path | None = None,
                 configured_at: float = 0.0, launch: Launch | None = None) -> None:
        self.options = options
        self.configured_at = configured_at  # perf_counter at pytest_configure
        self.device = resolve_device(options.device_choice)
        self.rootdir = rootdir
        self.results_dir = Path(options.results_dir) if options.results_dir else rootdir / "results"
        group = None if launch is None else Group(launch, self.device, options.rank_timeout_s)  # joins the ranks
        self.context = Context(self.device, environment.device_name(self.device), options, group=group)
        self.launcher = ("pytest",) if launch is None else launch.command
        self.command = shlex.join(self.launcher + tuple(invocation_args))
        self.started_utc = utc_now()
        self.phase_s: dict[str, float] = defaultdict(float)
        self.writer: RunWriter | None = None
        sweep = options.sweep
        self.repetitions = sweep.repetitions if timing else 1
        self.processes = sweep.processes if timing else 1
        self.process = self.processes - 1 if worker is None else worker
        self.passes = min(sweep.passes, -(-self.repetitions // self.processes))  # per process
        self.log = None if worker is None or worker_dir is None else WorkerLog(log_path(worker_dir, worker))
        self.pool_cache = None if worker_dir is None else PoolCache(worker_dir)  # the session's: set by run_workers
        self.variants = options.variants or variant_names()
        self.step_variants = options.step_variants or step_variant_names()
        self.point_blocks, self.scenario_blocks = plan_blocks(self, group)
        self.planned: set[str] = set()  # the cases whose benchmarks were collected
        self.runner = Runner(self)
        self.crosscheck = crosscheck_enabled(options.crosscheck_mode, self.device) and self.log is None
        self.crosscheck_unavailable: str | None = None  # why the cross-check could not run (it is never retried)
        self._crosscheck_answers: dict[str, profiler_check.CheckAnswer] | None = None
        self.trace_dir: Path | None = None  # where the cross-check process leaves its profile
        self._loaded: environment.Loaded | None = None  # the device's link and clock under load
        self.workers: list[WorkerRun] = []
        self.worker_benchmarks: list[dict] = []  # the workers' pytest-benchmark JSON entries
        self.loop_started: float | None = None  # perf_counter when this process's test loop began

    def collected(self, blocks: Sequence[Block]) -> Sequence[Block]:
        """This process's share of `blocks`, for a benchmark's parametrization; their cases count as planned rows."""
        own = [b for b in blocks if b.process == self.process]
        self.planned |= {b.case_id for b in own}
        return own

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
        return self.run_crosscheck().get(block.case_id) if self.crosscheck else None

    def run_crosscheck(self) -> dict[str, profiler_check.CheckAnswer]:
        if self._crosscheck_answers is None:
            cases = [profiler_check.CheckCase(b.variant, b.point) for b in self.point_blocks + self.scenario_blocks
                     if b.repetition == 0 and b.case_id in self.planned
                     and b.point.unavailable_reason(b.variant, self.device) is None]
            self._crosscheck_answers = {}
            if not cases:
                return self._crosscheck_answers
            self.trace_dir = Path(tempfile.mkdtemp(prefix="kvpages-crosscheck-"))
            with self.phase("crosscheck"):
                try:
                    self._crosscheck_answers = profiler_check.run_crosscheck(
                        cases, self.device, trace_out=self.trace_dir / profiler_check.TRACE_FILE)
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
        """Right after a timed loop: read the PCIe link and the SM clock once, while the device is loaded (an idle
        link downshifts, an idle clock drops)."""
        if self.device == "cuda" and self._loaded is None and record:
            self._loaded = environment.loaded_now()

    # ------------------------------------------------------------------ the run folder

    def _writer(self) -> RunWriter:
        """The run folder, created when the first row is recorded."""
        if self.writer is None:
            self.writer = open_run_folder(self)
        return self.writer

    def write(self, table: Table, rows: Sequence[Row | ScenarioRow | RankRow], samples: Sequence[Samples] = (),
              cases: int | None = None) -> None:
        group = self.context.group
        if group is not None and group.rank != 0:  # rank 0 gathered every rank's samples and writes the run folder
            return
        with self.phase("write"):
            self._writer().add(table, rows, samples, cases)

    def finish(self, exitstatus: int, total_s: float) -> None:
        """Close the run folder: completed only if every planned case ran and the session passed (a worker: its log)."""
        self.context.worker.shutdown(wait=True)
        group = self.context.group
        if group is not None:
            group.close()
        if self.trace_dir is not None:
            shutil.rmtree(self.trace_dir, ignore_errors=True)
        if self.log is not None:
            self.log.end(EndRecord(os.getpid(), self.runner.first_block_at, self.phase_s["generate"],
                                   self.runner.blocks_run))
        if self.writer is None:
            return
        self.writer.meta.processes = process_infos(self, total_s)
        done, planned = self.writer.recorded, len(self.planned)
        rows = "rows" if group is None else "cases"  # a multi-rank case has a row per rank and role
        if group is not None and group.failure is not None:
            completed, note = False, f"stopped after {done} of {planned} cases: {group.failure}"
        elif exitstatus == pytest.ExitCode.INTERRUPTED:
            completed, note = False, f"interrupted after {done} of {planned} {rows}"
        elif done < planned:
            completed, note = False, f"only {done} of {planned} {rows} were recorded (deselected or failed cases)"
        elif exitstatus != pytest.ExitCode.OK:
            completed, note = False, f"all {done} {rows} recorded, but the session failed (exit status {int(exitstatus)})"
        else:
            completed, note = True, f"all {done} {rows} recorded"
        if self._loaded is not None:
            self.writer.meta.environment = dataclasses.replace(self.writer.meta.environment,
                                                               pcie_link_loaded=self._loaded.pcie_link or "unknown",
                                                               sm_clock_mhz_loaded=self._loaded.sm_clock_mhz)
        if self.options.breakdown != "off":  # what meta.json says if this process is stopped during the profile
            self.writer.meta.breakdown = "not finished: the sweep was stopped during the profiled passes"
        timing = {f"{name}_s": value for name, value in sorted(self.phase_s.items())} | {"session_s": total_s}
        self.writer.finish(completed, note, timing)  # the run folder is finished before the breakdown starts
        if self.options.breakdown != "off":
            add_breakdown(self, exitstatus)

def plan_blocks(session: KvSession, group: Group | None) -> tuple[tuple[Block, ...], tuple[Block, ...]]:
    """The session's blocks, in run order: the points', and the whole requests' and steps' (a multi-rank run: the
    steps alone, each timed on every rank at once)."""
    options, sweep = session.options, session.options.sweep
    points: list[Target] = [PointTarget(p) for p in sweep.points(session.device)]
    per_request = [n for n in session.step_variants if not get_step_variant(n).batched]
    requests: list[Target] = [ScenarioTarget(s) for s in options.scenario_set if s.kind == "request"]
    steps: list[Target] = [ScenarioTarget(s) for s in options.scenario_set if s.kind == "step"]
    if group is not None:
        points, requests = [], []
        steps = [RankTarget(s, group.size) for s in options.scenario_set if isinstance(s, StepScenario)]
    counts = (session.repetitions, sweep.seed, session.passes, session.processes)
    families = in_run_order(plan(session.variants, points, *counts), plan(per_request, requests, *counts),
                            plan(session.step_variants, steps, session.repetitions, sweep.seed + 1, session.passes,
                                 session.processes))
    return families[0], families[1] + families[2]


def open_run_folder(session: KvSession) -> RunWriter:
    """A new run folder with its meta.json (after the cross-check, whose outcome the environment states)."""
    if session.crosscheck:  # before the environment says whether it confirmed the meter
        session.run_crosscheck()
    confirmed = session.crosscheck and not session.crosscheck_unavailable
    env = environment.capture(session.device, session.rootdir, confirmed)
    label = "cpu" if session.device == "cpu" else f"cuda-{session.context.device_name}"
    if session.context.group is not None:
        label += f"-{session.context.group.size}ranks"
    path = create_run_dir(session.results_dir, label)
    meta = RunMeta(
        run_id=path.name,
        preset=session.options.preset_name,
        options=session.options.as_strings(),
        command=session.command,
        started_utc=session.started_utc,
        environment=env,
        repetitions=session.repetitions,
        order_seed=session.options.sweep.seed,
        crosscheck=session.crosscheck_status(),
        ranks=None if session.context.group is None else session.context.group.meta,
    )
    writer = RunWriter(path, meta)
    if session.trace_dir is not None and (session.trace_dir / profiler_check.TRACE_FILE).exists():
        shutil.move(session.trace_dir / profiler_check.TRACE_FILE, path / profiler_check.TRACE_FILE)
    return writer


def process_infos(session: KvSession, total_s: float) -> list[ProcessInfo]:
    """The processes that timed this run, the workers first, then this session."""
    infos = [w.info() for w in session.workers]
    own_start = session.loop_started or 0.0
    infos.append(ProcessInfo(session.process, os.getpid(), "session", own_start - session.configured_at,
                             session.phase_s["generate"], total_s - sum(w.wall_s for w in session.workers),
                             session.runner.blocks_run))
    return infos


class WorkerFailed(Exception):
    """A worker process did not run to its end (killed, crashed, refused, or past its limit): the run cannot be
    completed."""


WORKER_START_S = 45.0
"""A worker's allowance for what comes before its blocks: the interpreter, torch and pytest imports, collection,
CUDA's start (a process of the dev box's default sweep takes 2-3 s)..."""
WORKER_PER_TARGET_S = 5.0
"""...plus this much per point, request or step of its share, for building its inputs (a 512K-token pool: well
under a second on an idle dev box)..."""
WORKER_PER_BLOCK_S = 0.05
"""...plus this much untimed work per block (its check, meter and bookkeeping: about 5-10 ms on the dev box)..."""
WORKER_BUDGET_FACTOR = 10.0
"""...plus this many times the timed budget of its blocks (warm-up and rounds of minimum length come on top of it)."""


def worker_limit_s(session: KvSession, process: int, case_ids: frozenset[str]) -> float:
    """How long worker `process` may run before it is killed and the run fails naming it: well over what its share
    of `case_ids` (the cases the session selected) takes; for the quick preset, well inside a sweep step of
    bench/gpu_check.sh (150 s)."""
    own = [b for b in session.point_blocks + session.scenario_blocks if b.process == process and b.case_id in case_ids]
    budget = sum(b.point.budget_s(session.options) for b in own) / session.repetitions
    return (WORKER_START_S + WORKER_PER_TARGET_S * len({b.point for b in own}) + WORKER_PER_BLOCK_S * len(own)
            + WORKER_BUDGET_FACTOR * budget)


def run_workers(session: KvSession, command: WorkerCommand, case_ids: Sequence[str],
                say: Callable[[str], None]) -> None:
    """Time the earlier processes' shares, one fresh worker process after another, folding each one's log into the
    runner as it ends; `case_ids`: the cases this session selected (a worker keeps only those)."""
    if session.crosscheck:  # its child process runs before any timing, as in a run of one process
        session.run_crosscheck()
    write_cases(command.folder, case_ids)
    selected = frozenset(case_ids)
    session.pool_cache = PoolCache(command.folder)
    targets = {b.case_id: (b.point, b.variant) for b in session.point_blocks + session.scenario_blocks}
    for process in range(session.processes - 1):
        limit = worker_limit_s(session, process, selected)
        result = run_worker(command, process, limit)
        session.workers.append(result)
        if result.timed_out:
            raise WorkerFailed(f"kvpages: worker process {process} of {session.processes} did not finish within its "
                               f"limit of {limit:.0f} s and was stopped; the last lines it printed:\n{result.output_tail}")
        if not result.ok:
            raise WorkerFailed(f"kvpages: worker process {process} of {session.processes} exited with status "
                               f"{result.returncode} before its end; the last lines it printed:\n{result.output_tail}")
        session.runner.records.merge(result, targets)
        if command.json_out:
            session.worker_benchmarks += json.loads(json_path(command.folder, process).read_text())["benchmarks"]
        info = result.info()
        say(f"kvpages: process {process + 1} of {session.processes} (pid {info.pid}): {info.blocks} blocks in "
            f"{info.wall_s:.1f} s, of which start-up {info.startup_s:.1f} s and inputs {info.generate_s:.1f} s")
    say(f"kvpages: process {session.processes} of {session.processes} (pid {os.getpid()}, this session) times its "
        "share now")


def add_breakdown(session: KvSession, exitstatus: int) -> None:
    """Where the time goes, into the finished run folder, in a process of its own: breakdown.csv, and meta.json's
    note of it and its seconds."""
    writer = session.writer
    assert writer is not None
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        writer.meta.breakdown = "not run: the session was interrupted"
    else:
        with session.phase("breakdown"):
            cases = where_time_goes.planned_cases(session.point_blocks, session.planned, session.device)
            writer.meta.breakdown = where_time_goes.write_breakdown_into(writer.path, cases, session.device)
        writer.meta.timing["breakdown_s"] = session.phase_s["breakdown"]
    writer.write_meta()
