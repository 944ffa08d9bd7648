"""The sweep session: wires the options, the plan of blocks, the runner, the recorder and the run folder.

One per pytest session (kvpages.plugin); in a worker process it logs its outcomes instead of recording them.
How a block travels through it: docs/guide.md#how-a-block-travels.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import shlex
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from kvpages.core import adaptive
from kvpages.core.affinity import AUTO
from kvpages.core.names import case_id, per_request_name, step_baseline
from kvpages.core.options import BenchOptions, crosscheck_enabled
from kvpages.measure import breakdown as where_time_goes
from kvpages.measure import crosscheck as profiler_check
from kvpages.measure import environment, pinning, probe
from kvpages.measure.group import Group, Launch
from kvpages.measure.inputs import PoolCache
from kvpages.measure.ranks import RankTarget
from kvpages.measure.recorder import Recorder
from kvpages.measure.remeasure import Remeasurer, Round, off
from kvpages.measure.runner import Crosscheck, Phases, Runner
from kvpages.measure.schedule import Block, in_run_order, plan, plan_scenarios
from kvpages.measure.signals import deferred_interruption, interrupt
from kvpages.measure.steps import get_step_variant, step_variant_names
from kvpages.measure.targets import Context, PointTarget, ScenarioTarget, Target
from kvpages.measure.variants import device_of, variant_names
from kvpages.measure.workers import Started, Worker, WorkerCommand, Workers, run_alone, run_workers, wants_spare
from kvpages.measure.worklog import WorkerEnd, WorkerLog, log_path, read_readings, write_cases
from kvpages.schema.meta import REMEASURE, ProcessInfo, Remeasurement, RunMeta, RunTiming
from kvpages.schema.profiles import read_profile
from kvpages.schema.writer import RunWriter, create_run_dir, utc_now

# A worker's time limit (SweepPlan.worker_limit_s), well over what each part of its share takes:
WORKER_START_S = 45.0  # its start-up: imports, collection, CUDA's start
WORKER_PER_TARGET_S = 5.0  # building the inputs of each point, request or step of its share
WORKER_PER_BLOCK_S = 0.05  # each block's untimed work: its check, meter and bookkeeping
WORKER_BUDGET_FACTOR = 10.0  # times its blocks' timed budget (warm-up and minimum rounds come on top)
SPARE_COLLECT_S = 0.5  # a spare's collection of its round, after its go (0.2-0.4 s on the 2-core box)


class SweepPlan:
    """The blocks of a session, in run order: the points', and the whole requests' and steps' (a multi-rank run:
    the steps alone, each timed on every rank at once); and the cases whose benchmarks this process collected."""

    def __init__(self, options: BenchOptions, device: str, group: Group | None, repetitions: int, processes: int,
                 process: int, round_: Round | None = None) -> None:
        """`round_`: the re-measurement round a worker after the planned ones times (its only blocks)."""
        sweep = options.sweep
        self.process = process
        self.variants = options.variants or variant_names()
        self.step_variants = options.step_variants or step_variant_names()
        points: list[Target] = [PointTarget(p) for p in sweep.points(device)]
        per_request = [n for n in self.step_variants if not get_step_variant(n).batched]
        requests: list[Target] = [ScenarioTarget(s) for s in options.scenario_set if s.kind == "request"]
        steps: list[Target] = [ScenarioTarget(s) if group is None else RankTarget(s, group.size)
                               for s in options.scenario_set if s.kind == "step"]
        if group is not None:  # the steps alone, each timed on every rank at once
            points, requests = [], []
        self.passes = min(sweep.passes, -(-repetitions // processes))  # per process
        self.options, self.repetitions = options, repetitions
        counts, also = (repetitions, sweep.seed, self.passes, processes), (per_request_name(options.baseline_name),)
        families = in_run_order(plan(self.variants, points, *counts), plan_scenarios(per_request, requests, *counts, also),
                                plan_scenarios(self.step_variants, steps, repetitions, sweep.seed + 1, self.passes,
                                               processes, also))
        self.point_blocks, self.scenario_blocks = families[0], families[1] + families[2]
        self.planned: set[str] = set()
        self.point_targets, self.scenario_targets = points, requests + steps
        if round_ is not None:
            self.point_blocks, self.scenario_blocks = self.round_blocks(round_)

    def collected(self, blocks: Sequence[Block]) -> Sequence[Block]:
        """This process's share of `blocks`, for a benchmark's parametrization; their cases count as planned rows."""
        own = [b for b in blocks if b.process == self.process]
        self.planned |= {b.case_id for b in own}
        return own

    def worker_limit_s(self, process: int, case_ids: frozenset[str]) -> float:
        """How long worker `process` may run before it is killed and the run fails naming it: well over what its share of
        `case_ids` takes; for the quick preset, well inside a sweep step of bench/gpu_check.sh (150 s)."""
        own = [b for b in self.point_blocks + self.scenario_blocks if b.process == process and b.case_id in case_ids]
        return limit_s(own, self.options, self.repetitions)

    def remeasurer(self, recorder: Recorder, processes: int, overhead_s: float = 0.0, fresh_s: float = 0.0) -> Remeasurer:
        """The re-measurement after this plan's repetitions, within --kv-remeasure-budget of its points' timed seconds."""
        options, blocks = self.options, self.point_blocks
        baselines = (options.baseline_name, step_baseline(options.baseline_name, self.step_variants))
        return Remeasurer(recorder, baselines, processes, self.repetitions, len(blocks + self.scenario_blocks),
                          options.disturb_factor_value, options.remeasure_fraction,
                          planned_timed_s(blocks, options, self.repetitions),
                          lambda target: target.budget_s(options) / self.repetitions, overhead_s, fresh_s)

    def round_blocks(self, round_: Round) -> tuple[tuple[Block, ...], tuple[Block, ...]]:
        """A round's point blocks and scenario blocks: its worker's, and the session's for the round's limit."""
        found = round_.blocks(self.variants, self.point_targets, self.options.sweep.seed)
        return found, round_.blocks(self.step_variants, self.scenario_targets, self.options.sweep.seed + 1, len(found))

    def cases(self, selected: Sequence[Block]) -> list[tuple[Target, str]]:
        """The (target, variant)s of the `selected` blocks, in run order, each target's in variant order."""
        ids = {b.case_id for b in selected}
        targets = dict.fromkeys(b.target for b in self.point_blocks + self.scenario_blocks if b.case_id in ids)
        return [(t, v) for t in targets for v in (self.variants if isinstance(t, PointTarget) else self.step_variants)
                if case_id(v, t.id) in ids]


def planned_timed_s(blocks: Sequence[Block], options: BenchOptions, repetitions: int) -> float:
    """The timed seconds `blocks` are planned to take: each its target's time budget over the repetitions."""
    return sum(b.target.budget_s(options) for b in blocks) / repetitions


def limit_s(blocks: Sequence[Block], options: BenchOptions, repetitions: int) -> float:
    """How long a worker that times `blocks` may run: well over what they take (the WORKER_* constants)."""
    return (WORKER_START_S + WORKER_PER_TARGET_S * len({b.target for b in blocks}) + WORKER_PER_BLOCK_S * len(blocks)
            + WORKER_BUDGET_FACTOR * planned_timed_s(blocks, options, repetitions))


def end_note(done: int, partial: int, planned: int, exitstatus: int, multi_rank: bool,
             group_failure: str | None) -> tuple[bool, str]:
    """Whether a run completed, and meta.json's note of how it ended."""
    rows = "cases" if multi_rank else "rows"  # a multi-rank case has a row per rank and role
    of_them = f" ({partial} of them partial)" if partial else ""
    if group_failure is not None:
        return False, f"stopped after {done} of {planned} cases{of_them}: {group_failure}"
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        return False, f"interrupted after {done} of {planned} {rows}{of_them}"
    if done < planned:
        return False, f"only {done} of {planned} {rows} were recorded (deselected or failed cases)"
    if exitstatus != pytest.ExitCode.OK:
        return False, f"all {done} {rows} recorded, but the session failed (exit status {int(exitstatus)})"
    return True, f"all {done} {rows} recorded"


def own_process(index: int, phase: Phases, workers: Workers, started_at: float, total_s: float,
                rounds: Sequence[Worker] = ()) -> ProcessInfo:
    """meta.json's record of the session's own process: its wall is the session's, less its workers' (their start-up
    together, then their turns), the cross-check's and the re-measurement rounds' (after its blocks: a spare's from
    its go, its start-up being in the workers'); its start-up runs to its first block, less the first two."""
    others = workers.startup_s + sum(w.turn_s for w in workers.runs) + phase.seconds["crosscheck"]
    wall, span = total_s - others - sum(w.charged_s for w in rounds), phase.span
    startup = wall if span is None else span[0] - started_at - others
    return phase.spent().info(index, os.getpid(), "session", startup, wall)


def run_round(command: WorkerCommand, plan: SweepPlan, recorder: Recorder, say: Callable[[str], None], workers: Workers,
              round_: Round, rounds: list[Worker]) -> Worker:
    """One re-measurement round: its blocks handed to a fresh worker process, timed and recorded (added to `rounds`)."""
    round_.write(command.folder)
    own = sum(plan.round_blocks(round_), ())
    return run_alone(command, round_.process, WORKER_START_S, limit_s(own, plan.options, plan.repetitions), recorder,
                     say, workers, rounds)


def round_overhead_s(planned: Sequence[ProcessInfo], spare: bool = False) -> float:
    """A round's untimed cost before any round has shown it: with a spare waiting, its inputs (a later planned
    worker's, loaded from the pool cache) and its collection; else a fresh worker's start-up and inputs, as a planned
    worker's, which started beside the others and so had a share of the cores (a round starts alone: on the 2-core box
    4-7 s together, 2-2.5 s alone; on CUDA each includes the device's start)."""
    if spare:
        return SPARE_COLLECT_S + min((p.inputs_s or 0.0 for p in planned[1:]), default=0.0)
    share = min(1.0, (os.cpu_count() or 1) / max(1, len(planned)))
    return share * min(((p.startup_s or 0.0) + (p.inputs_s or 0.0) for p in planned), default=0.0)


def remeasure_record(remeasurer: Remeasurer | None, options: BenchOptions, processes: int,
                     multi_rank: bool) -> Remeasurement:
    """meta.json's `remeasure`: what the re-measurement did, or why it did nothing."""
    if remeasurer is not None and remeasurer.record is not None:
        return remeasurer.record
    why = ("--kv-remeasure-budget 0" if options.remeasure_fraction == 0 else "a multi-rank run" if multi_rank else
           "a run of one process (its interval covers what varies within it)" if processes < 2 else
           "the session did not get past its planned repetitions")
    return off(options.remeasure_fraction, options.disturb_factor_value, processes, why)


class KvSession:
    """The state of one pytest session of the sweep: options, device, plan, runner, recorder, run folder."""

    def __init__(self, options: BenchOptions, rootdir: Path, invocation_args: tuple[str, ...],
                 timing: bool = True, worker: int | None = None, worker_dir: Path | None = None,
                 started_at: float = 0.0, launch: Launch | None = None, go_fd: int | None = None,
                 benchmark_output: bool = True, released: WorkerLog | None = None) -> None:
        """`released`: a spare worker's log, its wait for its round behind it (kvpages.measure.workers)."""
        self.options = options
        adaptive.use_threshold(options.adaptive_threshold or adaptive.DEFAULT_THRESHOLD)  # before any call of `adaptive`
        self.started_at = started_at  # perf_counter when this process started (kvpages.measure.worklog)
        self.device = device_of(options.device_choice)
        self.rootdir = rootdir
        self.results_dir = Path(options.results_dir) if options.results_dir else rootdir / "results"
        group = None if launch is None else Group(launch, self.device, options.rank_timeout_s)  # joins the ranks
        self.context = Context(self.device, environment.device_name(self.device), options, group=group)
        self.launcher = ("pytest",) if launch is None else launch.command
        self.command = shlex.join(self.launcher + tuple(invocation_args))
        self.started_utc = utc_now()
        self.phase = Phases()
        sweep = options.sweep
        self.timing = timing
        self.repetitions = sweep.repetitions if timing else 1
        self.processes = sweep.processes if timing else 1
        self.process = self.processes - 1 if worker is None else worker
        self.log = released or (None if worker is None or worker_dir is None else
                                 WorkerLog(log_path(worker_dir, worker), go_fd))
        round_ = Round.read(worker_dir, worker) if worker_dir is not None and worker is not None and \
            worker >= self.processes else None
        self.plan = SweepPlan(options, self.device, group, self.repetitions, self.processes, self.process, round_)
        self.runner = Runner(self.context, self.repetitions, self.plan.passes, self.process, self.phase,
                             pool_cache=None if worker_dir is None else PoolCache(worker_dir),
                             benchmark_output=benchmark_output)
        self.crosscheck_on = crosscheck_enabled(options.crosscheck_mode, self.device) and self.log is None
        self.trace_dir: Path | None = None  # where the cross-check process leaves its profile
        self.writer: RunWriter | None = None
        self.recorder: Recorder | None = None
        self.workers = Workers()
        self.remeasurer: Remeasurer | None = None
        self.pinned = pinning.Pinned(pinning.resolve(options.cpus or AUTO, options.threads_value, self.device), timing)
        """Its CPUs and torch threads from its first timed block, free again after its last (the round workers it
        starts, its breakdown and its analysis run free)."""

    def start(self, selected: Sequence[Block]) -> None:
        """Before the first block, once: signals; the cross-check of the `selected` cases; the run folder, recorder."""
        gc.freeze()  # the ~260,000 objects here now (worklog.collector_paused) leave full GC passes (0.17 -> 0.08 s a process)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, interrupt)
            signal.signal(signal.SIGINT, interrupt)
        if self.log is not None:  # a worker logs its outcomes, once its turn comes
            if self.device == "cuda":
                torch.empty(1, device="cuda")  # its CUDA context started while it waits, beside the others' start-ups
            if not self.log.wait_for_turn():
                pytest.exit("kvpages: the session ended before this worker's turn", pytest.ExitCode.INTERRUPTED)
            self.runner.ready(read_readings(self.log.folder), selected)
            self.pinned.pin()
            return
        cases = self.plan.cases(selected)
        checked = profiler_check.representative([profiler_check.CheckCase(v, t) for t, v in cases
                                                 if self.crosscheck_on and t.unavailable_reason(v, self.device) is None])
        if checked:
            self.trace_dir = Path(tempfile.mkdtemp(prefix="kvpages-crosscheck-"))
            with self.phase("crosscheck"):
                self.runner.crosscheck = Crosscheck.of(checked, self.device, self.trace_dir / profiler_check.TRACE_FILE)
        if not self.timing or not selected:
            return
        with deferred_interruption():  # a signal waits until the run folder (rank 0's: it gathers) and its recorder are
            if self.context.group is None or self.context.group.rank == 0:  # whole, so its end is written
                self.writer = open_run_folder(self)
            self.recorder = Recorder(self.writer, cases, self.context, self.repetitions, self.process, self.launcher)
        if self.processes <= 1:  # no workers to start first: this process times from its first block
            self.pinned.pin()

    def run_workers(self, command: WorkerCommand, say: Callable[[str], None], started: Started | None = None) -> None:
        """Time the earlier processes' shares in workers (those `started` before, else now); the recorder takes each
        outcome a worker logs as it comes."""
        assert self.recorder is not None, "workers run in a session that records"
        write_cases(command.folder, list(self.recorder.cases))
        self.runner.pool_cache = PoolCache(command.folder)
        limits = [self.plan.worker_limit_s(process, frozenset(self.recorder.cases)) for process in range(self.processes - 1)]
        spare = wants_spare(self.options.remeasure_fraction, multi_rank=self.context.group is not None)
        run_workers(command, WORKER_START_S, limits, self.recorder, say, self.workers, spare=spare, started=started)
        self.runner.first_readings = self.recorder.first_readings()  # this process is a later one too
        if self.workers.spare is not None:  # its own rows are written beside the spare's round (or at the end)
            self.recorder.hold()
        self.pinned.pin()  # its own share next (the workers it started are free: they pinned themselves)

    def remeasure(self, command: WorkerCommand, say: Callable[[str], None]) -> None:
        """After the planned repetitions: re-measure the unstable points in fresh processes (kvpages.measure.remeasure)."""
        assert self.recorder is not None, "a session that records"
        self.pinned.unpin()
        planned = [w.info() for w in self.workers.runs]
        self.remeasurer = self.plan.remeasurer(self.recorder, self.processes,
                                               round_overhead_s(planned, self.workers.spare is not None),
                                               round_overhead_s(planned))
        try:
            if self.remeasurer.budget_s > 0:
                if self.device == "cuda":
                    torch.cuda.empty_cache()  # the rounds' fresh processes get the memory this one no longer uses
                self.remeasurer.run(functools.partial(run_round, command, self.plan, self.recorder, say, self.workers),
                                    say)
        finally:
            self.workers.dismiss_spare()  # not needed, or not reached

    def run(self, benchmark, block: Block) -> None:
        """Run one block (called by bench/) and record its outcome; a stopped case's test is skipped or failed."""
        case = None if self.recorder is None else self.recorder.cases.get(block.case_id)
        if case is not None and case.failure is not None:  # a worker's failure fails this process's next test
            message, case.failure = case.failure, None
            pytest.fail(message, pytrace=False)
        if case is not None and case.status is not None:
            pytest.skip(f"{block.case_id}: recorded as {case.status} in an earlier repetition")
        outcome = self.runner.run(benchmark, block)
        if not benchmark.disabled:
            if self.log is not None:
                self.log.write(outcome)
            elif self.recorder is not None:
                self.recorder.record(outcome)
        if outcome.stopped:
            message = f"{block.case_id}: {outcome.note}"
            if outcome.fail:
                pytest.fail(message, pytrace=False)
            pytest.skip(message)

    def finish(self, exitstatus: int, total_s: float) -> None:
        """Close the run folder: completed only if every planned case ran and the session passed (a worker: its log)."""
        self.context.transfer_thread.shutdown(wait=True)
        self.pinned.unpin()
        group = self.context.group
        if group is not None:
            group.close()
        if self.trace_dir is not None:
            shutil.rmtree(self.trace_dir, ignore_errors=True)
        if self.log is not None:
            self.log.end(WorkerEnd(os.getpid(), self.phase.first_block_at, self.phase.spent(), self.log.released_at))
        if self.recorder is None:
            return
        self.recorder.finish()
        if self.writer is None:
            return
        timing = close_run(self, exitstatus, total_s)
        after_sweep(self, exitstatus, timing)

    def analysed(self, seconds: float) -> None:
        if self.writer is not None and self.writer.meta.timing is not None:
            self.writer.meta.timing = dataclasses.replace(self.writer.meta.timing, analysis_s=seconds)
            self.writer.write_meta()


def close_run(kv: KvSession, exitstatus: int, total_s: float) -> RunTiming:
    """meta.json's processes, re-measurement, end and timing, and the run folder finished; the timing returned."""
    assert kv.writer is not None and kv.recorder is not None
    meta, group = kv.writer.meta, kv.context.group
    rounds = [] if kv.remeasurer is None else kv.remeasurer.workers
    meta.processes = [w.info() for w in kv.workers.runs] + [
        own_process(kv.process, kv.phase, kv.workers, kv.started_at, total_s, rounds)] + [
        dataclasses.replace(w.info(), role=REMEASURE) for w in rounds]
    meta.remeasure = remeasure_record(kv.remeasurer, kv.options, kv.processes, group is not None)
    completed, note = end_note(kv.recorder.recorded, kv.recorder.partial, len(kv.plan.planned), exitstatus,
                               group is not None, None if group is None else group.failure)
    loaded = kv.runner.loaded
    if loaded is not None:
        meta.environment = dataclasses.replace(meta.environment, pcie_link_loaded=loaded.pcie_link or "unknown",
                                               sm_clock_mhz_loaded=loaded.sm_clock_mhz)
    if kv.options.breakdown != "off":  # what meta.json says if this process is stopped during the profile
        meta.breakdown = "not finished: the sweep was stopped during the profiled passes"
    overlap = kv.workers.overlap_s + sum(w.ready_s for w in rounds if w.spare)  # a spare started with the others
    timing = RunTiming.of(total_s, meta.processes, kv.phase.seconds["crosscheck"], overlap)
    kv.writer.finish(completed, note, timing)  # the run folder is finished before the breakdown starts
    return timing


def after_sweep(kv: KvSession, exitstatus: int, timing: RunTiming) -> None:
    """Into the finished run folder: the bandwidth probe (CUDA), then where the time goes (its own process)."""
    assert kv.writer is not None
    meta, interrupted = kv.writer.meta, exitstatus == pytest.ExitCode.INTERRUPTED
    if crosscheck_enabled(kv.options.bandwidth_probe or "auto", kv.device):
        with kv.phase("probe"):
            meta.bandwidth_probe = "not run: the session was interrupted" if interrupted else \
                probe.probe_into(kv.writer.path, kv.device)
        timing = dataclasses.replace(timing, probe_s=kv.phase.seconds["probe"])
        meta.timing = timing
        kv.writer.write_meta()
    if kv.options.breakdown != "off":  # where the time goes, in a process of its own, into the finished folder
        with kv.phase("breakdown"):
            if interrupted:
                meta.breakdown = "not run: the session was interrupted"
            else:
                cases = where_time_goes.planned_cases(kv.plan.point_blocks, kv.plan.planned, kv.device)
                meta.breakdown = where_time_goes.write_breakdown_into(kv.writer.path, cases, kv.device)
        meta.timing = dataclasses.replace(timing, breakdown_s=kv.phase.seconds["breakdown"])
        kv.writer.write_meta()


def open_run_folder(kv: KvSession) -> RunWriter:
    """A new run folder with its meta.json (after the cross-check, whose outcome the environment states)."""
    confirmed = kv.crosscheck_on and kv.runner.crosscheck.unavailable is None
    env = environment.capture(kv.device, kv.rootdir, confirmed, kv.pinned.pinning.threads, kv.pinned.pinning.said)
    group = kv.context.group
    label = ("cpu" if kv.device == "cpu" else f"cuda-{kv.context.device_name}") + (
        "" if group is None else f"-{group.size}ranks")
    path = create_run_dir(kv.results_dir, label)
    meta = RunMeta(run_id=path.name, preset=kv.options.selected_preset.name, options=kv.options.as_strings(),
                   command=kv.command, started_utc=kv.started_utc, environment=env,
                   repetitions=kv.repetitions, order_seed=kv.options.sweep.seed, baseline=kv.options.baseline_name,
                   crosscheck=kv.runner.crosscheck.status(kv.crosscheck_on), ranks=None if group is None else group.meta,
                   link_profiles=[read_profile(Path(p).resolve()) for p in kv.options.link_profiles or ()])
    writer = RunWriter(path, meta)
    if kv.trace_dir is not None and (kv.trace_dir / profiler_check.TRACE_FILE).exists():
        shutil.move(kv.trace_dir / profiler_check.TRACE_FILE, path / profiler_check.TRACE_FILE)
    return writer
