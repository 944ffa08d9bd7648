"""A run folder's analysis kept between commands (no torch): `kvpages plot` then `kvpages report` (or summary, cite,
noise, fleet, calibrate, and a CPU run's GPU answer) on one folder load and analyse it once.

An entry is the pickled `Analysis` under a key of everything that analysis depends on: the bytes of every file of
this kvpages package (its code and built-in profiles), the versions of Python, numpy and pandas, the run's path as
given, and the bytes of every file in the run's folder but what `plot` and `report` write there (OUTPUTS): any change
to any of them is another key, never a stale analysis. Each entry carries the SHA-256 of its pickle, checked before it
is read. What a command computes once per run on top of the analysis (its memo, `Run.cached`: the report's findings,
recommendations and files, pair estimates) is kept with it again when it grew (`Loaded.remember`): each memo key names
what its value depends on beyond the run (a finding's GPU answer by that run's own key; the report's files the charts in
the folder too). Entries live in $KVPAGES_CACHE (default $XDG_CACHE_HOME/kvpages, else ~/.cache/kvpages), the newest
KEEP of them; KVPAGES_CACHE=off keeps none. A folder that cannot be written keeps none either (the commands work as
without)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pickle
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatch
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from kvpages.analysis.ratios import Analysis, analyze
from kvpages.schema.reader import load_run
from kvpages.schema.rows import RESULTS_CSV

VARIABLE = "KVPAGES_CACHE"
KEEP = 8
OUTPUTS = ("*.png", "*.svg", "REPORT.md", "APPENDIX.md", "ratios.csv", "scenario_ratios.csv", "noisy.csv", "recommendations.csv",
           "contention.csv")
"""What the charts and the report write into a run folder: none of it is read by the analysis."""
MAX_INPUT_BYTES = 1 << 29  # a folder with more to hash than this is analysed afresh each time
SUFFIX = ".analysis"


def folder() -> Path | None:
    """Where entries are kept; None when KVPAGES_CACHE is 'off'."""
    given = os.environ.get(VARIABLE)
    if given == "off":
        return None
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvpages"


@cache
def _code() -> bytes:
    """What the analysis of given files depends on besides them: this package's files and the interpreter's and
    libraries' versions."""
    digest = hashlib.sha256(f"{sys.version} {platform.machine()} {np.__version__} {pd.__version__}".encode())
    package = Path(__file__).resolve().parents[1]
    for path in sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(f"\0{path.relative_to(package)}\0".encode())
        digest.update(path.read_bytes())
    return digest.digest()


def key(path: Path) -> str | None:
    """The key of `path`'s analysis (a run folder or a results CSV, as given); None where it is not kept: no such
    folder or file (load_run says what is wrong), or more than MAX_INPUT_BYTES to hash."""
    if not (path.is_file() or (path / RESULTS_CSV).is_file()):
        return None
    where = path if path.is_dir() else path.parent
    inputs = sorted(p for p in where.iterdir() if p.is_file() and not p.name.startswith(".")
                    and not any(fnmatch(p.name, pattern) for pattern in OUTPUTS))
    if sum(p.stat().st_size for p in inputs) > MAX_INPUT_BYTES:
        return None
    digest = hashlib.sha256(_code() + f"\0{path}\0{path.is_dir()}".encode())
    for p in inputs:
        digest.update(f"\0{p.name}\0".encode())
        digest.update(p.read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class Pickled:
    """A run's analysis, pickled, and what keeps it under its key (nothing when it was read from there or is not kept):
    `kvpages plot` hands the pickle to its drawing process first and keeps it while that draws. `entry`: where it is
    kept (None: not kept, the cache off or too much to hash)."""

    payload: bytes
    keep: Callable[[], None]
    entry: Path | None = None


@dataclass(frozen=True)
class Loaded:
    """An analysis as a command loaded it (`found`, kept), and how many memo values its run held then."""

    analysis: Analysis
    found: Pickled
    memo_at_load: int

    @classmethod
    def kept(cls, found: Pickled) -> Loaded:
        """`found`'s analysis, `found` kept first."""
        found.keep()
        analysis = loads(found.payload)
        return cls(analysis, found, analysis.run.memo_size)

    @classmethod
    def of(cls, path: Path) -> Loaded:
        """`path`'s analysis (`pickled`: the one kept since the folder's last change, else made now), kept."""
        return cls.kept(pickled(path))

    @property
    def entry_name(self) -> str | None:
        """Its entry's name: the key of every input of the analysis; None where it is not kept."""
        return None if self.found.entry is None else self.found.entry.name

    def remember(self) -> None:
        """Keep the analysis again in its entry when its run's memo grew since it was loaded, so that the next command
        on the folder reads what this one computed (a report kept so: 0.70 -> 0.58 s)."""
        if self.found.entry is None or self.analysis.run.memo_size <= self.memo_at_load:
            return
        try:
            payload = pickle.dumps(self.analysis, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError):  # a memo value pickle cannot take: kept as read
            return
        _write(self.found.entry, payload)


def _entry(path: Path) -> Path | None:
    """Where `path`'s analysis is kept; None where it is not (the cache off, or too much to hash)."""
    where = folder()
    name = None if where is None else key(path)
    return None if where is None or name is None else where / f"{name}{SUFFIX}"


def pickled(path: Path, analyse: Callable[[], Analysis] | None = None) -> Pickled:
    """`path`'s analysis pickled: the entry kept under its key, else `analyse()`'s (by default `path` loaded and
    analysed now), to be kept."""
    entry = _entry(path)
    found = None if entry is None else _read(entry)
    if found is not None:
        return Pickled(found, lambda: None, entry)
    made = analyze(load_run(path)) if analyse is None else analyse()
    payload = pickle.dumps(made, protocol=pickle.HIGHEST_PROTOCOL)
    return Pickled(payload, lambda: None if entry is None else _write(entry, payload), entry)


def keep(analysis: Analysis) -> None:
    """Keep `analysis` as its run's (a sweep's own, its folder finished), pickled only where it is kept."""
    entry = _entry(analysis.run.path)
    if entry is not None:
        _write(entry, pickle.dumps(analysis, protocol=pickle.HIGHEST_PROTOCOL))


def light(analysis: Analysis) -> Analysis:
    """`analysis` without its run's raw samples (`Run.without_samples`): what a drawing process is handed."""
    return dataclasses.replace(analysis, run=analysis.run.without_samples())


def without_samples(payload: bytes) -> bytes:
    """`payload`'s analysis pickled again without its run's raw samples (`light`)."""
    return pickle.dumps(light(loads(payload)), protocol=pickle.HIGHEST_PROTOCOL)


def loads(payload: bytes) -> Analysis:
    """The analysis a `Pickled.payload` holds."""
    analysis = pickle.loads(payload)
    assert isinstance(analysis, Analysis)
    return analysis


def _read(entry: Path) -> bytes | None:
    """The pickle kept in `entry`, whole (its SHA-256 checked); None for none."""
    try:
        data = entry.read_bytes()
        os.utime(entry)  # the newest entries are kept
    except OSError:  # no entry, or a cache folder that cannot be read: analysed afresh
        return None
    digest, payload = data[:32], data[32:]
    return payload if hashlib.sha256(payload).digest() == digest else None  # else cut off or altered: analysed again


def _write(entry: Path, payload: bytes) -> None:
    """Keep `payload` in `entry` (written beside it, then renamed over it) and the KEEP newest entries."""
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, entry)
        kept = sorted(entry.parent.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in kept[KEEP:]:
            old.unlink(missing_ok=True)
    except OSError:  # a folder that cannot be written (or an entry another command removed meanwhile): not kept
        with contextlib.suppress(OSError):  # the partial file, where there is one
            tmp.unlink()
