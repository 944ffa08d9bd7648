"""A run folder's report kept for the next `kvpages report` on it (no numpy, no pandas): a report on a folder that
did not change writes what the last one made without importing the analysis side or loading its analysis (the
reference run's report: 0.95 -> 0.2 s on the dev box, most of it pandas' import and the analyses' unpickling).

The entry (kvpages.schema.store) is every file the report writes, as (name, text), under a key of the run's inputs,
its GPU answer's inputs and the charts the folder holds (the report links them): any change is another key. `kvpages
report` keeps what it made; so does a sweep with --kv-analyze (kvpages.plugin), once its meta.json is final, so that the
first report after `make bench` writes what the sweep wrote."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from kvpages.schema.beside import gpu_run_beside
from kvpages.schema.store import kept_at, key, read_entry, write_atomic, write_entry

SUFFIX = ".report"
REPORT_MD = "REPORT.md"
Files = tuple[tuple[str, str], ...]
"""Every file a report writes, as (name, text), REPORT.md last."""


def charts_in(run: Path) -> tuple[str, ...]:
    """The charts a run folder holds, which its report links."""
    return tuple(sorted(p.name for p in run.glob("*.png")))


def write_files(run: Path, files: Files) -> Path:
    """Write each of `files` into the run folder (each atomically); return the report's path."""
    for name, text in files:
        write_atomic(run / name, text)
    return run / REPORT_MD


def _name(run: Path, answer: Path | None) -> str | None:
    """The entry's name: the keys of the run and its GPU answer, and the charts in the folder (None: a run not kept)."""
    mine, theirs = key(run), "" if answer is None else key(answer)
    if mine is None or theirs is None:
        return None
    return hashlib.sha256("\0".join((mine, theirs, *charts_in(run))).encode()).hexdigest()


@dataclass(frozen=True)
class KeptReport:
    """Where the report on a run folder with one GPU answer is kept."""

    entry: Path

    @classmethod
    def of(cls, run: Path, gpu: Path | None) -> KeptReport | None:
        """The entry of the report on the run folder `run` (as given) with the GPU answer `gpu`, else the one a report
        finds beside it (kvpages.schema.beside; a CUDA run's report has none); None where none is kept: the cache
        off, `run` not a folder, or a run with no key (kvpages.schema.store.key)."""
        entry = kept_at(lambda: _name(run, gpu or gpu_run_beside(run)), SUFFIX) if run.is_dir() else None
        return None if entry is None else cls(entry)

    def files(self) -> Files | None:
        """The files kept; None for none (or an entry cut off or altered)."""
        payload = read_entry(self.entry)
        return None if payload is None else tuple((name, text) for name, text in json.loads(payload))

    def keep(self, files: Files) -> None:
        write_entry(self.entry, json.dumps(files).encode())
