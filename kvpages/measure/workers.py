"""Fresh processes for a sweep's repetitions: pyperf's idea, with pytest as the runner.

A process fixes its address-space layout, allocator state, code and data placement for its whole
life, so repetitions inside one process cannot see a shift of the whole process. With
`--kv-processes P` (P >= 2), the pytest session the user runs is the last of P processes: before it
times its own share, it starts each earlier process in turn, never two at once, as

    python -m pytest <the same files> <the same --kv-* options> --benchmark-only --kv-worker K --kv-worker-dir DIR

A worker plans the same blocks (kvpages.measure.schedule), collects only those of process K, keeps
only the cases the session selected (DIR/cases.json), and logs each finished block to
DIR/process-K.jsonl as it goes: its samples and the D2H bytes it measured, or why its case stopped,
then one `end` line with its pid and costs. The session folds each log into its runner, then times
its own share and writes every row as its point's last block finishes (kvpages.measure.runner).
No torch import.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpages.schema.meta import ProcessInfo
from kvpages.schema.rows import TABLES, Samples, Table

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
class BlockRecord:
    """A block a worker timed: its samples (its process and repetition among them) and what its meter saw."""

    case_id: str
    table: Table
    samples: Samples
    d2h_bytes: int | None
    d2h_transfers: int | None


@dataclass(frozen=True)
class StopRecord:
    """A case a worker recorded as `status` (skipped, mismatch, ...), and whether its test failed."""

    case_id: str
    status: str
    note: str
    fail: bool


@dataclass(frozen=True)
class EndRecord:
    """A worker's last line: who it was and what its start cost."""

    pid: int
    first_block_at: float | None
    """time.time() when its first block started (None: it timed nothing)."""
    generate_s: float
    blocks: int


Record = BlockRecord | StopRecord | EndRecord


class WorkerLog:
    """A worker's log: one JSON line per finished block or stopped case, flushed as it goes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "a")  # noqa: SIM115 (open for the worker's whole session)

    def _line(self, kind: str, fields: dict[str, Any]) -> None:
        self._file.write(json.dumps({"kind": kind, **fields}) + "\n")
        self._file.flush()

    def block(self, case_id: str, table: Table, samples: Samples, d2h_bytes: int | None,
              d2h_transfers: int | None) -> None:
        fields = {f.name: getattr(samples, f.name) for f in dataclasses.fields(samples)}  # asdict's, without
        # deep-copying every sample (its values are floats, strings and tuples of floats)
        self._line("block", {"case_id": case_id, "table": table.rows_csv, "samples": fields,
                             "d2h_bytes": d2h_bytes, "d2h_transfers": d2h_transfers})

    def stop(self, case_id: str, status: str, note: str, fail: bool) -> None:
        self._line("stop", {"case_id": case_id, "status": status, "note": note, "fail": fail})

    def end(self, record: EndRecord) -> None:
        self._line("end", dataclasses.asdict(record))
        self._file.close()


def read_log(path: Path) -> list[Record]:
    """A worker's records, in the order it wrote them (a torn last line, from a killed worker, is dropped)."""
    records: list[Record] = []
    for line in path.read_text().splitlines() if path.exists() else ():
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            break
        kind = data.pop("kind")
        if kind == "block":
            table = TABLES[data.pop("table")]
            records.append(BlockRecord(data["case_id"], table, table.samples_from(data["samples"]),
                                       data["d2h_bytes"], data["d2h_transfers"]))
        elif kind == "stop":
            records.append(StopRecord(**data))
        else:
            records.append(EndRecord(**data))
    return records


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
    """What one worker left: its exit status, its records, its wall time and the tail of its output."""

    process: int
    returncode: int
    records: list[Record]
    launched_at: float
    wall_s: float
    output_tail: str
    timed_out: bool = False
    """It ran past its limit and was killed."""

    @property
    def end(self) -> EndRecord | None:
        return next((r for r in self.records if isinstance(r, EndRecord)), None)

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
        return ProcessInfo(self.process, end.pid, "worker", startup, end.generate_s, self.wall_s, end.blocks)


def run_worker(command: WorkerCommand, process: int, limit_s: float) -> WorkerRun:
    """Start worker `process`, wait for it at most `limit_s` (then kill it), and read its log (its output goes to a
    file beside the log)."""
    output = command.folder / f"process-{process}.out"
    launched, start = time.time(), time.perf_counter()
    timed_out = False
    with open(output, "w") as out:
        try:
            returncode = subprocess.run(command.argv(process), cwd=command.cwd, stdout=out, stderr=subprocess.STDOUT,
                                        timeout=limit_s, check=False).returncode
        except subprocess.TimeoutExpired:  # subprocess.run has killed it and waited for it
            returncode, timed_out = -9, True
    wall = time.perf_counter() - start
    tail = "\n".join(output.read_text(errors="replace").splitlines()[-15:])
    return WorkerRun(process, returncode, read_log(log_path(command.folder, process)), launched, wall, tail, timed_out)


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
