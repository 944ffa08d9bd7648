"""Where the time goes: the trace arithmetic on written traces, the profiling process for real, and a sweep that
writes breakdown.csv, its chart and its report section (or notes in meta.json why it could not)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from kvpages.core.sweep import Point
from kvpages.measure.breakdown import (
    CALL_MARK,
    BreakdownError,
    breakdown_rows,
    chosen_points,
    host_waits,
    profile_trace,
    run_breakdown,
    self_times,
    write_breakdown_into,
)
from kvpages.measure.crosscheck import CheckCase
from kvpages.measure.targets import PointTarget
from kvpages.schema.breakdown import BREAKDOWN_CSV, CALLS, PASSES, read_breakdown, shares, stack, write_breakdown

BENCH = (Path(__file__).parents[1] / "bench" / "test_d2h.py").read_text()
SMALL = ("--benchmark-only", "--kv-time-budget", "0.001", "-p", "no:cacheprovider", "--kv-device", "cpu",
         "--kv-scenarios", "none", "--kv-repetitions", "1", "--kv-passes", "1", "--kv-analyze")
H200 = Path(__file__).parents[1] / "results" / "20261204T181656Z-cuda-nvidia-h200"
"""The first H200 run (real CUDA data: its cross-check's trace)."""
META = {"variant": "v", "dtype": "int32", "layout": "fragmented", "seq_len": 512, "page_size": 16}


def x(name: str, ts: float, dur: float, cat: str = "cpu_op", **args) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "args": args}


def calls(case: str, durations: list[float], inner) -> list[dict]:
    """One `kvpages:<case>#k` range per call, 1000 µs apart, with `inner(start)` events inside each."""
    out = []
    for k, dur in enumerate(durations):
        out += [x(f"kvpages:{case}#{k}", 1000.0 * k, dur, "user_annotation")] + inner(1000.0 * k)
    return out


def test_self_time_is_an_op_less_the_ops_nested_in_it():
    ops = [x("aten::to", 0, 10), x("aten::_to_copy", 1, 8), x("aten::copy_", 2, 5), x("aten::slice", 20, 3)]
    assert dict(self_times(ops)) == {"aten::to": 2, "aten::_to_copy": 3, "aten::copy_": 5, "aten::slice": 3}


def test_a_cpu_row_is_the_median_call_split_into_aten_and_host():
    def inner(t):
        return [x("aten::floor_divide", t + 1, 4), x("aten::to", t + 6, 3), x("aten::_to_copy", t + 6.5, 2)]

    trace = {"traceEvents": calls("c", [30.0, 10.0, 20.0], inner)}
    [row] = breakdown_rows(trace, {"c": META}, "cpu", 3)
    assert (row.id, row.wall_us, row.calls) == ("c", 20.0, 3)  # the median of 30, 10 and 20
    assert (row.aten_copy_us, row.aten_ops_us, row.host_us) == (3.0, 4.0, 13.0)
    assert row.top_ops == "aten::floor_divide 4.00; aten::_to_copy 2.00; aten::to 1.00"
    assert sum(v for _, v in stack(row)) == pytest.approx(row.wall_us)


@pytest.mark.parametrize(("memory", "sync", "launch", "wait", "other_wait"), [
    ("Pageable", "cudaStreamSynchronize", 4.0, 23.0, 7.0),  # the copy call waits until the copy is done (CUDA stages it)
    ("Pinned", "cudaEventSynchronize", 7.0, 20.0, 4.0),  # device_stride_pinned: the copy call only queues it
])
def test_a_cuda_row_splits_the_wait_by_the_device_work_it_waited_for(memory, sync, launch, wait, other_wait):
    def inner(t):
        return [x("cudaLaunchKernel", t + 1, 4, "cuda_runtime", correlation=1),
                x("cudaMemcpyAsync", t + 6, 3, "cuda_runtime", correlation=2),
                x(sync, t + 10, 20, "cuda_runtime", correlation=3),
                x("floor_divide_kernel", t + 5, 6, "kernel", correlation=1),
                x(f"Memcpy DtoH (Device -> {memory})", t + 12, 10, "gpu_memcpy", correlation=2, bytes=2048)]

    [row] = breakdown_rows({"traceEvents": calls("c", [40.0], inner)}, {"c": META}, "cuda", 1)
    assert (row.launch_us, row.wait_us, row.host_us) == (launch, wait, 13.0)
    assert (row.kernel_us, row.memcpy_us, row.memcpy_bytes, row.memcpy_direction) == (6.0, 10.0, 2048, "DtoH")
    parts = dict(stack(row))
    assert parts["GPU kernels (waited for)"] == pytest.approx(6.0)
    assert parts["other wait (synchronize, queue)"] == pytest.approx(other_wait)
    assert sum(parts.values()) == pytest.approx(row.wall_us)
    assert sum(s for _, s in shares(row)) == pytest.approx(1.0)


def test_the_host_waits_in_a_synchronize_and_a_copy_that_is_synchronous_for_it():
    gpu = {2: {"name": "Memcpy DtoH (Device -> Pinned)"}, 3: {"name": "Memcpy DtoH (Device -> Pageable)"},
           4: {"name": "Memcpy DtoD (Device -> Device)"}}
    copies = [{"name": "cudaMemcpyAsync", "args": {"correlation": c}} for c in (2, 3, 4, 5)]  # 5: its record lost
    assert [host_waits(c, gpu) for c in copies] == [False, True, False, True]
    assert host_waits({"name": "cudaMemcpy", "args": {"correlation": 2}}, gpu)  # synchronous whatever the memory
    assert host_waits({"name": "cudaEventSynchronize", "args": {}}, gpu)
    assert not host_waits({"name": "cudaLaunchKernel", "args": {"correlation": 1}}, gpu)


@pytest.mark.skipif(not (H200 / "crosscheck_trace.json.gz").is_file(), reason=f"{H200.name} is not committed here")
def test_on_the_h200_every_copy_into_pinned_memory_queues_and_every_copy_into_pageable_memory_waits():
    with gzip.open(H200 / "crosscheck_trace.json.gz", "rt") as f:  # its cross-check's trace: real CUDA records
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    records = {e["args"]["correlation"]: e for e in events if e.get("cat") == "gpu_memcpy"}
    copies = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"] == "cudaMemcpyAsync"
              and records.get(e["args"].get("correlation"), {}).get("name", "").startswith("Memcpy DtoH")]
    assert {"Pinned" in records[e["args"]["correlation"]]["name"] for e in copies} == {True, False}
    assert all(host_waits(e, records) == ("Pageable" in records[e["args"]["correlation"]]["name"]) for e in copies)


def test_a_cuda_profile_without_gpu_activity_fails_instead_of_giving_zeros():
    def inner(t):  # the CPU side of a call, as a profile without CUPTI records it: no kernel, no memcpy
        return [x("cudaLaunchKernel", t + 1, 4, "cuda_runtime", correlation=1),
                x("cudaMemcpyAsync", t + 6, 3, "cuda_runtime", correlation=2)]

    trace = {"traceEvents": calls("c", [40.0], inner)}
    with pytest.raises(BreakdownError, match=r"the profiler saw no GPU activity at all .*so there is no breakdown"):
        breakdown_rows(trace, {"c": META}, "cuda", 1)
    [row] = breakdown_rows(trace, {"c": META}, "cpu", 1)  # a CPU profile has no GPU activity to see
    assert row.kernel_us is None


def test_the_synchronize_runs_after_each_profiled_call_outside_its_range():
    from torch.profiler import record_function

    def sync():  # a stand-in for the device's synchronize that leaves its own range in the trace
        with record_function("probe:sync"):
            pass

    cases = [CheckCase(v, PointTarget(Point(512, 16))) for v in ("host_stride", "device_stride")]
    events = [e for e in profile_trace(cases, "cpu", CALLS, PASSES, sync)["traceEvents"] if e.get("ph") == "X"]
    ranges = [e for e in events if CALL_MARK in str(e["name"]) and str(e["name"]).startswith("kvpages:")]
    syncs = [e for e in events if e["name"] == "probe:sync"]
    assert len(ranges) == len(cases) * CALLS * PASSES and len(syncs) >= len(ranges)
    ranges = sorted(ranges, key=lambda e: float(e["ts"]))
    for r, following in zip(ranges, [*ranges[1:], None], strict=True):
        start, end = float(r["ts"]), float(r["ts"]) + float(r["dur"])
        assert not [s for s in syncs if start <= float(s["ts"]) < end], f"a synchronize inside {r['name']}"
        before = math.inf if following is None else float(following["ts"])  # after this call, before the next
        assert [s for s in syncs if end <= float(s["ts"]) < before], f"no synchronize after {r['name']}"


def test_a_trace_without_a_case_is_an_error():
    with pytest.raises(ValueError, match="0 ranges for case c, expected 3"):
        breakdown_rows({"traceEvents": []}, {"c": META}, "cpu", 3)


def test_three_lengths_per_page_size():
    points = [Point(n, p) for p in (1, 64) for n in (512, 2048, 8192, 32768)]
    assert [(q.seq_len, q.page_size) for q in chosen_points(points)] == [
        (512, 1), (8192, 1), (32768, 1), (512, 64), (8192, 64), (32768, 64)]


def test_the_profiling_process_for_real(tmp_path):
    from kvpages.core import adaptive

    variants = ("host_stride", "device_stride", "host_mirror", "adaptive")
    cases = [CheckCase(v, PointTarget(Point(4096, 16))) for v in variants]
    before = adaptive.threshold()
    adaptive.use_threshold(4096)  # as the session does for --kv-adaptive-threshold 4096 (the default: 32768)
    try:
        rows = run_breakdown(cases, "cpu")
    finally:
        adaptive.use_threshold(before)
    assert [r.id for r in rows] == [c.id for c in cases]
    by = {r.variant: r for r in rows}
    assert by["host_mirror"].aten_copy_us == 0 and by["host_mirror"].aten_ops_us == 0
    assert "aten::floor_divide" in by["device_stride"].top_ops and "aten::floor_divide" not in by["host_stride"].top_ops
    assert "aten::floor_divide" in by["adaptive"].top_ops  # the child divides on the device from the sweep's threshold
    write_breakdown(tmp_path, rows)
    assert read_breakdown(tmp_path) == tuple(rows)


def test_a_failed_breakdown_returns_why_and_writes_nothing(tmp_path):
    cases = [CheckCase("host_stride", PointTarget(Point(512, 16)))]
    with pytest.raises(BreakdownError, match=r"did not finish within 0\.01 s"):
        run_breakdown(cases, "cpu", timeout_s=0.01)
    note = write_breakdown_into(tmp_path, cases, "cuda", timeout_s=0.01)  # CUDA's own process (a CPU run's is this one)
    assert note.startswith("failed after") and not (tmp_path / BREAKDOWN_CSV).exists()


def test_a_sweep_writes_breakdown_csv_its_chart_and_its_report_section(pytester):
    pytester.makepyfile(test_kv_sweep=BENCH)
    result = pytester.runpytest(*SMALL, "--kv-seq-lens", "256,1024,4096,8192", "--kv-page-sizes", "1,16")
    assert result.ret == 0
    [folder] = list((pytester.path / "results").iterdir())
    rows = read_breakdown(folder)
    assert {(r.seq_len, r.page_size) for r in rows} == {(n, p) for n in (256, 4096, 8192) for p in (1, 16)}
    assert len({r.id for r in rows}) == len(rows)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["breakdown"].startswith(f"breakdown.csv: {len(rows)} rows") and meta["timing"]["breakdown_s"] > 0
    assert (folder / "breakdown_int32_fragmented.png").exists()
    report, appendix = (folder / "REPORT.md").read_text(), (folder / "APPENDIX.md").read_text()
    assert "### Where the time goes\n\nShares of one call's wall time" in report
    assert f"## Where the time goes\n\nThe call of median wall time of {PASSES * CALLS} profiled calls" in appendix
    assert "## Host mirror" in appendix


def test_a_breakdown_that_fails_loses_nothing_of_the_run(pytester):
    pytester.makeconftest("import kvpages.measure.breakdown as b\n\n\n"
                          "def broken(*args, **kwargs):  # a CPU run profiles in the session's process: it fails there\n"
                          "    raise b.BreakdownError('the profiler failed')\n\n\n"
                          "b.profile_breakdown = broken\n")
    pytester.makepyfile(test_kv_sweep=BENCH)
    result = pytester.runpytest_subprocess(*SMALL, "--kv-seq-lens", "256", "--kv-page-sizes", "16")
    assert result.ret == 0
    [folder] = list((pytester.path / "results").iterdir())
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["completed"] and meta["breakdown"].startswith("failed after")
    assert not (folder / BREAKDOWN_CSV).exists() and (folder / "REPORT.md").exists()


def test_the_chart_stacks_each_bar_s_shares_under_its_time_and_over_its_name(reported_reference):
    """The reference run's chart, as drawn: per panel (page size), each profiled row is one bar of its parts' shares
    stacked from 0 to 1 (one rectangle per part, in its part's colour), its profiled µs above and its variant and
    length under it."""
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgba

    from kvpages.analysis.cite import sig
    from kvpages.render.breakdown import PART_COLORS, breakdown_figure

    rows = reported_reference.analysis.breakdown
    fig = breakdown_figure(reported_reference.analysis)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == [f"page_size={p}" for p in sorted({r.page_size for r in rows})]
    for ax in panels:
        page_size = int(ax.get_title().split("=")[1])
        mine = [r for r in rows if r.page_size == page_size]
        (bars,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
        boxes = [path.vertices for path in bars.get_paths()]
        low, high = ax.get_xlim()  # every bar inside the panel, with a margin (as ax.bar's)
        assert low < min(box[:, 0].min() for box in boxes) - 0.5 and max(box[:, 0].max() for box in boxes) + 0.5 < high
        parts = len(shares(mine[0]))
        assert len(boxes) == parts * len(mine)
        texts = [t.get_text() for t in ax.texts]
        names = [t for t in texts if "  s" in t]
        assert sorted(names) == sorted(f"{r.variant}  s{r.seq_len}" for r in mine)
        assert sorted(t for t in texts if t not in names) == sorted(sig(r.wall_us) for r in mine)
        colors = [tuple(c) for c in bars.get_facecolors()]
        for k, name in enumerate(names):  # bar k: its parts are boxes k, k + bars, k + 2 bars, ...
            variant, seq_len = name.split("  s")
            row = next(r for r in mine if r.variant == variant and r.seq_len == int(seq_len))
            stacked = [boxes[k + j * len(mine)] for j in range(parts)]
            heights = [box[:, 1].max() - box[:, 1].min() for box in stacked]
            assert heights == pytest.approx([share for _, share in shares(row)], abs=1e-12)
            assert stacked[0][:, 1].min() == pytest.approx(0) and stacked[-1][:, 1].max() == pytest.approx(1)
            assert [colors[k + j * len(mine)] for j in range(parts)] == [to_rgba(c) for c in PART_COLORS[:parts]]
