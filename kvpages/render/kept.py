"""What `kvpages report` and `kvpages plot` made on a run folder, kept for the next command on it (no numpy, no pandas,
no matplotlib): a report on a folder that did not change writes what the last one made without importing the analysis
side or loading its analysis (the reference run's report: 0.95 -> 0.2 s on the dev box, most of it pandas' import and
the analyses' unpickling); a plot on a folder whose charts are still the ones it drew writes nothing.

A report's entry (kvpages.schema.store) is every file the report writes, as (name, text), under a key of the run's
inputs, its GPU answer's inputs and the charts the folder holds (the report links them): any change is another key.
A plot's entry (`KeptCharts`) is the charts it drew, each with the SHA-256 of its bytes, under a key of the run's inputs
(this package's code in it), the formats, matplotlib's version and every matplotlibrc it could read (its order:
matplotlib.matplotlib_fname): the next plot writes nothing where each chart still holds those bytes, and draws every
chart again where one is missing or changed. `kvpages report` and `kvpages plot` keep what they made; so does a sweep
with --kv-analyze (kvpages.plugin), once its meta.json is final, so that the first report and plot after `make bench`
write what the sweep wrote."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from kvpages.schema.beside import gpu_run_beside
from kvpages.schema.store import installed, kept_at, key, read_entry, write_atomic, write_entry

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


CHARTS_SUFFIX = ".charts"


def _rc_files() -> tuple[Path, ...]:
    """Every matplotlibrc a drawing could read, its own default aside (its version is in the key): the folder's, then
    $MATPLOTLIBRC's, then the configuration folder's ($MPLCONFIGDIR, else ~/.config/matplotlib or ~/.matplotlib)."""
    env = os.environ
    found = [Path("matplotlibrc")]
    if given := env.get("MATPLOTLIBRC"):
        found += [Path(given), Path(given) / "matplotlibrc"]
    if config := env.get("MPLCONFIGDIR"):
        found.append(Path(config) / "matplotlibrc")
    else:
        try:
            home = Path.home()
        except RuntimeError:  # no home folder: matplotlib reads none there either
            home = None
        if xdg := env.get("XDG_CONFIG_HOME") or (home and home / ".config"):
            found.append(Path(xdg) / "matplotlib" / "matplotlibrc")
        if home:
            found.append(home / ".matplotlib" / "matplotlibrc")
    return tuple(p for p in found if p.is_file())


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _charts_name(run: Path, formats: tuple[str, ...]) -> str | None:
    """The entry's name: the run's key, the formats, matplotlib's version and the matplotlibrc files (None: not kept)."""
    mine = key(run)
    if mine is None:
        return None
    parts = [mine, *formats, installed("matplotlib")]
    for rc in _rc_files():
        parts += [str(rc.resolve()), _digest(rc) or ""]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


@dataclass(frozen=True)
class KeptCharts:
    """Where the charts `kvpages plot` draws of a run folder in some formats are kept."""

    entry: Path

    @classmethod
    def of(cls, run: Path, formats: tuple[str, ...]) -> KeptCharts | None:
        """The entry of the run folder `run` (as given) drawn in `formats`; None where none is kept: the cache off,
        `run` not a folder, or a run with no key (kvpages.schema.store.key)."""
        entry = kept_at(lambda: _charts_name(run, formats), CHARTS_SUFFIX) if run.is_dir() else None
        return None if entry is None else cls(entry)

    def charts(self) -> list[Path] | None:
        """The charts kept, as the plot that drew them named them, where every one still holds the bytes it was
        written with; None otherwise (none kept, one missing or changed, an entry cut off or altered)."""
        payload = read_entry(self.entry)
        if payload is None:
            return None
        drawn = [(Path(name), digest) for name, digest in json.loads(payload)]
        return [path for path, _ in drawn] if all(_digest(path) == digest for path, digest in drawn) else None

    def keep(self, charts: list[Path]) -> None:
        """Keep `charts`, as just drawn (each with the digest of its bytes now); none for no charts."""
        drawn = [(str(path), _digest(path)) for path in charts]
        if drawn and all(digest is not None for _, digest in drawn):
            write_entry(self.entry, json.dumps(drawn).encode())
