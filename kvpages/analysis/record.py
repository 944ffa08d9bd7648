"""The public record: GPU figures published elsewhere that the link model (kvpages/core/links.py) must reproduce
within a stated tolerance, each with its source, the profile it is priced on and how the model prices it.

A figure the model cannot reproduce within 2x keeps a `gap`: what the figure contains that the model does not. The
profile terms are never tuned to hit a figure. tests/test_public_record.py checks every row against the built-in
profiles and that docs/method.md holds the table `record_markdown` writes. No torch, no file IO here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvpages.analysis.cite import sig
from kvpages.core.checks import with_table
from kvpages.core.links import LinkProfile

GAP_FACTOR = 2.0
"""Beyond this factor of the public figure a row must say why (its `gap`); within it, a row may not keep one."""
PR_34338 = "SGLang PR #34338's microbenchmark, https://github.com/sgl-project/sglang/pull/34338"
PR_BYTES = 256
"""The bytes the #34338 step hands the host, either way: 'a few hundred' (at 26.5 GB/s any such size adds < 0.02 µs)."""
PR_OLD = "5 device syncs, each a blocking read-back of a few bytes (the issue's 'five device syncs'): 5 x (copy + sync) + 256 B"
PR_NEW = "1 blocking copy (the values gathered into one buffer): copy + sync + 256 B"
STEP_GAP = ("a scheduler step's consumption, not a copy's: the Python work around each sync, `.item()`/`.tolist()` making "
            "Python values, and each sync's wait for the work queued before it on the stream; the model has none of these "
            "(it prices an idle stream's 3 µs sync and an 8 µs copy)")
RANKS_GAP = (STEP_GAP + "; with 4 DP ranks also the wait for the other ranks and their contention for the host and its PCIe "
             "root (the link model has no contention or collective term)")


@dataclass(frozen=True)
class PublicFigure:
    """One published GPU figure and how the link model prices it."""

    id: str
    what: str
    public: tuple[float, float]  # the published value, or its range (low, high)
    unit: str  # µs, GB/s, or x for a ratio
    source: str  # a URL or a document's name
    profile: str  # the built-in profile it is priced on, and why (in `prices`)
    prices: str  # how the model prices it, in words
    model: Callable[[LinkProfile], float]  # the model's figure on that profile, in `unit`
    within: float  # the tolerance: the model within this factor of the public value or range (1: inside the range)
    gap: str = ""  # where the model is outside GAP_FACTOR: what the figure contains that the model does not

    def __post_init__(self) -> None:
        low, high = self.public
        if not 0 < low <= high:
            raise ValueError(f"{self.id}: public {self.public} must be 0 < low <= high")
        if not 1 <= self.within <= GAP_FACTOR:
            raise ValueError(f"{self.id}: tolerance {self.within:g}x must lie within 1-{GAP_FACTOR:g}x")

    def public_text(self) -> str:
        low, high = self.public
        said = sig if self.unit == "x" else "{:g}".format  # a ratio to 3 figures, a published value as published
        space = "" if self.unit == "x" else " "
        return f"{said(low)}{space}{self.unit}" if low == high else f"{said(low)}-{said(high)}{space}{self.unit}"


@dataclass(frozen=True)
class RecordCheck:
    """A figure against the model: `ratio` is the model over the nearest end of the public range (1 inside it)."""

    figure: PublicFigure
    model: float
    ratio: float

    @property
    def within_tolerance(self) -> bool:
        return 1 / self.figure.within <= self.ratio <= self.figure.within

    @property
    def within_gap_factor(self) -> bool:
        return 1 / GAP_FACTOR <= self.ratio <= GAP_FACTOR

    @property
    def holds(self) -> bool:
        """Reproduced within tolerance without a gap, or outside 2x with its gap said: what the test asserts."""
        return (self.within_tolerance and not self.figure.gap) or (bool(self.figure.gap) and not self.within_gap_factor)


def _step(copies: int) -> Callable[[LinkProfile], float]:
    return lambda p: p.modeled_us(PR_BYTES, copies)


def _ratio(p: LinkProfile) -> float:
    return _step(5)(p) / _step(1)(p)


NVBANDWIDTH_BYTES = 64 * 2**20
"""The copy priced: 64 MiB, the default buffer of nvbandwidth's first releases (a larger one comes closer to the bandwidth)."""

RECORD: tuple[PublicFigure, ...] = (
    PublicFigure(
        "small_cpu", "a small `.cpu()` with its sync (a few bytes)", (6.0, 12.0), "µs",
        "public microbenchmarks of a small `.cpu()` (the 6-12 µs the profiles' sync term cites)",
        "pcie5_pageable", "1 blocking copy of 8 B: copy + sync + bytes (`.cpu()` copies into pageable memory; "
        "an H100 or H200 reaches its host over PCIe Gen5 x16)", lambda p: p.modeled_us(8, 1), 1.0),
    PublicFigure(
        "pr34338_tp1_old", "#34338, attn_tp=1: five device syncs per scheduler step, before the PR", (212.0, 212.0),
        "µs", PR_34338, "pcie5_pageable", PR_OLD + " (H100/H200 SXM over PCIe Gen5, pageable `.cpu()`/`.item()`)",
        _step(5), 2.0, STEP_GAP),
    PublicFigure(
        "pr34338_tp1_new", "#34338, attn_tp=1: one D2H of a few hundred bytes per step, after the PR", (49.0, 49.0),
        "µs", PR_34338, "pcie5_pageable", PR_NEW, _step(1), 2.0, STEP_GAP),
    PublicFigure(
        "pr34338_tp1_ratio", "#34338, attn_tp=1: before over after (212 / 49 µs)", (212 / 49, 212 / 49), "x",
        PR_34338, "pcie5_pageable", "the two lines above, divided: 5 x (copy + sync) over 1 x (copy + sync)", _ratio,
        2.0),
    PublicFigure(
        "pr34338_dp4_old", "#34338, 4 DP ranks: five device syncs per scheduler step, before the PR", (454.6, 454.6),
        "µs", PR_34338, "pcie5_pageable", PR_OLD + ", one rank's step (the model has no ranks)", _step(5), 2.0,
        RANKS_GAP),
    PublicFigure(
        "pr34338_dp4_new", "#34338, 4 DP ranks: one D2H per step, after the PR", (172.0, 172.0), "µs", PR_34338,
        "pcie5_pageable", PR_NEW + ", one rank's step", _step(1), 2.0, RANKS_GAP),
    PublicFigure(
        "pr34338_dp4_ratio", "#34338, 4 DP ranks: before over after (454.6 / 172.0 µs)", (454.6 / 172.0, 454.6 / 172.0),
        "x", PR_34338, "pcie5_pageable", "as at attn_tp=1; the model's ratio does not depend on the ranks "
        "(5x), the public one falls from 4.33x to 2.64x as the step's costs the PR leaves in place grow with 4 ranks (49 to "
        "172 µs)", _ratio, 2.0),
    PublicFigure(
        "nvbandwidth_d2h_pinned", "pinned D2H bandwidth, H100 PCIe Gen5 x16 (an H200 SXM's host link is the same Gen5 "
        "x16)", (53.0, 55.0), "GB/s", "NVIDIA nvbandwidth's device_to_host_memcpy_ce, https://github.com/NVIDIA/nvbandwidth",
        "pcie5_pinned", "1 blocking copy of 64 MiB into pinned memory (nvbandwidth's buffers are pinned): bytes / "
        "(copy + sync + bytes / bandwidth)", lambda p: NVBANDWIDTH_BYTES / p.modeled_us(NVBANDWIDTH_BYTES, 1) / 1e3, 1.1),
)


def check(figure: PublicFigure, profiles: tuple[LinkProfile, ...]) -> RecordCheck:
    """`figure` priced on its profile among `profiles` (KeyError naming the profile where it is not there)."""
    profile = next((p for p in profiles if p.name == figure.profile), None)
    if profile is None:
        raise KeyError(f"{figure.id}: no profile {figure.profile!r} among {', '.join(p.name for p in profiles)}")
    model = figure.model(profile)
    low, high = figure.public
    return RecordCheck(figure, model, model / low if model < low else model / high if model > high else 1.0)


RECORD_BEGIN = "<!-- public record: written by kvpages.analysis.record.record_markdown from RECORD and the built-in profiles -->"
RECORD_END = "<!-- end of public record -->"


def _cell(text: str) -> str:
    return text.replace("|", "&#124;")


def _row(c: RecordCheck) -> str:
    f = c.figure
    space = "" if f.unit == "x" else " "
    inside = f.public[0] < f.public[1] and c.ratio == 1.0
    verdict = ("yes" if c.within_tolerance and not f.gap else f"no, beyond {GAP_FACTOR:g}x: {f.gap}" if c.holds
               else "FAILS: outside its tolerance with no gap said")
    tolerance = "inside the range" if f.within == 1 else f"within {f.within:g}x"
    cells = [f.what, f.public_text(), f.source, f"`{f.profile}`: {f.prices}", f"{sig(c.model)}{space}{f.unit}",
             "in range" if inside else sig(c.ratio), tolerance, verdict]
    return "| " + " | ".join(_cell(x) for x in cells) + " |"


def record_markdown(profiles: tuple[LinkProfile, ...]) -> str:
    """The public record as a markdown table, one row per figure in RECORD order, priced on `profiles`."""
    head = "| figure | public | source | priced on, as | model | model / public | tolerance | reproduced |"
    rows = [_row(check(f, profiles)) for f in RECORD]
    return "\n".join([head, "|---|---|---|---|---|---|---|---|", *rows])


def with_record_table(text: str, where: str, profiles: tuple[LinkProfile, ...]) -> str:
    """`text` (a docs page, `where` in errors) with the table between RECORD_BEGIN and RECORD_END written anew."""
    return with_table(text, where, "public record", RECORD_BEGIN, RECORD_END, record_markdown(profiles))
