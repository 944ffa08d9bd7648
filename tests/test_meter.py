"""The D2H meter counts each hand-off to the host once, with exact bytes (its profiler cross-check: test_crosscheck.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import devices

from kvpages.core.sweep import Point
from kvpages.measure.inputs import make_workload
from kvpages.measure.meter import D2HMeasurement, Transfer, measure_call
from kvpages.measure.targets import PointTarget, measure
from kvpages.measure.variants import get_variant, variant_names


def ops(fn, kv) -> list[tuple[str, int]]:
    return [(t.op, t.nbytes) for t in measure_call(lambda: fn(kv, 1), (kv,)).transfers]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize(
    "body, expected",
    [
        (lambda kv, p: kv.cpu(), [("Tensor.cpu", 40)]),
        (lambda kv, p: kv.cpu().numpy(), [("Tensor.cpu", 40)]),
        (lambda kv, p: kv.to("cpu").numpy(), [("Tensor.to", 40)]),
        (lambda kv, p: kv.to(device="cpu"), [("Tensor.to", 40)]),
        (lambda kv, p: kv.to(torch.empty(0)), [("Tensor.to", 40)]),
        (lambda kv, p: kv.to(torch.int64).cpu(), [("Tensor.cpu", 80)]),
        (lambda kv, p: kv[:3].tolist(), [("Tensor.tolist", 12)]),
        (lambda kv, p: kv[2].item(), [("Tensor.item", 4)]),
        (lambda kv, p: int(kv[1]), [("int(Tensor)", 4)]),
        (lambda kv, p: float(kv[1]), [("float(Tensor)", 4)]),
        (lambda kv, p: np.asarray(kv[:5].cpu()), [("Tensor.cpu", 20)]),
        (lambda kv, p: torch.empty(4, dtype=kv.dtype).copy_(kv[:4]), [("Tensor.copy_", 16)]),
        (lambda kv, p: torch.empty(4, dtype=kv.dtype).__setitem__(slice(0, 2), kv[:2]), [("Tensor.__setitem__", 8)]),
        (lambda kv, p: (kv[::2] // 2).cpu().cpu().numpy(), [("Tensor.cpu", 20)]),
        (lambda kv, p: [kv[:1].cpu(), kv[1:].cpu()], [("Tensor.cpu", 4), ("Tensor.cpu", 36)]),
        (lambda kv, p: kv.shape[0] + kv.numel(), []),
        (lambda kv, p: torch.arange(5).numpy(), []),  # host data that never came from the device
    ],
)
def test_each_transfer_kind_is_counted_once_with_exact_bytes(device, body, expected):
    kv = torch.arange(10, dtype=torch.int32, device=device)
    assert ops(body, kv) == expected


def test_numpy_of_a_device_side_cpu_tensor_is_one_transfer():
    kv = torch.arange(6, dtype=torch.int64)
    assert ops(lambda kv, p: kv.numpy(), kv) == [("Tensor.numpy", 48)]
    assert ops(lambda kv, p: np.asarray(kv), kv) == [("np.asarray(Tensor)", 48)]


def test_host_to_host_copies_are_not_transfers():
    kv = torch.arange(8, dtype=torch.int32)

    def body(kv, p):
        host = kv.cpu()
        other = torch.empty_like(host)
        other.copy_(host)  # both on the host already
        return other.numpy()

    assert ops(body, kv) == [("Tensor.cpu", 32)]


@pytest.mark.parametrize("seq_len", [8192, 1000])
@pytest.mark.parametrize("page_size", [1, 64])
def test_host_stride_moves_every_token_and_device_stride_one_index_per_page(seq_len, page_size):
    kv = make_workload(Point(seq_len, page_size), rotation=1).inputs[0]
    host = measure_call(lambda: get_variant("host_stride").fn(kv, page_size), (kv,))
    dev = measure_call(lambda: get_variant("device_stride").fn(kv, page_size), (kv,))
    assert (host.d2h_bytes, host.d2h_transfers) == (seq_len * 4, 1)
    assert (dev.d2h_bytes, dev.d2h_transfers) == (-(-seq_len // page_size) * 4, 1)
    assert host.link == dev.link == "none (cpu)"


@pytest.mark.parametrize("name", variant_names())
def test_every_variant_moves_what_it_declares(name):
    v = get_variant(name)
    if v.unavailable_reason("cpu"):
        pytest.skip(v.unavailable_reason("cpu"))
    for dtype, itemsize in (("int32", 4), ("int64", 8)):
        target = PointTarget(Point(777, 16, dtype))
        measured = measure(target, name, target.inputs_for(name, make_workload(target.point, rotation=1))[0])
        assert measured.d2h_bytes == v.expected_d2h_bytes(777, 16, itemsize)
        assert v.moves.expected_transfers in (None, measured.d2h_transfers)  # NONE: exactly 0 transfers


def test_link_labels():
    assert D2HMeasurement(()).link == "none (no transfer)"
    assert D2HMeasurement((Transfer("Tensor.cpu", 8, False, False),)).link == "none (cpu)"
    assert D2HMeasurement((Transfer("Tensor.cpu", 8, True, False),)).link == "pcie pageable"
    assert D2HMeasurement((Transfer("Tensor.copy_", 8, True, True),)).link == "pcie pinned"
    mixed = (Transfer("Tensor.cpu", 8, True, False), Transfer("Tensor.copy_", 8, True, True))
    assert D2HMeasurement(mixed).link == "pcie mixed"
