"""Reads a run folder back (kvpages.schema.rows), validating it: what every analysis starts from (no torch).

A folder that was edited, mixed up or is not a run is refused with a `RunError` naming the file and what is wrong.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from kvpages.core.names import BASELINE
from kvpages.schema.meta import Environment, ProcessInfo, RankInfo, RanksMeta, RunMeta, RunTiming
from kvpages.schema.rows import (
    KEY_COLUMNS,
    META_JSON,
    OK,
    POINTS,
    RANK_SAMPLES_CSV,
    RANKS,
    RANKS_CSV,
    RESULTS_CSV,
    SAMPLES_CSV,
    SCENARIO_SAMPLES_CSV,
    SCENARIOS,
    SCENARIOS_CSV,
    SCHEMA_VERSION,
    TIMED,
    RankSampleSet,
    Table,
    typed_columns,
)

T = TypeVar("T")
MEDIAN_RTOL = 1e-9
"""load_run recomputes each ok row's median from its samples; beyond this relative difference it refuses the folder."""


class RunError(ValueError):
    """A run folder or file that cannot be read; the message names the file and what is wrong."""


@dataclass(frozen=True, eq=False)
class Run:
    """A loaded run: its rows, its raw samples by row key, and its meta (None for a bare CSV)."""

    path: Path
    rows: pd.DataFrame
    samples: dict[tuple, list[np.ndarray]]
    """Per row key, the per-round times of its block in each repetition, in repetition order."""
    meta: RunMeta | None
    scenarios: pd.DataFrame | None = None
    """scenarios.csv (whole requests and steps), or None for a run without them."""
    scenario_samples: dict[tuple, dict[str, list[np.ndarray]]] | None = None
    """Per (scenario, variant): {'blocked': blocks, 'ready': blocks}, in repetition order."""
    processes: dict[tuple, tuple[int, ...]] | None = None
    """Per row key, and per (scenario, variant): the process of each block, in the same order."""
    ranks: pd.DataFrame | None = None
    """ranks.csv of a multi-rank run (kvpages.schema.ranks), or None."""
    rank_samples: dict[tuple, list[RankSampleSet]] | None = None
    """Per (scenario, variant, role, rank): its blocks, in repetition order (rank -1 for the step's)."""
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
        return any(bool(f["link"].fillna("").str.startswith("pcie").any()) for f in frames)

    def ok_rows(self) -> pd.DataFrame:
        return self.rows[self.rows["status"] == OK]

    def timed_rows(self) -> pd.DataFrame:
        """The rows with timings: ok, and partial (an interrupted run's cases cut short)."""
        return self.rows[self.rows["status"].isin(TIMED)]

    def block_processes(self, key: tuple, count: int) -> np.ndarray:
        """The process of each of a key's `count` blocks (a row key, or a (scenario, variant))."""
        found = (self.processes or {}).get(key)
        return np.array(found if found is not None and len(found) == count else (0,) * count)

    def cached(self, key: tuple, compute: Callable[[], T]) -> T:
        """`compute()`, once per `key` for this run: what the analysis derives from its samples
        (kvpages.analysis.intervals)."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    @property
    def baseline(self) -> str:
        """The variant its ratios are against (meta.json; host_stride for a bare CSV)."""
        return self.meta.baseline if self.meta else BASELINE

    @property
    def process_count(self) -> int:
        """How many processes timed the run (1 for a bare results CSV)."""
        return max(1, len(self.meta.processes)) if self.meta else 1


def row_key(row: pd.Series | dict) -> tuple:
    return tuple(int(row[c]) if c in ("seq_len", "page_size") else str(row[c]) for c in KEY_COLUMNS)


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise RunError(f"{path}: no such file")
    data = path.read_bytes()
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
    """A rows CSV with exactly the table's columns, its integer and float columns parsed; empty cells missing."""
    frame = _read_csv(path, table.columns)[list(table.columns)].copy()
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
        ranks = None if group is None else RanksMeta(**{**group, "ranks": tuple(RankInfo(**r) for r in group["ranks"])})
        return RunMeta(environment=env, processes=processes, ranks=ranks,
                       timing=RunTiming.from_json(timing) if timing else None, **data)
    except (TypeError, KeyError) as exc:
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
    else:
        folder, csv_path = path.parent, path
        meta = _read_meta(folder / META_JSON) if (folder / META_JSON).exists() else None
    rows = _read_typed(csv_path, POINTS)
    samples_path = folder / SAMPLES_CSV
    blocks, processes = _read_blocks(samples_path, POINTS.sample_columns, row_key, ("samples_us",)) \
        if samples_path.exists() else ({}, {})
    samples = {key: [b[0] for b in found] for key, found in blocks.items()}
    if samples:
        _check_medians(rows, samples, row_key, "median_us", csv_path, SAMPLES_CSV)
    scenarios, scenario_samples, scenario_processes = _read_scenarios(folder)
    ranks, rank_samples = _read_ranks(folder)
    return Run(folder, rows, samples, meta, scenarios, scenario_samples, {**processes, **scenario_processes}, ranks,
               rank_samples)


def _read_ranks(folder: Path) -> tuple[pd.DataFrame | None, dict[tuple, list[RankSampleSet]] | None]:
    """ranks.csv and rank_samples.csv of a multi-rank run, checked as results.csv is; (None, None) for any other run."""
    path = folder / RANKS_CSV
    if not path.exists():
        return None, None
    frame = _read_typed(path, RANKS)
    found: dict[tuple, list[RankSampleSet]] = {}
    samples_path = folder / RANK_SAMPLES_CSV
    if samples_path.exists():
        try:
            for r in _read_csv(samples_path, RANKS.sample_columns).to_dict("records"):
                rank = int(r["rank"]) if r["rank"] != "" else None
                series = [tuple(float(v) for v in r[c].split()) for c in ("blocked_us", "ready_us", "skew_us")]
                block = RankSampleSet(r["scenario"], r["variant"], int(r["repetition"]), int(r["order"]),
                                      int(r["process"]), r["role"], rank, *series)
                found.setdefault((block.scenario, block.variant, block.role, -1 if rank is None else rank),
                                 []).append(block)
        except ValueError:
            raise RunError(f"{samples_path}: a repetition, process, rank or sample is not a number") from None
    for blocks in found.values():
        blocks.sort(key=lambda b: b.repetition)
    _check_medians(frame, {key: [np.asarray(b.blocked_us) for b in blocks] for key, blocks in found.items()},
                   lambda r: (r["scenario"], r["variant"], r["role"], -1 if pd.isna(r["rank"]) else int(r["rank"])),
                   "blocked_median_us", path, RANK_SAMPLES_CSV)
    return frame, found


ScenarioSamples = dict[tuple, dict[str, list[np.ndarray]]]


def _read_scenarios(folder: Path) -> tuple[pd.DataFrame | None, ScenarioSamples | None, dict[tuple, tuple[int, ...]]]:
    path = folder / SCENARIOS_CSV
    if not path.exists():
        return None, None, {}
    frame = _read_typed(path, SCENARIOS)
    samples_path = folder / SCENARIO_SAMPLES_CSV
    blocks, processes = _read_blocks(samples_path, SCENARIOS.sample_columns, lambda r: (r["scenario"], r["variant"]),
                                     ("blocked_us", "ready_us")) if samples_path.exists() else ({}, {})
    samples = {key: {"blocked": [b[0] for b in found], "ready": [b[1] for b in found]} for key, found in blocks.items()}
    _check_medians(frame, {key: found["blocked"] for key, found in samples.items()},
                   lambda r: (r["scenario"], r["variant"]), "blocked_median_us", path, SCENARIO_SAMPLES_CSV)
    return frame, samples, processes


def _read_blocks(path: Path, columns: tuple[str, ...], key_of: Callable[[dict], tuple], series: tuple[str, ...]
                 ) -> tuple[dict[tuple, list[tuple[np.ndarray, ...]]], dict[tuple, tuple[int, ...]]]:
    """A samples file by key: each block's `series` (space-separated microseconds), in repetition order, and each
    block's process."""
    by_key: dict[tuple, list[tuple[int, int, tuple[np.ndarray, ...]]]] = {}
    for i, record in enumerate(_read_csv(path, columns).to_dict("records")):
        try:
            values = tuple(np.array(record[c].split(), dtype=np.float64) for c in series)
            repetition, process = int(record["repetition"]), int(record["process"])
        except ValueError:
            raise RunError(f"{path}: line {i + 2}: {', '.join(series)}, repetition or process holds a non-number"
                           ) from None
        by_key.setdefault(key_of(record), []).append((repetition, process, values))
    ordered = {key: sorted(blocks, key=lambda b: b[0]) for key, blocks in by_key.items()}
    return ({key: [v for _, _, v in blocks] for key, blocks in ordered.items()},
            {key: tuple(p for _, p, _ in blocks) for key, blocks in ordered.items()})


def _check_medians(rows: pd.DataFrame, samples: dict[tuple, list[np.ndarray]], key_of: Callable[[dict], tuple],
                   column: str, path: Path, samples_csv: str) -> None:
    """Refuse a table whose timed rows' medians are not those of their samples (a hand edit, a mix-up)."""
    for row in rows[rows["status"].isin(TIMED)].to_dict("records"):
        key = key_of(row)
        blocks = samples.get(key)
        if blocks is None:
            raise RunError(f"{path}: row {' '.join(map(str, key))} has no samples in {samples_csv}")
        median = float(np.median(np.concatenate(blocks)))
        if not math.isclose(median, float(row[column]), rel_tol=MEDIAN_RTOL, abs_tol=1e-12):
            raise RunError(f"{path}: row {' '.join(map(str, key))} says {column} {row[column]!r}, but its samples in "
                           f"{samples_csv} give {median!r}; the folder was edited or mixed up")
