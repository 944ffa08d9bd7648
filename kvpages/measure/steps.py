"""Step variants: `(list of kv slices, page_size) -> list of page-index arrays`, one scheduler step's worth.

The registry holds `per_request[<v>]` for every single-call variant v (kvpages.measure.variants): each
slice converted on its own, which is what SGLang does today; and batched hypotheses, one
decorated function each, at the bottom of this file. A step variant may be asynchronous: it
returns a `Pending` whose `wait()` gives the arrays, so the calling (scheduler) thread is
blocked only until it returns, and a worker thread waits for the data, as SGLang's Mooncake
path does ("The schedule stream may wait on the in-flight forward; move the D2H wait to the
transfer worker").
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvpages.core.names import per_request_name, per_request_of
from kvpages.measure.variants import Moves, Variant, all_variants, check_declared, unavailable_reason

Arrays = list[np.ndarray]


class Pending:
    """Page indices on their way to the host; `wait()` blocks until they are there and returns them."""

    def __init__(self, wait: Callable[[], Arrays]) -> None:
        self._wait = wait

    def wait(self) -> Arrays:
        return self._wait()


StepFn = Callable[..., "Arrays | Pending"]
"""`fn(kv_slices, page_size, **extras) -> Arrays | Pending`."""


@dataclass(frozen=True)
class Refresh:
    """One upkeep D2H of a host-side table: `table[rows, pages] = source.cpu().numpy()` (kvpages.core.scenarios.Upkeep)."""

    source: torch.Tensor
    table: np.ndarray
    rows: np.ndarray
    pages: np.ndarray

    def __call__(self) -> None:
        self.table[self.rows, self.pages] = self.source.cpu().numpy()


@dataclass(frozen=True)
class StepExtra:
    """An extra input over a request or step: its value for each call, and the upkeep due before a call."""

    calls: tuple[Any, ...]
    upkeep: dict[int, Refresh] = field(default_factory=dict)

    @property
    def device_tensors(self) -> tuple[torch.Tensor, ...]:
        """What the upkeep copies from the device (the meter counts it as device side, on a CPU run too)."""
        return tuple(r.source for r in self.upkeep.values())


@dataclass(frozen=True)
class StepVariant:
    name: str
    fn: StepFn
    description: str
    doc: str
    moves: Moves
    batched: bool  # one D2H for the whole step, instead of one per request
    requires: tuple[str, ...]
    module: str
    """Where it was registered (a conftest's step variants are imported by the cross-check process too)."""
    extras: tuple[str, ...] = ()
    """Extra inputs (kvpages.measure.variants.EXTRA_INPUTS), each a StepExtra, by keyword."""

    def unavailable_reason(self, device: str) -> str | None:
        return unavailable_reason(self.requires, device)

    def expected_d2h_bytes(self, tokens: Sequence[int], page_size: int, itemsize: int) -> int:
        return sum(self.moves.expected_d2h_bytes(n, page_size, itemsize) for n in tokens)

    def expected_transfers(self, calls: int) -> int:
        if self.moves is Moves.NONE:
            return 0
        return 1 if self.batched else calls


_REGISTRY: dict[str, StepVariant] = {}


def _register(variant: StepVariant) -> None:
    if variant.name in _REGISTRY or per_request_of(variant.name) is not None:
        raise ValueError(f"step variant {variant.name!r} is already registered; choose another name")
    _REGISTRY[variant.name] = variant


def step_variant(name: str, *, moves: Moves, batched: bool, requires: tuple[str, ...] = (),
                 extras: tuple[str, ...] = ()) -> Callable[[StepFn], StepFn]:
    """Register the decorated function as step variant `name`; its docstring's first line describes it."""
    check_declared(name, requires, extras)

    def register(fn: StepFn) -> StepFn:
        doc = inspect.getdoc(fn)
        if not doc:
            raise ValueError(f"step variant {name!r} needs a docstring: its first line is the description")
        _register(StepVariant(name, fn, doc.splitlines()[0], doc, moves, batched, tuple(requires), fn.__module__,
                              tuple(extras)))
        return fn

    return register


def _per_request(v: Variant) -> StepFn:
    fn = v.fn
    if not v.extras:
        def run(kv_slices: Sequence[torch.Tensor], page_size: int) -> Arrays:
            return [fn(kv, page_size) for kv in kv_slices]

        return run

    def run_with(kv_slices: Sequence[torch.Tensor], page_size: int, **extras: StepExtra) -> Arrays:
        out = []
        for i, kv in enumerate(kv_slices):
            for extra in extras.values():  # the upkeep of this scheduler step, before its conversion
                if i in extra.upkeep:
                    extra.upkeep[i]()
            out.append(fn(kv, page_size, **{name: extra.calls[i] for name, extra in extras.items()}))
        return out

    return run_with


_PER_REQUEST: dict[tuple[Variant, ...], dict[str, StepVariant]] = {}


def _per_request_variants() -> dict[str, StepVariant]:
    """per_request[<v>] for every single-call variant registered now (a conftest's too); made once per registry."""
    registered = all_variants()
    if registered not in _PER_REQUEST:
        _PER_REQUEST.clear()  # the registry grew (a conftest, --kv-sglang): the new set replaces the old
        _PER_REQUEST[registered] = _make_per_request(registered)
    return _PER_REQUEST[registered]


def _make_per_request(registered: tuple[Variant, ...]) -> dict[str, StepVariant]:
    def described(v: Variant) -> tuple[str, str]:
        if not v.extras:
            return (f"Each request converted on its own with {v.name}, as SGLang's PD paths do.",
                    f"Each request converted on its own with {v.name}: one D2H per request.")
        return (f"Each request converted on its own with {v.name}, plus the upkeep of its {', '.join(v.extras)} "
                "(one batched D2H per scheduler step).", f"Each request converted on its own with {v.name}, after the "
                f"upkeep its {', '.join(v.extras)} needs in that step (kvpages.core.scenarios.EXTRA_UPKEEP).")

    return {per_request_name(v.name): StepVariant(
        per_request_name(v.name), _per_request(v), described(v)[0], f"{described(v)[1]}\n\n{v.doc}", v.moves, False,
        v.requires, v.fn.__module__, v.extras,
    ) for v in registered}


def all_step_variants() -> tuple[StepVariant, ...]:
    return tuple({**_per_request_variants(), **_REGISTRY}.values())


def step_variant_names() -> tuple[str, ...]:
    return tuple(v.name for v in all_step_variants())


def get_step_variant(name: str) -> StepVariant:
    variants = {v.name: v for v in all_step_variants()}
    if name not in variants:
        raise ValueError(f"unknown step variant {name!r}; valid: {', '.join(variants)}")
    return variants[name]


def _split(on_host: np.ndarray, sizes: list[int]) -> Arrays:
    return list(np.split(on_host, np.cumsum(sizes)[:-1])) if sizes else []


# --------------------------------------------------------------------------------------
# Batched hypotheses. Bodies are literal.
# --------------------------------------------------------------------------------------


@step_variant("batched_device_stride", moves=Moves.PAGES, batched=True)
def batched_device_stride(kv_slices: Sequence[torch.Tensor], page_size: int) -> Arrays:
    """Stride and divide every request on the device, concatenate, one D2H for the step, split on the host.

    Hypothesis: a step of B requests pays B copies' fixed cost (and B synchronisations of the
    scheduler stream) per-request; one copy of the concatenated page indices pays it once, for
    B small kernels and one concatenation on the device. It should win once B is more than a few.
    """
    pages = [kv[::page_size] // page_size for kv in kv_slices]
    host = torch.cat(pages).cpu().numpy()
    return _split(host, [p.numel() for p in pages])


@step_variant("batched_device_stride_pinned", moves=Moves.PAGES, batched=True, requires=("cuda",))
def batched_device_stride_pinned(kv_slices: Sequence[torch.Tensor], page_size: int) -> Pending:
    """The batched step with one non-blocking copy into pinned memory; a worker waits on its event.

    Hypothesis: as `batched_device_stride`, and the scheduler thread is not blocked behind the
    work already queued on the stream (the in-flight forward): it returns as soon as the copy is
    enqueued, while the transfer worker waits for the event, as SGLang's Mooncake path does.
    """
    pages = [kv[::page_size] // page_size for kv in kv_slices]
    flat = torch.cat(pages)
    host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
    host.copy_(flat, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    sizes = [p.numel() for p in pages]

    def wait() -> Arrays:
        done.synchronize()
        return _split(host.numpy(), sizes)

    return Pending(wait)
