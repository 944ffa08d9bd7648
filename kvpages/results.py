"""The result schema and the run folder: rows, raw samples and meta.json (no torch import).

A run folder `results/<run-id>/` holds
- `results.csv`: one `Row` per (variant, point);
- `samples.csv`: one `SampleSet` per timed row, the per-round times in microseconds;
- `meta.json`: a `RunMeta` (environment, command, options, start/end, completed).
Every file is rewritten to a temporary file and renamed over the old one after
each finished row, so an interrupted run keeps every finished row, parseable.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path

SCHEMA_VERSION = 1
RESULTS_CSV = "results.csv"
SAMPLES_CSV = "samples.csv"
META_JSON = "meta.json"

STATUSES = ("ok", "skipped", "mismatch", "out_of_memory")
"""ok: checked, metered and timed; skipped: cannot run on this device (see note);
mismatch: wrong output or D2H bytes (see note); out_of_memory: the point did not fit."""

KEY_COLUMNS = ("variant", "dtype", "layout", "seq_len", "page_size")
"""A row's identity within a run (the device is the run's)."""


@dataclass(frozen=True)
class Row:
    """One (variant, point) of a run. Times in microseconds per call, bytes per call."""

    variant: str
    device: str
    device_name: str
    dtype: str
    layout: str
    seq_len: int
    page_size: int
    num_pages: int
    rotation: int
    expected_d2h_bytes: int
    d2h_bytes: int | None
    d2h_transfers: int | None
    link: str
    median_us: float | None
    iqr_us: float | None
    q1_us: float | None
    q3_us: float | None
    min_us: float | None
    max_us: float | None
    mean_us: float | None
    stddev_us: float | None
    rounds: int | None
    iterations: int | None
    status: str
    note: str
    repro: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown row status {self.status!r}; valid: {', '.join(STATUSES)}")


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Row))
INT_COLUMNS = ("seq_len", "page_size", "num_pages", "rotation", "expected_d2h_bytes", "d2h_bytes", "d2h_transfers", "rounds", "iterations")
FLOAT_COLUMNS = tuple(c for c in COLUMNS if c.endswith("_us"))


@dataclass(frozen=True)
class SampleSet:
    """The raw per-round times of one timed row."""

    variant: str
    dtype: str
    layout: str
    seq_len: int
    page_size: int
    samples_us: tuple[float, ...]


SAMPLE_COLUMNS = KEY_COLUMNS + ("rounds", "samples_us")


@dataclass(frozen=True)
class Environment:
    """Where a run ran. Fields that do not apply (no CUDA) are None."""

    kvpages_version: str
    python_version: str
    torch_version: str
    numpy_version: str
    pytest_benchmark_version: str
    platform: str
    cpu_model: str
    cpu_count: int
    torch_threads: int
    device: str
    device_name: str
    cuda_version: str | None
    driver_version: str | None
    pcie_link: str | None
    git_commit: str | None
    git_dirty: bool | None
    link_crossed: bool
    link_note: str


@dataclass
class RunMeta:
    """meta.json: what ran, where, how, and whether it finished."""

    run_id: str
    preset: str
    options: dict[str, str]
    command: str
    started_utc: str
    environment: Environment
    finished_utc: str | None = None
    completed: bool = False
    end_note: str = "running (or killed before it could finish)"
    schema_version: int = SCHEMA_VERSION
    timing: dict[str, float] = field(default_factory=dict)


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def create_run_dir(results_dir: Path, device_label: str) -> Path:
    """Make a new, empty `results_dir/<UTC time>-<device>` folder; never reuses an existing one."""
    results_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{_slug(device_label)}"
    for attempt in range(1, 1000):
        path = results_dir / (stem if attempt == 1 else f"{stem}-{attempt}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{results_dir}: too many runs named {stem}-*")


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`.

    A reader, or a run interrupted at any point, sees the old file or the new one,
    never a torn one. (No fsync: this guards against interruption and crashes of
    the process, not against power loss, and keeps bookkeeping off the run's clock.)
    """
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def _csv_text(columns: tuple[str, ...], records: list[dict[str, object]], header: bool = True) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    if header:
        writer.writeheader()
    for record in records:
        writer.writerow({k: ("" if v is None else v) for k, v in record.items()})
    return buffer.getvalue()


class RunWriter:
    """Owns one run folder; `add` rewrites the CSVs atomically after each finished row.

    The CSV text of earlier rows is kept, so each row costs one serialisation and one write.
    """

    def __init__(self, path: Path, meta: RunMeta) -> None:
        self.path = path
        self.meta = meta
        self.rows: list[Row] = []
        self._rows_text = _csv_text(COLUMNS, [])
        self._samples_text = _csv_text(SAMPLE_COLUMNS, [])
        self._write_meta()

    def add(self, row: Row, samples: SampleSet | None = None) -> None:
        """Record a finished row; its samples are written first, so every row on disk has them."""
        if samples is not None:
            self._samples_text += _csv_text(SAMPLE_COLUMNS, [_sample_record(samples)], header=False)
            write_atomic(self.path / SAMPLES_CSV, self._samples_text)
        self.rows.append(row)
        self._rows_text += _csv_text(COLUMNS, [dataclasses.asdict(row)], header=False)
        write_atomic(self.path / RESULTS_CSV, self._rows_text)

    def finish(self, completed: bool, end_note: str, timing: dict[str, float]) -> None:
        self.meta.finished_utc = utc_now()
        self.meta.completed = completed
        self.meta.end_note = end_note
        self.meta.timing = timing
        self._write_meta()

    def _write_meta(self) -> None:
        write_atomic(self.path / META_JSON, json.dumps(dataclasses.asdict(self.meta), indent=2) + "\n")


def _sample_record(s: SampleSet) -> dict[str, object]:
    return {
        "variant": s.variant,
        "dtype": s.dtype,
        "layout": s.layout,
        "seq_len": s.seq_len,
        "page_size": s.page_size,
        "rounds": len(s.samples_us),
        "samples_us": " ".join(repr(float(x)) for x in s.samples_us),
    }
