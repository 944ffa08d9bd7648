"""The run-folder schema: its files, their record types and columns (no torch); results/README.md documents each column."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from kvpages.core.names import BASELINE
from kvpages.core.payloads import DEFAULT_PAYLOADS

T = TypeVar("T")

SCHEMA_VERSION = 5  # the only version read (5 added `host_syncs`): an older run folder is refused, naming its version
RESULTS_CSV = "results.csv"
SAMPLES_CSV = "samples.csv"
META_JSON = "meta.json"
RATIOS_CSV = "ratios.csv"
SCENARIOS_CSV = "scenarios.csv"
SCENARIO_SAMPLES_CSV = "scenario_samples.csv"
SCENARIO_RATIOS_CSV = "scenario_ratios.csv"
RANKS_CSV = "ranks.csv"
RANK_SAMPLES_CSV = "rank_samples.csv"
NOISY_CSV = "noisy.csv"

OK = "ok"
PARTIAL = "partial"
STATUSES = (OK, PARTIAL, "skipped", "mismatch", "out_of_memory")
"""ok: checked, metered and timed in every planned repetition; partial: the run was interrupted after some of its
repetitions (`repetitions` says how many); skipped: cannot run on this device (see note); mismatch: wrong output or
D2H bytes (see note); out_of_memory: the point did not fit."""
TIMED = (OK, PARTIAL)  # the statuses of a row with timings (and samples)

KEY_COLUMNS = ("variant", "dtype", "layout", "seq_len", "page_size")  # a row's identity within a run
SCENARIO_KEY = ("scenario", "variant")  # a scenarios.csv row's
TIMING = {"timing": True}  # field metadata of the timing columns: empty on a row that was not timed
LATER = {"later": True}  # field metadata of a column added within schema 5: a run written before it reads its default


def columns(record_type: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(record_type))


def later_columns(row_type: type) -> dict[str, str]:
    """The columns a run written before they existed lacks, each with the text its default reads from ('' for None)."""
    return {f.name: "" if f.default is None else str(f.default) for f in fields(row_type) if f.metadata.get("later")}


def timing_columns(row_type: type) -> tuple[str, ...]:
    """The timing columns of a row type, from its fields: what a row that was not timed leaves empty."""
    return tuple(f.name for f in fields(row_type) if f.metadata.get("timing"))


def typed_columns(row_type: type, kind: str) -> tuple[str, ...]:
    """The columns of a row type whose values are `kind` ('int' or 'float', missing or not), from its annotations."""
    return tuple(f.name for f in fields(row_type) if str(f.type).partition(" |")[0] == kind)


def parse_cell(annotation: str, text: str) -> Any:
    """A CSV cell read back by its field's annotation: '' is None where the field may be; a tuple is space-separated."""
    kind = annotation.partition(" |")[0]
    if kind == "str":
        return text
    if text == "" and annotation.endswith("| None"):
        return None
    if kind == "tuple[float, ...]":
        return tuple(map(float, text.split()))
    return int(text) if kind == "int" else float(text)


def read_rows(path: Path, row_type: type[T]) -> tuple[T, ...]:
    """The rows of a kvpages CSV written from dataclass `row_type` (its fields, in order, are the columns); () when
    there is no such file. A malformed one is a ValueError naming it."""
    if not path.is_file():
        return ()
    names = columns(row_type)
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != names:
                raise ValueError(f"columns {reader.fieldnames}, expected {list(names)}")
            kinds = {f.name: str(f.type) for f in fields(row_type)}  # type: ignore[arg-type]  # a dataclass type
            return tuple(row_type(**{k: parse_cell(kinds[k], line[k]) for k in names}) for line in reader)
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read it ({exc})") from None


class _Status:
    status: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown row status {self.status!r}; valid: {', '.join(STATUSES)}")


@dataclass(frozen=True)
class Table:
    rows_csv: str
    samples_csv: str
    row_type: type
    sample_type: type[SampleSet] | type[ScenarioSampleSet] | type[RankSampleSet]

    @property
    def columns(self) -> tuple[str, ...]:
        return columns(self.row_type)

    @property
    def sample_columns(self) -> tuple[str, ...]:
        """The samples type's fields, with `rounds` (the length of each series) before the first series."""
        names = columns(self.sample_type)
        first = next(i for i, f in enumerate(fields(self.sample_type)) if str(f.type).startswith("tuple"))
        return names[:first] + ("rounds",) + names[first:]

    def samples_from(self, fields_: dict[str, object]) -> Samples:
        return self.sample_type(**{k: tuple(v) if isinstance(v, list) else v  # type: ignore[arg-type]
                                   for k, v in fields_.items()})


@dataclass(frozen=True)
class SampleSet:
    """The per-round times of one block: a row's `repetition`, the run's `order`-th, timed in meta.json's `process`."""

    variant: str
    dtype: str
    layout: str
    seq_len: int
    page_size: int
    repetition: int
    order: int
    process: int
    samples_us: tuple[float, ...]


@dataclass(frozen=True)
class Row(_Status):
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
    host_syncs: int | None
    link: str
    median_us: float | None = field(metadata=TIMING)
    iqr_us: float | None = field(metadata=TIMING)
    q1_us: float | None = field(metadata=TIMING)
    q3_us: float | None = field(metadata=TIMING)
    min_us: float | None = field(metadata=TIMING)
    max_us: float | None = field(metadata=TIMING)
    mean_us: float | None = field(metadata=TIMING)
    stddev_us: float | None = field(metadata=TIMING)
    rounds: int | None = field(metadata=TIMING)
    iterations: int | None = field(metadata=TIMING)
    repetitions: int | None = field(metadata=TIMING)
    rep_spread: float | None = field(metadata=TIMING)
    status: str = field(default="ok")
    note: str = ""
    repro: str = ""


POINTS = Table(RESULTS_CSV, SAMPLES_CSV, Row, SampleSet)


@dataclass(frozen=True)
class StepBlock:
    """A timed block of a (scenario, step variant), numbered as SampleSet's."""

    scenario: str
    variant: str
    repetition: int
    order: int
    process: int


@dataclass(frozen=True)
class ScenarioSampleSet(StepBlock):
    """One timed block of a (scenario, step variant): per round, blocked and ready microseconds."""

    blocked_us: tuple[float, ...]
    ready_us: tuple[float, ...]  # written empty where it equals blocked_us (every blocking variant; a CPU run)
    busy_us: tuple[float, ...] = ()  # per round, the device busy time queued before it (busy-queue scenarios on CUDA)

    def __post_init__(self) -> None:
        if not self.ready_us:  # an empty cell: ready when the thread got control back
            object.__setattr__(self, "ready_us", self.blocked_us)


@dataclass(frozen=True)
class ScenarioRow(_Status):
    """One (scenario, step variant): a whole request (all its calls) or a whole scheduler step, measured as one; per
    request or step, bytes, transfers and host syncs, and µs: `blocked` until the calling (scheduler) thread got
    control back, `ready` until the page indices were usable on the host (later only with a transfer thread)."""

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
    host_syncs: int | None
    link: str
    blocked_median_us: float | None = field(metadata=TIMING)
    blocked_q1_us: float | None = field(metadata=TIMING)
    blocked_q3_us: float | None = field(metadata=TIMING)
    ready_median_us: float | None = field(metadata=TIMING)
    ready_q1_us: float | None = field(metadata=TIMING)
    ready_q3_us: float | None = field(metadata=TIMING)
    rounds: int | None = field(metadata=TIMING)
    repetitions: int | None = field(metadata=TIMING)
    status: str = field(default="ok")
    note: str = ""
    repro: str = ""
    busy_measured_us: float | None = field(default=None, metadata=TIMING)
    """The device busy time each timed round actually had (CUDA events around the queued kernel), median."""
    payloads: str = field(default=DEFAULT_PAYLOADS, metadata=LATER)
    """The payloads each send carried (kvpages.core.payloads.PAYLOAD_PRESETS)."""
    swa_window: int = field(default=0, metadata=LATER)
    """The SWA payload's window in tokens; 0: no SWA payload."""
    device_ops: int | None = field(default=None, metadata=LATER)
    """The device ops the meter counted in the request or step (kvpages.measure.meter)."""
    id: str = ""  # filled in: `scenario_row_id`

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "id", scenario_row_id(self.scenario, self.variant))


SCENARIOS = Table(SCENARIOS_CSV, SCENARIO_SAMPLES_CSV, ScenarioRow, ScenarioSampleSet)


@dataclass(frozen=True)
class RankSampleSet(StepBlock):
    """One timed block of a (scenario, step variant) of a multi-rank run, as one role (and rank) saw it."""

    role: str
    rank: int | None
    blocked_us: tuple[float, ...]
    ready_us: tuple[float, ...]
    skew_us: tuple[float, ...] = ()  # per round (step lines): the last rank's start minus the first's


@dataclass(frozen=True)
class RankRow(_Status):
    """A (scenario, step variant) of a multi-rank run as one rank, or the whole step, saw it, at once or alone (`role`:
    rank, alone, step or alone_max, kvpages.schema.ranks; `rank` empty for the step's); latencies as ScenarioRow's,
    per step; the step's bytes summed over the ranks; `skew_median_us`: RankSampleSet's, empty when the ranks span
    hosts (no common clock)."""

    scenario: str
    variant: str
    role: str
    rank: int | None
    world_size: int
    device: str
    page_size: int
    requests: int
    tokens: int
    d2h_bytes: int | None
    d2h_transfers: int | None
    host_syncs: int | None
    blocked_median_us: float | None = field(metadata=TIMING)
    blocked_q1_us: float | None = field(metadata=TIMING)
    blocked_q3_us: float | None = field(metadata=TIMING)
    ready_median_us: float | None = field(metadata=TIMING)
    ready_q1_us: float | None = field(metadata=TIMING)
    ready_q3_us: float | None = field(metadata=TIMING)
    skew_median_us: float | None = field(metadata=TIMING)
    rounds: int | None = field(metadata=TIMING)
    repetitions: int | None = field(metadata=TIMING)
    status: str = "ok"
    note: str = ""
    repro: str = ""


RANKS = Table(RANKS_CSV, RANK_SAMPLES_CSV, RankRow, RankSampleSet)
SAMPLE_FILES = tuple(t.samples_csv for t in (POINTS, SCENARIOS, RANKS))
"""A run's per-round files: appended as plain CSV while the run is written, gzip-compressed (`<name>.gz`) once it has
finished (kvpages.schema.writer.compress_samples); the reader takes either."""
TABLES = {table.rows_csv: table for table in (POINTS, SCENARIOS, RANKS)}


Samples = SampleSet | ScenarioSampleSet | RankSampleSet  # a point's, a scenario's or one multi-rank step role's


@dataclass(frozen=True)
class RatioRow:
    """`variant` against `baseline` at one point of an analysed run (ratios.csv; results/README.md has each column)."""

    id: str
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
    min_effect: float
    q_value: float
    repro: str
    processes: int = 1  # behind the centre: the run's, less `left_out`
    interval_unit: str = "repetition"
    stability: str = "stable"  # stable | fragile | disturbed (kvpages.analysis.pairs)
    left_out: str = ""  # the processes left out of the centre, each with its level over the others' ('3 (1.52x)')


@dataclass(frozen=True)
class ScenarioRatioRow:
    """A step variant against the baseline step variant on one scenario and latency (scenario_ratios.csv); `id` is the
    variant's scenarios.csv row id, the other fields mean what RatioRow's do."""

    id: str
    scenario: str
    variant: str
    baseline: str
    latency: str  # blocked | ready
    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    repetitions: int
    verdict: str
    min_effect: float
    q_value: float
    repro: str
    processes: int = 1
    interval_unit: str = "repetition"
    stability: str = "stable"
    left_out: str = ""


RATIO_COLUMNS = columns(RatioRow)
SCENARIO_RATIO_COLUMNS = columns(ScenarioRatioRow)


def _id_part(name: str) -> str:
    """A name as it goes into an id: shell-safe (per_request[v] -> per_request-v)."""
    return name.replace("[", "-").replace("]", "")


def ratio_id(variant: str, baseline: str, dtype: str, layout: str, seq_len: int, page_size: int) -> str:
    """A ratios.csv row's id, the same in every run: r-<variant>-s<seq_len>-p<page_size>-<dtype>-<layout>, with
    -vs-<baseline> when the baseline is not host_stride."""
    vs = "" if baseline == BASELINE else f"-vs-{_id_part(baseline)}"
    return f"r-{_id_part(variant)}-s{seq_len}-p{page_size}-{dtype}-{layout}{vs}"


def scenario_row_id(scenario: str, variant: str) -> str:
    """A scenarios.csv row's stable id: <scenario>:<variant> (brackets made shell-safe)."""
    return f"{scenario}:{_id_part(variant)}"


def timed_us(s: Samples) -> tuple[float, ...]:
    """A block's per-round times that its verdicts rest on: a point's samples, a request's or step's blocked time."""
    return s.samples_us if isinstance(s, SampleSet) else s.blocked_us


def sample_record(s: Samples) -> dict[str, object]:
    """A samples.csv (or scenario_samples.csv) line: the key fields, `rounds`, and each series space-separated."""
    record: dict[str, object] = {}
    for f in fields(s):
        value = getattr(s, f.name)
        record[f.name] = " ".join(repr(float(x)) for x in value) if isinstance(value, tuple) else value
    if isinstance(s, ScenarioSampleSet) and s.ready_us == s.blocked_us:
        record["ready_us"] = ""  # read back as blocked_us: a blocking variant's, and every CPU run's, would repeat it
    record["rounds"] = len(timed_us(s))
    return record
