"""A run folder's analysis kept between commands (no torch): `kvpages plot` then `kvpages report` (or summary, cite,
noise, fleet, calibrate, and a CPU run's GPU answer, which `kvpages plot` makes ahead of the report: `made_ahead`)
on one folder load and analyse it once; `kvpages compare` reads the run from there (`kept_run`).

An entry (kvpages.schema.store) is the pickled `Analysis` under the key of the run folder (`key`: everything that
analysis depends on, so that any change is another key, never a stale analysis), its SHA-256 checked before it is
read. What a command computes once per run on top of the analysis (its memo, `Run.cached`: the report's findings,
recommendations and files, pair estimates) is kept with it again when it grew (`Loaded.remember`): each memo key names
what its value depends on beyond the run (a finding's GPU answer by that run's own key; the report's files the charts in
the folder too)."""

from __future__ import annotations

import dataclasses
import functools
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvpages.analysis.ratios import Analysis, analyze
from kvpages.schema.reader import Run, load_run
from kvpages.schema.store import kept_at, key, read_entry, write_entry

SUFFIX = ".analysis"


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
        write_entry(self.found.entry, payload)


def _entry(path: Path) -> Path | None:
    """Where `path`'s analysis is kept; None where it is not (the cache off, or too much to hash)."""
    return kept_at(lambda: key(path), SUFFIX)


def _read(path: Path) -> tuple[Path | None, bytes | None]:
    """Where `path`'s analysis is kept (None: not kept) and the pickle found there (None: none, or one damaged)."""
    entry = _entry(path)
    return entry, None if entry is None else read_entry(entry)


def pickled(path: Path, analyse: Callable[[], Analysis] | None = None) -> Pickled:
    """`path`'s analysis pickled: the entry kept under its key, else `analyse()`'s (by default `path` loaded and
    analysed now), to be kept."""
    entry, found = _read(path)
    if found is not None:
        return Pickled(found, lambda: None, entry)
    return _made(path, entry, analyse)


def _made(path: Path, entry: Path | None, analyse: Callable[[], Analysis] | None = None) -> Pickled:
    """`analyse()`'s analysis (by default `path` loaded and analysed now), pickled, to be kept in `entry` (None: not
    kept); what keeps it pickles too (`made_ahead`: made in one process, kept in another)."""
    made = analyze(load_run(path)) if analyse is None else analyse()
    payload = pickle.dumps(made, protocol=pickle.HIGHEST_PROTOCOL)
    return Pickled(payload, functools.partial(_keep_in, entry, payload), entry)


def _keep_in(entry: Path | None, payload: bytes) -> None:
    if entry is not None:
        write_entry(entry, payload)


def kept_run(path: Path) -> Run:
    """`path`'s run as its kept analysis holds it, where one is kept (no CSV parsed again); else loaded now, and nothing
    analysed or kept (`kvpages compare` reads the runs, not their analyses)."""
    found = _read(path)[1]
    return load_run(path) if found is None else loads(found).run


def made_ahead(path: Path) -> Pickled | None:
    """`path`'s analysis made for a command yet to come, and what keeps it; None where one would not be kept, or is
    kept already."""
    entry = _entry(path)
    return None if entry is None or entry.is_file() else _made(path, entry)


def keep(analysis: Analysis) -> None:
    """Keep `analysis` as its run's (a sweep's own, its folder finished), pickled only where it is kept."""
    entry = _entry(analysis.run.path)
    if entry is not None:
        write_entry(entry, pickle.dumps(analysis, protocol=pickle.HIGHEST_PROTOCOL))


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
