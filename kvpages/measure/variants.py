"""The variants: implementations of "KV token indices on the device -> page indices on the host".

Add one as a decorated function at the bottom of this file; its docstring's first line is its description
(`kvpages list`), the rest its hypothesis:

    @variant("my_variant", moves=Moves.PAGES)
    def my_variant(kv_indices: torch.Tensor, page_size: int) -> np.ndarray: ...

Bodies stay literal: calling through the registry checks the arguments, and the harness checks them once per
point, outside anything timed. A variant may declare its host syncs per call (`syncs=Syncs(cuda, cpu)`; by
default one when it moves anything) and extra inputs (`extras=("host_pages",)`, from `EXTRA_INPUTS`).
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvpages.core.adaptive import on_device
from kvpages.core.checks import check_positive
from kvpages.core.sglang import PREFIX
from kvpages.core.sweep import paged_bytes

VariantFn = Callable[..., np.ndarray]
"""`fn(kv_indices, page_size, **extras) -> page indices on the host`."""


class Moves(enum.Enum):
    """Which elements a variant hands to the host: its expected D2H bytes."""

    TOKENS = "tokens"  # every token index: seq_len * itemsize bytes
    PAGES = "pages"  # one index per page: ceil(seq_len / page_size) * itemsize bytes
    NONE = "none"  # nothing: 0 bytes in 0 transfers (the page indices are already on the host)
    BY_LENGTH = "by length"  # PAGES from the adaptive threshold on (above page size 1), TOKENS below (core.adaptive)

    def expected_d2h_bytes(self, seq_len: int, page_size: int, itemsize: int) -> int:
        if self is Moves.NONE:
            return 0
        pages = self is Moves.PAGES or (self is Moves.BY_LENGTH and on_device(seq_len, page_size))
        return paged_bytes(seq_len, page_size, itemsize) if pages else seq_len * itemsize

    @property
    def expected_transfers(self) -> int | None:
        """0 for NONE (the meter must see no hand-off at all); else not fixed by the declaration."""
        return 0 if self is Moves.NONE else None

    @property
    def syncs(self) -> Syncs:
        """The host syncs per call unless the variant declares its own."""
        return NO_SYNC if self is Moves.NONE else ONE_SYNC


@dataclass(frozen=True)
class Syncs:
    """How often one call makes the calling (scheduler) thread wait for the device: its expected `host_syncs` on
    CUDA and on a CPU run, where the meter counts the blocking hand-offs instead (kvpages.measure.meter)."""

    cuda: int
    cpu: int

    def on(self, device: str) -> int:
        return self.cpu if device == "cpu" else self.cuda


ONE_SYNC = Syncs(cuda=1, cpu=1)
NO_SYNC = Syncs(cuda=0, cpu=0)


@dataclass(frozen=True)
class HostPages:
    """Where one request slice's page indices lie in the host-side page table (`host_pages` extra input):
    `table[row, page]` is page `page` of the request in pool row `row`; the slice starts at page `first_page`."""

    table: np.ndarray
    row: int
    first_page: int


EXTRA_INPUTS: dict[str, str] = {
    "host_pages": "a HostPages: where the request's page indices lie in a host-side page table that the workload "
                  "builds with the pool, outside anything timed; in whole requests and steps, keeping that table costs "
                  "one batched D2H of the pages allocated per step (kvpages.core.scenarios.mirror_upkeep)",
}
"""The extra inputs a variant may declare, by keyword (kvpages.measure.inputs builds them)."""


@dataclass(frozen=True)
class WithExtras:
    """One input set of a variant that declares extras: the slice(s), and the extras as keyword arguments."""

    inputs: Any
    extras: dict[str, Any] = field(default_factory=dict)


def call_args(inputs: Any, page_size: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The (args, kwargs) of one call on an input set: `fn(inputs, page_size)`, or with its extras by keyword."""
    if isinstance(inputs, WithExtras):
        return (inputs.inputs, page_size), inputs.extras
    return (inputs, page_size), {}


REQUIREMENTS: tuple[str, ...] = ("cuda",)


def unavailable_reason(requires: tuple[str, ...], device: str) -> str | None:
    """Why something with these requirements (a variant, a step variant) cannot run on `device`, or None."""
    if "cuda" in requires:
        if device != "cuda":
            return f"requires CUDA (pinned host memory, CUDA event); this run's device is {device}"
        if not torch.cuda.is_available():
            return "requires CUDA, but torch.cuda.is_available() is False"
    return None


@dataclass(frozen=True)
class Variant:
    """A registered implementation; calling it checks the arguments."""

    name: str
    fn: VariantFn
    description: str
    doc: str
    moves: Moves
    requires: tuple[str, ...]
    extras: tuple[str, ...] = ()
    syncs: Syncs = ONE_SYNC

    def __call__(self, kv_indices: torch.Tensor, page_size: int, **extras: Any) -> np.ndarray:
        check_kv_indices(kv_indices)
        check_positive("page_size", page_size)
        if set(extras) != set(self.extras):
            raise TypeError(f"variant {self.name!r} takes the extra inputs {', '.join(self.extras) or 'none'}, "
                            f"got {', '.join(extras) or 'none'}")
        reason = self.unavailable_reason(kv_indices.device.type)
        if reason is not None:
            raise RuntimeError(f"variant {self.name!r} cannot run here: {reason}")
        return self.fn(kv_indices, page_size, **extras)

    def unavailable_reason(self, device: str) -> str | None:
        return unavailable_reason(self.requires, device)

    def expected_d2h_bytes(self, seq_len: int, page_size: int, itemsize: int) -> int:
        return self.moves.expected_d2h_bytes(seq_len, page_size, itemsize)


_REGISTRY: dict[str, Variant] = {}


def check_declared(name: str, requires: tuple[str, ...], extras: tuple[str, ...] = ()) -> None:
    """A variant's (or step variant's) requirements and extra inputs must be known ones."""
    for what, given, valid in (("requirement", requires, REQUIREMENTS), ("extra input", extras, tuple(EXTRA_INPUTS))):
        for item in given:
            if item not in valid:
                raise ValueError(f"variant {name!r}: unknown {what} {item!r}; valid: {', '.join(valid)}")


def register(new: Variant) -> Variant:
    """Add `new` to the registry; a name registered twice is refused, naming who has it."""
    check_declared(new.name, new.requires, new.extras)
    if new.name in _REGISTRY:
        other = _REGISTRY[new.name].fn
        raise ValueError(f"variant {new.name!r} is already registered by {other.__module__}.{other.__qualname__}; "
                         "choose another name")
    _REGISTRY[new.name] = new
    return new


def variant(name: str, *, moves: Moves, requires: tuple[str, ...] = (), extras: tuple[str, ...] = (),
            syncs: Syncs | None = None) -> Callable[[VariantFn], VariantFn]:
    """Register the decorated function as variant `name`; `syncs` by default what `moves` implies (Moves.syncs)."""
    check_declared(name, requires, extras)

    def decorate(fn: VariantFn) -> VariantFn:
        doc = described("variant", name, fn)
        register(Variant(name, fn, doc.splitlines()[0], doc, moves, tuple(requires), tuple(extras),
                         moves.syncs if syncs is None else syncs))
        return fn

    return decorate


def described(what: str, name: str, fn: Callable) -> str:
    """The docstring of a (step) variant's function, which it must have: its first line is the description."""
    doc = inspect.getdoc(fn)
    if not doc:
        raise ValueError(f"{what} {name!r} needs a docstring: its first line is the description")
    return doc


def variant_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get_variant(name: str) -> Variant:
    if name not in _REGISTRY:
        unloaded = name.startswith(PREFIX) and not any(n.startswith(PREFIX) for n in _REGISTRY)
        hint = f" (an {PREFIX}<label> variant exists once --kv-sglang loads SGLang's functions)" if unloaded else ""
        raise ValueError(f"unknown variant {name!r}; valid: {', '.join(_REGISTRY)}{hint}")
    return _REGISTRY[name]


def device_of(choice: str) -> str:
    """The device `--kv-device` `choice` runs on: 'auto' is CUDA where torch has it, else the CPU."""
    return ("cuda" if torch.cuda.is_available() else "cpu") if choice == "auto" else choice


def check_runnable(names: Collection[str] | None, device: str) -> None:
    """Some of `names` can run on `device` ('auto': CUDA where available); else a ValueError naming why each cannot
    and the variants that can (a run of them alone would time nothing)."""
    if not names:
        return
    device = device_of(device)
    why = {name: get_variant(name).unavailable_reason(device) for name in names}
    if all(why.values()):
        can = [v.name for v in all_variants() if v.unavailable_reason(device) is None]
        raise ValueError(f"none can run on {device} ({'; '.join(f'{n} {r}' for n, r in why.items())}), so nothing "
                         f"would be timed; those that can: {', '.join(can)}")


def all_variants() -> tuple[Variant, ...]:
    return tuple(_REGISTRY.values())


def check_kv_indices(kv_indices: object) -> torch.Tensor:
    """Return `kv_indices` if it is a 1-D int32/int64 tensor, else raise TypeError/ValueError."""
    if not isinstance(kv_indices, torch.Tensor):
        raise TypeError(f"kv_indices must be a 1-D torch.Tensor of int32 or int64, got {type(kv_indices).__name__}")
    if kv_indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"kv_indices has dtype {kv_indices.dtype}; valid: torch.int32, torch.int64")
    if kv_indices.dim() != 1:
        raise ValueError(f"kv_indices must be 1-D, got shape {tuple(kv_indices.shape)}")
    return kv_indices


def reference_page_indices(kv_indices: torch.Tensor, page_size: int) -> np.ndarray:
    """The definition every variant must match: `kv[::page_size] // page_size` on the host (a new array: the division
    writes its own)."""
    return kv_indices.detach().cpu().numpy()[::page_size] // page_size


# --------------------------------------------------------------------------------------
# The variants. Bodies are literal: no argument checks, nothing beyond the code path.
# --------------------------------------------------------------------------------------


@variant("host_stride", moves=Moves.TOKENS)
def host_stride(kv_indices: torch.Tensor, page_size: int) -> np.ndarray:
    """Pre-PR SGLang: copy every token index to the host, then stride and divide in numpy.

    The caller did `req_to_token[req_pool_idx, start:end].cpu().numpy()` and passed the
    result to `kv_to_page_indices`, which returns early when page_size == 1.
    D2H bytes: seq_len * itemsize, in one transfer.
    """
    kv = kv_indices.cpu().numpy()
    if page_size == 1:
        return kv
    return kv[::page_size] // page_size


@variant("device_stride", moves=Moves.PAGES)
def device_stride(kv_indices: torch.Tensor, page_size: int) -> np.ndarray:
    """Merged PR: stride and divide on the device, copy only the page indices.

    SGLang PR "[PD] Stride KV token->page indices on device before D2H copy":
    about page_size times fewer D2H bytes for one extra kernel; the PR dropped the
    page_size == 1 shortcut, so at page size 1 it launches that kernel for nothing.
    """
    return (kv_indices[::page_size] // page_size).cpu().numpy()


@variant("device_stride_pinned", moves=Moves.PAGES, requires=("cuda",), syncs=ONE_SYNC)
def device_stride_pinned(kv_indices: torch.Tensor, page_size: int) -> np.ndarray:
    """Newer SGLang: stride on the device, non-blocking copy into pinned memory, wait on an event.

    The pinned buffer comes from PyTorch's caching host allocator, so after warm-up
    it is a cache hit, not a cudaHostAlloc. The returned array keeps that buffer alive.
    The copy does not block, but the event's wait does, in the calling thread: one host sync per
    call, as a blocking copy makes (a step that hands the wait to a worker makes none).
    """
    pages = kv_indices[::page_size] // page_size
    host = torch.empty(pages.shape, dtype=pages.dtype, pin_memory=True)
    host.copy_(pages, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    done.synchronize()
    return host.numpy()


@variant("device_stride_shortcut", moves=Moves.PAGES)
def device_stride_shortcut(kv_indices: torch.Tensor, page_size: int) -> np.ndarray:
    """The merged PR with the page_size == 1 shortcut restored.

    Hypothesis: page size 1 is SGLang's default on most backends, and there
    `kv[::1] // 1` is an extra kernel (and an extra device allocation) that moves
    the same bytes as copying the indices directly. Restoring the shortcut should
    make page size 1 as fast as `host_stride` while keeping `device_stride`'s byte
    savings for page sizes > 1.
    """
    if page_size == 1:
        return kv_indices.cpu().numpy()
    return (kv_indices[::page_size] // page_size).cpu().numpy()


@variant("device_shift", moves=Moves.PAGES)
def device_shift(kv_indices: torch.Tensor, page_size: int) -> np.ndarray:
    """The merged PR with a right shift instead of integer division for power-of-two page sizes.

    Hypothesis: integer division is a multi-instruction sequence on GPUs and a slow
    path on CPUs, while `>> log2(page_size)` is one instruction; floor division by
    2**k equals an arithmetic shift by k, so results are identical. If the extra
    kernel's cost is launch overhead rather than arithmetic, this changes nothing,
    which is worth knowing too.
    """
    if page_size & (page_size - 1) == 0:
        return (kv_indices[::page_size] >> (page_size.bit_length() - 1)).cpu().numpy()
    return (kv_indices[::page_size] // page_size).cpu().numpy()


@variant("host_mirror", moves=Moves.NONE, extras=("host_pages",))
def host_mirror(kv_indices: torch.Tensor, page_size: int, host_pages: HostPages) -> np.ndarray:
    """The zero-D2H floor: read the request's page indices from a host-side page table, copy nothing.

    vLLM's scheduler keeps block ids as host lists, TensorRT-LLM reads them from its C++
    KVCacheManager; SGLang keeps `req_to_token` on the GPU, so it copies. This is what a host
    mirror of the page table would cost per call: a numpy slice of the mirror (only the slice's
    length is read from the device tensor, which is host metadata).

    Hypothesis: with no copy, no kernel and no synchronize, a call costs a numpy slice, flat in
    seq_len; the gap between it and every other variant is what any D2H design can still win per
    call. Keeping the mirror is not free: whole requests and steps add its upkeep, one batched D2H
    of the pages allocated per step, so there it is compared as conversion plus upkeep.
    """
    first = host_pages.first_page
    return host_pages.table[host_pages.row, first:first - (-kv_indices.numel() // page_size)]


@variant("adaptive", moves=Moves.BY_LENGTH)
def adaptive(kv_indices: torch.Tensor, page_size: int) -> np.ndarray:
    """Choose by length: the merged PR's device stride from --kv-adaptive-threshold tokens on, pre-PR's host stride below.

    The recommendation "choose by length" as code: below the crossover (and at page size 1,
    where striding saves no byte) one copy of every token index and numpy's stride, as pre-PR;
    from it on, the merged PR's kernel and its page_size times fewer bytes.
    Hypothesis: it takes the faster of the two at every length, so it is never slower than
    either beyond the noise, on the link whose crossover set the threshold.
    """
    chosen = device_stride if on_device(kv_indices.numel(), page_size) else host_stride
    return chosen(kv_indices, page_size)
