"""The result schema and the run folder: rows, raw samples and meta.json (no torch import).

A run folder `results/<run-id>/` holds
- `results.csv`: one `Row` per (variant, point);
- `samples.csv`: one `SampleSet` per timed repetition (block) of a row, its per-round
  times in microseconds, with the block's repetition and its position in the run order;
- `meta.json`: a `RunMeta` (environment, command, options, start/end, completed);
- `ratios.csv` (analysed runs): one `RatioRow` per (variant, baseline, point).
Every file is rewritten to a temporary file and renamed over the old one after
each finished point, so an interrupted run keeps every finished row, parseable.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path

SCHEMA_VERSION = 2
"""2: repetitions (samples.csv has one line per block, with `repetition` and `order`). Version 1 is still read."""
READABLE_SCHEMAS = (1, 2)
RESULTS_CSV = "results.csv"
SAMPLES_CSV = "samples.csv"
META_JSON = "meta.json"
RATIOS_CSV = "ratios.csv"
SCENARIOS_CSV = "scenarios.csv"
SCENARIO_SAMPLES_CSV = "scenario_samples.csv"

STATUSES = ("ok", "skipped", "mismatch", "out_of_memory")
"""ok: checked, metered and timed; skipped: cannot run on this device (see note);
mismatch: wrong output or D2H bytes (see note); out_of_memory: the point did not fit."""

KEY_COLUMNS = ("variant", "dtype", "layout", "seq_len", "page_size")


def check_status(status: str) -> None:
    if status not in STATUSES:
        raise ValueError(f"unknown row status {status!r}; valid: {', '.join(STATUSES)}")
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
    repetitions: int | None
    rep_spread: float | None
    status: str
    note: str
    repro: str

    def __post_init__(self) -> None:
        check_status(self.status)


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Row))
INT_COLUMNS = ("seq_len", "page_size", "num_pages", "rotation", "expected_d2h_bytes", "d2h_bytes", "d2h_transfers",
               "rounds", "iterations", "repetitions")
FLOAT_COLUMNS = tuple(c for c in COLUMNS if c.endswith("_us")) + ("rep_spread",)
OPTIONAL_COLUMNS = ("repetitions", "rep_spread")
"""Columns schema version 1 did not have; reading such a run leaves them empty."""


@dataclass(frozen=True)
class SampleSet:
    """The raw per-round times of one timed block: repetition `repetition` of a row, the
    `order`-th block the run timed."""

    variant: str
    dtype: str
    layout: str
    seq_len: int
    page_size: int
    repetition: int
    order: int
    samples_us: tuple[float, ...]


SAMPLE_COLUMNS = KEY_COLUMNS + ("repetition", "order", "rounds", "samples_us")


@dataclass(frozen=True)
class ScenarioRow:
    """One (scenario, step variant): a whole request (all its calls) or a whole scheduler step, measured as one.

    Bytes and transfers per request or step, as the meter counted them; latencies per request or
    step in microseconds: `blocked` until the calling (scheduler) thread got control back, `ready`
    until the page indices were usable on the host (equal, except for variants whose wait runs on
    a worker thread; on a CPU run always equal).
    """

    scenario: str
    kind: str  # request | step
    side: str  # prefill | decode
    variant: str
    device: str
    dtype: str
    layout: str
    requests: int
    tokens: int
    chunk_size: int
    page_size: int
    busy_us: int
    calls: int
    expected_d2h_bytes: int
    d2h_bytes: int | None
    d2h_transfers: int | None
    link: str
    blocked_median_us: float | None
    blocked_q1_us: float | None
    blocked_q3_us: float | None
    ready_median_us: float | None
    ready_q1_us: float | None
    ready_q3_us: float | None
    rounds: int | None
    repetitions: int | None
    status: str
    note: str
    repro: str
    busy_measured_us: float | None = None
    """The device busy time each timed round actually had (CUDA events around the queued kernel), median."""

    def __post_init__(self) -> None:
        check_status(self.status)


SCENARIO_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ScenarioRow))
SCENARIO_INT_COLUMNS = ("requests", "tokens", "chunk_size", "page_size", "busy_us", "calls", "expected_d2h_bytes",
                        "d2h_bytes", "d2h_transfers", "rounds", "repetitions")
SCENARIO_FLOAT_COLUMNS = tuple(c for c in SCENARIO_COLUMNS if c.endswith("_us") and c != "busy_us")
SCENARIO_OPTIONAL_COLUMNS = ("busy_measured_us",)
"""Columns added since scenarios.csv first appeared; reading an older run leaves them empty."""


@dataclass(frozen=True)
class ScenarioSampleSet:
    """One timed block of a (scenario, step variant): per round, blocked and ready microseconds."""

    scenario: str
    variant: str
    repetition: int
    order: int
    blocked_us: tuple[float, ...]
    ready_us: tuple[float, ...]
    busy_us: tuple[float, ...] = ()
    """Per round, the device busy time queued before it (busy-queue scenarios on CUDA; else empty)."""


SCENARIO_SAMPLE_COLUMNS = ("scenario", "variant", "repetition", "order", "rounds", "blocked_us", "ready_us", "busy_us")


@dataclass(frozen=True)
class RatioRow:
    """`variant` against `baseline` at one point of an analysed run (ratios.csv).

    ratio: median over repetitions of the paired block-median ratios variant/baseline, with the
    order-statistic interval of that median at `confidence` (kvpages.stats); bytes_ratio: measured D2H bytes.
    verdict: 'faster' or 'slower' when the interval excludes 1, else 'within noise'.
    """

    variant: str
    baseline: str
    dtype: str
    layout: str
    seq_len: int
    page_size: int
    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    repetitions: int
    bytes_ratio: float
    variant_median_us: float
    baseline_median_us: float
    variant_d2h_bytes: int
    baseline_d2h_bytes: int
    verdict: str


RATIO_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(RatioRow))


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
    gpu_uuid: str | None = None
    pcie_link_loaded: str | None = None
    """The PCIe link as nvidia-smi saw it right after the first timed block (an idle link downshifts)."""


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
    repetitions: int = 1
    order_seed: int = 0
    crosscheck: str = "off"


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
        self.scenario_rows: list[ScenarioRow] = []
        self._scenarios_text = _csv_text(SCENARIO_COLUMNS, [])
        self._scenario_samples_text = _csv_text(SCENARIO_SAMPLE_COLUMNS, [])
        write_atomic(self.path / RESULTS_CSV, self._rows_text)  # a run of scenarios alone has no point rows
        self._write_meta()

    def add(self, rows: Sequence[Row], samples: Sequence[SampleSet] = ()) -> None:
        """Record finished rows; their samples are written first, so every row on disk has them."""
        if samples:
            self._samples_text += _csv_text(SAMPLE_COLUMNS, [_sample_record(s) for s in samples], header=False)
            write_atomic(self.path / SAMPLES_CSV, self._samples_text)
        self.rows.extend(rows)
        self._rows_text += _csv_text(COLUMNS, [dataclasses.asdict(row) for row in rows], header=False)
        write_atomic(self.path / RESULTS_CSV, self._rows_text)

    def add_scenarios(self, rows: Sequence[ScenarioRow], samples: Sequence[ScenarioSampleSet] = ()) -> None:
        """Record finished scenario rows, their samples first."""
        if samples:
            records = [{"scenario": b.scenario, "variant": b.variant, "repetition": b.repetition, "order": b.order,
                        "rounds": len(b.blocked_us), "blocked_us": " ".join(repr(float(x)) for x in b.blocked_us),
                        "ready_us": " ".join(repr(float(x)) for x in b.ready_us),
                        "busy_us": " ".join(repr(float(x)) for x in b.busy_us)} for b in samples]
            self._scenario_samples_text += _csv_text(SCENARIO_SAMPLE_COLUMNS, records, header=False)
            write_atomic(self.path / SCENARIO_SAMPLES_CSV, self._scenario_samples_text)
        self.scenario_rows.extend(rows)
        self._scenarios_text += _csv_text(SCENARIO_COLUMNS, [dataclasses.asdict(r) for r in rows], header=False)
        write_atomic(self.path / SCENARIOS_CSV, self._scenarios_text)

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
        "repetition": s.repetition,
        "order": s.order,
        "rounds": len(s.samples_us),
        "samples_us": " ".join(repr(float(x)) for x in s.samples_us),
    }


def write_ratios(path: Path, ratios: list[RatioRow]) -> Path:
    """Write ratios.csv into the run folder `path` and return its path."""
    out = path / RATIOS_CSV
    write_atomic(out, _csv_text(RATIO_COLUMNS, [dataclasses.asdict(r) for r in ratios]))
    return out
