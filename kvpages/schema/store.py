"""How kvpages writes files and keeps what a command made for the next one (no numpy, no pandas: `kvpages report` on
a folder that did not change reads its kept report without importing either, kvpages.render.kept).

`write_atomic`: a file written beside its path, then renamed over it. An entry: bytes kept in $KVPAGES_CACHE (default
$XDG_CACHE_HOME/kvpages, else ~/.cache/kvpages) under a `key` of everything it depends on, with the SHA-256 of its
bytes, checked before they are read; the newest KEEP entries of each kind (file suffix) stay, and KVPAGES_CACHE=off
keeps none. A folder that cannot be written keeps none either (the commands work as without). The key of a run folder
(`key`) covers the bytes of every file of this kvpages package (its code and built-in profiles), the versions of
Python, numpy and pandas, the run's path as given, and the bytes of every file in the run's folder but what `plot`
and `report` write there (OUTPUTS): any change to any of them is another key, never a stale entry."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import platform
import sys
from collections.abc import Callable
from fnmatch import fnmatch
from functools import cache
from pathlib import Path

from kvpages.schema.rows import RESULTS_CSV

VARIABLE = "KVPAGES_CACHE"
KEEP = 8
OUTPUTS = ("*.png", "*.svg", "REPORT.md", "APPENDIX.md", "ratios.csv", "scenario_ratios.csv", "noisy.csv",
           "recommendations.csv", "contention.csv")
"""What the charts and the report write into a run folder: none of it is read by the analysis."""
MAX_INPUT_BYTES = 1 << 29  # a folder with more to hash than this is analysed afresh each time
LIBRARIES = ("numpy", "pandas")
"""What an analysis computes with besides this package and Python: their installed versions are in every key."""


def write_atomic(path: Path, text: str) -> None:
    """Write `text` beside `path`, then rename it over `path`: a reader, or a run interrupted at any point, sees the
    old file or the new one (no fsync: this guards against crashes, not power loss)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def folder() -> Path | None:
    """Where entries are kept; None when KVPAGES_CACHE is 'off'."""
    given = os.environ.get(VARIABLE)
    if given == "off":
        return None
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvpages"


def installed(name: str) -> str:
    """`name`'s installed version, as its distribution's metadata folder beside it is named (`numpy-2.4.6.dist-info`),
    without importing it (importing importlib.metadata alone takes 0.09 s on the dev box); importlib.metadata's answer
    where there is no such folder (a conda or egg install); 'missing' where it is not installed."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return "missing"
    site = Path(spec.origin).parent.parent
    found = sorted(p.name.removesuffix(".dist-info") for p in site.glob(f"{name}-*.dist-info"))
    if len(found) == 1:
        return found[0].removeprefix(f"{name}-")
    from importlib.metadata import version

    return version(name)


@cache
def _code() -> bytes:
    """What the analysis of given files depends on besides them: this package's files and the interpreter's and
    libraries' versions."""
    versions = " ".join(installed(name) for name in LIBRARIES)
    digest = hashlib.sha256(f"{sys.version} {platform.machine()} {versions}".encode())
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


def kept_at(name: Callable[[], str | None], suffix: str) -> Path | None:
    """Where the entry named `name()` of this kind is kept; None where none is: the cache off (`name` is not called:
    a key hashes a run's files), or no name."""
    where = folder()
    found = None if where is None else name()
    return None if where is None or found is None else where / f"{found}{suffix}"


def read_entry(kept: Path) -> bytes | None:
    """The bytes kept in `kept`, whole (their SHA-256 checked); None for none."""
    try:
        data = kept.read_bytes()
        os.utime(kept)  # the newest entries are kept
    except OSError:  # no entry, or a cache folder that cannot be read: made afresh
        return None
    digest, payload = data[:32], data[32:]
    return payload if hashlib.sha256(payload).digest() == digest else None  # else cut off or altered: made again


def write_entry(kept: Path, payload: bytes) -> None:
    """Keep `payload` in `kept` (written beside it, then renamed over it) and the KEEP newest entries of its kind."""
    tmp = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, kept)
        newest = sorted(kept.parent.glob(f"*{kept.suffix}"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in newest[KEEP:]:
            old.unlink(missing_ok=True)
    except BaseException as exc:  # OSError: a folder that cannot be written (or an entry another command removed
        # meanwhile), not kept; anything else (Ctrl-C) raised. Either way the partial file goes, where there is one.
        with contextlib.suppress(OSError):
            tmp.unlink()
        if not isinstance(exc, OSError):
            raise
