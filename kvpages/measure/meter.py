"""The D2H meter: what a variant actually hands to the host, and its host syncs (docs/method.md, "The meter").

A tensor is device side when it lives on an accelerator or is (computed from) the input, so a CPU run, where
`.cpu()` is a no-op, still counts the bytes handed across; `.cpu().numpy()` is one transfer, not two. A device op is a
call on device-side data that makes a new device-side tensor: a kernel (a strided divide, a gather, a cast, a
concatenation), not a view (a slice), not a no-op (`.to` its own dtype) and not a hand-off to the host.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import wraps

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from kvpages.measure.outcome import MeterReading


@dataclass(frozen=True)
class Transfer:
    """One hand-off of tensor data to the host."""

    op: str
    nbytes: int
    crossed_link: bool  # the source lived on an accelerator
    pinned: bool  # the destination is pinned (page-locked) host memory


@dataclass(frozen=True)
class D2HMeasurement:
    """What one call handed to the host."""

    transfers: tuple[Transfer, ...]
    host_syncs: int = 0
    transfer_syncs: int = 0
    """The waits of a transfer thread's part (`transfer_wait`), run in this thread."""
    device_ops: int = 0

    @property
    def d2h_bytes(self) -> int:
        return sum(t.nbytes for t in self.transfers)

    @property
    def d2h_transfers(self) -> int:
        return len(self.transfers)

    @property
    def link(self) -> str:
        if not self.transfers:
            return "none (no transfer)"
        crossed = [t for t in self.transfers if t.crossed_link]
        if not crossed:
            return "none (cpu)"
        kinds = {t.pinned for t in crossed}
        if len(kinds) > 1:
            return "pcie mixed"
        return "pcie pinned" if kinds == {True} else "pcie pageable"

    def reading(self) -> MeterReading:
        return MeterReading(self.d2h_bytes, self.d2h_transfers, self.link, self.host_syncs, self.device_ops)


def _target_device(args: tuple, kwargs: dict) -> torch.device | None:
    """The device a `Tensor.to(...)` call asks for, or None for a dtype-only conversion."""
    if "device" in kwargs and kwargs["device"] is not None:
        return torch.device(kwargs["device"])
    if len(args) > 1:
        target = args[1]
        if isinstance(target, torch.Tensor):
            return target.device
        if isinstance(target, (str, torch.device, int)):
            return torch.device(target)
    if isinstance(kwargs.get("other"), torch.Tensor):
        return kwargs["other"].device
    return None


_T = torch.Tensor
_TO_HOST_SCALARS = {
    _T.numpy: "Tensor.numpy",
    _T.tolist: "Tensor.tolist",
    _T.item: "Tensor.item",
    _T.__int__: "int(Tensor)",
    _T.__float__: "float(Tensor)",
    _T.__bool__: "bool(Tensor)",
    _T.__index__: "Tensor.__index__",
    _T.__array__: "np.asarray(Tensor)",
}


SYNC_WARNING = "called a synchronizing CUDA operation"
"""What torch.cuda.set_sync_debug_mode("warn") warns (c10::cuda::warn_or_error_on_sync)."""


@dataclass
class SyncCount:
    """The host syncs of the thread that made it: its own, and those inside `transfer_wait()`."""

    thread: int = field(default_factory=threading.get_ident)
    calling: int = 0
    transfer: int = 0
    in_transfer_wait: bool = False
    in_wrapped: int = 0  # inside a wrapped synchronize: a sync warning raised there is that same sync

    def add(self) -> None:
        if self.in_transfer_wait:
            self.transfer += 1
        else:
            self.calling += 1


_ACTIVE = threading.local()
"""The SyncCount of the metered call running on this thread, if any."""


@contextmanager
def transfer_wait() -> Iterator[None]:
    """What runs inside is a transfer thread's wait, run in this thread: its syncs count as `transfer_syncs`."""
    count: SyncCount = getattr(_ACTIVE, "count", None) or SyncCount()  # not metered: counted nowhere
    count.in_transfer_wait = True
    try:
        yield
    finally:
        count.in_transfer_wait = False


def _counted(fn: Callable, count: SyncCount) -> Callable:
    """`fn` (a synchronize the debug mode does not flag), counting one sync per call on the counting thread."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        if threading.get_ident() != count.thread:
            return fn(*args, **kwargs)
        count.in_wrapped += 1
        try:
            return fn(*args, **kwargs)
        finally:
            count.in_wrapped -= 1
            count.add()

    return wrapper


@contextmanager
def cuda_syncs(count: SyncCount) -> Iterator[None]:
    """Count the CUDA syncs of `count`'s thread while inside (module doc); everything is restored on the way out."""
    previous = torch.cuda.get_sync_debug_mode()
    event_sync, device_sync = torch.cuda.Event.synchronize, torch.cuda.synchronize

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if not str(message).startswith(SYNC_WARNING):
            shown(message, category, filename, lineno, file, line)
        elif threading.get_ident() == count.thread and not count.in_wrapped:
            count.add()  # another thread's sync warning is dropped: it exists only because the mode is on

    with warnings.catch_warnings():
        warnings.filterwarnings("always", message=SYNC_WARNING)  # every sync, none deduplicated by location
        shown = warnings.showwarning
        warnings.showwarning = show
        torch.cuda.Event.synchronize = _counted(event_sync, count)  # type: ignore[method-assign]
        torch.cuda.synchronize = _counted(device_sync, count)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)
            torch.cuda.Event.synchronize = event_sync  # type: ignore[method-assign]
            torch.cuda.synchronize = device_sync


class D2HMeter(TorchFunctionMode):
    """Records a `Transfer` for every hand-off of device-side data to the host; on a CPU run, each blocking one is
    also a host sync of `count`."""

    def __init__(self, inputs: tuple[torch.Tensor, ...], count: SyncCount | None = None) -> None:
        super().__init__()
        self.count = count
        self.transfers: list[Transfer] = []
        self.device_ops = 0
        self._device_side = WeakIdKeyDictionary(dict.fromkeys(inputs, True))

    def _is_device_side(self, obj: object) -> bool:
        return isinstance(obj, torch.Tensor) and (obj.device.type != "cpu" or obj in self._device_side)

    def _record(self, op: str, src: torch.Tensor, dst: torch.Tensor | None, non_blocking: bool = False) -> None:
        crossed = src.device.type != "cpu"
        pinned = bool(crossed and dst is not None and dst.is_pinned())
        self.transfers.append(Transfer(op, src.numel() * src.element_size(), crossed, pinned))
        if not non_blocking and self.count is not None:
            self.count.add()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _T.cpu or func is _T.to:
            src = args[0]
            target = torch.device("cpu") if func is _T.cpu else _target_device(args, kwargs)
            if self._is_device_side(src) and target is not None and target.type == "cpu":
                out = func(*args, **kwargs)
                if out is src:  # a no-op on a CPU run: hand out a host-side alias
                    out = out.view_as(out)
                self._record("Tensor.cpu" if func is _T.cpu else "Tensor.to", src, out, kwargs.get("non_blocking", False))
                return out
        elif func in _TO_HOST_SCALARS:
            src = args[0]
            out = func(*args, **kwargs)
            if self._is_device_side(src):
                self._record(_TO_HOST_SCALARS[func], src, None)
            return out
        elif func is _T.copy_:
            dst, src = args[0], args[1]
            if self._is_device_side(src) and not self._is_device_side(dst):
                out = func(*args, **kwargs)
                self._record("Tensor.copy_", src, dst, args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
                return out
        elif func is _T.__setitem__:
            dst, value = args[0], args[2]
            if self._is_device_side(value) and not self._is_device_side(dst):
                func(*args, **kwargs)  # returns None
                self._record("Tensor.__setitem__", value, dst)
                return None

        out = func(*args, **kwargs)
        given = tree_flatten((args, kwargs))[0]
        if any(self._is_device_side(a) for a in given):
            made = [r for r in tree_flatten(out)[0] if isinstance(r, torch.Tensor)]
            self.device_ops += any(not r._is_view() and all(r is not a for a in given) for r in made)
            for result in made:
                if result.device.type == "cpu":
                    self._device_side[result] = True
        return out


def measure_call(call: Callable[[], object], inputs: tuple[torch.Tensor, ...]) -> D2HMeasurement:
    """Run `call()` once: what it handed to the host of `inputs` (and of what was computed from them) and its host
    syncs (module doc)."""
    count = SyncCount()
    on_cuda = any(t.device.type == "cuda" for t in inputs)
    _ACTIVE.count = count
    try:
        with cuda_syncs(count) if on_cuda else nullcontext(), D2HMeter(inputs, None if on_cuda else count) as meter:
            call()
    finally:
        _ACTIVE.count = None
    return D2HMeasurement(tuple(meter.transfers), count.calling, count.transfer, meter.device_ops)

