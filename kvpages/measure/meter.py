"""The D2H meter: observes what a variant actually hands to the host.

`measure_call(call, inputs)` runs `call()` once under a
`torch.overrides.TorchFunctionMode` that sees every hand-off of tensor data to the
host: `.cpu()`, `.to(<cpu>)`, `.numpy()`, `.tolist()`, `.item()`, `int()/float()/bool()`,
`np.asarray()`, `copy_` into host memory and `host[...] = device_tensor`.

A tensor is *device side* when it lives on an accelerator, or when it is (or was
computed from) the input: so on a CPU run, where `.cpu()` is a no-op, the meter
still counts the bytes handed across the host boundary, and `Transfer.crossed_link`
says that no link was crossed. A hand-off's result is host side, so
`.cpu().numpy()` is one transfer, not two.

The CUDA profiler's view of the same calls is compared with the meter's in a process of its
own (kvpages.measure.crosscheck), never in the one that times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


NO_TRANSFER = "none (no transfer)"


@dataclass(frozen=True)
class D2HMeasurement:
    """What one call handed to the host."""

    transfers: tuple[Transfer, ...]

    @property
    def d2h_bytes(self) -> int:
        return sum(t.nbytes for t in self.transfers)

    @property
    def d2h_transfers(self) -> int:
        return len(self.transfers)

    @property
    def link(self) -> str:
        """'none (no transfer)' when nothing was handed over, 'none (cpu)' when nothing crossed a link, else
        'pcie pinned', 'pcie pageable' or 'pcie mixed'."""
        if not self.transfers:
            return NO_TRANSFER
        crossed = [t for t in self.transfers if t.crossed_link]
        if not crossed:
            return "none (cpu)"
        kinds = {t.pinned for t in crossed}
        if kinds == {True}:
            return "pcie pinned"
        if kinds == {False}:
            return "pcie pageable"
        return "pcie mixed"

    def reading(self) -> MeterReading:
        return MeterReading(self.d2h_bytes, self.d2h_transfers, self.link)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


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


class D2HMeter(TorchFunctionMode):
    """Records a `Transfer` for every hand-off of device-side data to the host (see module doc)."""

    def __init__(self, inputs: tuple[torch.Tensor, ...]) -> None:
        super().__init__()
        self.transfers: list[Transfer] = []
        self._device_side = WeakIdKeyDictionary()
        for tensor in inputs:
            self._device_side[tensor] = True

    def _is_device_side(self, obj: object) -> bool:
        return isinstance(obj, torch.Tensor) and (obj.device.type != "cpu" or obj in self._device_side)

    def _record(self, op: str, src: torch.Tensor, dst: torch.Tensor | None) -> None:
        crossed = src.device.type != "cpu"
        pinned = bool(crossed and dst is not None and dst.is_pinned())
        self.transfers.append(Transfer(op, _nbytes(src), crossed, pinned))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _T.cpu or func is _T.to:
            src = args[0]
            target = torch.device("cpu") if func is _T.cpu else _target_device(args, kwargs)
            if self._is_device_side(src) and target is not None and target.type == "cpu":
                out = func(*args, **kwargs)
                if out is src:  # a no-op on a CPU run: hand out a host-side alias
                    out = out.view_as(out)
                self._record("Tensor.cpu" if func is _T.cpu else "Tensor.to", src, out)
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
                self._record("Tensor.copy_", src, dst)
                return out
        elif func is _T.__setitem__:
            dst, value = args[0], args[2]
            if self._is_device_side(value) and not self._is_device_side(dst):
                func(*args, **kwargs)  # returns None
                self._record("Tensor.__setitem__", value, dst)
                return None

        out = func(*args, **kwargs)
        if any(self._is_device_side(a) for a in tree_flatten((args, kwargs))[0]):
            for result in tree_flatten(out)[0]:
                if isinstance(result, torch.Tensor) and result.device.type == "cpu":
                    self._device_side[result] = True
        return out


def measure_call(call: Callable[[], object], inputs: tuple[torch.Tensor, ...]) -> D2HMeasurement:
    """Run `call()` once and return what it handed to the host of `inputs` (and what was computed from them)."""
    with D2HMeter(inputs) as meter:
        call()
    return D2HMeasurement(tuple(meter.transfers))

