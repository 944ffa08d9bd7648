"""Fresh processes for a sweep's repetitions: pyperf's idea, with pytest as the runner.

A process fixes its address-space layout, allocator state, code and data placement for its whole
life, so repetitions inside one process cannot see a shift of the whole process. With
`--kv-processes P` (P >= 2), the pytest session the user runs is the last of P processes: before it
times its own share, it starts each earlier process in turn, never two at once, as

    python -m pytest <the same files> <the same --kv-* options> --benchmark-only --kv-worker K --kv-worker-dir DIR

A worker plans the same blocks (kvpages.measure.schedule), collects only those of process K, keeps
only the cases the session selected (DIR/cases.json), and logs each finished block to
DIR/process-K.jsonl as it goes: each block's outcome (kvpages.measure.outcome), then one `end`
line with its pid and costs. The session's recorder reads each outcome as it is written
(kvpages.measure.recorder), so an interrupted run keeps the workers' finished blocks too; then the
session times its own share.
No torch import.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvpages.measure.outcome import BlockOutcome
from kvpages.measure.recorder import deferred_interruption
from kvpages.schema.meta import ProcessInfo

WORKER_FLAG = "--kv-worker"
WORKER_DIR_FLAG = "--kv-worker-dir"
CASES_JSON = "cases.json"
LEAN_PYTEST = ("-q", "--benchmark-quiet", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:logging",
               "-p", "no:unraisableexception")
"""A worker's pytest: quiet (no table of its hundreds of benchmarks: the session reports the run), no cache, and
without three plugins bench/ does not use: hypothesis's (no property tests; about 1.5 s of import at the end of a
session), log capture (it attaches its handlers to the root and every non-propagating logger, torch's ~40,
around each phase of the ~600 tests: about 0.4 s a process) and the unraisable-exception hook (two full garbage
collections at the end of a session: about 0.3 s); the Makefile's BENCH_PYTEST leaves the same out of the session."""
PASSED_THROUGH = ("--benchmark-timer", "--benchmark-disable-gc")
"""pytest-benchmark options that change how a block is timed: a worker gets them as the session got them."""


@dataclass(frozen=True)
class BlocksSpent:
    """Where a process's blocks went, from its first block's start to its last one's end (seconds)."""

    blocks: int
    span_s: float
    inputs_s: float
    checks_s: float
    warmup_s: float
    timed_s: float

    def info(self, index: int, pid: int, role: str, startup_s: float, wall_s: float) -> ProcessInfo:
        """meta.json's record of the process: its untimed work is the rest of the span, its end the rest of its wall."""
        untimed = self.span_s - self.inputs_s - self.checks_s - self.warmup_s - self.timed_s
        return ProcessInfo(index, pid, role, startup_s, self.inputs_s, wall_s, self.blocks, self.checks_s,
                           self.warmup_s, self.timed_s, untimed, wall_s - startup_s - self.span_s)


@dataclass(frozen=True)
class WorkerEnd:
    """A worker's last line: who it was and where its blocks went."""

    pid: int
    first_block_at: float | None
    """time.time() when its first block started (None: it timed nothing)."""
    spent: BlocksSpent

    @classmethod
    def from_json(cls, data: dict) -> WorkerEnd:
        return cls(data["pid"], data["first_block_at"], BlocksSpent(**data["spent"]))


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


class WorkerLog:
    """A worker's log: one JSON line per block outcome (kvpages.measure.outcome), flushed as it goes, then its end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "a")  # noqa: SIM115 (open for the worker's whole session)

    def write(self, outcome: BlockOutcome) -> None:
        self._file.write(outcome.to_json() + "\n")
        self._file.flush()

    def end(self, end: WorkerEnd) -> None:
        self._file.write(json.dumps({"end": dataclasses.asdict(end)}) + "\n")
        self._file.close()


class LogReader:
    """Reads a worker's log as it grows: each call returns the outcomes of the lines completed since the last
    (a torn last line, of a worker still writing or killed, waits or is dropped); its end line sets `end`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.end: WorkerEnd | None = None

    def new_outcomes(self) -> list[BlockOutcome]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            text = f.read()
        complete = text[:text.rfind(b"\n") + 1]
        self.offset += len(complete)
        outcomes = []
        for line in complete.decode().splitlines():
            data = json.loads(line)
            if "end" in data:
                self.end = WorkerEnd.from_json(data["end"])
            else:
                outcomes.append(BlockOutcome.from_json(data))
        return outcomes


def log_path(folder: Path, process: int) -> Path:
    return folder / f"process-{process}.jsonl"


def json_path(folder: Path, process: int) -> Path:
    """Where a worker's pytest-benchmark JSON goes, when the session writes one."""
    return folder / f"process-{process}.json"


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

    def argv(self, process: int) -> list[str]:
        json_args = ["--benchmark-json", str(json_path(self.folder, process))] if self.json_out else []
        return [sys.executable, "-m", "pytest", *self.paths, *self.kv_args, "--benchmark-only",
                WORKER_FLAG, str(process), WORKER_DIR_FLAG, str(self.folder), "--rootdir", self.rootdir,
                *LEAN_PYTEST, *self.extra, *json_args]


@dataclass(frozen=True)
class WorkerRun:
    """What one worker left: its exit status, its end line, its wall time and the tail of its output."""

    process: int
    returncode: int
    end: WorkerEnd | None
    launched_at: float
    wall_s: float
    output_tail: str
    interrupted: bool = False
    """The session, or the worker itself, was interrupted (SIGINT, SIGTERM) before the worker's end."""
    timed_out: bool = False
    """It ran past its limit and was killed."""

    @property
    def ok(self) -> bool:
        """It ran to its end: every case passed or was recorded as failed (pytest's 0 and 1)."""
        return self.returncode in (0, 1) and self.end is not None

    def info(self) -> ProcessInfo:
        """meta.json's record of it; its start-up runs from its launch to its first block (all of it, if it timed
        nothing or did not get that far)."""
        end = self.end
        if end is None:
            return ProcessInfo(self.process, -1, "worker", self.wall_s, 0.0, self.wall_s, 0)
        startup = self.wall_s if end.first_block_at is None else end.first_block_at - self.launched_at
        return end.spent.info(self.process, end.pid, "worker", startup, self.wall_s)


POLL_S = 0.2
"""How often the session reads a running worker's log: its outcomes reach the run folder this soon."""
STOP_WAIT_S = 30.0
"""How long an interrupted session waits for a worker it passed the interruption on to, before killing it."""


def run_worker(command: WorkerCommand, process: int, limit_s: float, record: Callable[[BlockOutcome], None]
               ) -> WorkerRun:
    """Start worker `process`, wait for it at most `limit_s` (then kill it), and `record` each outcome it logs as it
    is written (its output goes to a file beside the log). Interrupted meanwhile (SIGINT, SIGTERM), the session
    passes SIGINT on to the worker and records what it logged until it stopped."""
    output = command.folder / f"process-{process}.out"
    log = LogReader(log_path(command.folder, process))
    launched, start = time.time(), time.perf_counter()
    with open(output, "w") as out:
        child = subprocess.Popen(command.argv(process), cwd=command.cwd, stdout=out, stderr=subprocess.STDOUT)
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
    wall = time.perf_counter() - start
    tail = "\n".join(output.read_text(errors="replace").splitlines()[-15:])
    interrupted |= child.returncode in (2, -signal.SIGINT)  # pytest's exit status when interrupted, or the signal
    return WorkerRun(process, child.returncode, log.end, launched, wall, tail, interrupted, timed_out)


class WorkerFailed(Exception):
    """A worker process did not run to its end (killed, crashed, refused, or past its limit): the run cannot be
    completed."""


def run_workers(command: WorkerCommand, limits_s: Sequence[float], record: Callable[[BlockOutcome], None],
                say: Callable[[str], None], runs: list[WorkerRun]) -> list[dict]:
    """Run the earlier processes' shares, one fresh worker after another (worker K within `limits_s[K]`), each into
    `runs` as it ends; return their pytest-benchmark JSON entries. An interrupted worker interrupts the session
    (KeyboardInterrupt); one that did not run to its end fails the run (WorkerFailed, naming it)."""
    benchmarks: list[dict] = []
    processes = len(limits_s) + 1
    for process, limit in enumerate(limits_s):
        result = run_worker(command, process, limit, record)
        runs.append(result)
        if result.interrupted:
            raise KeyboardInterrupt(f"worker process {process} was interrupted")
        if result.timed_out:
            raise WorkerFailed(f"kvpages: worker process {process} of {processes} did not finish within its "
                               f"limit of {limit:.0f} s and was stopped; the last lines it printed:\n{result.output_tail}")
        if not result.ok:
            raise WorkerFailed(f"kvpages: worker process {process} of {processes} exited with status "
                               f"{result.returncode} before its end; the last lines it printed:\n{result.output_tail}")
        if command.json_out:
            benchmarks += json.loads(json_path(command.folder, process).read_text())["benchmarks"]
        info = result.info()
        say(f"kvpages: process {process + 1} of {processes} (pid {info.pid}): {info.blocks} blocks in "
            f"{info.wall_s:.1f} s, of which start-up {info.startup_s:.1f} s, inputs {info.inputs_s:.1f} s and timed "
            f"rounds {info.timed_s or 0.0:.1f} s")
    say(f"kvpages: process {processes} of {processes} (pid {os.getpid()}, this session) times its share now")
    return benchmarks


def read_cases(folder: Path) -> frozenset[str]:
    return frozenset(json.loads((folder / CASES_JSON).read_text()))


def write_cases(folder: Path, case_ids: Sequence[str]) -> None:
    (folder / CASES_JSON).write_text(json.dumps(sorted(set(case_ids))))


def exit_without_collecting() -> None:
    """Leave the objects alive now out of the garbage collector's last passes when this interpreter exits.

    A process that imported torch holds about a million objects, and walking them at exit took about 0.45 s of
    its 0.65 s exit on the dev box, in each of a sweep's processes (its workers, the breakdown's child and the
    session). Everything still frees by reference counting, and files are closed by then; nothing measured runs.
    Runs at exit, once, however often it is asked for."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
