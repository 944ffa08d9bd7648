"""The link model: what a row's measured D2H bytes and transfers would cost on a given link.

    modeled_<link>_us = d2h_transfers * latency_us + d2h_bytes / bandwidth

This is a model, not a measurement: it prices the bytes and transfers the meter
counted at a link's fixed per-copy cost and sustained bandwidth. It ignores the
device kernel, Python overhead and synchronisation, which the measured latency
contains. No torch import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LAUNCH_SYNC_US = 5.0
"""The launch and sync term: what one extra device op before the copy costs (the merged PR's stride and divide).
An eager PyTorch op on CUDA costs a few µs of host time (dispatch and cudaLaunchKernel, which the CUDA C++ Best
Practices Guide calls small but not free), and the blocking copy then waits for it on the stream. 5 µs is an
assumption of that order, not a measurement: a CUDA run's 'Model vs measurement' table checks it."""
LAUNCH_SYNC_SOURCE = ("assumed 5 µs per device op before the copy: eager dispatch + cudaLaunchKernel, a few µs of host "
                      "time (CUDA C++ Best Practices Guide), and the stream wait of the blocking copy")


@dataclass(frozen=True)
class LinkProfile:
    """A device-to-host link: fixed cost per copy and sustained bandwidth (1 GB/s = 1e9 B/s)."""

    name: str
    label: str
    latency_us: float
    bandwidth_gb_s: float
    source: str

    def modeled_us(self, d2h_bytes: float, d2h_transfers: float, launches: int = 0) -> float:
        """transfers x latency + bytes / bandwidth, plus `launches` x LAUNCH_SYNC_US for device work before the copy."""
        return d2h_transfers * self.latency_us + d2h_bytes / (self.bandwidth_gb_s * 1e3) + launches * LAUNCH_SYNC_US

    @property
    def column(self) -> str:
        return f"modeled_{self.name}_us"


LINK_PROFILES: tuple[LinkProfile, ...] = (
    LinkProfile(
        "pcie4_pinned", "PCIe Gen4 x16, pinned", 5.0, 25.0,
        "nvbandwidth device_to_host_memcpy_ce on A100 PCIe Gen4: ~25-26 GB/s; "
        "several us fixed cost per cudaMemcpy (CUDA C++ Best Practices Guide, 'Data Transfer Between Host and Device')",
    ),
    LinkProfile(
        "pcie4_pageable", "PCIe Gen4 x16, pageable", 10.0, 12.5,
        "assumption: half the pinned bandwidth and twice the fixed cost, because a pageable copy is staged "
        "through a pinned driver buffer (CUDA C++ Best Practices Guide, 'Pinned Memory')",
    ),
    LinkProfile(
        "pcie5_pinned", "PCIe Gen5 x16, pinned", 5.0, 52.8,
        "nvbandwidth device_to_host_memcpy_ce on H100 PCIe Gen5: ~52.8 GB/s; fixed cost as for Gen4",
    ),
    LinkProfile(
        "pcie5_pageable", "PCIe Gen5 x16, pageable", 10.0, 26.4,
        "assumption: half the pinned bandwidth and twice the fixed cost (staged copy), as for Gen4",
    ),
    LinkProfile(
        "nvlink_c2c", "NVLink-C2C (GH200)", 3.0, 450.0,
        "NVIDIA GH200 Grace Hopper datasheet: 900 GB/s NVLink-C2C, 450 GB/s per direction; fixed cost assumed ~3 us",
    ),
)
"""The profiles the charts and the report price rows at."""


def profile_for(pcie_link: str | None, link: str) -> LinkProfile | None:
    """The profile of a measured link: the PCIe generation the link trains to, from meta.json's
    `pcie_link` ('Gen1 x16 (max Gen5 x16)': an idle link drops to Gen1, so the maximum counts),
    and pinned/pageable from a row's `link` ('pcie pinned'); None when there is no such profile."""
    generation = re.search(r"max Gen(\d+)", pcie_link or "") or re.match(r"Gen(\d+)", pcie_link or "")
    kind = {"pcie pinned": "pinned", "pcie pageable": "pageable"}.get(link)
    if generation is None or kind is None:
        return None
    name = f"pcie{generation.group(1)}_{kind}"
    return next((p for p in LINK_PROFILES if p.name == name), None)
