"""The sweep: frozen points and the named presets that pytest, the CLI and the docs read.

A `Point` is one input configuration; a `Sweep` is the cross product of its axes.
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from kvpages.checks import check_choice, check_page_size, check_seq_len

DTYPES: tuple[str, ...] = ("int32", "int64")
"""Index dtypes: int32 is what SGLang's `req_to_token` holds."""
ITEMSIZE: dict[str, int] = {"int32": 4, "int64": 8}
DEVICES: tuple[str, ...] = ("cpu", "cuda")
LAYOUTS: tuple[str, ...] = ("fragmented", "contiguous")
"""fragmented: pages come from a shuffled free list; contiguous: consecutive pages."""


@dataclass(frozen=True)
class Point:
    """One input configuration: a request slice of `seq_len` tokens in pages of `page_size`."""

    seq_len: int
    page_size: int
    dtype: str = "int32"
    device: str = "cpu"
    layout: str = "fragmented"
    seed: int = 0

    def __post_init__(self) -> None:
        check_seq_len(self.seq_len)
        check_page_size(self.page_size)
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("device", self.device, DEVICES)
        check_choice("layout", self.layout, LAYOUTS)

    @property
    def num_pages(self) -> int:
        return math.ceil(self.seq_len / self.page_size)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def id(self) -> str:
        """Short id used in pytest ids and benchmark groups, e.g. 's8192-p64-int32-fragmented'."""
        return f"s{self.seq_len}-p{self.page_size}-{self.dtype}-{self.layout}"


@dataclass(frozen=True)
class Sweep:
    """The axes of a run; `points(device)` expands their cross product.

    `time_budget_s` is the timed wall time each (variant, point) benchmark aims
    for; rounds are bounded by `min_rounds` and `max_rounds`.
    """

    name: str
    seq_lens: tuple[int, ...]
    page_sizes: tuple[int, ...]
    dtypes: tuple[str, ...] = ("int32",)
    layouts: tuple[str, ...] = ("fragmented",)
    seed: int = 0
    time_budget_s: float = 0.25
    min_rounds: int = 10
    max_rounds: int = 1000

    def __post_init__(self) -> None:
        for axis in ("seq_lens", "page_sizes", "dtypes", "layouts"):
            if not getattr(self, axis):
                raise ValueError(f"sweep {self.name!r}: axis {axis} is empty")
        for seq_len in self.seq_lens:
            check_seq_len(seq_len)
        for page_size in self.page_sizes:
            check_page_size(page_size)
        for dtype in self.dtypes:
            check_choice("dtype", dtype, DTYPES)
        for layout in self.layouts:
            check_choice("layout", layout, LAYOUTS)
        if not (self.time_budget_s > 0 and math.isfinite(self.time_budget_s)):
            raise ValueError(f"time budget must be a positive number of seconds, got {self.time_budget_s!r}")
        if not 1 <= self.min_rounds <= self.max_rounds:
            raise ValueError(f"need 1 <= min_rounds <= max_rounds, got {self.min_rounds} and {self.max_rounds}")

    def points(self, device: str) -> Iterator[Point]:
        """Points ordered by dtype, layout, page size, then sequence length."""
        for dtype, layout, page_size, seq_len in itertools.product(
            self.dtypes, self.layouts, self.page_sizes, self.seq_lens
        ):
            yield Point(seq_len, page_size, dtype, device, layout, self.seed)

    def replace(self, **changes: object) -> "Sweep":
        """A copy with some axes replaced (validated again)."""
        return dataclasses.replace(self, **changes)


_DEFAULT_SEQ_LENS = (512, 2048, 8192, 32768, 131072, 524288)

PRESETS: dict[str, Sweep] = {
    preset.name: preset
    for preset in (
        Sweep("quick", seq_lens=(512, 8192), page_sizes=(1, 64), time_budget_s=0.02, max_rounds=200),
        Sweep("default", seq_lens=_DEFAULT_SEQ_LENS, page_sizes=(1, 16, 64, 128)),
        Sweep(
            "full",
            # 1M and 2M tokens: the longest contexts served today; a point that does not
            # fit the device is recorded as skipped (out of memory), not dropped.
            seq_lens=_DEFAULT_SEQ_LENS + (1048576, 2097152),
            page_sizes=(1, 16, 32, 64, 128, 256),
            dtypes=DTYPES,
            time_budget_s=0.5,
        ),
    )
}
"""Named sweeps: `quick` (seconds, what CI runs), `default` (`make bench`), `full`."""


def get_preset(name: str) -> Sweep:
    """The preset called `name`; an unknown name raises a ValueError listing the presets."""
    check_choice("preset", name, PRESETS)
    return PRESETS[name]
