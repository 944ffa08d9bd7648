"""Seeded workloads that look like SGLang's: request rows of a `req_to_token` pool.

SGLang keeps the KV token index of every token of a request in an int32 `req_to_token[max_reqs,
max_context_len]` tensor on the GPU. Page `g` owns tokens `g*page_size ... g*page_size + page_size-1`, and a
request's pages come from a free list, shuffled as requests come and go (fragmented) or in order (contiguous).
A sent chunk is the row slice `req_to_token[row, start:end]`, starting at a page boundary.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvpages.core.capacity import HEADROOM, host_available_bytes
from kvpages.core.checks import check_positive
from kvpages.core.payloads import DEFAULT_PAYLOADS, PAYLOADS, SWA_POOL
from kvpages.core.scenarios import Call, Scenario, Upkeep, mirror_upkeep
from kvpages.core.sweep import Point, pool_pages
from kvpages.measure.payloads import Conversions, conversions, host_translation, shuffled_pages, swa_mapping
from kvpages.measure.steps import Refresh, StepExtra
from kvpages.measure.variants import EXTRA_INPUTS, HostPages, check_kv_indices, reference_page_indices

TORCH_DTYPES: dict[str, torch.dtype] = {"int32": torch.int32, "int64": torch.int64}


@dataclass(frozen=True)
class Workload:
    """The inputs of one target: the sets the timed rounds rotate among, slices of one `req_to_token` pool (a
    point's: one tensor each; a scenario's: a tuple of slices, one per call), and each set's expected output."""

    pool: torch.Tensor
    inputs: tuple[Any, ...]
    expected: tuple[Any, ...]
    page_size: int = 1
    calls: tuple[tuple[Call, ...], ...] = ()
    """Per input set, where each of its slices lies in the pool (absolute rows)."""
    upkeep: tuple[Upkeep, ...] = ()
    """Per input set (rows relative to the set's first row), what keeping a host-side table costs."""
    built_extras: dict[str, tuple[StepExtra, ...]] = field(default_factory=dict, compare=False, repr=False)

    def extra(self, name: str) -> tuple[StepExtra, ...]:
        """The extra input `name` (kvpages.measure.variants.EXTRA_INPUTS) for each input set, built on first use
        (outside anything timed) and shared with the fresh copies."""
        if name not in self.built_extras:
            self.built_extras[name] = EXTRA_BUILDERS[name](self)
        return self.built_extras[name]

    def fresh_copy(self) -> Workload:
        """The same inputs in a copy of the pool, every slice at the same place in it (the expected outputs and the
        host-side extras are shared: they are never written, or rewritten with the same values)."""
        pool = self.pool.clone()

        def moved(view: torch.Tensor) -> torch.Tensor:
            return pool.as_strided(view.size(), view.stride(), view.storage_offset())

        inputs = tuple(moved(x) if isinstance(x, torch.Tensor) else x.moved(moved) if isinstance(x, Conversions)
                       else tuple(moved(t) for t in x) for x in self.inputs)
        return replace(self, pool=pool, inputs=inputs)


def host_pages(workload: Workload) -> tuple[StepExtra, ...]:
    """The `host_pages` extra: a host mirror of the pool's page table (`table[row, page]`), filled from the pool
    once, and per input set where each slice's pages lie in it and the upkeep D2H due before a call."""
    p = workload.page_size
    # divided on the host, as reference_page_indices does, into a new array (also at p = 1): numpy divides by a
    # constant without torch's per-element floor (the CPU default grid's tables: 0.38-0.40 -> 0.20-0.24 s a process)
    table = np.ascontiguousarray(workload.pool[:, ::p].cpu().numpy() // p)
    out = []
    for calls in workload.calls:
        first_row = min(c.row for c in calls)
        refreshes = {}
        for u in workload.upkeep:
            rows = np.array([first_row + r for r, _ in u.pages], dtype=np.int64)
            pages = np.array([page for _, page in u.pages], dtype=np.int64)
            source = (workload.pool[torch.from_numpy(rows).to(workload.pool.device),
                                    torch.from_numpy(pages * p).to(workload.pool.device)] // p).contiguous()
            refreshes[u.before_call] = Refresh(source, table, rows, pages)
        out.append(StepExtra(tuple(HostPages(table, c.row, c.start // p) for c in calls), refreshes))
    return tuple(out)


EXTRA_BUILDERS: dict[str, Callable[[Workload], tuple[StepExtra, ...]]] = {"host_pages": host_pages}
if set(EXTRA_BUILDERS) != set(EXTRA_INPUTS):
    raise ImportError(f"extra inputs without a builder: {sorted(set(EXTRA_INPUTS) - set(EXTRA_BUILDERS))}")


@dataclass(frozen=True)
class PoolCache:
    """Pools an earlier process of the same run built and checked, as files in the run's worker folder: a pool is a
    pure function of its arguments, and a later process loads it into its own memory instead of building and
    checking it again (a long fragmented pool shuffles millions of pages: a second or more)."""

    folder: Path

    def path(self, key: tuple) -> Path:
        return self.folder / f"pool-{hashlib.sha1(repr(key).encode()).hexdigest()[:16]}.pt"

    def load(self, key: tuple) -> torch.Tensor | None:
        path = self.path(key)
        return torch.load(path, weights_only=True) if path.exists() else None

    def save(self, key: tuple, pool: torch.Tensor) -> None:
        """Keep `pool` for later processes; a full disk only costs them the build."""
        path = self.path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
        try:
            torch.save(pool, tmp)
            os.replace(tmp, path)
        except (OSError, RuntimeError):
            tmp.unlink(missing_ok=True)


def _build_pool(lengths: Sequence[int], page_size: int, dtype: str, layout: str, seed: int) -> torch.Tensor:
    """A `req_to_token` pool with one row per length, its pages taken in turn from one free list of pages
    1..pool_pages (page 0 is SGLang's padding slot), shuffled for `fragmented`; rows are padded with 0. Built in the
    pool's own dtype (every token index fits it: Point checks), each page's tokens at once for every row."""
    pages_per_row = [math.ceil(n / page_size) for n in lengths]
    handed_out = sum(pages_per_row)
    index = TORCH_DTYPES[dtype]
    if layout == "fragmented":  # the same values as randperm's int64, half the bytes to write
        free_pages = torch.randperm(pool_pages(handed_out), generator=torch.Generator().manual_seed(seed),
                                    dtype=index)[:handed_out].add_(1)
    else:
        free_pages = torch.arange(1, handed_out + 1, dtype=index)
    tokens = free_pages if page_size == 1 else \
        (free_pages[:, None] * page_size + torch.arange(page_size, dtype=index)).reshape(-1)
    pool = torch.zeros((len(lengths), max(lengths)), dtype=index)
    start = 0
    for row, (n, pages) in enumerate(zip(lengths, pages_per_row, strict=True)):
        pool[row, :n] = tokens[start:start + n]
        start += pages * page_size
    return pool


@dataclass(frozen=True)
class PoolSpec:
    """A `req_to_token` pool as its arguments (a pure function of them) and the slices the calls take of it."""

    lengths: tuple[int, ...]
    calls: tuple[tuple[Call, ...], ...]  # per input set
    page_size: int
    dtype: str
    layout: str
    seed: int

    @property
    def key(self) -> tuple:
        """What the pool is a function of (PoolCache's key): two specs of one key share a pool, not their slices."""
        return self.lengths, self.page_size, self.dtype, self.layout, self.seed

    @property
    def nbytes(self) -> int:
        return len(self.lengths) * max(self.lengths) * int(TORCH_DTYPES[self.dtype].itemsize)

    def host(self, cache: PoolCache | None, validate: bool) -> torch.Tensor:
        """The pool on the host: from the `cache`, or built, its slices checked (`validate`), and kept there."""
        key = self.key
        host = cache.load(key) if cache is not None else None
        if host is None:
            host = _build_pool(self.lengths, self.page_size, self.dtype, self.layout, self.seed)
            distinct = dict.fromkeys((c.row, c.start, c.end) for copy in self.calls for c in copy)  # payloads share
            for row, start, end in distinct if validate else ():
                if start % self.page_size == 0:  # a decode prefix may start mid-page
                    validate_page_layout(host[row, start:end], self.page_size)
            if cache is not None:
                cache.save(key, host)
        return host


def point_pool(point: Point, rotation: int | None = None, chunk_offset_pages: int = 0) -> PoolSpec:
    """`rotation` request rows for `point`, and from each a chunk of `point.seq_len` tokens that starts
    `chunk_offset_pages` pages into its request."""
    geometry = point.geometry(rotation, chunk_offset_pages)
    start = chunk_offset_pages * point.page_size
    return PoolSpec((geometry.row_tokens,) * geometry.rows,
                    tuple((Call(row, start, geometry.row_tokens),) for row in range(geometry.rows)),
                    point.page_size, point.dtype, point.layout, point.seed)


def scenario_pool(scenario: Scenario, copies: int, seed: int = 0) -> PoolSpec:
    """`copies` sets of the scenario's rows, each set's calls with their rows in the pool."""
    per_copy = len(scenario.lengths)
    calls = tuple(tuple(c._replace(row=k * per_copy + c.row) for c in scenario.calls()) for k in range(copies))
    return PoolSpec(tuple(scenario.lengths) * copies, calls, scenario.page_size, scenario.dtype, scenario.layout, seed)


def make_workload(point: Point, rotation: int | None = None, chunk_offset_pages: int = 0,
                  cache: PoolCache | None = None, validate: bool = False) -> Workload:
    """The inputs of `point_pool(point, rotation, chunk_offset_pages)`: the same for the same point, whatever the
    device. `validate`: every slice is checked against the page invariant (in the process that builds the pool)."""
    sets = _workload(point_pool(point, rotation, chunk_offset_pages), point.device, cache, validate)
    return replace(sets, inputs=tuple(x for x, in sets.inputs), expected=tuple(e for e, in sets.expected))


def make_scenario_workload(scenario: Scenario, device: str, copies: int, seed: int = 0,
                           cache: PoolCache | None = None) -> Workload:
    """The pool of `copies` sets of the scenario's rows, and each set's calls as slices with their references."""
    made = _workload(scenario_pool(scenario, copies, seed), device, cache, True, mirror_upkeep(scenario))
    return made if scenario.payloads == DEFAULT_PAYLOADS else _converted(made, seed)


def _converted(workload: Workload, seed: int) -> Workload:
    """A workload of several payloads per send: each input set as `Conversions`, an SWA payload's reference that of
    its slice translated on the host (kvpages.measure.payloads)."""
    p = workload.page_size
    sigma = shuffled_pages(int(workload.pool.max()) // p, seed)
    mapping = swa_mapping(sigma, p, str(workload.pool.device))
    expected = tuple(tuple(reference_page_indices(host_translation(sigma, kv, p), p) if PAYLOADS[c.payload].pool == SWA_POOL
                           else e for kv, c, e in zip(views, calls, refs, strict=True))
                     for views, calls, refs in zip(workload.inputs, workload.calls, workload.expected, strict=True))
    inputs = tuple(conversions(views, calls, mapping) for views, calls in zip(workload.inputs, workload.calls, strict=True))
    return replace(workload, inputs=inputs, expected=expected)


def _workload(spec: PoolSpec, device: str, cache: PoolCache | None, validate: bool,
              upkeep: tuple[Upkeep, ...] = ()) -> Workload:
    """The spec's pool (`PoolSpec.host`) on `device`, and per set its calls' slices of it (a tuple) and their
    references."""
    pool = spec.host(cache, validate).to(device).contiguous()
    slices = tuple(tuple(pool[c.row, c.start:c.end] for c in copy) for copy in spec.calls)
    expected = tuple(tuple(reference_page_indices(v, spec.page_size) for v in views) for views in slices)
    return Workload(pool, slices, expected, spec.page_size, spec.calls, upkeep)


BUILD_PEAK = 4
"""A pool's build holds at most about this many times the pool's bytes at once (the pool, its tokens, the shuffled
free list in the pool's dtype, a slice checked in int64): how many `keep_pools` builds fit in the free memory."""


def keep_pools(specs: Sequence[PoolSpec], cache: PoolCache, threads: int) -> None:
    """Build each pool of `specs` into the run's `cache` once, every slice any of them takes checked, largest first on
    `threads` threads at once: the first process of a run builds every pool before its first block, on every CPU it
    may use (torch shuffles and copies without the GIL) and as many as fit in the free memory (core.capacity's
    headroom) beside every pool kept, and loads each when it needs it, as the later processes do.
    A build that fails is left to its block, which builds it again and says why (out of memory, say)."""
    merged: dict[tuple, PoolSpec] = {}
    for spec in specs:
        kept = merged.get(spec.key)
        merged[spec.key] = spec if kept is None else replace(kept, calls=tuple(dict.fromkeys(kept.calls + spec.calls)))

    def build(spec: PoolSpec) -> None:
        with contextlib.suppress(Exception):  # raised again, and reported, where the block builds it
            spec.host(cache, validate=True)

    ordered = sorted(merged.values(), key=lambda spec: -spec.nbytes)
    available = host_available_bytes()  # builds at once only where the largest ones fit beside each other and beside
    room = 0 if available is None else int(HEADROOM * available) - sum(s.nbytes for s in ordered)  # every pool kept
    threads = min(threads, room // max(1, BUILD_PEAK * ordered[0].nbytes)) if ordered else 1  # (/dev/shm is memory)
    if threads <= 1 or len(ordered) <= 1:
        for spec in ordered:
            build(spec)
        return
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(build, ordered))


def validate_page_layout(kv_indices: torch.Tensor, page_size: int) -> None:
    """Check the invariant the conversion relies on (token `i` belongs to page `i // page_size`, whose first token
    is a non-negative multiple of page_size and its tokens consecutive); a ValueError names the first violation."""
    check_kv_indices(kv_indices)
    check_positive("page_size", page_size)
    n = kv_indices.numel()
    if n == 0 or _keeps_page_layout(kv_indices, page_size):
        return
    kv = kv_indices.to(torch.int64)
    firsts = kv[::page_size]
    bad = (firsts < 0) | (firsts % page_size != 0)
    if bool(bad.any()):
        page = int(bad.nonzero()[0])
        raise ValueError(f"kv_indices break the page invariant: position {page * page_size} (first token of page "
                         f"{page}) holds {int(firsts[page])}, which is not a non-negative multiple of page_size={page_size}")
    expected = firsts.repeat_interleave(page_size)[:n] + torch.arange(n, device=kv.device) % page_size
    wrong = kv != expected
    if bool(wrong.any()):
        i = int(wrong.nonzero()[0])
        raise ValueError(f"kv_indices break the page invariant: position {i} holds {int(kv[i])}, expected "
                         f"{int(expected[i])} (tokens of a page must be consecutive; page_size={page_size})")


def _keeps_page_layout(kv: torch.Tensor, page_size: int) -> bool:
    """Whether `kv` keeps the page invariant, in its own dtype and about three passes over it (the search for the
    first violation, which names it, takes about eight at int64)."""
    if page_size == 1:
        return bool((kv >= 0).all())
    full = kv.numel() - kv.numel() % page_size
    steps = torch.arange(page_size, dtype=kv.dtype, device=kv.device)
    pages = [p for p in (kv[:full].reshape(-1, page_size), kv[full:].reshape(1, -1)) if p.numel()]
    return all(bool((p[:, 0] >= 0).all()) and bool((p[:, 0] % page_size == 0).all())
               and bool((p - p[:, :1] == steps[:p.shape[1]]).all()) for p in pages)
