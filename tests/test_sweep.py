"""Points, sweeps and presets check themselves; the options parse into a sweep."""

from __future__ import annotations

import pytest

from kvpages.options import BenchOptions
from kvpages.sweep import PRESETS, Point, Sweep, get_preset


def test_presets_are_the_documented_ones():
    assert list(PRESETS) == ["quick", "default", "full"]
    default = PRESETS["default"]
    assert default.seq_lens == (512, 2048, 8192, 32768, 131072, 524288)
    assert default.page_sizes == (1, 16, 64, 128) and default.dtypes == ("int32",)
    full = PRESETS["full"]
    assert {32, 256} <= set(full.page_sizes) and "int64" in full.dtypes
    assert max(full.seq_lens) > max(default.seq_lens)


def test_points_expand_the_cross_product_in_order():
    sweep = Sweep("t", seq_lens=(2, 1), page_sizes=(4,), dtypes=("int32", "int64"))
    points = list(sweep.points("cpu"))
    assert [(p.dtype, p.seq_len) for p in points] == [("int32", 2), ("int32", 1), ("int64", 2), ("int64", 1)]
    assert points[0].id == "s2-p4-int32-fragmented" and points[0].num_pages == 1


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(seq_len=0, page_size=1), ValueError, "seq_len must be an integer >= 1, got 0"),
        (dict(seq_len=8, page_size=0), ValueError, "page_size must be an integer >= 1, got 0"),
        (dict(seq_len=8, page_size=True), TypeError, "page_size must be an integer >= 1, got True"),
        (dict(seq_len=8.0, page_size=1), TypeError, "seq_len must be an integer >= 1, got 8.0"),
        (dict(seq_len=8, page_size=1, dtype="int8"), ValueError, "unknown dtype 'int8'; valid: int32, int64"),
        (dict(seq_len=8, page_size=1, device="mps"), ValueError, "unknown device 'mps'; valid: cpu, cuda"),
        (dict(seq_len=8, page_size=1, layout="x"), ValueError, "unknown layout 'x'; valid: fragmented, contiguous"),
    ],
)
def test_bad_points(kwargs, error, words):
    with pytest.raises(error, match=words):
        Point(**kwargs)


def test_bad_sweeps():
    with pytest.raises(ValueError, match="axis seq_lens is empty"):
        Sweep("t", seq_lens=(), page_sizes=(1,))
    with pytest.raises(ValueError, match="time budget must be a positive number"):
        Sweep("t", seq_lens=(1,), page_sizes=(1,), time_budget_s=0)
    with pytest.raises(ValueError, match="unknown preset 'nope'; valid: quick, default, full"):
        get_preset("nope")


def test_options_override_the_preset():
    given = {"--kv-preset": "quick", "--kv-seq-lens": "3,5", "--kv-variants": "host_stride", "--kv-time-budget": "0.5"}
    options = BenchOptions.parse(given.get)
    assert options.sweep.seq_lens == (3, 5) and options.sweep.page_sizes == PRESETS["quick"].page_sizes
    assert options.sweep.time_budget_s == 0.5 and options.variants == ("host_stride",)
    assert options.device == "auto" and options.as_strings() == given | {}
