"""The sweep: a `Point` is one input configuration, a `Sweep` the cross product of its axes (presets: kvpages.core.presets).
No torch."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kvpages.core.checks import check_choice, check_positive
from kvpages.core.names import point_id

DTYPES: tuple[str, ...] = ("int32", "int64")
"""Index dtypes: int32 is what SGLang's `req_to_token` holds."""
ITEMSIZE: dict[str, int] = {"int32": 4, "int64": 8}


def paged_bytes(seq_len: Any, page_size: Any, itemsize: Any) -> Any:  # ints, or numpy arrays or pandas columns
    """The bytes of ceil(seq_len / page_size) indices of `itemsize` bytes: the ideal a call that hands the host one
    index per page moves (the bytes chart's line, its caption, and a variant's declared bytes)."""
    return -(-seq_len // page_size) * itemsize


INDEX_MAX: dict[str, int] = {"int32": 2**31 - 1, "int64": 2**63 - 1}
DEVICES: tuple[str, ...] = ("cpu", "cuda")
LAYOUTS: tuple[str, ...] = ("fragmented", "contiguous")
"""fragmented: pages come from a shuffled free list; contiguous: consecutive pages."""

ROTATION_TARGET_BYTES = 64 * 2**20
MIN_ROTATION = 2
MAX_ROTATION = 32
"""Timed rounds rotate among 2 to 32 request rows that together span 64 MiB, more than the 50-60 MB L2 of an
H100/H200, so long rows are not timed out of a warm cache (short ones stay partly cached, as in production)."""


def pool_pages(handed_out: int) -> int:
    """The pages of a pool that hands out `handed_out` pages: some slack, so a shuffled free list leaves holes."""
    return handed_out + max(1, handed_out // 8)


def max_token_index(pages: int, page_size: int) -> int:
    return pages * page_size + page_size - 1


@dataclass(frozen=True)
class Point:
    """One input configuration: a request slice of `seq_len` tokens in pages of `page_size`."""

    seq_len: int
    page_size: int
    dtype: str = "int32"
    device: str = "cpu"
    layout: str = "fragmented"
    seed: int = 0
    check_range: bool = dataclasses.field(default=True, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_positive("seq_len", self.seq_len)
        check_positive("page_size", self.page_size)
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("device", self.device, DEVICES)
        check_choice("layout", self.layout, LAYOUTS)
        if self.check_range:
            needed = self.geometry().max_token_index
            if needed > INDEX_MAX[self.dtype]:
                raise ValueError(f"seq_len {self.seq_len} at page_size {self.page_size} needs token indices up to "
                                 f"{needed}, beyond {self.dtype}'s maximum {INDEX_MAX[self.dtype]}; the largest valid "
                                 f"seq_len for {self.dtype} at page_size {self.page_size} is "
                                 f"{largest_seq_len(self.page_size, self.dtype)}")

    @property
    def num_pages(self) -> int:
        return math.ceil(self.seq_len / self.page_size)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def rotation(self) -> int:
        """How many distinct request rows the timed rounds rotate among."""
        row_bytes = self.seq_len * self.itemsize
        return max(MIN_ROTATION, min(MAX_ROTATION, math.ceil(ROTATION_TARGET_BYTES / row_bytes)))

    def geometry(self, rotation: int | None = None, chunk_offset_pages: int = 0) -> PoolGeometry:
        """The pool of `rotation` rows (default: `self.rotation`), each `chunk_offset_pages` pages before the slice."""
        rows = self.rotation if rotation is None else rotation
        if rows < 1:
            raise ValueError(f"rotation must be >= 1, got {rows}")
        if chunk_offset_pages < 0:
            raise ValueError(f"chunk_offset_pages must be >= 0, got {chunk_offset_pages}")
        row_tokens = chunk_offset_pages * self.page_size + self.seq_len
        pages_per_row = math.ceil(row_tokens / self.page_size)
        return PoolGeometry(rows, row_tokens, pages_per_row, pool_pages(rows * pages_per_row), self.page_size, self.itemsize)

    @property
    def id(self) -> str:
        """E.g. 's8192-p64-int32-fragmented': in pytest ids and benchmark groups."""
        return point_id(self.seq_len, self.page_size, self.dtype, self.layout)


@dataclass(frozen=True)
class PoolGeometry:
    """The `req_to_token` pool a point's inputs are cut from (kvpages.measure.inputs), and what it costs: pages
    1..pool_pages are handed out (page 0 is SGLang's padding slot)."""

    rows: int
    row_tokens: int
    pages_per_row: int
    pool_pages: int
    page_size: int
    itemsize: int

    @property
    def max_token_index(self) -> int:
        return max_token_index(self.pool_pages, self.page_size)

    @property
    def pool_bytes(self) -> int:
        """The pool itself: what the session keeps of a point between passes."""
        return self.itemsize * self.rows * self.row_tokens

    def memory_bytes(self, device: str) -> dict[str, int]:
        """Peak bytes on the host (and the CUDA device) while the inputs are built (host: int64 page ids x3, every token in
        int64, the pool) and checked (33 B per token of a row: int64 row, positions, expected row, a bool mask)."""
        tokens_int64 = 8 * self.rows * self.pages_per_row * self.page_size
        page_ids = 3 * 8 * self.pool_pages
        check_row = 33 * self.row_tokens
        if device == "cpu":
            return {"host": page_ids + tokens_int64 + 2 * self.pool_bytes + check_row}
        return {"host": page_ids + tokens_int64 + self.pool_bytes, "cuda": self.pool_bytes + check_row}


def largest_seq_len(page_size: int, dtype: str) -> int:
    """The largest seq_len whose pool's token indices fit `dtype` at `page_size` (default rotation), by bisection."""
    def too_long(seq_len: int) -> bool:
        return Point(seq_len, page_size, dtype, check_range=False).geometry().max_token_index > INDEX_MAX[dtype]

    return bisect.bisect_left(range(1, INDEX_MAX[dtype] + 1), True, key=too_long)


@dataclass(frozen=True)
class Sweep:
    """The axes of a run. Each (variant, point) is timed in `repetitions` blocks, dealt to `processes` processes and
    within each to `passes` sweeps over the points (kvpages.measure.schedule), for `time_budget_s` of timed wall time
    over all its repetitions, each block's rounds bounded by `min_rounds` and `max_rounds`."""

    name: str
    seq_lens: tuple[int, ...]
    page_sizes: tuple[int, ...]
    dtypes: tuple[str, ...] = ("int32",)
    layouts: tuple[str, ...] = ("fragmented",)
    seed: int = 0
    time_budget_s: float = 0.25
    repetitions: int = 10
    passes: int = 10
    processes: int = 1
    """Fresh processes the repetitions are dealt to, run one after another (1: time in the pytest process)."""
    min_rounds: int = 10
    max_rounds: int = 200
    """A short call's block fills its share of the budget up to this many rounds (all kept in samples.csv)."""

    def __post_init__(self) -> None:
        for axis in ("seq_lens", "page_sizes", "dtypes", "layouts"):
            if not getattr(self, axis):
                raise ValueError(f"sweep {self.name!r}: axis {axis} is empty")
        list(self.points("cpu"))  # each point checks its values, and that its token indices fit its dtype
        if not (self.time_budget_s > 0 and math.isfinite(self.time_budget_s)):
            raise ValueError(f"time budget must be a positive number of seconds, got {self.time_budget_s!r}")
        for count in ("repetitions", "passes", "processes"):
            check_positive(count, getattr(self, count))
        if self.processes > self.repetitions:
            raise ValueError(f"{self.processes} processes but {self.repetitions} repetitions: every process times "
                             f"at least one repetition of each case; give at most {self.repetitions} processes")
        if not 1 <= self.min_rounds <= self.max_rounds:
            raise ValueError(f"need 1 <= min_rounds <= max_rounds, got {self.min_rounds} and {self.max_rounds}")

    def points(self, device: str) -> Iterator[Point]:
        """Points ordered by dtype, layout, page size, then sequence length."""
        for dtype, layout, page_size, seq_len in itertools.product(self.dtypes, self.layouts, self.page_sizes, self.seq_lens):
            yield Point(seq_len, page_size, dtype, device, layout, self.seed)
