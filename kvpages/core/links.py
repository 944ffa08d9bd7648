"""The link model: what a call or a step would cost on a GPU box, term by term, with every term's source here.

    predicted_us = host work this run measured (only where it is host work on any box)
                 + device ops x (LAUNCH_US + KERNEL_US)
                 + blocking copies x (SYNC_US + the profile's fixed cost per copy)
                 + d2h_bytes / the profile's bandwidth

A model, not a measurement: the bytes and transfers are the meter's (exact), a blocking copy is one transfer and one
sync. Pre-PR's numpy stride and the host mirror's slice are host work on any box, so their measured time is added; a
device variant's time on a CPU run is its divide on this CPU, which a GPU box does not pay, so the modelled launch and
kernel replace it. No torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvpages.core.names import per_request_of


@dataclass(frozen=True)
class Term:
    """One term of the model: its value and where the value comes from."""

    name: str
    value: float
    unit: str
    source: str


LAUNCH = Term("launch per device op", 5.0, "µs",
              "assumed: an eager PyTorch op on CUDA costs a few µs of host time (dispatch and cudaLaunchKernel; the "
              "CUDA C++ Best Practices Guide calls a launch small but not free)")
KERNEL = Term("device time per small kernel", 2.0, "µs",
              "assumed: a strided divide or shift over at most 2 MB of indices (< 1 µs of HBM traffic at ~2 TB/s, "
              "H100 PCIe datasheet) plus its start on the device; counted in full, not overlapped with the copy")
SYNC = Term("sync per blocking copy", 3.0, "µs",
            "assumed: the host's wait for the stream and its wake-up, once per blocking copy (not per op); with a "
            "copy's fixed cost a small .cpu() then takes 9-11 µs, inside the public 6-12 µs for a small .cpu() with "
            "its sync")
LAUNCH_US, KERNEL_US, SYNC_US = LAUNCH.value, KERNEL.value, SYNC.value
HOST_WORK = ("the timed figure of this run (the geometric mean of the block medians, every round on a cold input "
             "rotated through the pool): on a GPU box numpy reads a buffer a DMA has just written, so it is cold there "
             "too; the profiled pass runs warm and would give less")
"""Which figure of the measured host work the prediction adds (an assumption the report states)."""


@dataclass(frozen=True)
class LinkProfile:
    """A device-to-host link: fixed cost per copy and sustained bandwidth (1 GB/s = 1e9 B/s)."""

    name: str
    label: str
    latency_us: float
    bandwidth_gb_s: float
    source: str
    pinned: bool = False

    def modeled_us(self, d2h_bytes: float, d2h_transfers: float, launches: int = 0) -> float:
        """The module's formula less the measured host work."""
        return (d2h_transfers * (self.latency_us + SYNC_US) + d2h_bytes / (self.bandwidth_gb_s * 1e3)
                + launches * (LAUNCH_US + KERNEL_US))

    def predicted_us(self, variant: str, page_size: int, calls: int, d2h_bytes: float, d2h_transfers: float,
                     measured_us: float, host_side: bool = False) -> float:
        """A call or a whole request or step of `variant` on this link (the module's formula)."""
        host = measured_us if carries_host_work(variant, host_side) else 0.0
        return host + self.modeled_us(d2h_bytes, d2h_transfers, device_ops(variant, page_size, calls, host_side))

    @property
    def column(self) -> str:
        return f"modeled_{self.name}_us"


LINK_PROFILES: tuple[LinkProfile, ...] = (
    LinkProfile("pcie4_pinned", "PCIe Gen4 x16, pinned", 6.0, 25.0,
                "nvbandwidth device_to_host_memcpy_ce on A100 PCIe Gen4: ~25-26 GB/s; about 5-7 µs per cudaMemcpyAsync",
                pinned=True),
    LinkProfile("pcie4_pageable", "PCIe Gen4 x16, pageable", 8.0, 12.5,
                "assumption: half the pinned bandwidth and 2 µs more per copy, because a pageable copy is staged through "
                "a pinned driver buffer (CUDA C++ Best Practices Guide, 'Pinned Memory')"),
    LinkProfile("pcie5_pinned", "PCIe Gen5 x16, pinned", 6.0, 53.0,
                "about 53 GB/s pinned D2H on H100 PCIe Gen5 (nvbandwidth device_to_host_memcpy_ce); about 5-7 µs per "
                "cudaMemcpyAsync", pinned=True),
    LinkProfile("pcie5_pageable", "PCIe Gen5 x16, pageable", 8.0, 26.5,
                "assumption: half the pinned bandwidth and 2 µs more per copy (staged copy), as for Gen4"),
    LinkProfile("nvlink_c2c", "NVLink-C2C (GH200)", 4.0, 450.0,
                "NVIDIA GH200 Grace Hopper datasheet: 900 GB/s NVLink-C2C, 450 GB/s per direction; the CPU reads "
                "pageable memory coherently; fixed cost per copy assumed 4 µs"),
)
"""The profiles the charts and the report price rows at."""

PREDICTION_PROFILES = ("pcie5_pageable", "nvlink_c2c", "pcie5_pinned")
"""The profiles a CPU run's findings predict on: `.cpu()` copies into pageable memory, so pre-PR and the merged PR
are priced on the pageable PCIe Gen5 link and on GH200's C2C; the pinned profile is a labelled what-if."""

KERNELS_PER_CALL = {"host_stride": 0, "host_mirror": 0, "device_stride": 1, "device_shift": 1,
                    "device_stride_shortcut": 1, "device_stride_pinned": 1}
"""Device ops a call launches before its copy (the strided divide or shift; a slice is a view); none: host work."""


def prediction_profiles() -> tuple[LinkProfile, ...]:
    return tuple(next(p for p in LINK_PROFILES if p.name == name) for name in PREDICTION_PROFILES)


def carries_host_work(variant: str, host_side: bool = False) -> bool:
    """Whether `variant`'s time is host work on a GPU box too: declared above, else `host_side` (what the meter saw)."""
    name = per_request_of(variant) or variant
    return KERNELS_PER_CALL[name] == 0 if name in KERNELS_PER_CALL else host_side


def device_ops(variant: str, page_size: int, calls: int = 1, host_side: bool = False) -> int:
    """The device ops `calls` calls launch before their copies: a batched step one per request and one to gather them
    (B + 1); an undeclared variant one per call, none when its stride is host work (`host_side`)."""
    inner = per_request_of(variant)
    if inner is None and variant.startswith("batched_"):
        return calls + 1
    name = inner or variant
    if name == "device_stride_shortcut" and page_size == 1:
        return 0
    return KERNELS_PER_CALL.get(name, 0 if host_side else 1) * calls


def model_terms() -> tuple[Term, ...]:
    return (LAUNCH, KERNEL, SYNC)


def profile_for(pcie_link: str | None, link: str) -> LinkProfile | None:
    """The profile of a measured link, or None: the PCIe generation from meta.json's `pcie_link` ('Gen1 x16 (max Gen5
    x16)': an idle link drops to Gen1, so the maximum counts), pinned/pageable from a row's `link` ('pcie pinned')."""
    generation = re.search(r"max Gen(\d+)", pcie_link or "") or re.match(r"Gen(\d+)", pcie_link or "")
    kind = {"pcie pinned": "pinned", "pcie pageable": "pageable"}.get(link)
    if generation is None or kind is None:
        return None
    name = f"pcie{generation.group(1)}_{kind}"
    return next((p for p in LINK_PROFILES if p.name == name), None)
