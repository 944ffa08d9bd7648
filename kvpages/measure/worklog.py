"""The log a worker process writes and its session reads (kvpages.measure.workers): one JSON line when the worker
is ready, one per block outcome (kvpages.measure.outcome) as it finishes, then its end line with its pid and costs;
and the pipe the worker waits on for its turn; the flags a worker is started with, and what each sweep process does at
its start and exit. No torch import: the plugin imports this at every pytest start, kvpages sweep or not.
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from kvpages.measure.outcome import BlockOutcome, MeterReading
from kvpages.schema.meta import ProcessInfo

CASES_JSON = "cases.json"
READINGS_JSON = "readings.json"

WORKER_FLAG = "--kv-worker"
WORKER_DIR_FLAG = "--kv-worker-dir"
WORKER_GO_FLAG = "--kv-worker-go"
WORKER_SPARE_FLAG = "--kv-worker-spare"
LEAN_PLUGINS = ("--assert=plain", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:logging", "-p",
                "no:unraisableexception", "-p", "no:xdist", "-p", "no:xdist.looponfail")
"""pytest without what a kvpages sweep never uses: assertion rewriting (bench/ asserts nothing), the cache, and the
plugins the Makefile's BENCH_PYTEST leaves out (it says what each costs). The pytest sessions the tests start run so
too (tests/conftest.py)."""
LEAN_PYTEST = ("-q", "--benchmark-quiet", *LEAN_PLUGINS)
"""A worker's pytest: quiet (the session reports the run) and lean (LEAN_PLUGINS)."""


def process_started_at() -> float:
    """When this process started, on time.perf_counter()'s clock (now where /proc/self/stat cannot be read), so the
    session's start-up counts the interpreter and pytest's imports before any hook runs."""
    now = time.perf_counter()
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, ValueError, IndexError):
        return now
    return now - max(age, 0.0)


def exit_without_collecting() -> None:
    """Leave the objects alive at exit out of the garbage collector's last passes (once, however often asked for):
    walking torch's ~million objects took ~0.45 s of a 0.65 s exit per sweep process; all still frees by refcount."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


_COLLECTOR_WAS: list[bool] = []


def collector_paused() -> None:
    """A sweep process imports torch and collects without the cyclic collector (its passes over torch's objects as
    they are made: a worker's collection 1.80-1.86 -> 1.70-1.76 s of CPU, docs/method.md), until `collector_resumed`
    once its collection is done; KvSession.start freezes what is alive by then, with the garbage the collector would
    have found meanwhile. Asked again before the resume, it does nothing."""
    if not _COLLECTOR_WAS:
        _COLLECTOR_WAS.append(gc.isenabled())  # as it was: a caller's disabled collector stays disabled
        gc.disable()


def collector_resumed() -> None:
    if _COLLECTOR_WAS and _COLLECTOR_WAS.pop():
        gc.enable()


def exit_at_once(status: int) -> NoReturn:
    """A worker's exit once pytest is done (its log's end line, its JSON and its output written): `status`, without
    Python's and libtorch's teardown, which was most of each worker's end, between its last block and the next
    worker's turn (0.10-0.16 s; 0.02-0.05 s so: docs/method.md, "Where a run's time goes")."""
    for stream in filter(None, (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)):
        with suppress(Exception):  # closed or detached: nothing of it is left to write
            stream.flush()
    with suppress(Exception):  # C's stdio buffers too (libtorch's std::cout goes through them)
        ctypes.CDLL(None).fflush(None)
    os._exit(status)


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
    first_block_at: float | None  # time.time() when its first block started (None: it timed nothing)
    spent: BlocksSpent
    released_at: float | None = None  # time.time() when the session let it time its share (None: it did not wait)

    @classmethod
    def from_json(cls, data: dict) -> WorkerEnd:
        return cls(data["pid"], data["first_block_at"], BlocksSpent(**data["spent"]), data.get("released_at"))


class WorkerLog:
    """A worker's log: one JSON line per block outcome (kvpages.measure.outcome), flushed as it goes, then its end."""

    def __init__(self, path: Path, go_fd: int | None = None) -> None:
        self.folder = path.parent
        self._file = open(path, "a")  # noqa: SIM115 (open for the worker's whole session)
        self.go_fd = go_fd  # the pipe it waits on for its turn (None: it does not wait)
        self.released_at: float | None = None  # time.time() when its turn came
        self.waited_s = 0.0  # how long it waited for its session's cases (`wait_to_collect`): not its start-up

    def write(self, outcome: BlockOutcome) -> None:
        self._file.write(outcome.to_json() + "\n")
        self._file.flush()

    def wait_for_turn(self) -> bool:
        """Say it is ready (imported and collected; a spare: imported), then wait until the session writes to its
        pipe: False if the pipe closed unwritten (the session stopped, an earlier worker failed, a spare not needed).
        Once released, it does not wait again."""
        if self.go_fd is None or self.released_at is not None:
            return True
        self._file.write(json.dumps({"ready": time.time(), "waited": self.waited_s}) + "\n")
        self._file.flush()
        try:
            go = os.read(self.go_fd, 1)
        finally:
            os.close(self.go_fd)
        self.released_at = time.time()
        return bool(go)

    def end(self, end: WorkerEnd) -> None:
        self._file.write(json.dumps({"end": dataclasses.asdict(end)}) + "\n")
        self._file.close()


class LogReader:
    """Reads a worker's log as it grows: each call returns the outcomes of the lines completed since the last
    (a torn last line, of a worker still writing or killed, waits or is dropped); its end line sets `end`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.ready_at: float | None = None  # time.time() when it said it was ready (its ready line)
        self.waited_s = 0.0  # of its start-up, its wait for the session's cases (its ready line)
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
            if "ready" in data:
                self.ready_at, self.waited_s = data["ready"], data.get("waited", 0.0)
            elif "end" in data:
                self.end = WorkerEnd.from_json(data["end"])
            else:
                outcomes.append(BlockOutcome.from_json(data))
        return outcomes


def log_path(folder: Path, process: int) -> Path:
    return folder / f"process-{process}.jsonl"


def round_path(folder: Path, process: int) -> Path:
    """Where the session leaves a re-measurement round for its worker (kvpages.measure.remeasure.Round)."""
    return folder / f"round-{process}.json"


def json_path(folder: Path, process: int) -> Path:
    return folder / f"process-{process}.json"


COLLECT = b"c"
"""What a session writes on a worker's pipe once it has written the cases it selected (`write_cases`): the worker,
started before (kvpages.measure.workers.Started), has imported and collected its blocks meanwhile and keeps those."""


def wait_to_collect(go_fd: int) -> bool:
    """A worker's wait, its imports and collection behind it, for the session's cases: True once the session says
    `COLLECT`; False if the pipe closed first (the session ended, or needed no workers)."""
    return os.read(go_fd, 1) == COLLECT


def read_cases(folder: Path) -> frozenset[str]:
    return frozenset(json.loads((folder / CASES_JSON).read_text()))


def write_cases(folder: Path, case_ids: Sequence[str]) -> None:
    (folder / CASES_JSON).write_text(json.dumps(sorted(set(case_ids))))


def write_readings(folder: Path, readings: dict[str, MeterReading]) -> None:
    """What process 0's meter read of each case, for the later workers (`read_readings`)."""
    (folder / READINGS_JSON).write_text(json.dumps({case: dataclasses.asdict(r) for case, r in readings.items()}))


def read_readings(folder: Path) -> dict[str, MeterReading]:
    """`write_readings`'s readings; none before process 0 has ended."""
    path = folder / READINGS_JSON
    return {case: MeterReading(**r) for case, r in json.loads(path.read_text()).items()} if path.exists() else {}
