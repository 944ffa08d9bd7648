"""Which CPUs a timed process runs on (`--kv-cpus`), as data: the choices, the Linux CPU-list format and the rule for
a CPU run (no torch, no IO but the process's own CPU set; kvpages.measure.pinning applies it).
docs/method.md#spread-at-its-source says why."""

from __future__ import annotations

import os
from collections.abc import Iterable

AUTO, OFF = "auto", "off"
CPU_CHOICES = (AUTO, OFF)


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def parse_cpu_list(text: str) -> frozenset[int]:
    """'0-3,8,10-11' (the kernel's cpulist format, as sysfs writes it) -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.strip().split(",")):
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ValueError(f"{text!r} is not a CPU list; give e.g. 2,3 or 8-15") from None
        if first < 0 or last < first:
            raise ValueError(f"{text!r}: the range {part!r} is empty or negative; give e.g. 2,3 or 8-15")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError(f"{text!r} names no CPU; give e.g. 2,3 or 8-15")
    return frozenset(cpus)


def cpu_list(cpus: Iterable[int]) -> str:
    """The cpulist format of a set of CPUs: {0, 1, 2, 3, 8} -> '0-3,8'."""
    ordered, parts = sorted(set(cpus)), []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_cpus(text: str) -> str:
    """`--kv-cpus`: auto, off, or a CPU list (returned normalised, '2-3'); ValueError names the valid forms."""
    text = text.strip()
    if text in CPU_CHOICES:
        return text
    try:
        return cpu_list(parse_cpu_list(text))
    except ValueError as exc:
        raise ValueError(f"{exc}, or one of {', '.join(CPU_CHOICES)}") from None


MIN_CPUS_TO_PIN = 3
"""A CPU run pins its timed process only where it may use more than two CPUs: on two, the pinned core is the only
one left to the session's recorder and the box's own work, and the dev box's processes spread more pinned than not
(docs/method.md#spread-at-its-source)."""


def one_core(available: Iterable[int]) -> frozenset[int] | None:
    """A CPU run's timed process: one fixed core, the highest this process may use, so never core 0 (where the
    kernel's housekeeping and interrupts land first); None (not pinned) with fewer than MIN_CPUS_TO_PIN."""
    available = frozenset(available)
    return frozenset({max(available)}) if len(available) >= MIN_CPUS_TO_PIN else None


def chosen(text: str, allowed: Iterable[int]) -> frozenset[int]:
    """The CPUs of a `--kv-cpus` list that this process may use; ValueError when it may use none of them."""
    allowed = frozenset(allowed)
    cpus = parse_cpu_list(text) & allowed
    if not cpus:
        raise ValueError(f"--kv-cpus {text}: none of these CPUs is available to this process (it may use "
                         f"{cpu_list(allowed)}); give some of those, or {AUTO} or {OFF}")
    return cpus
