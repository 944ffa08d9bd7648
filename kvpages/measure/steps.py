"""Step variants: `(list of kv slices, page_size) -> list of page-index arrays`, one scheduler step's worth.

The registry holds `per_request[<v>]` for every single-call variant v (each slice converted on its own, as SGLang
does today) and the batched hypotheses, one decorated function each at the bottom of this file. A step variant
may return a `Pending` whose `wait()` gives the arrays: the scheduler thread is blocked only until it returns,
and a transfer thread waits for the data, as SGLang's Mooncake path does.

A step runs in SGLang's order (docs/method.md, "The scheduler's order in a step"; kvpages.measure.order): a
`staged=True` variant's device work (its function returns the readback), the next forward, then the readback.

On a scenario of several payloads (kvpages.core.payloads) the slices come as `Conversions` (kvpages.measure.payloads):
`stage` translates the SWA payloads on the device, inside the call, and hands every variant the plain slices: a staged
variant's before the next forward, with the rest of its device work; every other's in its readback, after the forward,
as SGLang's send path translates a payload just before its copy (`translate_loc_from_full_to_swa`). A
`per_send=True` variant also gets `sends=`, the send of each slice. The strategies for such scenarios are
`per_request[device_stride]`, `batched_device_stride` and the two at the bottom of this file.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from kvpages.core.names import per_request_name, per_request_of
from kvpages.core.payloads import GATHERED, STAGED, send_runs
from kvpages.measure.meter import transfer_wait
from kvpages.measure.payloads import Conversions
from kvpages.measure.variants import (
    NO_SYNC,
    ONE_SYNC,
    Moves,
    Syncs,
    Variant,
    all_variants,
    check_declared,
    described,
    unavailable_reason,
)

Arrays = list[np.ndarray]
IN_ORDER = ("ran in order on the CPU: no streams, so the indices, the forward and the readback ran one after "
            "another on the calling thread")
"""The note on a staged variant's rows off CUDA."""


@dataclass(frozen=True)
class Pending:
    """Page indices on their way to the host; `wait()` blocks until they are there and returns them."""

    wait: Callable[[], Arrays]


Readback = Callable[[], "Arrays | Pending"]
StepFn = Callable[..., "Arrays | Pending | Readback"]
"""`fn(kv_slices, page_size, **extras) -> Arrays | Pending`; a staged variant's returns the `Readback` instead."""


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
    """Where it was registered (the cross-check process imports a conftest's step variants too)."""
    extras: tuple[str, ...] = ()
    """Extra inputs (kvpages.measure.variants.EXTRA_INPUTS), each a StepExtra, by keyword."""
    syncs: Syncs = ONE_SYNC
    """Per step when batched, else per request."""
    staged: bool = False
    itemsize: int | None = None
    """Bytes per page index when the variant fixes them (an int32 readback), else the pool's."""
    per_send: bool = False
    """One D2H per send (a request's payloads together), not per call: it takes `sends=`, the send of each slice."""
    cpu_note: str = ""
    """What its rows' note says off CUDA (how a staged variant ran without streams)."""

    def unavailable_reason(self, device: str) -> str | None:
        return unavailable_reason(self.requires, device)

    def expected_d2h_bytes(self, tokens: Sequence[int], page_size: int, itemsize: int) -> int:
        return sum(self.moves.expected_d2h_bytes(n, page_size, self.itemsize or itemsize) for n in tokens)

    def copies(self, calls: int, sends: int | None = None) -> int:
        """Its D2H copies in a request or step of `calls` calls in `sends` sends (None: one send per call)."""
        return 1 if self.batched else sends if self.per_send and sends is not None else calls

    def expected_transfers(self, calls: int, sends: int | None = None) -> int:
        return 0 if self.moves is Moves.NONE else self.copies(calls, sends)

    def expected_syncs(self, calls: int, device: str, sends: int | None = None) -> int:
        return self.copies(calls, sends) * self.syncs.on(device)

    def stage(self, kv_slices: Sequence[torch.Tensor] | Conversions, page_size: int, **extras: Any) -> Readback:
        """The work before the next forward (none unless staged), returning the readback to run after it; a scenario's
        `Conversions` are translated first, where the variant's own device work runs (module doc)."""
        sends = tuple(range(len(kv_slices))) if not isinstance(kv_slices, Conversions) else kv_slices.sends
        if self.per_send:
            extras = {**extras, "sends": sends}
        if self.staged:
            return cast(Readback, self.fn(_translated(kv_slices), page_size, **extras))
        return lambda: cast("Arrays | Pending", self.fn(_translated(kv_slices), page_size, **extras))

    def arrays(self, kv_slices: Sequence[torch.Tensor] | Conversions, page_size: int, **extras: Any) -> Arrays:
        """One step with no forward, any wait made here as the transfer thread's (kvpages.measure.meter)."""
        out = self.stage(kv_slices, page_size, **extras)()
        if isinstance(out, Pending):
            with transfer_wait():
                return out.wait()
        return out


def _translated(kv_slices: Sequence[torch.Tensor] | Conversions) -> Sequence[torch.Tensor]:
    """The slices a variant converts: a scenario's `Conversions` translated here (its device gathers), plain slices as given."""
    return kv_slices.indices() if isinstance(kv_slices, Conversions) else kv_slices


_REGISTRY: dict[str, StepVariant] = {}


def step_variant(name: str, *, moves: Moves, batched: bool, requires: tuple[str, ...] = (),
                 extras: tuple[str, ...] = (), syncs: Syncs | None = None, staged: bool = False,
                 index_dtype: torch.dtype | None = None, per_send: bool = False,
                 cpu_note: str = "") -> Callable[[StepFn], StepFn]:
    """Register the decorated function as step variant `name`, as `variant` does (its options: `StepVariant`)."""
    check_declared(name, requires, extras)

    def register(fn: StepFn) -> StepFn:
        doc = described("step variant", name, fn)
        if name in _REGISTRY or per_request_of(name) is not None:
            raise ValueError(f"step variant {name!r} is already registered; choose another name")
        _REGISTRY[name] = StepVariant(name, fn, doc.splitlines()[0], doc, moves, batched, tuple(requires), fn.__module__,
                                      tuple(extras), moves.syncs if syncs is None else syncs, staged,
                                      None if index_dtype is None else index_dtype.itemsize, per_send, cpu_note)
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


@functools.lru_cache(maxsize=1)  # the registry grows (a conftest, --kv-sglang): the new set replaces the old
def _per_request_variants(registered: tuple[Variant, ...]) -> dict[str, StepVariant]:
    """per_request[<v>] for every single-call variant registered (a conftest's too)."""
    return {per_request_name(v.name): _per_request_variant(v) for v in registered}


def _per_request_variant(v: Variant) -> StepVariant:
    own = f"Each request converted on its own with {v.name}"
    if v.extras:
        extras = ", ".join(v.extras)
        description = f"{own}, plus the upkeep of its {extras} (one batched D2H per scheduler step)."
        doc = f"{own}, after the upkeep its {extras} needs in that step (kvpages.core.scenarios.EXTRA_UPKEEP)."
    else:
        description, doc = f"{own}, as SGLang's PD paths do.", f"{own}: one D2H per request."
    return StepVariant(per_request_name(v.name), _per_request(v), description, f"{doc}\n\n{v.doc}", v.moves, False,
                       v.requires, v.fn.__module__, v.extras, v.syncs)


def all_step_variants() -> tuple[StepVariant, ...]:
    return tuple({**_per_request_variants(all_variants()), **_REGISTRY}.values())


def step_variant_names() -> tuple[str, ...]:
    return tuple(v.name for v in all_step_variants())


def get_step_variant(name: str) -> StepVariant:
    variants = {v.name: v for v in all_step_variants()}
    if name not in variants:
        raise ValueError(f"unknown step variant {name!r}; valid: {', '.join(variants)}")
    return variants[name]


def split_host(on_host: np.ndarray, sizes: list[int]) -> Arrays:
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
    return split_host(host, [p.numel() for p in pages])


@step_variant("batched_device_stride_pinned", moves=Moves.PAGES, batched=True, requires=("cuda",), syncs=Syncs(0, 0))
def batched_device_stride_pinned(kv_slices: Sequence[torch.Tensor], page_size: int) -> Pending:
    """The batched step with one non-blocking copy into pinned memory; a transfer thread waits on its event.

    Hypothesis: as `batched_device_stride`, and the scheduler thread is not blocked behind the
    work already queued on the stream (the in-flight forward): it returns as soon as the copy is
    enqueued, while the transfer thread waits for the event, as SGLang's Mooncake path does.
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
        return split_host(host.numpy(), sizes)

    return Pending(wait)


@functools.cache
def private_stream(device: torch.device) -> torch.cuda.Stream:
    """The readback's own stream on `device`, made once (as SGLang keeps one for its metadata flush)."""
    return torch.cuda.Stream(device=device)


@step_variant("deferred_device_stride", moves=Moves.PAGES, batched=True, staged=True, syncs=Syncs(cuda=0, cpu=1),
              index_dtype=torch.int32, cpu_note=IN_ORDER)
def deferred_device_stride(kv_slices: Sequence[torch.Tensor], page_size: int) -> Readback:
    """SGLang main's decode side: int32 page indices on the device, read back after the next forward is launched.

    Source: SGLang main after 0.5.23, test/registered/unit/disaggregation/test_deferred_metadata_flush.py: the
    inline readback "sits on the scheduler stream, which the WAR barrier fences behind the in-flight forward, so
    it stalled the very path that has to launch the next forward". So the page indices are computed on the device
    (int32, as `_page_indices_device`), the next forward is launched, then `flush_pending_metadata()` reads them
    back into pinned memory on a private stream that waits only for them, and the send waits on the transfer thread.
    Hypothesis: the scheduler thread is not blocked at all, not even behind the forward it just launched, and
    the indices are on the host without waiting for that forward (ready shorter than the forward); bytes as
    `batched_device_stride`, in int32. On a CPU run there are no streams: indices, forward and readback run in
    order on the calling thread, and the readback's `.cpu()` is its one host sync.
    """
    pages = [(kv[::page_size] // page_size).to(torch.int32) for kv in kv_slices]
    flat = torch.cat(pages)
    sizes = [p.numel() for p in pages]
    if flat.device.type != "cuda":
        return lambda: split_host(flat.cpu().numpy(), sizes)
    computed = torch.cuda.Event()
    computed.record()  # on the scheduler's stream, after the indices and before the forward

    def flush_pending_metadata() -> Pending:
        stream = private_stream(flat.device)
        stream.wait_event(computed)  # only the indices: not the forward queued after them
        host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        with torch.cuda.stream(stream):
            host.copy_(flat, non_blocking=True)
        flat.record_stream(stream)  # its memory is not reused before the copy on `stream` is done
        copied = torch.cuda.Event()
        copied.record(stream)

        def send() -> Arrays:
            copied.synchronize()  # the send waits for the private stream alone
            return split_host(host.numpy(), sizes)

        return Pending(send)

    return flush_pending_metadata


STAGED_ON_CPU = ("ran in order on the CPU: no streams, so the conversion ran on the calling thread before the forward "
                 "and its hand-off to the host, non-blocking, made no host sync; the indices were on the host when the "
                 "thread got control back: blocked = ready")
"""The note on the staged strategy's rows off CUDA."""


@step_variant(GATHERED, moves=Moves.PAGES, batched=False, per_send=True)
def gathered_device_stride(kv_slices: Sequence[torch.Tensor], page_size: int, sends: Sequence[int]) -> Arrays:
    """The payloads of a send (a request's main KV, SWA and indexer) strided into one device buffer: one D2H per request.

    Hypothesis: a hybrid model's send pays a copy's fixed cost and a host sync per payload (three for main + SWA +
    indexer); gathering them on the device (one concatenation per send) pays them once per request, for the same
    bytes. Per request, so it fits SGLang's per-request `send_metadata` / `send` as they are.
    """
    pages = [kv[::page_size] // page_size for kv in kv_slices]
    out: Arrays = []
    for first, last in send_runs(tuple(sends)):
        own = pages[first:last]
        out += split_host(torch.cat(own).cpu().numpy(), [p.numel() for p in own])
    return out


@step_variant(STAGED, moves=Moves.PAGES, batched=True, staged=True, syncs=NO_SYNC, cpu_note=STAGED_ON_CPU)
def staged_device_stride(kv_slices: Sequence[torch.Tensor], page_size: int) -> Readback:
    """Every payload of the step converted on a side stream with a non-blocking copy; the transfer worker waits.

    SGLang #34515 stages the transfer indices asynchronously, #35710 stops `pop_preallocated()` reading them back
    inline and #35132 hands the `copy_done` event to the transfer workers. Before the next forward the conversion is
    launched on a stream of its own, gated on the scheduler's stream as it was (the slices, their translations), with
    one non-blocking copy into pinned memory and an event; the readback hands a `Pending` to the transfer thread, which
    waits on the event. Hypothesis: 0 host syncs on the scheduler thread (blocked: its launches alone), and the
    indices ready without waiting for the forward queued after them. On a CPU run there are no streams: it runs in
    order, its copy non-blocking, so 0 host syncs there too and blocked equals ready.
    """
    device = kv_slices[0].device
    if device.type != "cuda":  # no streams: in order, the hand-off to the host non-blocking (no host sync)
        pages = [kv[::page_size] // page_size for kv in kv_slices]
        host = torch.cat(pages).to("cpu", non_blocking=True)
        return lambda: split_host(host.numpy(), [p.numel() for p in pages])
    stream = private_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))  # the slices and their translations, not what comes after
    with torch.cuda.stream(stream):
        pages = [kv[::page_size] // page_size for kv in kv_slices]
        flat = torch.cat(pages)
        pinned = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        pinned.copy_(flat, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record(stream)
    for kv in kv_slices:  # a translation was made on the scheduler's stream: not reused before this stream read it
        kv.record_stream(stream)
    sizes = [p.numel() for p in pages]

    def send() -> Arrays:
        copied.synchronize()  # the transfer worker's wait (#35132's copy_done)
        return split_host(pinned.numpy(), sizes)

    return lambda: Pending(send)
