"""Writes a run folder (kvpages.schema.rows): each finished block's samples and row are appended in one write, and
meta.json is replaced atomically, so an interrupted run keeps every finished block and row, parseable (no torch)."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import os
import re
import shutil
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvpages.schema.meta import RunMeta, RunTiming
from kvpages.schema.rows import (
    META_JSON,
    POINTS,
    RESULTS_CSV,
    SAMPLE_FILES,
    RankRow,
    Row,
    Samples,
    ScenarioRow,
    Table,
    sample_record,
)
from kvpages.schema.store import write_atomic


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def create_run_dir(results_dir: Path, device_label: str) -> Path:
    """Make a new, empty `results_dir/<UTC time>-<device>` folder; never reuses an existing one."""
    results_dir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", device_label.lower()).strip("-")
    stem = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{slug}"
    for attempt in range(1, 1000):
        path = results_dir / (stem if attempt == 1 else f"{stem}-{attempt}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{results_dir}: too many runs named {stem}-*")


def _csv_text(columns: tuple[str, ...], records: list[dict[str, object]], header: bool = True) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    if header:
        writer.writeheader()
    for record in records:
        writer.writerow({k: ("" if v is None else v) for k, v in record.items()})
    return buffer.getvalue()


class RunWriter:
    """Owns one run folder: its tables grow by appending each finished block's samples and each finished row, one
    write each (rewriting a 4 MB samples.csv after each of a run's 1,500 blocks would write gigabytes)."""

    def __init__(self, path: Path, meta: RunMeta) -> None:
        self.path = path
        self.meta = meta
        self._gzipping: dict[str, Gzipping] = {}  # each per-round file's gzip stream, as it grows
        self._append(RESULTS_CSV, POINTS.columns, [])  # a run without points has no rows
        self.write_meta()

    def add_samples(self, table: Table, samples: Sequence[Samples], compress: bool = True) -> bytes:
        """Append `samples`; return what was appended, compressed now or, with `compress=False`, by `compress` later
        (in the order appended)."""
        data = self._append(table.samples_csv, table.sample_columns, [sample_record(s) for s in samples])
        if compress:
            self.compress(table, data)
        return data

    def compress(self, table: Table, data: bytes) -> None:
        """Feed what `add_samples` appended to the file's gzip stream (`Gzipping`)."""
        self._gzipping.setdefault(table.samples_csv, Gzipping()).add(data)

    def add_rows(self, table: Table, rows: Sequence[Row | ScenarioRow | RankRow]) -> None:
        self._append(table.rows_csv, table.columns, [dataclasses.asdict(r) for r in rows])

    def replace_rows(self, table: Table, rows: Sequence[Row | ScenarioRow | RankRow], key_columns: tuple[str, ...]) -> None:
        """Put `rows` in place of the rows of the same key (re-measured cases), atomically: the file is the old one
        or the new one, never torn, and every other row stays where it was."""
        records = [dataclasses.asdict(r) for r in rows]
        new = {tuple(str(r[c]) for c in key_columns): r for r in records}
        with open(self.path / table.rows_csv, newline="") as f:
            old = list(csv.DictReader(f))
        kept = [new.pop(tuple(r[c] for c in key_columns), r) for r in old]
        write_atomic(self.path / table.rows_csv, _csv_text(table.columns, kept + list(new.values())))

    def _append(self, name: str, columns: tuple[str, ...], records: list[dict]) -> bytes:
        """One write system call, appending: an interruption leaves the file as it was before or after, never torn.
        Returns what it wrote."""
        fd = os.open(self.path / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            data = _csv_text(columns, records, header=os.fstat(fd).st_size == 0).encode()
            os.write(fd, data)
        finally:
            os.close(fd)
        return data

    def finish(self, completed: bool, end_note: str, timing: RunTiming) -> None:
        self.meta.finished_utc = utc_now()
        self.meta.completed = completed
        self.meta.end_note = end_note
        self.meta.timing = timing
        compress_samples(self.path, self._gzipping)
        self.write_meta()

    def write_meta(self) -> None:
        write_atomic(self.path / META_JSON, json.dumps(dataclasses.asdict(self.meta), indent=2) + "\n")


GZIP_WBITS = 31  # zlib's gzip framing
COMPRESS_LEVEL = 4
"""gzip's level for the per-round files. A make bench run's 18.6 MB of them on the 2-core dev box (2026-12-05): level 6
0.95 s of the session's end for 4.46 MB, level 5 0.44 s for 4.62 MB, level 4 0.24 s for 4.90 MB, level 1 0.15 s for 5.64
MB. Level 4 takes a quarter of level 6's time for a folder 10% larger; below it, the files grow faster than the time
falls."""


@dataclass
class Gzipping:
    """A per-round file's gzip stream (COMPRESS_LEVEL), compressed as its blocks are appended and kept in memory (a
    quarter of the file) until the run ends: the session compresses a worker's blocks as it writes them, during the
    worker's turn, instead of the whole file once the last process is done (0.24 s of the session's end in `make
    bench`'s sweep, 2026-12-05). One stream from first byte to last: the same deflate data as compressing the
    finished file (only the gzip header's OS byte differs). A run killed first leaves only its CSV, as before."""

    fed: int = 0  # the bytes compressed so far
    crc: int = 0  # their CRC-32
    chunks: list[bytes] = field(default_factory=list)
    _stream: Any = field(default_factory=lambda: zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, GZIP_WBITS))

    def add(self, data: bytes) -> None:
        out = self._stream.compress(data)
        if out:
            self.chunks.append(out)
        self.fed += len(data)
        self.crc = zlib.crc32(data, self.crc)

    def end(self, plain: Path, out: Path) -> bool:
        """Into `out` if the stream holds `plain` as it is (its size and CRC-32); else False: compress the file."""
        if plain.stat().st_size != self.fed or zlib.crc32(plain.read_bytes()) != self.crc:
            return False
        with open(out, "wb") as f:
            f.writelines([*self.chunks, self._stream.flush()])
        return True


def compress_samples(folder: Path, gzipping: Mapping[str, Gzipping] | None = None) -> None:
    """Each per-round file of a finished run, gzip-compressed in place (x.csv -> x.csv.gz, the same bytes inside): they
    are most of a run's bytes (a make bench run's 18.6 of 19 MB) and shrink about 4x, so results/ holds a CPU and a
    GPU reference. From its stream compressed as it grew (`gzipping`), or from the file. Atomic per file: the .gz
    appears whole (renamed into place), then the CSV goes; a reader takes either."""
    for name in SAMPLE_FILES:
        plain = folder / name
        if not plain.is_file():
            continue
        tmp = folder / f".{name}.gz.tmp"
        stream = (gzipping or {}).get(name)
        if stream is None or not stream.end(plain, tmp):
            with open(plain, "rb") as src, open(tmp, "wb") as raw, \
                    gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=COMPRESS_LEVEL, mtime=0) as out:
                shutil.copyfileobj(src, out)
        os.replace(tmp, folder / f"{name}.gz")
        plain.unlink()


def table_text(columns: tuple[str, ...], rows: Sequence[object]) -> str:
    """`rows` (dataclasses, or dicts with `columns`) as CSV text, as `write_table` writes them."""
    records = [r if isinstance(r, dict) else dataclasses.asdict(r) for r in rows]  # type: ignore[call-overload]
    return _csv_text(columns, records)


def write_table(path: Path, name: str, columns: tuple[str, ...], rows: Sequence[object]) -> Path:
    """Write `rows` (dataclasses, or dicts with `columns`) as the CSV `name` in the run folder `path`; return its path."""
    out = path / name
    write_atomic(out, table_text(columns, rows))
    return out

