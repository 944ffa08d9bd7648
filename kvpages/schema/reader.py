"""Reads a run folder back, refusing one that was edited, mixed up or is not a run with a one-line `RunError` (no torch)."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from kvpages.core.checks import UserError
from kvpages.core.names import BASELINE
from kvpages.schema.decimals import read_cell, read_series
from kvpages.schema.meta import Environment, ProcessInfo, RankInfo, RanksMeta, Remeasurement, RunMeta, RunTiming
from kvpages.schema.profiles import profile_from_record
from kvpages.schema.rows import (
    KEY_COLUMNS,
    META_JSON,
    OK,
    POINTS,
    RANKS,
    RESULTS_CSV,
    SAMPLES_CSV,
    SCENARIOS,
    SCHEMA_VERSION,
    TIMED,
    RankSampleSet,
    Table,
    later_columns,
    parse_cell,
    typed_columns,
)

T = TypeVar("T")
ScenarioSamples = dict[tuple, dict[str, list[np.ndarray]]]
MEDIAN_RTOL = 1e-9  # load_run refuses a folder where a timed row's median and its samples' differ by more (relative)


class RunError(UserError):
    """A run folder or file that cannot be read; the message names the file and what is wrong."""


class SamplesWithheld(LookupError):
    """A run's raw samples were read from a copy that leaves them out (`Run.without_samples`)."""


class _Withheld(dict):
    """Stands for a run's raw samples in a copy that leaves them out: any read of them raises SamplesWithheld."""

    def _refuse(self, *_args: object) -> Any:
        raise SamplesWithheld("this copy of the run leaves its raw samples out (Run.without_samples)")

    __getitem__ = get = __contains__ = __iter__ = __len__ = keys = values = items = _refuse

    def __reduce__(self) -> tuple:
        return _Withheld, ()


@dataclass(frozen=True, eq=False)
class Run:
    """A loaded run: its rows, its raw samples by row key, and its meta (None for a bare CSV)."""

    path: Path
    rows: pd.DataFrame
    samples: dict[tuple, list[np.ndarray]]  # per row key, its blocks' per-round times, in repetition order
    meta: RunMeta | None
    scenarios: pd.DataFrame | None = None
    scenario_samples: ScenarioSamples | None = None  # per (scenario, variant): {'blocked': blocks, 'ready': blocks}
    processes: dict[tuple, tuple[int, ...]] | None = None  # per row or (scenario, variant) key: each block's process
    ranks: pd.DataFrame | None = None
    rank_samples: dict[tuple, list[RankSampleSet]] | None = None  # per (scenario, variant, role, rank; -1: the step's)
    repetition_ids: dict[tuple, tuple[int, ...]] | None = None  # per row or (scenario, variant) key: each block's repetition
    _cache: dict[tuple, Any] = field(default_factory=dict, repr=False)

    @property
    def run_id(self) -> str:
        return self.meta.run_id if self.meta else self.path.name

    @property
    def device_name(self) -> str:
        names = self.rows["device_name"].dropna().unique()
        return ", ".join(str(n) for n in names) if len(names) else "unknown device"

    @property
    def link_crossed(self) -> bool:
        """Some row, a point's or a whole request's or step's, crossed the device-host link."""
        frames = [self.rows] + ([] if self.scenarios is None else [self.scenarios])
        return self.cached(("link crossed",),
                           lambda: any(bool(f["link"].fillna("").str.startswith("pcie").any()) for f in frames))

    def ok_rows(self) -> pd.DataFrame:
        return self.rows[self.rows["status"] == OK]

    def timed_rows(self) -> pd.DataFrame:
        """The rows with timings: ok, and partial (an interrupted run's cases cut short)."""
        return self.rows[self.rows["status"].isin(TIMED)]

    def block_processes(self, key: tuple, count: int) -> np.ndarray:
        found = (self.processes or {}).get(key)
        return np.array(found if found is not None and len(found) == count else (0,) * count)

    def block_repetitions(self, key: tuple, count: int) -> np.ndarray | None:
        """Each block's repetition id (samples.csv `repetition`), or None without them (a bare CSV)."""
        found = (self.repetition_ids or {}).get(key)
        return np.array(found) if found is not None and len(found) == count else None

    def cached(self, key: tuple, compute: Callable[[], T]) -> T:
        """`compute()`, once per `key` for this run (its memo, kept with its analysis: kvpages.analysis.cache): the
        key must name everything the value depends on beyond this run."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def without_samples(self) -> Run:
        """This run, its memo shared, without its points' and scenarios' raw samples (most of its pickle: 24 of the
        reference run's 28 MB): what `kvpages plot` hands its drawing process, whose charts read the intervals the
        analysis made, not the samples; a read of them raises SamplesWithheld."""
        return dataclasses.replace(self, samples=_Withheld(),
                                   scenario_samples=None if self.scenario_samples is None else _Withheld())

    def meta_read_again(self) -> Run:
        """This run, its memo shared, with its meta.json read again: what a load of the folder gives after a session
        added its analysis's seconds to it (`--kv-analyze`), the rest unchanged."""
        return dataclasses.replace(self, meta=_read_meta(self.path / META_JSON))

    @property
    def memo_size(self) -> int:
        """How many values `cached` holds."""
        return len(self._cache)

    @property
    def baseline(self) -> str:
        return self.meta.baseline if self.meta else BASELINE

    @property
    def process_count(self) -> int:
        return max(1, len(self.meta.processes)) if self.meta else 1


def row_key(row: pd.Series | dict) -> tuple:
    return tuple(int(row[c]) if c in ("seq_len", "page_size") else str(row[c]) for c in KEY_COLUMNS)


def sample_file(folder: Path, name: str) -> Path:
    """Where a run keeps one of its per-round files (SAMPLE_FILES): `name`, or `name`.gz once the run has finished."""
    plain = folder / name
    packed = folder / f"{name}.gz"
    return packed if packed.is_file() and not plain.is_file() else plain


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise RunError(f"{path}: no such file")
    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise RunError(f"{path}: not a complete gzip file ({exc})") from None
    if not data.strip():
        raise RunError(f"{path}: empty file")
    if b"\0" in data[:4096]:
        raise RunError(f"{path}: binary file, expected kvpages text (CSV or JSON)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise RunError(f"{path}: not UTF-8 text, expected kvpages text (CSV or JSON)") from None


def _read_csv(path: Path, required: tuple[str, ...]) -> pd.DataFrame:
    text = _read_text(path)
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise RunError(f"{path}: not a parseable CSV ({str(exc).splitlines()[0]})") from None
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise RunError(f"{path}: missing required columns: {', '.join(missing)}")
    return frame


def _read_typed(path: Path, table: Table) -> pd.DataFrame:
    """A rows CSV with exactly the table's columns (one added later with its default), its integer and float columns
    parsed; empty cells missing."""
    later = later_columns(table.row_type)
    frame = _read_csv(path, tuple(c for c in table.columns if c not in later))
    frame = frame.assign(**{c: text for c, text in later.items() if c not in frame.columns})[list(table.columns)].copy()
    column = ""
    try:
        for column in typed_columns(table.row_type, "int"):
            frame[column] = pd.to_numeric(frame[column].replace("", None)).astype("Int64")
        for column in typed_columns(table.row_type, "float"):
            frame[column] = pd.to_numeric(frame[column].replace("", None)).astype("float64")
    except (ValueError, TypeError) as exc:
        raise RunError(f"{path}: column {column!r} holds a non-number ({exc})") from None
    return frame


def _read_meta(path: Path) -> RunMeta:
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise RunError(f"{path}: expected a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RunError(f"{path}: schema version {version!r}; this kvpages reads schema version {SCHEMA_VERSION} only "
                       "(rerun the sweep to compare it)")
    try:
        env = Environment(**data.pop("environment"))
        processes = [ProcessInfo(**p) for p in data.pop("processes", [])]
        timing = data.pop("timing", None)
        group = data.pop("ranks", None)
        remeasure = data.pop("remeasure", None)
        ranks = None if group is None else RanksMeta(**{**group, "ranks": tuple(RankInfo(**r) for r in group["ranks"])})
        profiles = [profile_from_record(p) for p in data.pop("link_profiles", [])]
        return RunMeta(environment=env, processes=processes, ranks=ranks, link_profiles=profiles,
                       timing=RunTiming.from_json(timing) if timing else None,
                       remeasure=None if remeasure is None else Remeasurement.from_json(remeasure), **data)
    except (TypeError, KeyError, ValueError) as exc:
        raise RunError(f"{path}: fields do not match schema version {version} ({exc})") from None


def load_run(path: str | Path) -> Run:
    """Load a run folder, or a results CSV (its folder's meta.json and samples.csv are used when present)."""
    path = Path(path)
    if not path.exists():
        raise RunError(f"{path}: no such file or folder")
    if path.is_dir():
        folder, csv_path = path, path / RESULTS_CSV
        if not csv_path.exists():
            raise RunError(f"{path}: no {RESULTS_CSV} here; not a kvpages run folder")
        meta: RunMeta | None = _read_meta(folder / META_JSON)
    elif path.suffix != ".csv":
        raise RunError(f"{path}: not a CSV; give a run folder or its {RESULTS_CSV}")
    else:
        folder, csv_path = path.parent, path
        meta = _read_meta(folder / META_JSON) if (folder / META_JSON).exists() else None
    rows = _read_typed(csv_path, POINTS)
    samples_path = sample_file(folder, SAMPLES_CSV)
    lines = _read_lines(samples_path, POINTS)
    blocks = lines.blocks(lambda line: tuple(line[c] for c in KEY_COLUMNS))
    samples = lines.series_of(blocks, "samples_us")
    if samples or meta is not None:  # a sweep's folder (meta.json) has every timed row's samples; a bare CSV may not
        _check_medians(rows, samples, row_key, "median_us", csv_path, samples_path)
    scenarios, steps, step_blocks = _read_steps(folder, SCENARIOS, lambda r: (r["scenario"], r["variant"]))
    blocked, ready = (steps.series_of(step_blocks, f"{latency}_us") for latency in ("blocked", "ready"))
    scenario_samples = None if scenarios is None else {  # an empty ready cell: ready when blocked (ScenarioSampleSet)
        key: {"blocked": blocked[key], "ready": [r if r.size else b for r, b in zip(ready[key], blocked[key], strict=True)]}
        for key in step_blocks}
    processes = {**lines.ids(blocks, "process"), **steps.ids(step_blocks, "process")}
    repetitions = {**lines.ids(blocks, "repetition"), **steps.ids(step_blocks, "repetition")}
    ranks, rank_lines, rank_blocks = _read_steps(folder, RANKS, lambda r: (r["scenario"], r["variant"], r["role"],
                                                                         -1 if pd.isna(r["rank"]) else int(r["rank"])))
    return Run(folder, rows, samples, meta, scenarios, scenario_samples, processes, ranks,
               None if ranks is None else rank_lines.records(rank_blocks), repetitions)


@dataclass(frozen=True)
class _Lines:
    """A samples file read column by column (`table.sample_type`'s fields): each field's values, each series (a
    space-separated cell) as a float64 array, line by line in file order; no lines without the file."""

    table: Table
    values: dict[str, list[Any]] = field(default_factory=dict)
    series: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def line(self, i: int) -> dict[str, Any]:
        return {name: column[i] for name, column in self.values.items()}

    def blocks(self, key_of: Callable[[dict[str, Any]], tuple]) -> dict[tuple, list[int]]:
        """The lines of each key (`key_of` a line's values), in repetition order."""
        found: dict[tuple, list[int]] = {}
        for i in range(len(self.values.get("repetition", ()))):
            found.setdefault(key_of(self.line(i)), []).append(i)
        repetition = self.values.get("repetition", [])
        return {key: sorted(lines, key=repetition.__getitem__) for key, lines in found.items()}

    def series_of(self, blocks: dict[tuple, list[int]], name: str) -> dict[tuple, list[np.ndarray]]:
        return {key: [self.series[name][i] for i in lines] for key, lines in blocks.items()}

    def ids(self, blocks: dict[tuple, list[int]], name: str) -> dict[tuple, tuple[int, ...]]:
        """Each key's blocks' `name` (process or repetition), in repetition order."""
        return {key: tuple(self.values[name][i] for i in lines) for key, lines in blocks.items()}

    def records(self, blocks: dict[tuple, list[int]]) -> dict[tuple, list[Any]]:
        """Each key's blocks as `table.sample_type` records (their series tuples of floats)."""
        return {key: [self.table.samples_from({**self.line(i), **{name: column[i].tolist()
                                                                   for name, column in self.series.items()}})
                      for i in lines] for key, lines in blocks.items()}


def _read_lines(path: Path, table: Table) -> _Lines:
    """A samples file's lines (`_Lines`); a cell that is not a number is a RunError naming the first such line."""
    if not path.exists():
        return _Lines(table)
    frame = _read_csv(path, table.sample_columns)
    lines = _Lines(table)
    bad = []
    for f in fields(table.sample_type):
        kind, cells = str(f.type), frame[f.name].tolist()
        if kind.startswith("tuple"):
            try:
                lines.series[f.name] = read_series(cells)
            except ValueError:
                bad.append(_first_bad(read_cell, cells))
        else:
            try:
                lines.values[f.name] = [parse_cell(kind, cell) for cell in cells]
            except ValueError:
                bad.append(_first_bad(functools.partial(parse_cell, kind), cells))
    if bad:
        raise RunError(f"{path}: line {min(bad) + 2}: a repetition, process, rank or sample is not a number")
    return lines


def _first_bad(parse: Callable[[str], object], cells: list[str]) -> int:
    for i, cell in enumerate(cells):
        try:
            parse(cell)
        except ValueError:
            return i
    raise AssertionError("no cell fails to parse")  # called where one did


def _read_steps(folder: Path, table: Table, key_of: Callable[[dict], tuple]
                ) -> tuple[pd.DataFrame | None, _Lines, dict[tuple, list[int]]]:
    """scenarios.csv or ranks.csv, its samples' lines and each key's (`key_of` a row or line) lines, checked as
    results.csv is; (None, no lines, {}) for a run without it."""
    path = folder / table.rows_csv
    if not path.exists():
        return None, _Lines(table), {}
    frame = _read_typed(path, table)
    samples_path = sample_file(folder, table.samples_csv)
    lines = _read_lines(samples_path, table)
    blocks = lines.blocks(key_of)
    _check_medians(frame, lines.series_of(blocks, "blocked_us"), key_of, "blocked_median_us", path, samples_path)
    return frame, lines, blocks


def _check_medians(rows: pd.DataFrame, samples: dict[tuple, list[np.ndarray]], key_of: Callable[[dict], tuple],
                   column: str, path: Path, samples_path: Path) -> None:
    """Refuse a table whose timed rows' medians are not those of their samples (a hand edit, a mix-up), or whose
    samples file is missing (a folder copied without it: every interval is made from them)."""
    timed = rows[rows["status"].isin(TIMED)].to_dict("records")
    if timed and not samples_path.is_file():
        raise RunError(f"{path}: its {len(timed)} timed row(s) need their samples, and neither {samples_path.name} "
                       f"nor {samples_path.name}.gz is beside it; every interval is made from them")
    for row in timed:
        key = key_of(row)
        blocks = samples.get(key)
        if blocks is None:
            raise RunError(f"{path}: row {' '.join(map(str, key))} has no samples in {samples_path.name}")
        median = float(np.median(np.concatenate(blocks)))
        if not math.isclose(median, float(row[column]), rel_tol=MEDIAN_RTOL, abs_tol=1e-12):
            raise RunError(f"{path}: row {' '.join(map(str, key))} says {column} {row[column]!r}, but its samples in "
                           f"{samples_path.name} give {median!r}; the folder was edited or mixed up")
