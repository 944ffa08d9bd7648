"""The workload generator looks like SGLang's req_to_token, and the validator guards its invariant."""

from __future__ import annotations

import pytest
import torch
from conftest import devices

from kvpages.core.sweep import MAX_ROTATION, MIN_ROTATION, ROTATION_TARGET_BYTES, Point, pool_pages
from kvpages.measure.inputs import _build_pool, make_workload, validate_page_layout


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("layout", ["fragmented", "contiguous"])
@pytest.mark.parametrize("page_size", [1, 5, 16, 64])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_generated_slices_keep_the_page_invariant(device, layout, page_size, dtype):
    point = Point(1000, page_size, dtype, device, layout, seed=3)
    workload = make_workload(point, rotation=4, chunk_offset_pages=2)
    assert workload.pool.device.type == device
    assert workload.pool.dtype == getattr(torch, dtype)
    for kv in workload.inputs:
        assert kv.numel() == 1000 and kv.dtype == getattr(torch, dtype)
        validate_page_layout(kv, page_size)
        assert int(kv.min()) >= page_size  # page 0 is reserved
    # rows use disjoint pages, as a pool never hands one page to two requests
    pages = [set((kv[::page_size] // page_size).tolist()) for kv in workload.inputs]
    assert sum(map(len, pages)) == len(set().union(*pages))


def test_fragmented_pages_are_shuffled_and_contiguous_are_in_order():
    frag = make_workload(Point(64 * 50, 64, layout="fragmented"), rotation=2).inputs[0]
    cont = make_workload(Point(64 * 50, 64, layout="contiguous"), rotation=2).inputs[0]
    frag_pages, cont_pages = frag[::64] // 64, cont[::64] // 64
    assert bool((cont_pages.diff() == 1).all())
    assert not bool((frag_pages.diff() == 1).all())


def test_partial_last_page_and_page_aligned_chunk_offset():
    workload = make_workload(Point(100, 16), rotation=2, chunk_offset_pages=3)
    row = workload.pool[0]
    assert torch.equal(workload.inputs[0], row[48:148])
    assert workload.expected[0].size == 7  # 6 full pages and one of 4 tokens


def test_same_seed_same_inputs_other_seed_other_inputs():
    a = make_workload(Point(4096, 16, seed=1), rotation=2)
    b = make_workload(Point(4096, 16, seed=1), rotation=2)
    c = make_workload(Point(4096, 16, seed=2), rotation=2)
    assert torch.equal(a.pool, b.pool)
    assert not torch.equal(a.pool, c.pool)


@pytest.mark.parametrize("lengths, page_size, dtype, layout", [
    ((512,) * 4, 1, "int32", "fragmented"), ((3000, 5, 7000), 16, "int32", "fragmented"),
    ((8192,) * 3, 64, "int64", "contiguous"), ((100, 129, 1), 128, "int64", "fragmented")])
def test_the_pool_is_its_free_list_laid_out_row_by_row(lengths, page_size, dtype, layout):
    """The pool is the documented free list, token by token (so a seed gives the inputs that earlier runs timed)."""
    pool = _build_pool(lengths, page_size, dtype, layout, seed=7)
    handed_out = sum(-(-n // page_size) for n in lengths)
    order = torch.randperm(pool_pages(handed_out), generator=torch.Generator().manual_seed(7)) \
        if layout == "fragmented" else torch.arange(pool_pages(handed_out))
    free = (order + 1).tolist()
    expected = torch.zeros((len(lengths), max(lengths)), dtype=getattr(torch, dtype))
    for row, n in enumerate(lengths):
        for token in range(n):
            expected[row, token] = free[token // page_size] * page_size + token % page_size
        free = free[-(-n // page_size):]
    assert torch.equal(pool, expected)


def test_rotation_spans_caches_within_bounds():
    assert Point(512, 1).rotation == MAX_ROTATION
    assert Point(524288, 64).rotation * 524288 * 4 == ROTATION_TARGET_BYTES  # the longest default rows span it
    assert Point(2 ** 23, 1, "int64").rotation == MIN_ROTATION
    assert len(make_workload(Point(512, 1)).inputs) == MAX_ROTATION


@pytest.mark.parametrize("point", [Point(1000, 16, "int64", layout="contiguous"), Point(512, 1)])
def test_the_geometry_is_the_pool_the_generator_builds(point):
    workload = make_workload(point, chunk_offset_pages=3)
    geometry = point.geometry(chunk_offset_pages=3)
    assert workload.pool.shape == (geometry.rows, geometry.row_tokens)
    assert int(workload.pool.max()) <= geometry.max_token_index
    assert geometry.pool_bytes == workload.pool.numel() * workload.pool.element_size()


def test_a_fresh_copy_holds_the_same_inputs_in_new_memory():
    workload = make_workload(Point(700, 16), chunk_offset_pages=2)
    copy = workload.fresh_copy()
    assert copy.pool.data_ptr() != workload.pool.data_ptr()
    for a, b in zip(workload.inputs, copy.inputs, strict=True):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    assert copy.expected is workload.expected


@pytest.mark.parametrize(
    "kv, page_size, words",
    [
        ([3, 4, 5, 6], 4, "position 0 (first token of page 0) holds 3, which is not a non-negative multiple of page_size=4"),
        ([0, 1, 2, 3, 9, 10], 4, "position 4 (first token of page 1) holds 9"),
        ([0, 1, 3, 4], 4, "position 2 holds 3, expected 2"),
        ([-4, -3], 2, "holds -4, which is not a non-negative multiple"),
    ],
)
def test_validator_names_the_first_violation(kv, page_size, words):
    with pytest.raises(ValueError) as err:
        validate_page_layout(torch.tensor(kv, dtype=torch.int32), page_size)
    assert words in str(err.value)


def test_validator_accepts_empty_and_checks_arguments():
    validate_page_layout(torch.empty(0, dtype=torch.int64), 8)
    with pytest.raises(TypeError, match=r"kv_indices must be a 1-D torch\.Tensor"):
        validate_page_layout([0, 1], 2)
    with pytest.raises(ValueError, match="page_size must be an integer >= 1, got 0"):
        validate_page_layout(torch.arange(4), 0)


def test_bad_generator_arguments():
    with pytest.raises(ValueError, match="rotation must be >= 1, got 0"):
        make_workload(Point(8, 2), rotation=0)
    with pytest.raises(ValueError, match="chunk_offset_pages must be >= 0, got -1"):
        make_workload(Point(8, 2), chunk_offset_pages=-1)


def test_the_first_process_keeps_every_pool_once_and_a_failed_build_waits_for_its_block(tmp_path, monkeypatch):
    """keep_pools builds each pool into the cache once on two threads, every slice of the specs that share it checked;
    a later build loads the same pool; a pool that cannot be built is left to its block, the others kept."""
    from dataclasses import replace

    import kvpages.measure.inputs as inputs
    from kvpages.core.scenarios import Call
    from kvpages.measure.inputs import PoolCache, keep_pools, point_pool
    from kvpages.measure.targets import PointTarget

    cache = PoolCache(tmp_path)
    targets = [PointTarget(Point(n, p)) for n in (512, 4096) for p in (1, 16)]
    spec = point_pool(Point(4096, 16))
    other = replace(spec, calls=((Call(0, 16, 4096),),))  # the same pool, another slice (from its second page)
    unbuildable = replace(spec, lengths=(1, 2, 3), calls=((Call(0, 0, 1),),), dtype="int64")
    checked: list[tuple[int, int]] = []
    real_check = inputs.validate_page_layout
    monkeypatch.setattr(inputs, "validate_page_layout",
                        lambda kv, p: checked.append((p, kv.numel())) or real_check(kv, p))
    built: list[tuple] = []
    real_build = inputs._build_pool

    def build(lengths, page_size, *rest):
        built.append((lengths, page_size))
        if lengths == (1, 2, 3):
            raise MemoryError("no room")
        return real_build(lengths, page_size, *rest)

    monkeypatch.setattr(inputs, "_build_pool", build)
    keep_pools([unbuildable, other] + [t.pool() for t in targets], cache, threads=2)
    assert sorted(built, key=repr) == sorted({(t.pool().lengths, t.pool().page_size) for t in targets}
                                             | {((1, 2, 3), 16)}, key=repr)  # each pool once
    assert len(list(tmp_path.glob("pool-*.pt"))) == len(targets)  # the unbuildable one not kept
    assert sorted(n for p, n in checked if p == 16 and n > 600) == [4080] + [4096] * len(spec.calls)  # both specs' slices
    monkeypatch.undo()
    for target in targets:
        kept, fresh = target.build("cpu", cache=cache), target.build("cpu")
        assert torch.equal(kept.pool, fresh.pool)
        assert all(torch.equal(a, b) for a, b in zip(kept.inputs, fresh.inputs, strict=True))


@pytest.mark.parametrize("room, side_by_side", [(1.5, False), (1000.0, True)])
def test_pools_are_built_side_by_side_only_where_they_fit_in_the_free_memory(tmp_path, monkeypatch, room, side_by_side):
    """With room for `room` x the largest build's peak (beside every pool kept), two builds run at once only where two
    fit: each build holds itself open (at most 2 s) for another to start beside it."""
    import threading

    import kvpages.measure.inputs as inputs
    from kvpages.measure.inputs import BUILD_PEAK, PoolCache, keep_pools
    from kvpages.measure.targets import PointTarget

    specs = [PointTarget(Point(n, 16)).pool() for n in (4096, 8192, 16384)]
    largest, kept = max(spec.nbytes for spec in specs), sum(spec.nbytes for spec in specs)
    monkeypatch.setattr(inputs, "host_available_bytes",
                        lambda: int((room * BUILD_PEAK * largest + kept) / inputs.HEADROOM))
    active, most, lock, overlapped = [0], [0], threading.Lock(), threading.Event()
    real_build = inputs._build_pool

    def build(*args):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
            if active[0] > 1:
                overlapped.set()
        overlapped.wait(2.0 if side_by_side else 0.2)
        try:
            return real_build(*args)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(inputs, "_build_pool", build)
    keep_pools(specs, PoolCache(tmp_path), threads=2)
    assert (most[0] == 2) == side_by_side and len(list(tmp_path.glob("pool-*.pt"))) == len(specs)


@pytest.mark.parametrize("process, cached, built", [(0, True, True), (1, True, False), (0, False, False)])
def test_only_the_first_process_of_a_run_builds_the_pools_first_and_only_what_it_can_run(
        tmp_path, monkeypatch, process, cached, built):
    """Runner.ready: process 0 of a run with a pool cache builds the pools of its runnable blocks once, before its
    first block's inputs; a later process, or a run of one process (no cache), builds nothing ahead."""
    import kvpages.measure.runner as runner_module
    from kvpages.core.options import BenchOptions
    from kvpages.core.scenarios import StepScenario
    from kvpages.measure.inputs import PoolCache
    from kvpages.measure.runner import Runner
    from kvpages.measure.schedule import Block
    from kvpages.measure.targets import Context, PointTarget, ScenarioTarget

    calls: list[tuple] = []
    monkeypatch.setattr(runner_module, "keep_pools", lambda specs, cache, threads: calls.append(specs))
    runner = Runner(Context("cpu", "cpu", BenchOptions()), 1, 1, process,
                    pool_cache=PoolCache(tmp_path) if cached else None)
    point = PointTarget(Point(512, 16))
    busy = ScenarioTarget(StepScenario(2, "fixed:1024", page_size=16, busy_us=100.0))  # needs CUDA: only recorded here
    runner.ready({}, [Block("device_stride", point, 0, 0), Block("host_stride", point, 0, 1),
                      Block("per_request[device_stride]", busy, 0, 2)])
    runner.workload(point)
    runner.workload(ScenarioTarget(StepScenario(2, "fixed:1024", page_size=16)))
    assert calls == ([(point.pool(),)] if built else [])
