"""The link model: what a call or a step would cost on a GPU box, term by term, each term with its source and bounds.

    predicted_us = host work this run measured (only where it is host work on any box)
                 + device ops x (launch + kernel)
                 + copies x the fixed cost per copy + host syncs x sync   (a blocking copy: one of each)
                 + d2h_bytes / bandwidth

A model, not a measurement: the bytes and transfers are the meter's (exact). Pre-PR's numpy stride and the host
mirror's slice are host work on any box, so their measured host work (never a time that holds a copy:
kvpages.analysis.hostwork) is added; a device variant's time on a CPU run is its divide on this CPU, which a GPU box
does not pay, so the modelled launch and kernel replace it. The terms live in link profiles, TOML files read by
kvpages.schema.profiles (the built-in ones ship in kvpages/schema/profiles/), written by `kvpages calibrate` from a CUDA
run. No torch, no file IO here.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import NamedTuple

from kvpages.core.adaptive import ADAPTIVE
from kvpages.core.names import per_request_of

TERM_KEYS = ("launch_us", "kernel_us", "sync_us", "copy_us", "bandwidth_gb_s")
"""A profile's terms, in the order a profile file and the report list them."""
ASSUMED = TERM_KEYS[:4]
"""The terms each prediction's bounds move at 0.5-2x (bandwidth is a datasheet or nvbandwidth figure, not an
assumption; a fitted bandwidth moves within its fitted interval: `varied`)."""
TERM_NAMES = {"launch_us": "launch per device op", "kernel_us": "device time per small kernel",
              "sync_us": "sync per host sync", "copy_us": "fixed cost per copy", "bandwidth_gb_s": "D2H bandwidth"}
SHORT = {"launch_us": "launch", "kernel_us": "kernel", "sync_us": "sync", "copy_us": "fixed cost",
         "bandwidth_gb_s": "bandwidth"}
MEMORIES = ("pageable", "pinned")
SCALES = (0.5, 2.0)
"""An assumed term's bounds: this factor of its value, low and high (docs/method.md, "Bounds")."""
HOST_WORK = ("numpy's stride and divide, measured apart from the copy: pre-PR's time at page size p less its time at "
             "page size 1 on the same slice (the same copy of the same bytes, without the stride; none at p=1), each "
             "the run's timed figure on cold inputs rotated through the pool; the host mirror's slice, its whole time "
             "(it copies nothing; a request or step of it, its whole time on a CPU run, where its upkeep's copy crossed "
             "no link). Never a time that holds a copy, so a CUDA run's copy is priced once")
"""Which figure of the measured host work the prediction adds (kvpages.analysis.hostwork; the report states it)."""


@dataclass(frozen=True)
class Term:
    """One term of a profile: its value, where the value comes from, and its interval where it was fitted."""

    key: str
    value: float
    source: str
    low: float | None = None  # a fitted term's interval (`kvpages calibrate`); None: an assumption, bounded by SCALES
    high: float | None = None

    @property
    def name(self) -> str:
        return TERM_NAMES[self.key]

    @property
    def unit(self) -> str:
        return "GB/s" if self.key == "bandwidth_gb_s" else "µs"

    @property
    def fitted(self) -> bool:
        return self.low is not None and self.high is not None

    def bounds(self) -> tuple[tuple[float, str], tuple[float, str]]:
        """(value, how it is said) at its low and its high: its fitted interval, else SCALES x its value."""
        if self.low is not None and self.high is not None:
            return (self.low, f"{SHORT[self.key]} {self.low:.3g} {self.unit}"), (self.high, f"{SHORT[self.key]} "
                                                                                   f"{self.high:.3g} {self.unit}")
        low, high = SCALES
        return (self.value * low, f"{SHORT[self.key]} {low:g}x"), (self.value * high, f"{SHORT[self.key]} {high:g}x")


@dataclass(frozen=True)
class LinkProfile:
    """A device-to-host link and the device work around a copy: every term of the model (1 GB/s = 1e9 B/s)."""

    name: str
    label: str
    memory: str  # pageable or pinned: where `.cpu()` (pageable) or a pinned buffer receives the copy
    terms: tuple[Term, ...]  # one per TERM_KEYS, in that order
    origin: str = "built-in"  # the file it was read from, for a user's profile
    sha256: str = ""  # of that file
    fitted_from: tuple[str, ...] = ()  # the runs `kvpages calibrate` fitted it from (none: public figures)

    def in_sample(self, run_id: str) -> bool:
        """Whether it was fitted from the run it prices: its predictions of that run are in-sample."""
        return run_id in self.fitted_from

    def __post_init__(self) -> None:
        if tuple(t.key for t in self.terms) != TERM_KEYS:
            raise ValueError(f"profile {self.name!r}: terms {[t.key for t in self.terms]}, expected {list(TERM_KEYS)}")
        if self.memory not in MEMORIES:
            raise ValueError(f"profile {self.name!r}: memory {self.memory!r}; valid: {', '.join(MEMORIES)}")

    def term(self, key: str) -> Term:
        return self.terms[TERM_KEYS.index(key)]

    def us(self, key: str) -> float:
        return self.term(key).value

    @property
    def pinned(self) -> bool:
        return self.memory == "pinned"

    @property
    def fitted(self) -> bool:
        return any(t.fitted for t in self.terms)

    def with_values(self, values: dict[str, float]) -> LinkProfile:
        """This profile with some terms set to other values (their sources kept): one variation of its bounds."""
        terms = tuple(dataclasses.replace(t, value=values[t.key]) if t.key in values else t for t in self.terms)
        return dataclasses.replace(self, terms=terms)

    def modeled_us(self, d2h_bytes: float, d2h_transfers: float, launches: float = 0, syncs: float | None = None) -> float:
        """The module's formula less the measured host work; `syncs` None: one per copy (a blocking copy)."""
        syncs = d2h_transfers if syncs is None else syncs
        return (launches * (self.us("launch_us") + self.us("kernel_us")) + d2h_transfers * self.us("copy_us")
                + syncs * self.us("sync_us") + d2h_bytes / (self.us("bandwidth_gb_s") * 1e3))

    def predicted_us(self, variant: str, page_size: int, calls: int, d2h_bytes: float, d2h_transfers: float,
                     host_us: float, host_side: bool = False) -> float:
        """A call or a whole request or step of `variant` on this link (the module's formula); `host_us`: its host work
        (added only where `carries_host_work`)."""
        host = host_us if carries_host_work(variant, host_side) else 0.0
        return host + self.modeled_us(d2h_bytes, d2h_transfers, device_ops(variant, page_size, calls, host_side))

    @property
    def column(self) -> str:
        return f"modeled_{self.name}_us"


class Variation(NamedTuple):
    """One way the assumed terms may be off: `said` (e.g. 'sync 2x', 'all 0.5x') and the profile it gives."""

    said: str
    profile: LinkProfile


def varied(profile: LinkProfile) -> tuple[str, ...]:
    """The terms a prediction's bounds move: the assumed ones, and the bandwidth where it was fitted."""
    return ASSUMED + (("bandwidth_gb_s",) if profile.term("bandwidth_gb_s").fitted else ())


@functools.cache  # a report prices every point and scenario on each profile's ten variations
def variations(profile: LinkProfile) -> tuple[Variation, ...]:
    """Each varied term at its low and its high, one at a time, then all of them low and all high together (a
    bandwidth's 'low' is its slow end: the one that makes a copy cost more)."""
    keys = varied(profile)
    bounds = {key: profile.term(key).bounds() for key in keys}
    out = [Variation(said, profile.with_values({key: value})) for key in keys for value, said in bounds[key]]
    fitted = any(profile.term(key).fitted for key in keys)  # then 'low' is each term's own low, not one factor
    for side, word in enumerate(("low", "high")):
        said = f"all {word}" if fitted else f"all {SCALES[side]:g}x"
        costly = {key: bounds[key][1 - side if key == "bandwidth_gb_s" else side][0] for key in keys}
        out.append(Variation(said, profile.with_values(costly)))
    return tuple(out)


PREDICTION_PROFILES = ("pcie5_pageable", "nvlink_c2c", "pcie5_pinned", "h200_measured_pageable")
"""The built-in profiles a CPU run's findings predict on: `.cpu()` copies into pageable memory, so pre-PR and the merged
PR are priced on the pageable PCIe Gen5 link and on GH200's C2C, from public figures; the pinned profile is a labelled
what-if; h200_measured_pageable is the one H200 kvpages has measured (`kvpages calibrate` of the committed run
results/20261204T181656Z-cuda-nvidia-h200). A user's profiles (`--kv-link-profile`, `kvpages report --link-profile`)
are added after them."""

KERNELS_PER_CALL = {"host_stride": 0, "host_mirror": 0, "device_stride": 1, "device_shift": 1,
                    "device_stride_shortcut": 1, "device_stride_pinned": 1}
"""Device ops a call launches before its copy (the strided divide or shift; a slice is a view); none: host work."""


BY_ROW = (ADAPTIVE,)
"""Variants whose path depends on the call (kvpages.core.adaptive): each row's `host_side` says which it took."""


def carries_host_work(variant: str, host_side: bool = False) -> bool:
    """Whether `variant`'s time is host work on a GPU box too: declared above, else `host_side` (what the meter saw it
    move: every token index or none, at this row for a BY_ROW variant, at every row for an undeclared one)."""
    name = per_request_of(variant) or variant
    return KERNELS_PER_CALL[name] == 0 if name in KERNELS_PER_CALL else host_side


def device_ops(variant: str, page_size: int, calls: int = 1, host_side: bool = False) -> int:
    """The device ops `calls` calls launch before their copies: a batched step one per request and one to gather them
    (B + 1); a BY_ROW or undeclared variant one per call, none when its stride is host work (`host_side`)."""
    inner = per_request_of(variant)
    if inner is None and variant.startswith("batched_"):
        return calls + 1
    name = inner or variant
    if name == "device_stride_shortcut" and page_size == 1:
        return 0
    return KERNELS_PER_CALL.get(name, 0 if host_side or (name in BY_ROW and page_size == 1) else 1) * calls


LINK_LIMITS = {
    5: (63.0, "PCIe Gen5 x16: 32 GT/s x 16 lanes x 128/130 encoding (PCI-SIG PCIe 5.0 base specification)"),
    4: (31.5, "PCIe Gen4 x16: 16 GT/s x 16 lanes x 128/130 encoding (PCI-SIG PCIe 4.0 base specification)"),
    3: (15.75, "PCIe Gen3 x16: 8 GT/s x 16 lanes x 128/130 encoding (PCI-SIG PCIe 3.0 base specification)"),
}
"""The most a PCIe x16 link carries per direction, in GB/s, by generation, and where the figure comes from: no D2H
bandwidth of a profile of that link may exceed it (`kvpages calibrate` refuses a fitted one that does)."""


def pcie_generation(pcie_link: str | None) -> int | None:
    """The PCIe generation a link trains to, from meta.json's `pcie_link` ('Gen1 x16 (max Gen5 x16)': an idle link
    drops to Gen1, so the maximum counts)."""
    found = re.search(r"max Gen(\d+)", pcie_link or "") or re.match(r"Gen(\d+)", pcie_link or "")
    return None if found is None else int(found.group(1))


def link_limit(pcie_link: str | None) -> tuple[float, str] | None:
    """The per-direction limit (GB/s, its source) of a run's PCIe link; None when the generation is unknown."""
    generation = pcie_generation(pcie_link)
    return None if generation is None else LINK_LIMITS.get(generation)


def profile_for(pcie_link: str | None, link: str, profiles: tuple[LinkProfile, ...]) -> LinkProfile | None:
    """The profile of a measured link among `profiles`, or None: the PCIe generation from meta.json's `pcie_link`
    ('Gen1 x16 (max Gen5 x16)': an idle link drops to Gen1, so the maximum counts), pinned/pageable from a row's
    `link` ('pcie pinned')."""
    generation = pcie_generation(pcie_link)
    kind = {"pcie pinned": "pinned", "pcie pageable": "pageable"}.get(link)
    if generation is None or kind is None:
        return None
    name = f"pcie{generation}_{kind}"
    return next((p for p in profiles if p.name == name), None)
