"""The CPUs and torch threads of a timed process (`--kv-cpus`, `--kv-threads`): chosen once per process, applied
while it times its blocks and lifted after, so the workers it starts later start free (docs/method.md#spread-at-its-
source). On CUDA the CPUs of the GPU's NUMA node (sysfs `local_cpulist` of its PCI device, whose bus id nvidia-smi
gives); on a CPU run one fixed core, never core 0 where there is another (kvpages.core.affinity)."""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kvpages.core.affinity import AUTO, OFF, chosen, cpu_list, one_core, parse_cpu_list
from kvpages.measure.environment import gpu_uuid, query_smi

SYSFS_PCI = Path("/sys/bus/pci/devices")
SYSFS_NODES = Path("/sys/devices/system/node")


@dataclass(frozen=True)
class Pinning:
    """Where a timed process runs: `cpus` None when it is not pinned (`source` says why), and its torch threads."""

    cpus: frozenset[int] | None
    threads: int
    source: str

    @property
    def said(self) -> str:
        """meta.json's `cpu_affinity`: '15 (one core, auto)', or 'not pinned: --kv-cpus off'."""
        return f"not pinned: {self.source}" if self.cpus is None else f"{cpu_list(self.cpus)} ({self.source})"

    def apply(self) -> Callable[[], None]:
        """Pin every thread of this process (Linux sets a thread's own mask; threads started later inherit the
        caller's) and set its torch threads; the returned call puts both back as they were."""
        before_threads = torch.get_num_threads()
        before: dict[int, set[int]] = {}
        if self.cpus is not None:
            for tid in _threads():
                try:
                    before[tid] = os.sched_getaffinity(tid)
                    os.sched_setaffinity(tid, self.cpus)
                except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
                    before.pop(tid, None)
        torch.set_num_threads(self.threads)

        def restore() -> None:
            for tid, cpus in before.items():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.sched_setaffinity(tid, cpus)
            torch.set_num_threads(before_threads)

        return restore


def _threads() -> list[int]:
    """This process's thread ids (the calling thread first: 0 names it)."""
    try:
        return [0] + [int(t) for t in os.listdir("/proc/self/task") if int(t) != threading.get_native_id()]
    except OSError:
        return [0]


_SMI_BUS_ID = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])")


def sysfs_bus_id(smi_out: str | None) -> str | None:
    """The first line of nvidia-smi's output that is a bus id, '00000000:18:00.0', as sysfs names the device:
    '0000:18:00.0'; None where no line is one (nvidia-smi prints a warning first where, say, a GPU's infoROM is
    corrupt, and still exits 0)."""
    for line in (smi_out or "").splitlines():
        match = _SMI_BUS_ID.fullmatch(line.strip())
        if match:
            return f"{int(match[1], 16):04x}:{match[2].lower()}"
    return None


def gpu_node_cpus(smi_out: str | None, root: Path = SYSFS_PCI, nodes: Path = SYSFS_NODES) -> frozenset[int] | None:
    """The CPUs of the NUMA node the GPU hangs off (`smi_out`: nvidia-smi's `pci.bus_id`): its PCI device's
    `local_cpulist`, else its `numa_node`'s cpulist; None when they do not say (no bus id, no such file, a node of -1)."""
    bus_id = sysfs_bus_id(smi_out)
    if bus_id is None:
        return None
    device = root / bus_id
    try:
        return parse_cpu_list((device / "local_cpulist").read_text())
    except (OSError, ValueError):
        pass
    try:
        node = int((device / "numa_node").read_text())
        return parse_cpu_list((nodes / f"node{node}" / "cpulist").read_text()) if node >= 0 else None
    except (OSError, ValueError):
        return None


def resolve(choice: str, threads: int, device: str) -> Pinning:
    """The pinning `--kv-cpus` asks for on `device`, within the CPUs this process may use."""
    allowed = frozenset(os.sched_getaffinity(0))
    if choice == OFF:
        return Pinning(None, threads, "--kv-cpus off")
    if choice != AUTO:
        return Pinning(chosen(choice, allowed), threads, "--kv-cpus")
    if device == "cuda":
        node = gpu_node_cpus(query_smi(gpu_uuid(), "pci.bus_id"))
        if node is None or not node & allowed:
            return Pinning(None, threads, "auto: the GPU's NUMA node is unknown here (sysfs and nvidia-smi)")
        return Pinning(node & allowed, threads, "auto: the CPUs of the GPU's NUMA node")
    core = one_core(allowed)
    if core is None:
        return Pinning(None, threads, f"auto: {len(allowed)} CPU(s), too few to set one aside")
    return Pinning(core, threads, "auto: one core, not core 0")


class Pinned:
    """A process's pinning over its timed blocks: `pin` from its first (once), `unpin` after its last."""

    def __init__(self, pinning: Pinning, timing: bool) -> None:
        self.pinning, self.timing = pinning, timing
        self._restore: Callable[[], None] | None = None

    def pin(self) -> None:
        if self._restore is None and self.timing:
            self._restore = self.pinning.apply()

    def unpin(self) -> None:
        if self._restore is not None:
            self._restore()
            self._restore = None
