"""Link profiles as files: the TOML a profile is read from and written to (the built-in ones ship in profiles/ beside
this module; `kvpages calibrate` writes one), checked before any work. No torch.

A profile file:

    name = "pcie5_pageable"                  # a name of letters, digits and _ (it becomes a CSV column)
    label = "PCIe Gen5 x16, pageable"        # how the report and charts name it
    memory = "pageable"                      # pageable or pinned
    fitted_from = ["20261204T181656Z-..."]   # optional: the runs `kvpages calibrate` fitted it from

    [launch_us]                              # one table per term: launch_us, kernel_us, sync_us, copy_us, bandwidth_gb_s
    value = 5.0                              # > 0 (µs; bandwidth in GB/s = 1e9 B/s)
    source = "assumed: ..."                  # where the figure comes from
    low = 4.1                                # optional, both or neither: a fitted interval (low <= value <= high)
    high = 5.9
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

from kvpages.core.checks import UserError
from kvpages.core.links import MEMORIES, PREDICTION_PROFILES, TERM_KEYS, LinkProfile, Term
from kvpages.schema.rows import META_JSON
from kvpages.schema.store import write_atomic

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the backport, a dependency there (pyproject.toml, kvpages.preflight)
    import tomli as tomllib

BUILT_IN = Path(__file__).with_name("profiles")
NAME = re.compile(r"[a-z0-9_]+")
KEYS = ("name", "label", "memory", *TERM_KEYS)
OPTIONAL = ("fitted_from",)
TERM_FIELDS = ("value", "source", "low", "high")


class ProfileError(UserError):
    """A profile file that cannot be used: the message names the file and the key, in one line."""


def _number(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProfileError(f"{where}: {value!r} is not a finite number")
    return float(value)


def _term(path: Path, key: str, table: Any) -> Term:
    where = f"{path}: [{key}]"
    if not isinstance(table, dict):
        raise ProfileError(f"{path}: key {key!r} must be a table with value and source, got {table!r}")
    unknown = sorted(set(table) - set(TERM_FIELDS))
    if unknown:
        raise ProfileError(f"{where}: unknown key {unknown[0]!r}; valid: {', '.join(TERM_FIELDS)}")
    for needed in ("value", "source"):
        if needed not in table:
            raise ProfileError(f"{where}: missing key {needed!r}")
    value = _number(f"{where} value", table["value"])
    if value <= 0:
        raise ProfileError(f"{where} value: {value:g} must be > 0")
    if not isinstance(table["source"], str) or not table["source"].strip():
        raise ProfileError(f"{where} source: must say where the figure comes from (a non-empty string)")
    if ("low" in table) != ("high" in table):
        raise ProfileError(f"{where}: give both low and high (a fitted interval) or neither")
    low = high = None
    if "low" in table:
        low, high = _number(f"{where} low", table["low"]), _number(f"{where} high", table["high"])
        if not 0 < low <= value <= high:
            raise ProfileError(f"{where}: low {low:g} <= value {value:g} <= high {high:g} must hold, with low > 0")
    return Term(key, value, table["source"].strip(), low, high)


def parse_profile(path: Path, text: str) -> LinkProfile:
    """The profile in `text` (read from `path`), checked; ProfileError names the file and the key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML ({exc})") from None
    unknown = sorted(set(data) - set(KEYS) - set(OPTIONAL))
    if unknown:
        raise ProfileError(f"{path}: unknown key {unknown[0]!r}; valid: {', '.join(KEYS + OPTIONAL)}")
    runs = data.get("fitted_from", [])
    if not isinstance(runs, list) or not all(isinstance(r, str) and r for r in runs):
        raise ProfileError(f"{path}: key 'fitted_from' must be a list of run ids, got {runs!r}")
    missing = [k for k in KEYS if k not in data]
    if missing:
        raise ProfileError(f"{path}: missing key {missing[0]!r} (a profile has {', '.join(KEYS)})")
    for key in ("name", "label"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise ProfileError(f"{path}: key {key!r} must be a non-empty string, got {data[key]!r}")
    if not NAME.fullmatch(data["name"]):
        raise ProfileError(f"{path}: key 'name' {data['name']!r} must be lower-case letters, digits and _")
    if data["memory"] not in MEMORIES:
        raise ProfileError(f"{path}: key 'memory' {data['memory']!r}; valid: {', '.join(MEMORIES)}")
    terms = tuple(_term(path, key, data[key]) for key in TERM_KEYS)
    return LinkProfile(data["name"], data["label"].strip(), data["memory"], terms, fitted_from=tuple(runs))


def read_profile(path: str | Path, origin: str | None = None) -> LinkProfile:
    """A profile file, checked, with its path and SHA-256 recorded (`origin`: how to name the path instead)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the profile ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProfileError(f"{path}: not UTF-8 text, expected a TOML link profile") from None
    return dataclasses.replace(parse_profile(path, text), origin=origin or str(path),
                               sha256=hashlib.sha256(data).hexdigest())


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a TOML basic string (the same escapes)


def profile_text(profile: LinkProfile, header: str = "") -> str:
    """The profile as a TOML file that `read_profile` reads back to the same terms (`header`: comment lines)."""
    lines = [f"# {line}" for line in header.splitlines()]
    lines += [f"name = {_string(profile.name)}", f"label = {_string(profile.label)}", f"memory = {_string(profile.memory)}"]
    if profile.fitted_from:
        lines.append(f"fitted_from = [{', '.join(_string(r) for r in profile.fitted_from)}]")
    for t in profile.terms:
        lines += ["", f"[{t.key}]", f"value = {float(t.value)!r}", f"source = {_string(t.source)}"]
        if t.low is not None and t.high is not None:
            lines += [f"low = {float(t.low)!r}", f"high = {float(t.high)!r}"]
    return "\n".join(lines) + "\n"


@cache
def built_in_profiles() -> tuple[LinkProfile, ...]:
    """The profiles that ship with kvpages (profiles/*.toml), by name; the prediction profiles first."""
    found = {p.name: p for p in (read_profile(f, origin="built-in") for f in sorted(BUILT_IN.glob("*.toml")))}
    missing = [n for n in PREDICTION_PROFILES if n not in found]
    if missing:
        raise ProfileError(f"{BUILT_IN}: no built-in profile {missing[0]!r} (a broken installation)")
    order = list(PREDICTION_PROFILES) + sorted(set(found) - set(PREDICTION_PROFILES))
    return tuple(found[n] for n in order)


def profile_from_record(record: dict[str, Any]) -> LinkProfile:
    """A profile as meta.json records it (dataclasses.asdict of a LinkProfile)."""
    return LinkProfile(**{**record, "terms": tuple(Term(**t) for t in record["terms"]),
                          "fitted_from": tuple(record.get("fitted_from", ()))})


def record_profiles(folder: Path, profiles: tuple[LinkProfile, ...]) -> None:
    """Add `profiles` to the run's meta.json `link_profiles` (one of the same name is replaced), so that the folder's
    report and charts price them again when re-made without the files."""
    path = folder / META_JSON
    if not path.is_file():
        raise ProfileError(f"{folder}: no {META_JSON}, so a link profile cannot be recorded with the run; pass a run folder")
    data = json.loads(path.read_text())
    names = {p.name for p in profiles}
    kept = [p for p in data.get("link_profiles", []) if p.get("name") not in names]
    data["link_profiles"] = kept + [dataclasses.asdict(p) for p in profiles]
    write_atomic(path, json.dumps(data, indent=2) + "\n")
