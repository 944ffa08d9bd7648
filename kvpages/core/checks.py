"""Argument checks shared by the variants, the sweep and the CLIs: each names the bad value and what is valid."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from pathlib import Path


class UserError(ValueError):
    """Bad input of a user's (a run folder, a link profile, a row id, an option's value): the message names it and
    what is valid, and the `kvpages` program prints it in one line and exits 2 (kvpages.cli.main)."""


def one_line(exc: Exception) -> str:
    """A user error as its one line says it: an OSError with a path as 'path: reason' ('a -> b: reason' for a rename),
    without Python's errno prefix; anything else as it reads."""
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.filename}{f' -> {exc.filename2}' if exc.filename2 else ''}: {exc.strerror}"
    return str(exc)


def check_positive(name: str, value: object) -> int:
    """Return `value` if it is an integer >= 1 (a page size, a length, a count), else raise TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= 1, got {value!r} of type {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_choice(what: str, value: object, choices: Iterable[str]) -> str:
    """Return `value` if it is one of `choices`, else a ValueError that lists them."""
    valid = tuple(choices)
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")
    return str(value)


def split_csv(option: str, text: str) -> list[str]:
    """Split a comma-separated option value, refusing empty items."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ValueError(f"{option}: {text!r} has an empty item; give a comma-separated list")
    return items


def parse_positive_ints(option: str, text: str, *, example: str) -> tuple[int, ...]:
    """Parse '2048,8192' into (2048, 8192); every item must be an integer >= 1 (`example`: the option's own values, in
    the error)."""
    values = []
    for item in split_csv(option, text):
        try:
            value = int(item)
        except ValueError:
            raise ValueError(f"{option}: {item!r} is not an integer; give comma-separated integers >= 1, e.g. {example}") from None
        if value < 1:
            raise ValueError(f"{option}: {value} is not >= 1; give comma-separated integers >= 1, e.g. {example}")
        values.append(value)
    return tuple(values)


def parse_choices(option: str, text: str, choices: Sequence[str]) -> tuple[str, ...]:
    """Parse 'a,b' into ('a', 'b'), each item one of `choices`."""
    items = split_csv(option, text)
    for item in items:
        if item not in choices:
            raise ValueError(f"{option}: unknown value {item!r}; valid: {', '.join(choices)}")
    return tuple(items)


def check_runs(*paths: Path, fail_above: float | None = None, out: Path | None = None) -> None:
    """What `compare`, `noise` and `calibrate` check before any work: their run folders are not one given twice, a
    gate (`--fail-above`) is a finite percentage >= 0, and `--out` is not a file; UserError names the bad one."""
    seen: dict[Path, Path] = {}
    for path in paths:
        if (given := seen.setdefault(path.resolve(), path)) is not path:
            raise UserError(f"{path}: given twice (as {given} too); give another run")
    if fail_above is not None and not (math.isfinite(fail_above) and fail_above >= 0):
        raise UserError(f"--fail-above {fail_above}: give a finite percentage >= 0, e.g. 10")
    if out is not None:
        check_folder("--out", out)


def check_folder(flag: str, path: Path) -> None:
    """A folder a command writes under: made if missing; a UserError where a file stands."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path}: a file, not a folder; give a folder (made if missing)")


def with_table(text: str, where: str, what: str, begin: str, end: str, table: str) -> str:
    """`text` (a docs page, `where` in errors) with `table` between its line `begin` and its `end` (`what`: the table,
    as an error names it)."""
    head, found, rest = text.partition(begin + "\n")
    _, closed, tail = rest.partition(end)
    if not found or not closed:
        raise ValueError(f"{where}: no {what} to rewrite: it needs a line {begin!r}, then the table, then a line {end!r}")
    return f"{head}{found}{table}\n{closed}{tail}"
