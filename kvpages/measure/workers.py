"""Fresh processes for a sweep's repetitions: pyperf's idea, with pytest as the runner.

A process fixes its address-space layout, allocator state, code and data placement for its whole
life, so repetitions inside one process cannot see a shift of the whole process. With
`--kv-processes P` (P >= 2), the pytest session the user runs is the last of P processes: before it
times its own share, it starts the P - 1 earlier ones together, as

    python -m pytest <the same files> <the same --kv-* options> --benchmark-only --kv-worker K --kv-worker-dir DIR
        --kv-worker-go FD

Each imports and collects, says it is ready in its log, and waits on its pipe FD. Once every one is
ready (nothing runs but their waits), the session lets them time one at a time, never two at once:
the start-ups, about 2 s of one core each, overlap on the box's cores instead of adding up.
A worker plans the same blocks (kvpages.measure.schedule), collects only those of process K, keeps
only the cases the session selected (DIR/cases.json), and logs each finished block to
DIR/process-K.jsonl as it goes (kvpages.measure.worklog). The session's recorder reads each outcome as it is written
(kvpages.measure.recorder), so an interrupted run keeps the workers' finished blocks too; then the
session times its own share.
No torch import.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvpages.measure.outcome import BlockOutcome
from kvpages.measure.recorder import deferred_interruption
from kvpages.measure.worklog import LogReader, WorkerEnd, json_path, log_path
from kvpages.schema.meta import ProcessInfo

WORKER_FLAG = "--kv-worker"
WORKER_DIR_FLAG = "--kv-worker-dir"
WORKER_GO_FLAG = "--kv-worker-go"
LEAN_PYTEST = ("-q", "--benchmark-quiet", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:logging",
               "-p", "no:unraisableexception")
"""A worker's pytest: quiet (no table of its hundreds of benchmarks: the session reports the run), no cache, and
without three plugins bench/ does not use: hypothesis's (no property tests; about 1.5 s of import at the end of a
session), log capture (it attaches its handlers to the root and every non-propagating logger, torch's ~40,
around each phase of the ~600 tests: about 0.4 s a process) and the unraisable-exception hook (two full garbage
collections at the end of a session: about 0.3 s); the Makefile's BENCH_PYTEST leaves the same out of the session."""
PASSED_THROUGH = ("--benchmark-timer", "--benchmark-disable-gc")
"""pytest-benchmark options that change how a block is timed: a worker gets them as the session got them."""


def process_started_at() -> float:
    """When this process started, on time.perf_counter()'s clock: its age from /proc/self/stat (Linux, 10 ms
    resolution), so the session's start-up counts the interpreter and pytest's imports before any hook runs; now
    where that cannot be read."""
    now = time.perf_counter()
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, ValueError, IndexError):
        return now
    return now - max(age, 0.0)


def passed_through(invocation_args: Sequence[str]) -> list[str]:
    """The `PASSED_THROUGH` options among the session's arguments, as given (`--opt value` or `--opt=value`)."""
    out: list[str] = []
    args = list(invocation_args)
    for i, arg in enumerate(args):
        name = arg.split("=", 1)[0]
        if name in PASSED_THROUGH:
            takes_value = name != "--benchmark-disable-gc" and "=" not in arg and i + 1 < len(args)
            out += [arg, args[i + 1]] if takes_value else [arg]
    return out


@dataclass(frozen=True)
class WorkerCommand:
    """How the session starts worker K: everything but K is the same for every worker."""

    paths: tuple[str, ...]
    """The session's file arguments, parametrization stripped (a worker's blocks have other ids)."""
    kv_args: tuple[str, ...]
    extra: tuple[str, ...]
    rootdir: str
    cwd: Path
    folder: Path
    json_out: bool

    def argv(self, process: int, go_fd: int) -> list[str]:
        json_args = ["--benchmark-json", str(json_path(self.folder, process))] if self.json_out else []
        return [sys.executable, "-m", "pytest", *self.paths, *self.kv_args, "--benchmark-only",
                WORKER_FLAG, str(process), WORKER_DIR_FLAG, str(self.folder), WORKER_GO_FLAG, str(go_fd),
                "--rootdir", self.rootdir, *LEAN_PYTEST, *self.extra, *json_args]


@dataclass
class Started:
    """A worker launched, waiting for its turn."""

    process: int
    child: subprocess.Popen
    go_fd: int | None
    """The write end of its pipe (None once written or closed)."""
    output: Path
    log: LogReader
    launched_at: float
    """time.time() at its launch."""

    def release(self) -> None:
        """Its turn: it starts timing now."""
        assert self.go_fd is not None
        os.write(self.go_fd, b"g")
        self.dismiss()

    def dismiss(self) -> None:
        """Close its pipe: a worker still waiting exits."""
        if self.go_fd is not None:
            os.close(self.go_fd)
            self.go_fd = None

    def tail(self) -> str:
        return "\n".join(self.output.read_text(errors="replace").splitlines()[-15:])


@dataclass(frozen=True)
class WorkerRun:
    """What one worker left: its exit status, its end line, its wall time and the tail of its output."""

    process: int
    returncode: int
    end: WorkerEnd | None
    launched_at: float
    ready_s: float
    """From its launch until it was ready (its start-up, beside the other workers')."""
    turn_s: float
    """From the session's go until it exited (timing its share, one worker at a time)."""
    output_tail: str
    interrupted: bool = False
    """The session, or the worker itself, was interrupted (SIGINT, SIGTERM) before the worker's end."""
    timed_out: bool = False
    """It ran past its limit and was killed."""

    @property
    def wall_s(self) -> float:
        """Its own wall time, without its wait for its turn."""
        return self.ready_s + self.turn_s

    @property
    def ok(self) -> bool:
        """It ran to its end: every case passed or was recorded as failed (pytest's 0 and 1)."""
        return self.returncode in (0, 1) and self.end is not None

    def info(self) -> ProcessInfo:
        """meta.json's record of it; its start-up runs from its launch to its first block, less its wait for its
        turn (all of its wall, if it timed nothing or did not get that far)."""
        end = self.end
        if end is None:
            return ProcessInfo(self.process, -1, "worker", self.wall_s, 0.0, self.wall_s, 0)
        if end.first_block_at is None or end.released_at is None:
            startup = self.wall_s
        else:
            startup = self.ready_s + end.first_block_at - end.released_at
        return end.spent.info(self.process, end.pid, "worker", startup, self.wall_s)


@dataclass
class Workers:
    """A session's workers: each one's run as it ends, their start-up and their pytest-benchmark JSON entries."""

    runs: list[WorkerRun] = field(default_factory=list)
    startup_s: float = 0.0
    """The session's wall from their launch until every one was ready."""
    benchmarks: list[dict] = field(default_factory=list)

    @property
    def overlap_s(self) -> float:
        """How much of their start-ups ran beside one another: their sum, less the wall they took."""
        return sum(r.ready_s for r in self.runs) - self.startup_s if self.runs else 0.0

    @property
    def turns_s(self) -> float:
        return sum(r.turn_s for r in self.runs)


POLL_S = 0.2
"""How often the session reads a running worker's log: its outcomes reach the run folder this soon."""
READY_POLL_S = 0.02
"""How often it looks whether the workers are ready (nothing is timed meanwhile)."""
STOP_WAIT_S = 30.0
"""How long an interrupted session waits for a worker it passed the interruption on to, before killing it."""


class WorkerFailed(Exception):
    """A worker process did not run to its end (killed, crashed, refused, or past its limit): the run cannot be
    completed."""


def launch(command: WorkerCommand, processes: int, started: list[Started]) -> None:
    """Start workers 0 .. processes - 1 at once into `started`, each waiting for its turn on a pipe of its own."""
    for process in range(processes):
        read_fd, write_fd = os.pipe()
        output = command.folder / f"process-{process}.out"
        try:
            with open(output, "w") as out:
                child = subprocess.Popen(command.argv(process, read_fd), cwd=command.cwd, stdout=out,
                                         stderr=subprocess.STDOUT, pass_fds=(read_fd,))
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        started.append(Started(process, child, write_fd, output, LogReader(log_path(command.folder, process)),
                               time.time()))


def wait_ready(started: Sequence[Started], limit_s: float) -> float:
    """Wait until every worker is ready; return the wall from the first launch to the last ready. One that exits
    first, or is not ready within `limit_s`, fails the run (WorkerFailed, naming it)."""
    begin = time.perf_counter()
    total = len(started) + 1
    while True:
        waiting = []
        for s in started:
            s.log.new_outcomes()  # none before its turn: only its ready line
            if s.log.ready_at is not None:
                continue
            if s.child.poll() is not None:
                raise WorkerFailed(f"kvpages: worker process {s.process} of {total} exited with status "
                                   f"{s.child.returncode} before it was ready; the last lines it printed:\n{s.tail()}")
            waiting.append(s)
        if not waiting:
            return max(s.log.ready_at or 0.0 for s in started) - min(s.launched_at for s in started)
        if time.perf_counter() - begin > limit_s:
            for late in waiting:
                late.child.kill()
            s = waiting[0]
            raise WorkerFailed(f"kvpages: worker process {s.process} of {total} was not ready within its limit of "
                               f"{limit_s:.0f} s and was stopped; the last lines it printed:\n{s.tail()}")
        time.sleep(READY_POLL_S)


def run_worker(started: Started, limit_s: float, record: Callable[[BlockOutcome], None]) -> WorkerRun:
    """Let a ready worker time its share, wait for it at most `limit_s` (then kill it), and `record` each outcome it
    logs as it is written (its output goes to a file beside the log). Interrupted meanwhile (SIGINT, SIGTERM), the
    session passes SIGINT on to the worker and records what it logged until it stopped."""
    log, child = started.log, started.child
    start = time.perf_counter()
    started.release()
    interrupted = timed_out = False
    try:
        while True:
            with deferred_interruption():  # what was read is recorded whole: the log's offset has moved past it
                for outcome in log.new_outcomes():
                    record(outcome)
            try:
                child.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                if time.perf_counter() - start > limit_s:
                    child.kill()
                    child.wait()
                    timed_out = True
                    break
    except KeyboardInterrupt:
        interrupted = True
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    for outcome in log.new_outcomes():
        record(outcome)
    turn = time.perf_counter() - start
    ready_s = (log.ready_at or started.launched_at) - started.launched_at
    interrupted |= child.returncode in (2, -signal.SIGINT)  # pytest's exit status when interrupted, or the signal
    return WorkerRun(started.process, child.returncode, log.end, started.launched_at, ready_s, turn, started.tail(),
                     interrupted, timed_out)


def dismiss(started: Sequence[Started]) -> None:
    """The workers whose turn did not come exit (their pipes closed); one that does not within STOP_WAIT_S is
    killed."""
    for s in started:
        s.dismiss()
    deadline = time.perf_counter() + STOP_WAIT_S
    for s in started:
        try:
            s.child.wait(timeout=max(0.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            s.child.kill()
            s.child.wait()


def run_workers(command: WorkerCommand, start_limit_s: float, limits_s: Sequence[float],
                record: Callable[[BlockOutcome], None], say: Callable[[str], None], workers: Workers) -> None:
    """Run the earlier processes' shares: every worker started at once and, when all are ready (within
    `start_limit_s`), one after another (worker K within `limits_s[K]`), each into `workers` as it ends, with its
    pytest-benchmark JSON entries. An interrupted worker interrupts the session (KeyboardInterrupt); one that did not
    run to its end fails the run (WorkerFailed, naming it); either way the workers still waiting exit."""
    processes = len(limits_s) + 1
    started: list[Started] = []
    try:
        launch(command, len(limits_s), started)
        workers.startup_s = wait_ready(started, start_limit_s)
        say(f"kvpages: {len(started)} worker processes started together, all ready in {workers.startup_s:.1f} s")
        for s, limit in zip(started, limits_s, strict=True):
            result = run_worker(s, limit, record)
            workers.runs.append(result)
            if result.interrupted:
                raise KeyboardInterrupt(f"worker process {s.process} was interrupted")
            if result.timed_out:
                raise WorkerFailed(f"kvpages: worker process {s.process} of {processes} did not finish within its "
                                   f"limit of {limit:.0f} s and was stopped; the last lines it printed:\n"
                                   f"{result.output_tail}")
            if not result.ok:
                raise WorkerFailed(f"kvpages: worker process {s.process} of {processes} exited with status "
                                   f"{result.returncode} before its end; the last lines it printed:\n"
                                   f"{result.output_tail}")
            if command.json_out:
                workers.benchmarks += json.loads(json_path(command.folder, s.process).read_text())["benchmarks"]
            info = result.info()
            say(f"kvpages: process {s.process + 1} of {processes} (pid {info.pid}): {info.blocks} blocks in "
                f"{info.wall_s:.1f} s, of which start-up {info.startup_s:.1f} s, inputs {info.inputs_s:.1f} s and "
                f"timed rounds {info.timed_s or 0.0:.1f} s")
    finally:
        dismiss(started)
    say(f"kvpages: process {processes} of {processes} (pid {os.getpid()}, this session) times its share now")


def exit_without_collecting() -> None:
    """Leave the objects alive now out of the garbage collector's last passes when this interpreter exits.

    A process that imported torch holds about a million objects, and walking them at exit took about 0.45 s of
    its 0.65 s exit on the dev box, in each of a sweep's processes (its workers, the breakdown's child and the
    session). Everything still frees by reference counting, and files are closed by then; nothing measured runs.
    Runs at exit, once, however often it is asked for."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
