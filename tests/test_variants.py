"""Every variant returns exactly the reference on edge cases and CUDA workloads; the registry and bad input.

No hypothesis here: bench/gpu_check.sh collects this file on CUDA images that may lack it
(the property tests are in test_properties.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import call_on, call_variant, devices

from kvpages.core.sweep import Point
from kvpages.measure.inputs import make_workload
from kvpages.measure.targets import PointTarget
from kvpages.measure.variants import Moves, all_variants, get_variant, reference_page_indices, variant, variant_names

VARIANT_NAMES = variant_names()
REQUIRED = ("host_stride", "device_stride", "device_stride_pinned")


def runnable(name: str, device: str):
    v = get_variant(name)
    reason = v.unavailable_reason(device)
    if reason:
        pytest.skip(reason)
    return v


def assert_exact(out: np.ndarray, expected: np.ndarray) -> None:
    assert isinstance(out, np.ndarray)
    assert out.dtype == expected.dtype
    assert out.shape == expected.shape
    np.testing.assert_array_equal(out, expected)


def test_required_variants_and_at_least_one_own_variant_registered():
    assert set(REQUIRED) <= set(VARIANT_NAMES)
    own = [v for v in all_variants() if v.name not in REQUIRED]
    assert own and all("Hypothesis" in v.doc for v in own)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as err:
        get_variant("nope")
    assert "'nope'" in str(err.value)
    for name in VARIANT_NAMES:
        assert name in str(err.value)


def test_registering_a_name_twice_fails():
    with pytest.raises(ValueError, match="'host_stride' is already registered"):
        @variant("host_stride", moves=Moves.TOKENS)
        def again(kv, page_size):
            """dup"""


def test_unknown_requirement_and_missing_docstring_fail():
    with pytest.raises(ValueError, match="unknown requirement 'tpu'; valid: cuda"):
        variant("x_tpu", moves=Moves.PAGES, requires=("tpu",))
    with pytest.raises(ValueError, match="needs a docstring"):
        @variant("x_nodoc", moves=Moves.PAGES)
        def nodoc(kv, page_size):
            return kv
    assert "x_nodoc" not in variant_names()


def test_cuda_only_variant_reports_why_on_cpu():
    pinned = get_variant("device_stride_pinned")
    reason = pinned.unavailable_reason("cpu")
    assert reason and "CUDA" in reason and "cpu" in reason
    with pytest.raises(RuntimeError, match="cannot run here"):
        pinned(torch.arange(8, dtype=torch.int32), 4)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("name", VARIANT_NAMES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(
    "kv, page_size",
    [
        ([], 1),
        ([], 16),
        ([0, 1, 2, 3, 8, 9, 10, 11], 4),
        ([12, 13, 14, 15, 4, 5], 4),  # partial last page
        ([40, 41, 42], 8),  # a single partial page
        ([7, 3, 9, 1], 1),  # page size 1: any order
        ([2 ** 31 - 3, 2 ** 31 - 2], 1),  # large int32 indices
        (list(range(30, 45)), 15),  # non-power-of-two page size
    ],
)
def test_variant_matches_reference_on_edge_cases(name, dtype, kv, page_size, device):
    v = runnable(name, device)
    tensor = torch.tensor(kv, dtype=dtype, device=device)
    assert_exact(call_variant(v, tensor, page_size), reference_page_indices(tensor, page_size))


@pytest.mark.cuda
@pytest.mark.parametrize("name", VARIANT_NAMES)
@pytest.mark.parametrize("page_size", [1, 3, 16, 64, 128, 256])
def test_variant_matches_reference_on_cuda_workloads(name, page_size):
    runnable(name, "cuda")
    for dtype in ("int32", "int64"):
        point = Point(70_001, page_size, dtype, "cuda")
        workload = make_workload(point, rotation=3, chunk_offset_pages=2)
        for out, expected in zip(call_on(PointTarget(point), name, workload), workload.expected, strict=True):
            assert_exact(out, expected)


@pytest.mark.parametrize("bad", [0, -3])
def test_page_size_below_one_is_a_value_error(bad):
    with pytest.raises(ValueError, match=f"page_size must be an integer >= 1, got {bad}"):
        get_variant("device_stride")(torch.arange(4, dtype=torch.int32), bad)


@pytest.mark.parametrize("bad", [True, 2.0, "4", None])
def test_page_size_not_an_integer_is_a_type_error(bad):
    with pytest.raises(TypeError, match=f"page_size must be an integer >= 1, got {bad!r}"):
        get_variant("host_stride")(torch.arange(4, dtype=torch.int32), bad)


def test_numpy_integer_page_size_is_accepted():
    out = get_variant("device_stride")(torch.arange(8, dtype=torch.int32), np.int64(4))
    assert_exact(out, np.array([0, 1], dtype=np.int32))


@pytest.mark.parametrize(
    "bad, error, words",
    [
        ([0, 1, 2], TypeError, "got list"),
        (np.arange(4), TypeError, "got ndarray"),
        (torch.zeros(2, 4, dtype=torch.int32), ValueError, "must be 1-D, got shape (2, 4)"),
        (torch.zeros(4, dtype=torch.float32), TypeError, "dtype torch.float32; valid: torch.int32, torch.int64"),
        (torch.zeros(4, dtype=torch.int16), TypeError, "dtype torch.int16; valid"),
        (torch.zeros(4, dtype=torch.bool), TypeError, "dtype torch.bool; valid"),
    ],
)
def test_bad_kv_indices(bad, error, words):
    with pytest.raises(error) as err:
        get_variant("device_stride")(bad, 4)
    assert words in str(err.value)


@pytest.mark.parametrize("device", devices())
def test_adaptive_takes_each_path_by_length_and_moves_what_it_declares(device):
    """Below the threshold (and at page size 1) pre-PR's copy of every token, from it on the merged PR's pages: the
    output is the reference's either way, and the meter sees the bytes Moves.BY_LENGTH declares."""
    from kvpages.core import adaptive
    from kvpages.measure.meter import measure_call

    v = runnable("adaptive", device)
    before = adaptive.threshold()
    adaptive.use_threshold(1000)
    try:
        for seq_len, page_size, pages in ((999, 16, False), (1000, 16, True), (4000, 1, False), (4001, 64, True)):
            kv = torch.randperm(8192, device=device)[:seq_len].to(torch.int32)
            assert_exact(call_variant(v, kv, page_size), reference_page_indices(kv, page_size))
            moved = measure_call(lambda kv=kv, p=page_size: v(kv, p), (kv,)).d2h_bytes
            expected = (-(-seq_len // page_size) if pages else seq_len) * 4
            assert moved == expected == v.expected_d2h_bytes(seq_len, page_size, 4), (seq_len, page_size)
    finally:
        adaptive.use_threshold(before)
    with pytest.raises(ValueError, match="--kv-adaptive-threshold: 0 is not >= 1"):
        adaptive.use_threshold(0)
