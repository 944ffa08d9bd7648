"""Points, sweeps and presets check themselves; the options parse into a sweep."""

from __future__ import annotations

import pytest

from kvpages.core.capacity import check_fits
from kvpages.core.options import BenchOptions
from kvpages.core.presets import PARTIAL_PAGE_LEN, PRESETS, get_preset
from kvpages.core.sweep import INDEX_MAX, Point, Sweep, largest_seq_len
from kvpages.measure.schedule import plan
from kvpages.measure.targets import PointTarget, measure


def test_presets_are_the_documented_ones():
    assert list(PRESETS) == ["quick", "default", "full", "ranks"]
    ranks = PRESETS["ranks"]  # for torchrun: steps only, of the default preset's sizes
    assert {s.kind for s in ranks.scenarios} == {"step"}
    assert {(s.batch, s.page_size) for s in ranks.scenarios} <= {
        (s.batch, s.page_size) for s in PRESETS["default"].scenarios if s.kind == "step"}
    default = PRESETS["default"].sweep
    assert default.seq_lens == (512, 2048, 3000, 8192, 32768, 131072, 524288)
    assert default.page_sizes == (1, 16, 64, 128) and default.dtypes == ("int32",)
    full = PRESETS["full"].sweep
    assert {32, 256} <= set(full.page_sizes) and "int64" in full.dtypes
    assert max(full.seq_lens) > max(default.seq_lens)


@pytest.mark.parametrize("page_size", PRESETS["default"].sweep.page_sizes)
def test_the_default_preset_meters_a_partial_last_page(page_size):
    """Its partial-page length is a whole number of pages at no swept page size > 1; the meter's bytes there are
    ceil(L / p) * itemsize for a variant that moves pages, every token for one that moves tokens."""
    assert all(PARTIAL_PAGE_LEN % p for p in PRESETS["full"].sweep.page_sizes if p > 1)
    assert PARTIAL_PAGE_LEN in PRESETS["default"].sweep.seq_lens
    target = PointTarget(Point(PARTIAL_PAGE_LEN, page_size))
    workload = target.build("cpu")
    for name in ("host_stride", "device_stride", "host_mirror"):
        inputs = target.inputs_for(name, workload)[0]
        assert target.check(target.call_here(name, inputs), workload.expected[0]) is None
        measured = measure(target, name, inputs)
        pages = -(-PARTIAL_PAGE_LEN // page_size) * 4
        assert measured.d2h_bytes == target.expected_d2h(name)[0] == {"host_stride": PARTIAL_PAGE_LEN * 4,
                                                                       "device_stride": pages, "host_mirror": 0}[name]


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
    assert options.sweep.seq_lens == (3, 5) and options.sweep.page_sizes == PRESETS["quick"].sweep.page_sizes
    assert options.sweep.time_budget_s == 0.5 and options.variants == ("host_stride",)
    assert options.device_choice == "auto" and options.as_strings() == given | {}


def test_a_point_whose_indices_overflow_its_dtype_is_refused_naming_the_largest_valid_seq_len():
    largest = largest_seq_len(1, "int32")
    assert Point(largest, 1).geometry().max_token_index <= INDEX_MAX["int32"]
    assert Point(largest + 1, 1, check_range=False).geometry().max_token_index > INDEX_MAX["int32"]
    with pytest.raises(ValueError, match=f"seq_len 3000000000 at page_size 1 needs token indices up to .*beyond "
                                         f"int32's maximum 2147483647; the largest valid seq_len for int32 at "
                                         f"page_size 1 is {largest}"):
        Point(3_000_000_000, 1)
    Point(3_000_000_000, 1, "int64")  # fits int64
    with pytest.raises(ValueError, match="beyond int32's maximum"):
        Sweep("t", seq_lens=(512, 3_000_000_000), page_sizes=(1,))


def test_memory_estimates_refuse_what_cannot_fit():
    sweep = Sweep("t", seq_lens=(600_000_000,), page_sizes=(1,), passes=1, repetitions=1)
    needed = Point(600_000_000, 1).geometry().memory_bytes("cpu")["host"]
    assert needed > 24 * 2**30  # more than this 24 GiB box has
    with pytest.raises(ValueError, match=r"seq_len 600000000 at page_size 1 \(int32\) needs about .* GiB of host "
                                         r"memory to build and check its 2 request rows, but only 16.0 GiB is free"):
        check_fits(sweep, "cpu", {"host": 16 * 2**30})
    with pytest.raises(ValueError, match="GiB of cuda memory"):
        check_fits(sweep, "cuda", {"host": 2**50, "cuda": 2**30})
    check_fits(sweep, "cpu", {"host": None})  # unknown: not checked
    check_fits(PRESETS["full"].sweep, "cpu", {"host": 20 * 2**30})  # the full preset fits this box
    many = Sweep("t", seq_lens=(131072,), page_sizes=(1, 2, 3, 4, 5, 6, 7, 8), passes=2, repetitions=2)
    with pytest.raises(ValueError, match="the sweep keeps every point's inputs for its 2 passes"):
        check_fits(many, "cpu", {"host": 300 * 2**20})


def test_the_schedule_interleaves_seeded_shuffles_and_spreads_repetitions_over_passes():
    points = [Point(8, 1), Point(16, 1)]
    blocks = plan(("a", "b", "c"), points, repetitions=4, seed=0, passes=2)
    assert [b.order for b in blocks] == list(range(24))
    assert plan(("a", "b", "c"), points, 4, 0, 2) == blocks  # seeded
    assert plan(("a", "b", "c"), points, 4, 1, 2) != blocks
    # pass 0 holds repetitions 0 and 2 of every point, pass 1 repetitions 1 and 3
    assert [(b.target.seq_len, b.repetition) for b in blocks[:6]] == [(8, 0)] * 3 + [(8, 2)] * 3
    assert {b.repetition for b in blocks[12:]} == {1, 3}
    for point in points:
        for r in range(4):
            assert sorted(b.variant for b in blocks if b.target == point and b.repetition == r) == ["a", "b", "c"]
    assert sum(b.last_in_process for b in blocks) == 2
    orders = {tuple(b.variant for b in blocks[i:i + 3]) for i in range(0, 24, 3)}
    assert len(orders) > 1  # the order changes between repetitions
    with pytest.raises(ValueError, match="passes must be between 1 and the repetitions"):
        plan(("a",), points, 2, 0, 3)


def test_bad_repetitions_and_passes():
    with pytest.raises(ValueError, match="repetitions must be an integer >= 1, got 0"):
        Sweep("t", seq_lens=(1,), page_sizes=(1,), repetitions=0)
    with pytest.raises(ValueError, match="--kv-repetitions: 'x' is not an integer"):
        BenchOptions.parse({"--kv-repetitions": "x"}.get)
    with pytest.raises(ValueError, match="--kv-crosscheck: unknown cross-check mode 'maybe'; valid: auto, on, off"):
        BenchOptions.parse({"--kv-crosscheck": "maybe"}.get)


@pytest.mark.parametrize("given", [
    {},
    {"--kv-preset": "quick", "--kv-seq-lens": "3,5", "--kv-time-budget": "0.5", "--kv-device": "cpu"},
    {"--kv-page-sizes": "1,64", "--kv-dtypes": "int64", "--kv-layouts": "contiguous,fragmented", "--kv-seed": "3",
     "--kv-repetitions": "4", "--kv-passes": "2", "--kv-crosscheck": "on", "--kv-variants": "a,b",
     "--kv-results": "out"},
    {"--kv-request-lens": "1000,2000", "--kv-chunk-size": "256", "--kv-prefix": "10", "--kv-step-sizes": "4",
     "--kv-step-lens": "uniform:10,20", "--kv-step-variants": "x"},
    {"--kv-scenarios": "preset", "--kv-payloads": "hybrid", "--kv-swa-window": "512"},
])
def test_options_render_back_to_what_parses_to_them(given):
    options = BenchOptions.parse(given.get)
    args = options.to_args()
    again = BenchOptions.parse(dict(zip(args[::2], args[1::2], strict=True)).get)
    assert again == options and again.to_args() == args


def test_every_option_renders_back():
    """A new option in OPTIONS must parse and render: the repro commands are made from it."""
    from kvpages.core.options import FLAG as flag
    from kvpages.core.options import OPTIONS, SHAPES

    samples = {"--kv-preset": "quick", "--kv-seq-lens": "8", "--kv-page-sizes": "2", "--kv-dtypes": "int64",
               "--kv-layouts": "contiguous", "--kv-variants": "v", "--kv-device": "cpu", "--kv-seed": "1",
               "--kv-time-budget": "0.25", "--kv-repetitions": "3", "--kv-passes": "1", "--kv-processes": "2",
               "--kv-crosscheck": "off", "--kv-scenarios": "none", "--kv-request-lens": "64", "--kv-chunk-size": "32",
               "--kv-prefix": "0", "--kv-step-sizes": "2", "--kv-step-lens": "fixed:16", "--kv-busy-us": "500",
               "--kv-step-variants": "s",
               "--kv-payloads": "full,hybrid", "--kv-swa-window": "128",
               "--kv-results": "r", "--kv-sglang": "0.5.15,/src/sglang/python", "--kv-baseline": "sglang@0.5.15",
               "--kv-breakdown": "off", "--kv-link-profile": "mine.toml,theirs.toml",
               "--kv-disturb-factor": "1.5", "--kv-remeasure-budget": "0.0", "--kv-adaptive-threshold": "4096",
               "--kv-threads": "2", "--kv-cpus": "0-1", "--kv-bandwidth-probe": "off",
               "--kv-rank-timeout": "30.0"}
    assert set(samples) == {o.flag for o in OPTIONS}
    needs = {flag[name]: {flag[needed]: samples[flag[needed]]}
             for name, needed in SHAPES.items()}  # a chunk size shapes requests, a busy queue steps: given with them
    for option in OPTIONS:
        given = {**needs.get(option.flag, {}), option.flag: samples[option.flag]}
        rendered = BenchOptions.parse(given.get).to_args()
        assert dict(zip(rendered[::2], rendered[1::2], strict=True)) == given
