"""Writes a run folder (kvpages.schema.rows): every file is rewritten to a temporary file and renamed
over the old one after each finished point or scenario, so an interrupted run keeps every finished
row, parseable. No torch import.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from kvpages.schema.meta import RunMeta
from kvpages.schema.rows import (
    META_JSON,
    POINTS,
    RATIO_COLUMNS,
    RATIOS_CSV,
    RESULTS_CSV,
    SCENARIOS,
    RankRow,
    RatioRow,
    Row,
    Samples,
    ScenarioRow,
    Table,
    sample_record,
)


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
    """Owns one run folder; `add` rewrites a table's CSVs atomically after each finished point or scenario.

    The CSV text of earlier rows is kept, so each row costs one serialisation and one write.
    """

    def __init__(self, path: Path, meta: RunMeta) -> None:
        self.path = path
        self.meta = meta
        self.rows: dict[Table, list[Row | ScenarioRow | RankRow]] = {POINTS: [], SCENARIOS: []}
        self.cases = 0
        self._text: dict[tuple[Table, str], str] = {}
        write_atomic(self.path / RESULTS_CSV, self._table_text(POINTS, "rows"))  # a run without points has no rows
        self.write_meta()

    @property
    def recorded(self) -> int:
        """Cases recorded so far, points and scenarios (a multi-rank step records several rows per case)."""
        return self.cases

    def add(self, table: Table, rows: Sequence[Row | ScenarioRow | RankRow], samples: Sequence[Samples] = (),
            cases: int | None = None) -> None:
        """Record finished rows, of `cases` cases (default: one a row); their samples are written first, so every
        row on disk has them."""
        if samples:
            self._append(table, "samples", table.samples_csv, [sample_record(s) for s in samples])
        self.rows.setdefault(table, []).extend(rows)
        self.cases += len(rows) if cases is None else cases
        self._append(table, "rows", table.rows_csv, [dataclasses.asdict(r) for r in rows])

    def _table_text(self, table: Table, kind: str) -> str:
        if (table, kind) not in self._text:
            self._text[table, kind] = _csv_text(table.columns if kind == "rows" else table.sample_columns, [])
        return self._text[table, kind]

    def _append(self, table: Table, kind: str, name: str, records: list[dict]) -> None:
        columns = table.columns if kind == "rows" else table.sample_columns
        self._text[table, kind] = self._table_text(table, kind) + _csv_text(columns, records, header=False)
        write_atomic(self.path / name, self._text[table, kind])

    def finish(self, completed: bool, end_note: str, timing: dict[str, float]) -> None:
        self.meta.finished_utc = utc_now()
        self.meta.completed = completed
        self.meta.end_note = end_note
        self.meta.timing = timing
        self.write_meta()

    def write_meta(self) -> None:
        """(Re)write meta.json from `meta`, atomically."""
        write_atomic(self.path / META_JSON, json.dumps(dataclasses.asdict(self.meta), indent=2) + "\n")


def write_table(path: Path, name: str, columns: tuple[str, ...], rows: Sequence[object]) -> Path:
    """Write `rows` (dataclasses, or dicts with `columns`) as the CSV `name` in the run folder `path`; return its path."""
    out = path / name
    records = [r if isinstance(r, dict) else dataclasses.asdict(r) for r in rows]  # type: ignore[call-overload]
    write_atomic(out, _csv_text(columns, records))
    return out


def write_ratios(path: Path, ratios: list[RatioRow]) -> Path:
    """Write ratios.csv into the run folder `path` and return its path."""
    return write_table(path, RATIOS_CSV, RATIO_COLUMNS, ratios)
