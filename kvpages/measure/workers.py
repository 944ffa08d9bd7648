"""Fresh processes for a sweep's repetitions: pyperf's idea, with pytest as the runner (docs/guide.md#processes).

The session starts its P - 1 workers together (`WorkerCommand.argv`), on the CPU as it starts to collect (`Started`);
each imports and collects, waits for the session's cases, says it is ready in its log (kvpages.measure.worklog) and
waits on its pipe, so their start-ups overlap on the cores, and with the session's, instead of adding up.
Then they time one at a time, never two at once, and the session's recorder reads each log as it is written. Beside
them the session can start a *spare*: a worker that imports and says it is ready before it collects, because its
blocks are a re-measurement round's, known only after the planned ones; it collects that round when it is given one,
and exits unused when none is needed, so a round costs its own work and not a process start. No torch at import (the
plugin starts workers before the session imports it); what the plugin needs of the protocol at every pytest start is
in kvpages.measure.worklog.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvpages.measure.outcome import BlockOutcome
from kvpages.measure.signals import deferred_interruption
from kvpages.measure.worklog import (
    COLLECT,
    LEAN_PYTEST,
    WORKER_DIR_FLAG,
    WORKER_FLAG,
    WORKER_GO_FLAG,
    WORKER_SPARE_FLAG,
    LogReader,
    json_path,
    log_path,
    write_readings,
)
from kvpages.schema.meta import ProcessInfo

if TYPE_CHECKING:
    from kvpages.measure.recorder import Recorder


@dataclass(frozen=True)
class WorkerCommand:
    """How the session starts worker K: everything but K is the same for every worker."""

    paths: tuple[str, ...]  # the session's file arguments, parametrization stripped (a worker's blocks have other ids)
    kv_args: tuple[str, ...]
    timed_as: tuple[str, ...]  # the session's pytest-benchmark options that change how a block is timed (timer, GC)
    rootdir: str
    cwd: Path
    folder: Path
    json_out: bool

    def argv(self, process: int, go_fd: int, spare: bool = False) -> list[str]:
        json_args = ["--benchmark-json", str(json_path(self.folder, process))] if self.json_out else []
        return [sys.executable, "-m", "pytest", *self.paths, *self.kv_args, "--benchmark-only",
                WORKER_FLAG, str(process), WORKER_DIR_FLAG, str(self.folder), WORKER_GO_FLAG, str(go_fd),
                *([WORKER_SPARE_FLAG] if spare else []), "--rootdir", self.rootdir, *LEAN_PYTEST, *self.timed_as,
                *json_args]


POLL_S = 0.2  # how often the session reads a running worker's log: its outcomes reach the run folder this soon
READY_POLL_S = 0.02  # how often it looks whether the workers are ready (nothing is timed meanwhile)
STOP_WAIT_S = 30.0  # how long an interrupted session waits for a worker it passed the interruption on to, then kills it


class WorkerFailed(Exception):
    """A worker process did not run to its end (killed, crashed, refused, or past its limit): the run fails."""


@dataclass
class Worker:
    """One worker process: launched, waiting on its pipe for its turn, then timing its share."""

    process: int
    total: int  # the run's processes, the session's included (for messages)
    child: subprocess.Popen
    go_fd: int | None  # the write end of its pipe (None once written or closed)
    output: Path
    log: LogReader
    launched_at: float  # time.time()
    turn_s: float = 0.0  # from the session's go until it exited (timing its share, one worker at a time)
    interrupted: bool = False  # the session or the worker was interrupted (SIGINT, SIGTERM) before the worker's end
    timed_out: bool = False
    spare: bool = False  # started beside the planned workers for a round not yet known (its start-up behind it)
    collected: bool = False  # told to collect (a planned worker waits for that before it collects: `collect`)

    @property
    def ready_s(self) -> float:
        """From its launch until it was ready (its start-up, beside the other workers'), less its wait for the
        session's cases (a worker started before the session had collected: `Started`)."""
        return (self.log.ready_at or self.launched_at) - self.launched_at - self.log.waited_s

    @property
    def wall_s(self) -> float:
        """Its own wall time, without its wait for its turn."""
        return self.ready_s + self.turn_s

    @property
    def charged_s(self) -> float:
        """What a re-measurement round cost the run: a spare's turn (its start-up overlapped the planned workers'),
        any other worker's whole wall."""
        return self.turn_s if self.spare else self.wall_s

    def failed(self, what: str) -> WorkerFailed:
        tail = "\n".join(self.output.read_text(errors="replace").splitlines()[-15:])
        return WorkerFailed(f"kvpages: worker process {self.process} of {self.total} {what}; the last lines it "
                            f"printed:\n{tail}")

    def collect(self) -> None:
        """Tell a planned worker the session has written the cases it selected (kvpages.measure.worklog.COLLECT)."""
        assert self.go_fd is not None and not self.spare
        with suppress(BrokenPipeError):  # it has exited: `wait_ready` says so, with what it printed
            os.write(self.go_fd, COLLECT)
        self.collected = True

    def dismiss(self) -> None:
        """Close its pipe: a worker still waiting exits."""
        if self.go_fd is not None:
            os.close(self.go_fd)
            self.go_fd = None

    def run(self, limit_s: float, record: Callable[[BlockOutcome], None]) -> None:
        """Let it time its share within `limit_s` (then kill it), `record`ing each outcome as it logs it; interrupted
        meanwhile (SIGINT, SIGTERM), pass SIGINT on to it and record what it logged until it stopped."""
        start = time.perf_counter()
        assert self.go_fd is not None
        os.write(self.go_fd, b"g")  # its turn: it starts timing now
        self.dismiss()
        try:
            while self.child.poll() is None:
                if time.perf_counter() - start > limit_s:
                    self.timed_out = True
                    self.child.kill()
                with deferred_interruption():  # what was read is recorded whole: the log's offset has moved past it
                    for outcome in self.log.new_outcomes():
                        record(outcome)
                wait_exit(self.child, POLL_S)
        except KeyboardInterrupt:
            self.interrupted = True
            self.child.send_signal(signal.SIGINT)
            wait_or_kill(self.child, STOP_WAIT_S)
        with deferred_interruption():  # its turn's end is recorded whole, however late a signal lands
            for outcome in self.log.new_outcomes():
                record(outcome)
            self.turn_s = time.perf_counter() - start
            self.interrupted |= self.child.returncode in (2, -signal.SIGINT)  # pytest's status when interrupted, or the signal

    def info(self) -> ProcessInfo:
        """meta.json's record of it; its start-up runs from its launch to its first block, less its wait for its
        turn (all of its wall, if it timed nothing or did not get that far)."""
        end = self.log.end
        if end is None:
            return ProcessInfo(self.process, -1, "worker", self.wall_s, 0.0, self.wall_s, 0)
        if end.first_block_at is None or end.released_at is None:
            startup = self.wall_s
        else:
            startup = self.ready_s + end.first_block_at - end.released_at
        return end.spent.info(self.process, end.pid, "worker", startup, self.wall_s)


@dataclass
class Workers:
    """A session's workers: each one as it ends, their start-up and their pytest-benchmark JSON entries."""

    runs: list[Worker] = field(default_factory=list)
    startup_s: float = 0.0  # the session's wall from their launch until every one was ready
    benchmarks: list[dict] = field(default_factory=list)
    spare: Worker | None = None  # started with them for a first re-measurement round; None once used or dismissed

    def take_spare(self) -> Worker | None:
        spare, self.spare = self.spare, None
        return spare

    def dismiss_spare(self) -> None:
        """An unused spare exits (its pipe closed) and is waited for."""
        spare = self.take_spare()
        if spare is not None:
            _close([spare])

    @property
    def overlap_s(self) -> float:
        """How much of their start-ups ran beside one another: their sum, less the wall they took."""
        return sum(r.ready_s for r in self.runs) - self.startup_s if self.runs else 0.0


def wait_exit(child: subprocess.Popen, timeout_s: float) -> None:
    """Wait up to `timeout_s` for `child` to exit, and return as soon as it has, so the next worker's turn comes at
    once: Popen.wait's timeout polls, sleeping up to 50 ms between looks (25 ms of each turn's end on average)."""
    try:
        pidfd = os.pidfd_open(child.pid)  # Linux 5.3 and later: readable once the process has exited
    except (AttributeError, OSError):
        with suppress(subprocess.TimeoutExpired):
            child.wait(timeout=timeout_s)
        return
    try:
        waiting = select.poll()
        waiting.register(pidfd, select.POLLIN)
        waiting.poll(timeout_s * 1000)
    finally:
        os.close(pidfd)


def wait_or_kill(child: subprocess.Popen, timeout_s: float) -> None:
    try:
        child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def launch(command: WorkerCommand, process: int, total: int, spare: bool = False, collect: bool = True) -> Worker:
    """Worker `process` started; a planned one told of the cases at once (`collect=False`: by `Worker.collect`, later)."""
    read_fd, write_fd = os.pipe()
    output = command.folder / f"process-{process}.out"
    try:
        with open(output, "w") as out:
            child = subprocess.Popen(command.argv(process, read_fd, spare), cwd=command.cwd, stdout=out,
                                     stderr=subprocess.STDOUT, pass_fds=(read_fd,))
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    worker = Worker(process, total, child, write_fd, output, LogReader(log_path(command.folder, process)), time.time(),
                    spare=spare)
    if collect and not spare:
        worker.collect()
    return worker


@dataclass
class Started:
    """A sweep session's workers started before it imports torch and collects (kvpages.measure.spawn), where no
    cross-check child is to run meanwhile: their start-ups (imports, collection) run beside the session's own, which
    ran alone before them (1.9 s of a two-process sweep on the 2-core dev box). Each planned one then waits for the
    session's cases (`collect`, in `run_workers`) before it keeps those of its blocks; the spare waits as ever.
    `make bench`'s start-up 7.38-7.83 -> 6.90-7.20 s there, three runs each, alternating (docs/method.md)."""

    command: WorkerCommand
    planned: list[Worker]
    spare: Worker | None

    @classmethod
    def of(cls, command: WorkerCommand, processes: int, spare: bool) -> Started:
        started = cls(command, [], None)
        try:
            for process in range(processes - 1):
                started.planned.append(launch(command, process, processes, collect=False))
            if spare:
                started.spare = launch(command, processes, processes + 1, spare=True)
        except BaseException:
            started.stop()
            raise
        return started

    def stop(self) -> None:
        """Those the session never used (no cases to time, an error first) killed, and waited for."""
        unused = [w for w in [*self.planned, self.spare] if w is not None and w.go_fd is not None and not w.collected]
        for w in unused:
            w.dismiss()
            w.child.kill()
        for w in unused:
            w.child.wait()


def wants_spare(remeasure_fraction: float, multi_rank: bool) -> bool:
    """Whether a sweep's workers include a spare for a first re-measurement round (a round without a start): where
    re-measurement is on (`--kv-remeasure-budget` above 0) and the run has one rank (a multi-rank run is not
    re-measured). The session decides it, and so does `kvpages.measure.spawn.start_early` for the workers it starts."""
    return remeasure_fraction > 0 and not multi_rank


def wait_ready(started: Sequence[Worker], limit_s: float) -> float:
    """Wait until every worker is ready; return the wall from the first launch to the last ready. One that exits
    first, or is not ready within `limit_s`, fails the run (WorkerFailed, naming it)."""
    begin = time.perf_counter()
    while True:
        waiting = []
        for w in started:
            w.log.new_outcomes()  # none before its turn: only its ready line
            if w.log.ready_at is not None:
                continue
            if w.child.poll() is not None:
                raise w.failed(f"exited with status {w.child.returncode} before it was ready")
            waiting.append(w)
        if not waiting:
            return max(w.log.ready_at or 0.0 for w in started) - min(w.launched_at for w in started)
        if time.perf_counter() - begin > limit_s:
            for late in waiting:
                late.child.kill()
            raise waiting[0].failed(f"was not ready within its limit of {limit_s:.0f} s and was stopped")
        time.sleep(READY_POLL_S)


def run_workers(command: WorkerCommand, start_limit_s: float, limits_s: Sequence[float], recorder: Recorder,
                say: Callable[[str], None], workers: Workers, spare: bool = False, started: Started | None = None) -> None:
    """Run the earlier processes' shares: every worker started at once (and a `spare` for a first re-measurement
    round, kept in `workers.spare`), ready within `start_limit_s`, then one after another (worker K within
    `limits_s[K]`), the later ones on worker 0's meter readings. An interrupted worker interrupts the session, one
    that did not run to its end fails the run (WorkerFailed); either way the workers still waiting exit (their pipes
    closed), or are killed after STOP_WAIT_S. Workers `started` before (`Started`, with their spare) are used instead
    of starting them now; either way each is told of the cases (`Worker.collect`) once they are written."""
    total = len(limits_s) + 1
    beside = "" if started is None else " with this session's collection"
    planned: list[Worker] = []
    try:
        if started is None:
            started = Started.of(command, total, spare)
        planned = started.planned
        assert len(planned) == total - 1, f"{len(planned)} workers started for {total} processes"
        workers.spare = started.spare
        for w in planned:
            w.collect()
        workers.startup_s = wait_ready(planned + ([workers.spare] if workers.spare else []), start_limit_s)
        count = f"{len(planned)} worker process" + ("es" if len(planned) > 1 else "")
        say(f"kvpages: {count}{' and a spare' if workers.spare else ''} started together{beside}, all ready in "
            f"{workers.startup_s:.1f} s")
        for w, limit in zip(planned, limits_s, strict=True):
            _turn(w, limit, command, recorder, say, workers)
            if w.process == 0:
                write_readings(command.folder, recorder.first_readings())
    except BaseException:
        workers.dismiss_spare()
        raise
    finally:
        _close(planned)
    say(f"kvpages: process {total} of {total} (pid {os.getpid()}, this session) times its share now")


def run_alone(command: WorkerCommand, process: int, start_limit_s: float, limit_s: float, recorder: Recorder,
              say: Callable[[str], None], workers: Workers, rounds: list[Worker]) -> Worker:
    """One more worker after the planned ones (a re-measurement round: kvpages.measure.remeasure): the spare, if it
    waits for its round as `process`, else one started alone; then timed at once; it fails or interrupts the run as a
    planned worker does. Added to `rounds` once its turn has begun, as a planned one to `workers.runs`."""
    w = workers.take_spare() if workers.spare is not None and workers.spare.process == process else None
    if w is None:
        w = launch(command, process, process + 1)
    try:
        if not w.spare:
            wait_ready([w], start_limit_s)
        _turn(w, limit_s, command, recorder, say, workers, runs=rounds)
    finally:
        _close([w])
    return w


def _turn(w: Worker, limit_s: float, command: WorkerCommand, recorder: Recorder, say: Callable[[str], None],
          workers: Workers, runs: list[Worker] | None = None) -> None:
    """Worker `w`'s turn: it times its share, recorded as it goes; then it is checked and said."""
    try:
        w.run(limit_s, recorder.record)
    finally:  # in meta.json's processes even when a signal lands as its turn ends (a run of one process's blocks
        (workers.runs if runs is None else runs).append(w)  # would else read as a one-process run)
    if w.interrupted:
        raise KeyboardInterrupt(f"worker process {w.process} was interrupted")
    if w.timed_out:
        raise w.failed(f"did not finish within its limit of {limit_s:.0f} s and was stopped")
    if w.child.returncode not in (0, 1) or w.log.end is None:  # pytest's 0 and 1: every case passed or was recorded
        raise w.failed(f"exited with status {w.child.returncode} before its end")
    if command.json_out:
        workers.benchmarks += json.loads(json_path(command.folder, w.process).read_text())["benchmarks"]
    info = w.info()
    say(f"kvpages: process {w.process + 1} of {w.total} (pid {info.pid}): {info.blocks} blocks in "
        f"{info.wall_s:.1f} s, of which start-up {info.startup_s:.1f} s, inputs {info.inputs_s:.1f} s and "
        f"timed rounds {info.timed_s or 0.0:.1f} s")


def _close(started: Sequence[Worker]) -> None:
    """Close the pipes of workers still waiting (they exit), then wait for each, killing it after STOP_WAIT_S."""
    for w in started:
        w.dismiss()
    deadline = time.perf_counter() + STOP_WAIT_S
    for w in started:
        wait_or_kill(w.child, max(0.0, deadline - time.perf_counter()))
