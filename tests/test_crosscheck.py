"""The profiler cross-check: one session in a child process, copies attributed to cases by correlation id,
lost records as their own outcome, and a failure that costs one start, not one per block."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import FAST, REPO, assert_phases_add_up

from kvpages.core.scenarios import StepScenario
from kvpages.core.sweep import Point
from kvpages.measure.breakdown import host_waits
from kvpages.measure.busy import PROBE_CYCLES, cycles_for
from kvpages.measure.crosscheck import (
    AGREE,
    RANGE_PREFIX,
    WARM_UP_RANGE,
    CaseProfile,
    CheckAnswer,
    CheckCase,
    CrosscheckError,
    ProfiledCopy,
    TraceError,
    answers_of,
    case_profiles,
    judge,
    representative,
    run_child,
    run_crosscheck,
    sync_call,
    timeout_for,
)
from kvpages.measure.meter import D2HMeasurement, Transfer
from kvpages.measure.targets import PointTarget, ScenarioTarget
from kvpages.measure.variants import Moves, get_variant, variant_names
from kvpages.schema.reader import load_run

BENCH = (REPO / "bench" / "test_d2h.py").read_text()
PAGEABLE, PINNED = "Memcpy DtoH (Device -> Pageable)", "Memcpy DtoH (Device -> Pinned)"


# ----------------------------------------------------------------------------- a CUDA session's trace


def _range(name: str, ts: float, dur: float) -> list[dict]:
    """A record_function range as Kineto writes it: on the CPU, and its projection on the GPU timeline."""
    return [{"ph": "X", "cat": "user_annotation", "name": name, "pid": 4242, "tid": 4242, "ts": ts, "dur": dur,
             "args": {"External id": int(ts), "Record function id": 0}},
            {"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": 0, "tid": 7, "ts": ts + 500, "dur": dur,
             "args": {"External id": int(ts)}}]


def _copy(ts: float, correlation: int, name: str | None, nbytes: int, runtime_cat: str = "cuda_runtime",
          gpu_cat: str = "gpu_memcpy") -> list[dict]:
    """A `cudaMemcpyAsync` call and (unless `name` is None: the profiler lost it) its GPU record."""
    events = [{"ph": "X", "cat": runtime_cat, "name": "cudaMemcpyAsync", "pid": 4242, "tid": 4242, "ts": ts, "dur": 6,
               "args": {"cbid": 41, "correlation": correlation, "External id": correlation + 1000}}]
    if name is not None:  # the GPU record lands later, on the stream's row, with the same correlation id
        events.append({"ph": "X", "cat": gpu_cat, "name": name, "pid": 0, "tid": 7, "ts": ts + 700, "dur": 3,
                       "args": {"device": 0, "stream": 7, "correlation": correlation, "bytes": nbytes,
                                "memory bandwidth (GB/s)": 10.0}})
    return events


def _kernel(ts: float, correlation: int) -> list[dict]:
    return [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242, "ts": ts,
             "dur": 4, "args": {"correlation": correlation}},
            {"ph": "X", "cat": "kernel", "name": "elementwise_kernel", "pid": 0, "tid": 7, "ts": ts + 600, "dur": 2,
             "args": {"correlation": correlation}}]


CASES = ("device_stride-s8192-p64-int32-fragmented", "host_stride-s8192-p64-int32-fragmented",
         "device_stride_pinned-s8192-p64-int32-fragmented", "hidden_copy-s8192-p64-int32-fragmented",
         "device_shift-s8192-p64-int32-fragmented")


def cuda_session_trace() -> dict:
    """One session as kvpages.measure.crosscheck.profile_cases records it, in Kineto's Chrome-trace format: a warm-up
    range that lost its record (as session starts do on CUPTI < 13.1), then five cases."""
    events = _range(WARM_UP_RANGE, 100, 50) + _copy(110, 1, None, 64)
    events += _range(RANGE_PREFIX + CASES[0], 200, 50) + _kernel(205, 2) + _copy(215, 3, PAGEABLE, 512)
    events += _range(RANGE_PREFIX + CASES[1], 300, 50) + _copy(305, 4, PAGEABLE, 32768)
    events += _range(RANGE_PREFIX + CASES[2], 400, 50) + _kernel(402, 5) + _copy(410, 6, PINNED, 512)
    events += (_range(RANGE_PREFIX + CASES[3], 500, 50) + _copy(505, 7, "Memcpy DtoH (Device -> Pageable)", 32768)
               + _kernel(515, 8) + _copy(520, 9, PAGEABLE, 512))
    events += (_range(RANGE_PREFIX + CASES[4], 600, 50) + _kernel(601, 10)
               + _copy(610, 11, None, 512, runtime_cat="Runtime", gpu_cat="Memcpy"))  # older Kineto's categories
    return {"traceEvents": events}


def metered(nbytes: int, pinned: bool = False) -> D2HMeasurement:
    return D2HMeasurement((Transfer("Tensor.cpu", nbytes, True, pinned),))


def test_copies_are_attributed_to_their_case_by_correlation_id():
    seen = case_profiles(cuda_session_trace())
    assert set(seen) == set(CASES)  # the warm-up range and the GPU-side projections are not cases
    assert seen[CASES[0]] == CaseProfile((ProfiledCopy(PAGEABLE, 512),), 1, 0)
    assert seen[CASES[2]].copies == (ProfiledCopy(PINNED, 512),) and seen[CASES[2]].copies[0].pinned
    assert [c.nbytes for c in seen[CASES[3]].copies] == [32768, 512]
    assert seen[CASES[4]] == CaseProfile((), 1, 1)


def test_each_case_is_judged_agree_mismatch_or_lost():
    measured = {CASES[0]: metered(512), CASES[1]: metered(32768), CASES[2]: metered(512, pinned=True),
                CASES[3]: metered(512), CASES[4]: metered(512)}
    answers = answers_of(cuda_session_trace(), measured)
    assert answers[CASES[0]] == answers[CASES[1]] == answers[CASES[2]] == AGREE
    assert answers[CASES[3]].outcome == "mismatch"
    assert "the meter counted 512 bytes in 1 D2H transfers" in answers[CASES[3]].detail
    assert "the CUDA profiler recorded 33280 bytes in 2 'Memcpy DtoH' copies" in answers[CASES[3]].detail
    lost = answers[CASES[4]]
    assert lost.outcome == "lost_records" and "1 of 1 copy call(s) in this case have no GPU record" in lost.detail
    assert "mismatch" not in lost.detail


def test_pinnedness_and_zero_byte_handoffs():
    seen = CaseProfile((ProfiledCopy(PAGEABLE, 512),), 1, 0)
    assert judge(metered(512, pinned=True), seen).outcome == "mismatch"
    with_empty = D2HMeasurement((Transfer("Tensor.cpu", 512, True, False), Transfer("Tensor.cpu", 0, True, False)))
    assert judge(with_empty, seen) == AGREE  # a zero-byte hand-off issues no memcpy


def _sync(ts: float, name: str) -> list[dict]:
    return [{"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 4242, "tid": 4242, "ts": ts, "dur": 9, "args": {}}]


def test_host_syncs_are_checked_against_the_profilers_synchronize_calls_less_the_ranges_own():
    trace = {"traceEvents": _range(RANGE_PREFIX + "c", 0, 100) + _copy(5, 1, PAGEABLE, 512)
             + _sync(10, "cudaStreamSynchronize") + _sync(30, "cudaEventSynchronize")
             + _sync(90, "cudaDeviceSynchronize")}  # the range's closing synchronize
    assert case_profiles(trace)["c"].syncs == 2
    one_and_a_wait = D2HMeasurement((Transfer("Tensor.cpu", 512, True, False),), host_syncs=1, transfer_syncs=1)
    assert answers_of(trace, {"c": one_and_a_wait}) == {"c": AGREE}
    answer = answers_of(trace, {"c": metered(512)})["c"]
    assert answer.outcome == "mismatch" and "the meter counted 0 host syncs (+0 in a transfer thread's wait)" in answer.detail
    assert case_profiles(cuda_session_trace())[CASES[0]].syncs is None  # no synchronize records at all: unchecked


def test_the_drivers_and_per_thread_synchronizes_count_as_the_runtimes_do():
    """One definition of a synchronizing call (`sync_call`) for the cross-check's count and the breakdown's waits."""
    driver = [{**e, "cat": "cuda_driver"} for e in _sync(20, "cuStreamSynchronize")]
    trace = {"traceEvents": _range(RANGE_PREFIX + "c", 0, 100) + _copy(5, 1, PAGEABLE, 512) + driver
             + _sync(40, "cudaStreamSynchronize_ptsz") + _sync(60, "cudaLaunchKernel") + _sync(90, "cudaDeviceSynchronize")}
    assert case_profiles(trace)["c"].syncs == 2  # the driver's and the per-thread one; not the launch, nor the closing one
    assert [sync_call(n) for n in ("cuStreamSynchronize", "cudaEventSynchronize", "cuCtxSynchronize",
                                   "cudaStreamSynchronize_ptsz")] == [True] * 4
    assert not any(sync_call(n) for n in ("cudaMemcpyAsync", "cudaLaunchKernel", "cudaEventRecord", "Synchronize"))
    assert all(host_waits({"name": n, "args": {}}, {}) for n in ("cuStreamSynchronize", "cudaStreamSynchronize_ptsz"))


def test_no_gpu_activity_at_all_makes_the_crosscheck_unavailable_not_a_mismatch():
    with pytest.raises(CrosscheckError, match="the profiler saw no GPU activity at all"):
        answers_of({"traceEvents": _range(RANGE_PREFIX + CASES[0], 0, 10)}, {CASES[0]: metered(512)})
    cpu_only = D2HMeasurement((Transfer("Tensor.cpu", 512, False, False),))
    assert answers_of({"traceEvents": []}, {"c": cpu_only}) == {"c": AGREE}  # a CPU run crosses no link


def test_a_copy_record_without_bytes_is_a_trace_error():
    trace = {"traceEvents": _range(RANGE_PREFIX + "c", 0, 50) + _copy(5, 1, PAGEABLE, 8)}
    del trace["traceEvents"][-1]["args"]["bytes"]
    with pytest.raises(TraceError, match="carries no byte count"):
        case_profiles(trace)


def test_answers_refuse_unknown_outcomes():
    with pytest.raises(ValueError, match="unknown cross-check outcome 'maybe'; valid: agree, mismatch, lost_records"):
        CheckAnswer("maybe")


# ----------------------------------------------------------------------------- the child process


def test_one_session_answers_for_every_case_and_records_its_trace(tmp_path):
    cases = [CheckCase(v, PointTarget(Point(256, p))) for v in ("host_stride", "device_stride") for p in (1, 16)]
    trace_out = tmp_path / "trace.json.gz"
    assert run_crosscheck(cases, "cpu", trace_out=trace_out) == {c.id: AGREE for c in cases}  # CPU: no link crossed
    with gzip.open(trace_out, "rt") as f:
        trace = json.load(f)  # recorded by torch's profiler in the child: one range per case, in one session
    assert set(case_profiles(trace)) == {c.id for c in cases}
    assert sum(e.get("name") == WARM_UP_RANGE for e in trace["traceEvents"]) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where a CUDA point cannot be built")
def test_a_failing_crosscheck_process_is_one_clear_error():
    with pytest.raises(CrosscheckError, match=r"the profiler cross-check process exited 1: .*CUDA"):
        run_crosscheck([CheckCase("host_stride", PointTarget(Point(8, 1, device="cuda")))], "cuda")


def test_a_crosscheck_process_that_does_not_finish_is_stopped():
    with pytest.raises(CrosscheckError, match=r"did not finish within 0.01 s \(1 cases\)"):
        run_crosscheck([CheckCase("host_stride", PointTarget(Point(8, 1)))], "cpu", timeout_s=0.01)
    assert timeout_for(48) == 54  # the quick preset's 48 cases: well inside gpu_check.sh's 150 s sweep step


CHILD = """
import os, sys
sys.stdin.read()
print("some output before the reply")
{body}
"""


@pytest.mark.parametrize(("body", "outcome"), [
    ('print(\'{"answer": 42}\', flush=True); os._exit(134)  # replied, then crashed at exit', {"answer": 42}),
    ('print(\'{"answer": 42}\', flush=True)', {"answer": 42}),
    ('print("{not json", flush=True)', "exited 0 without a reply: its last line of output was '{not json'"),
    ('print("[1, 2]", flush=True)', "exited 0 without a reply"),
    ('sys.exit("CUPTI teardown failed")', "exited 1: CUPTI teardown failed"),
])
def test_a_child_is_judged_by_its_reply_before_its_exit_status(tmp_path, monkeypatch, body, outcome):
    (tmp_path / "kv_child_stand_in.py").write_text(CHILD.format(body=body))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    if isinstance(outcome, dict):
        assert run_child("kv_child_stand_in", {"cases": []}, 60, "test", CrosscheckError) == outcome
    else:
        with pytest.raises(CrosscheckError, match=f"^the test process {outcome}"):
            run_child("kv_child_stand_in", {"cases": []}, 60, "test", CrosscheckError)


def test_a_sweep_with_the_crosscheck_on_runs_it_in_its_own_process(pytester):
    pytester.makepyfile(test_kv_sweep=BENCH)
    result = pytester.runpytest(*FAST, "--kv-device", "cpu", "--kv-crosscheck", "on", "--kv-seq-lens", "256",
                                "--kv-page-sizes", "16", "--kv-variants", "host_stride,device_stride",
                                "--kv-repetitions", "2")
    result.assert_outcomes(passed=4)
    [folder] = list((pytester.path / "results").iterdir())
    run = load_run(folder)
    assert run.meta.crosscheck == "on (own process)" and run.meta.timing and run.meta.timing.crosscheck_s > 0
    assert_phases_add_up(run.meta)
    assert (run.rows["note"] == "").all()
    events = json.loads(gzip.decompress((folder / "crosscheck_trace.json.gz").read_bytes()))["traceEvents"]
    profiled = {e["pid"] for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"}
    assert profiled and os.getpid() not in profiled  # the calls were profiled in another process than the session's


UNUSABLE_PROFILER = '''
import sys
from pathlib import Path
from kvpages.measure.variants import Moves, variant

if sys.argv[0].endswith("crosscheck.py"):  # imported by the cross-check process: it fails there
    with open(Path(__file__).parent / "child_starts.txt", "a") as f:
        f.write("started\\n")
    raise SystemExit("CUPTI_ERROR_NOT_INITIALIZED (a test's stand-in for an unusable profiler)")


@variant("conftest_stride", moves=Moves.PAGES)
def conftest_stride(kv_indices, page_size):
    """device_stride, registered by a conftest so the cross-check process imports this file."""
    return (kv_indices[::page_size] // page_size).cpu().numpy()
'''


MALFORMED_REPLY = UNUSABLE_PROFILER.replace(
    'raise SystemExit("CUPTI_ERROR_NOT_INITIALIZED (a test\'s stand-in for an unusable profiler)")',
    'sys.modules["__main__"].reply_and_exit = lambda reply: (print(\'{"unavailable": null}\'), sys.exit(139))')


def test_a_malformed_reply_is_the_crosschecks_own_error_and_the_sweep_goes_on(pytester):
    pytester.makeconftest(MALFORMED_REPLY)
    pytester.makepyfile(test_kv_sweep=BENCH)
    result = pytester.runpytest_subprocess(*FAST, "--kv-device", "cpu", "--kv-crosscheck", "on", "--kv-seq-lens", "256",
                                           "--kv-page-sizes", "16", "--kv-variants", "host_stride,conftest_stride",
                                           "--kv-repetitions", "2")
    result.assert_outcomes(passed=4)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    [folder] = list((pytester.path / "results").iterdir())
    run = load_run(folder)
    assert (run.rows["status"] == "ok").all() and run.meta.completed
    assert run.meta.crosscheck.startswith("unavailable: the profiler cross-check process replied without a "
                                          "well-formed answer for every case")
    assert run.rows["note"].str.startswith("cross-check unavailable: the profiler cross-check process replied").all()


def test_a_failed_crosscheck_costs_one_start_and_the_rows_say_so(pytester):
    pytester.makeconftest(UNUSABLE_PROFILER)
    pytester.makepyfile(test_kv_sweep=BENCH)
    result = pytester.runpytest_subprocess(*FAST, "--kv-device", "cpu", "--kv-crosscheck", "on", "--kv-seq-lens",
                                           "256,512", "--kv-page-sizes", "16", "--kv-variants",
                                           "host_stride,conftest_stride", "--kv-repetitions", "3")
    result.assert_outcomes(passed=12)  # 2 variants x 2 points x 3 repetitions, all timed
    assert (pytester.path / "child_starts.txt").read_text().splitlines() == ["started"]
    [folder] = list((pytester.path / "results").iterdir())
    run = load_run(folder)
    assert len(run.rows) == 4 and (run.rows["status"] == "ok").all()
    unusable = "CUPTI_ERROR_NOT_INITIALIZED (a test's stand-in for an unusable profiler)"
    assert run.rows["note"].str.startswith("cross-check unavailable: the profiler cross-check process exited 1").all()
    assert run.rows["note"].str.contains(unusable, regex=False).all()
    assert run.meta.crosscheck.startswith("unavailable: ") and run.meta.completed


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_preflight_profiler_without_cuda_is_exit_4_in_one_line():
    done = subprocess.run([sys.executable, "-m", "kvpages.preflight", "--profiler"], capture_output=True, text=True,
                          timeout=180, cwd=REPO)
    assert done.returncode == 4, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("gpu-check: the profiler cross-check is unavailable here: ")


def cuda_profiler_cases() -> list[CheckCase]:
    """Every variant at L=8192, p = 1 and 64, on the device: what the CUDA cross-check test profiles."""
    return [CheckCase(name, PointTarget(Point(8192, p, device="cuda"))) for name in variant_names() for p in (1, 64)]


def test_the_cuda_profiler_cases_copy_something_unless_declared_not_to():
    # the CUDA test's agreement is vacuous for a case that copies nothing: only the host mirror may declare none
    # (checked here, on any machine, for that test ran only on a GPU: it once asserted > 0 bytes of the host mirror)
    cases = cuda_profiler_cases()
    nothing = {c.id for c in cases if get_variant(c.variant).expected_d2h_bytes(8192, c.target.page_size, 4) == 0}
    assert nothing == {c.id for c in cases if get_variant(c.variant).moves is Moves.NONE}
    assert "host_mirror" in {c.variant for c in cases} and len(nothing) < len(cases)


@pytest.mark.cuda
def test_meter_agrees_with_the_cuda_profiler_in_one_child_session(tmp_path):
    cases = cuda_profiler_cases()
    answers = run_crosscheck(cases, "cuda", trace_out=tmp_path / "trace.json.gz")
    assert answers == {c.id: AGREE for c in cases}, {k: a for k, a in answers.items() if a != AGREE}
    # every agreement but the host mirror's is over copies, not over nothing: the test above checks it, on any machine


# ----------------------------------------------------------------------------- the busy queue's calibration


def test_the_busy_queue_is_calibrated_at_the_boosted_clock():
    # An H200's SM clock: 345 MHz idle, 1980 MHz under load. 1M sleep cycles then take ~2898 us and ~505 us.
    idle_us, boosted_us = PROBE_CYCLES / 345, PROBE_CYCLES / 1980
    cycles = cycles_for(500, PROBE_CYCLES, [idle_us, boosted_us, boosted_us * 1.01, boosted_us * 1.02])
    assert cycles / 1980 == pytest.approx(500, rel=1e-3)  # 500 us once the clock has boosted
    assert cycles_for(500, PROBE_CYCLES, [idle_us]) / 1980 == pytest.approx(87, abs=1)  # the old, undersized queue


def test_the_profiled_cases_are_each_variants_shortest_and_longest_point_and_each_kind_of_steps_smallest():
    points = [CheckCase(v, PointTarget(Point(n, p))) for v in ("host_stride", "device_stride")
              for p in (1, 64) for n in (512, 8192, 131072)]
    steps = [CheckCase("per_request[device_stride]", ScenarioTarget(StepScenario(b, "fixed:2048", page_size=64,
                                                                                  payloads=payloads)))
             for payloads in ("full", "hybrid") for b in (8, 32)]
    chosen = representative(points + steps)
    assert [c.id for c in chosen] == [c.id for c in points + steps if c in chosen]  # in their order
    assert {(c.variant, c.target.point.page_size, c.target.point.seq_len) for c in chosen[:8]} == {
        (v, p, n) for v in ("host_stride", "device_stride") for p in (1, 64) for n in (512, 131072)}
    assert [(c.target.scenario.payloads, c.target.scenario.batch) for c in chosen[8:]] == [("full", 8), ("hybrid", 8)]
