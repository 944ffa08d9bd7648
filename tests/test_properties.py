"""Property tests (hypothesis): every variant matches the reference on random layouts and chunk offsets.

Skipped with the reason where hypothesis is not installed (it is in the `test` extra).
"""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install '.[test]')")

from conftest import call_on  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_variants import assert_exact, runnable  # noqa: E402

from kvpages.core.sweep import Point  # noqa: E402
from kvpages.measure.inputs import make_workload  # noqa: E402
from kvpages.measure.targets import PointTarget  # noqa: E402
from kvpages.measure.variants import variant_names  # noqa: E402


@pytest.mark.parametrize("name", variant_names())
@settings(max_examples=40, deadline=None)
@given(
    seq_len=st.integers(1, 3000),
    page_size=st.one_of(st.integers(1, 256), st.sampled_from([1, 16, 32, 64, 128, 256])),
    dtype=st.sampled_from(["int32", "int64"]),
    layout=st.sampled_from(["fragmented", "contiguous"]),
    chunk_offset_pages=st.integers(0, 5),
    seed=st.integers(0, 2 ** 16),
)
def test_variant_matches_reference_on_random_layouts(name, seq_len, page_size, dtype, layout, chunk_offset_pages, seed):
    v = runnable(name, "cpu")
    point = Point(seq_len, page_size, dtype, "cpu", layout, seed)
    workload = make_workload(point, rotation=2, chunk_offset_pages=chunk_offset_pages)
    for out, expected in zip(call_on(PointTarget(point), v.name, workload), workload.expected, strict=True):
        assert_exact(out, expected)
        assert expected.size == -(-seq_len // page_size)
