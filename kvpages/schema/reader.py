"""Reads a run folder back (kvpages.schema.rows), validating it: what every analysis starts from (no torch).

`load_run(path)` returns a `Run`: results.csv and scenarios.csv as typed frames, their raw
samples by row, and meta.json. A folder that was edited, mixed up or is not a run is refused
with a `RunError` naming the file and what is wrong.
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

from kvpages.schema.meta import Environment, ProcessInfo, RankInfo, RanksMeta, RunMeta, RunTiming
from kvpages.schema.rows import (
    COLUMNS,
    FLOAT_COLUMNS,
    INT_COLUMNS,
    KEY_COLUMNS,
    META_JSON,
    OK,
    RANK_COLUMNS,
    RANK_FLOAT_COLUMNS,
    RANK_INT_COLUMNS,
    RANK_SAMPLE_COLUMNS,
    RANK_SAMPLES_CSV,
    RANKS_CSV,
    RESULTS_CSV,
    SAMPLE_COLUMNS,
    SAMPLES_CSV,
    SCENARIO_COLUMNS,
    SCENARIO_FLOAT_COLUMNS,
    SCENARIO_INT_COLUMNS,
    SCENARIO_SAMPLE_COLUMNS,
    SCENARIO_SAMPLES_CSV,
    SCENARIOS_CSV,
    SCHEMA_VERSION,
    TIMED,
    RankSampleSet,
    scenario_row_id,
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
    """Per row key, the per-round times of each repetition (block), in repetition order."""
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


def _read_typed(path: Path, columns: tuple[str, ...], ints: tuple[str, ...], floats: tuple[str, ...]) -> pd.DataFrame:
    """A rows CSV with exactly `columns`, typed."""
    frame = _read_csv(path, columns)
    return _typed(frame[list(columns)].copy(), ints, floats, path)


def _typed(frame: pd.DataFrame, ints: tuple[str, ...], floats: tuple[str, ...], path: Path) -> pd.DataFrame:
    """`frame` (all strings) with its integer and float columns parsed; empty cells become missing."""
    column = ""
    try:
        for column in ints:
            frame[column] = pd.to_numeric(frame[column].replace("", None)).astype("Int64")
        for column in floats:
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
        processes = [_process(p) for p in data.pop("processes", [])]
        timing = data.pop("timing", None)
        group = data.pop("ranks", None)
        ranks = None if group is None else RanksMeta(**{**group, "ranks": tuple(RankInfo(**r) for r in group["ranks"])})
        return RunMeta(environment=env, processes=processes, ranks=ranks,
                       timing=RunTiming.from_json(timing) if timing else None, **data)
    except (TypeError, KeyError) as exc:
        raise RunError(f"{path}: fields do not match schema version {version} ({exc})") from None


def _process(data: dict) -> ProcessInfo:
    """A process of meta.json; one from before its phases were recorded named its inputs' phase `generate_s`."""
    renamed = {"generate_s": "inputs_s"}
    return ProcessInfo(**{renamed.get(k, k): v for k, v in data.items()})


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
    rows = _read_typed(csv_path, COLUMNS, INT_COLUMNS, FLOAT_COLUMNS)
    samples_path = folder / SAMPLES_CSV
    samples, processes = _read_samples(samples_path) if samples_path.exists() else ({}, {})
    _check_medians(rows, samples, csv_path)
    scenarios, scenario_samples, scenario_processes = _read_scenarios(folder)
    ranks, rank_samples = _read_ranks(folder)
    return Run(folder, rows, samples, meta, scenarios, scenario_samples, {**processes, **scenario_processes}, ranks,
               rank_samples)


def _read_ranks(folder: Path) -> tuple[pd.DataFrame | None, dict[tuple, list[RankSampleSet]] | None]:
    """ranks.csv and rank_samples.csv of a multi-rank run; (None, None) for any other run."""
    path = folder / RANKS_CSV
    if not path.exists():
        return None, None
    frame = _read_typed(path, RANK_COLUMNS, RANK_INT_COLUMNS, RANK_FLOAT_COLUMNS)
    found: dict[tuple, list[RankSampleSet]] = {}
    samples_path = folder / RANK_SAMPLES_CSV
    if samples_path.exists():
        try:
            for r in _read_csv(samples_path, RANK_SAMPLE_COLUMNS).to_dict("records"):
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
    for row in frame[frame["status"].isin(TIMED)].to_dict("records"):
        key = (row["scenario"], row["variant"], row["role"], -1 if pd.isna(row["rank"]) else int(row["rank"]))
        if key not in found:
            raise RunError(f"{path}: row {' '.join(map(str, key[:3]))} has no samples in {RANK_SAMPLES_CSV}")
    return frame, found


ScenarioSamples = dict[tuple, dict[str, list[np.ndarray]]]


def _read_scenarios(folder: Path) -> tuple[pd.DataFrame | None, ScenarioSamples | None, dict[tuple, tuple[int, ...]]]:
    path = folder / SCENARIOS_CSV
    if not path.exists():
        return None, None, {}
    frame = _read_typed(path, SCENARIO_COLUMNS, SCENARIO_INT_COLUMNS,
                        SCENARIO_FLOAT_COLUMNS)
    # ids follow from the key: the same in a run written before they were a column
    frame["id"] = [scenario_row_id(s, v) for s, v in zip(frame["scenario"], frame["variant"], strict=True)]
    samples: dict[tuple, dict[str, list[np.ndarray]]] = {}
    processes: dict[tuple, tuple[int, ...]] = {}
    samples_path = folder / SCENARIO_SAMPLES_CSV
    if samples_path.exists():
        required = SCENARIO_SAMPLE_COLUMNS
        by_latency: dict[str, dict[tuple, list[tuple[int, int, np.ndarray]]]] = {"blocked": {}, "ready": {}}
        records = _read_csv(samples_path, required).to_dict("records")
        try:
            blocked_us = _numbers([r["blocked_us"] for r in records])
            differ = [i for i, r in enumerate(records) if r["ready_us"] != r["blocked_us"]]  # none on a CPU run
            ready_us = dict(zip(differ, _numbers([records[i]["ready_us"] for i in differ]), strict=True))
            parsed = {"blocked": blocked_us, "ready": [ready_us.get(i, b) for i, b in enumerate(blocked_us)]}
            for i, r in enumerate(records):
                key = (r["scenario"], r["variant"])
                for what, found in by_latency.items():
                    found.setdefault(key, []).append((int(r["repetition"]), int(r["process"]),
                                                       parsed[what][i]))
        except ValueError:
            raise RunError(f"{samples_path}: a repetition, process or sample is not a number") from None
        blocked, processes = _in_repetition_order(by_latency["blocked"])
        ready, _ = _in_repetition_order(by_latency["ready"])
        samples = {key: {"blocked": blocked[key], "ready": ready[key]} for key in blocked}
    for _, row in frame[frame["status"].isin(TIMED)].iterrows():
        entry = samples.get((row["scenario"], row["variant"]))
        if entry is None:
            raise RunError(f"{path}: row {row['scenario']} {row['variant']} has no samples in {SCENARIO_SAMPLES_CSV}")
        median = float(np.median(np.concatenate(entry["blocked"])))
        if not math.isclose(median, float(row["blocked_median_us"]), rel_tol=MEDIAN_RTOL, abs_tol=1e-12):
            raise RunError(f"{path}: row {row['scenario']} {row['variant']} says blocked_median_us "
                           f"{row['blocked_median_us']!r}, but its samples give {median!r}; the folder was edited or mixed up")
    return frame, samples, processes


def _read_samples(path: Path) -> tuple[dict[tuple, list[np.ndarray]], dict[tuple, tuple[int, ...]]]:
    """samples.csv by row key, in repetition order, and each block's process."""
    records = _read_csv(path, SAMPLE_COLUMNS).to_dict("records")
    by_key: dict[tuple, list[tuple[int, int, np.ndarray]]] = {}
    for i, record in enumerate(records):
        try:
            values = np.array(record["samples_us"].split(), dtype=np.float64)
            repetition, process = int(record["repetition"]), int(record["process"])
        except ValueError:
            raise RunError(f"{path}: line {i + 2}: samples_us, repetition or process holds a non-number") from None
        by_key.setdefault(row_key(record), []).append((repetition, process, values))
    return _in_repetition_order(by_key)


def _numbers(texts: list[str]) -> list[np.ndarray]:
    """Each space-separated text as float64 values (ValueError where one holds something else)."""
    return [np.array(t.split(), dtype=np.float64) for t in texts]


def _in_repetition_order(by_key: dict[tuple, list[tuple[int, int, np.ndarray]]]
                         ) -> tuple[dict[tuple, list[np.ndarray]], dict[tuple, tuple[int, ...]]]:
    ordered = {key: sorted(blocks, key=lambda b: b[0]) for key, blocks in by_key.items()}
    return ({key: [v for _, _, v in blocks] for key, blocks in ordered.items()},
            {key: tuple(p for _, p, _ in blocks) for key, blocks in ordered.items()})


def _check_medians(rows: pd.DataFrame, samples: dict[tuple, list[np.ndarray]], path: Path) -> None:
    """Refuse a results.csv whose ok rows' medians are not those of their samples (a hand edit, a mix-up)."""
    if not samples:
        return
    for _, row in rows[rows["status"].isin(TIMED)].iterrows():
        key = row_key(row)
        blocks = samples.get(key)
        if blocks is None:
            raise RunError(f"{path}: row {' '.join(map(str, key))} has no samples in {SAMPLES_CSV}")
        median = float(np.median(np.concatenate(blocks)))
        if not math.isclose(median, float(row["median_us"]), rel_tol=MEDIAN_RTOL, abs_tol=1e-12):
            raise RunError(f"{path}: row {' '.join(map(str, key))} says median_us {row['median_us']!r}, but its "
                           f"samples in {SAMPLES_CSV} give {median!r}; the folder was edited or mixed up")
