"""A hybrid model's sends: payloads as data, the strategies that convert them (checked against the reference, metered
and declared), the sweep's rows and the report's finding (pytester). CUDA twins skip here, saying why."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_report import cuda_labelled
from torch.overrides import TorchFunctionMode

from kvpages.analysis.citations import cite
from kvpages.analysis.findings import findings
from kvpages.analysis.ratios import analyze
from kvpages.analysis.recommend import recommendations
from kvpages.analysis.wording import CELL_CHARS, MEASURED, MODEL
from kvpages.core.names import STEP_BASELINE, STEP_CANDIDATE
from kvpages.core.options import BenchOptions
from kvpages.core.payloads import BATCHED, GATHERED, PAYLOAD_PRESETS, PER_SEND, PER_STEP, STAGED, STRATEGIES, runs_on, window_start
from kvpages.core.presets import PRESETS
from kvpages.core.scenarios import RequestScenario, StepScenario, describe, sends_of, with_payloads
from kvpages.measure.inputs import make_scenario_workload
from kvpages.measure.order import Stamps, step_call
from kvpages.measure.payloads import Conversions, host_translation, shuffled_pages, swa_mapping, translate
from kvpages.measure.runner import Stop, check_metered
from kvpages.measure.schedule import plan_scenarios
from kvpages.measure.steps import get_step_variant, step_variant_names
from kvpages.measure.targets import ScenarioTarget, finish_for, measure
from kvpages.measure.variants import call_args
from kvpages.render.report import render
from kvpages.schema.reader import load_run

REPO = Path(__file__).resolve().parents[1]
FAST = ("--benchmark-only", "--kv-time-budget", "0.002", "-p", "no:cacheprovider", "--kv-device", "cpu",
        "--kv-breakdown", "off", "--kv-repetitions", "2", "--kv-remeasure-budget", "0")  # rounds: test_remeasure.py
STEP = StepScenario(4, "uniform:100,3000", page_size=16, payloads="hybrid", swa_window=500)
SCENARIOS = [STEP, RequestScenario(3000, 700, "prefill", page_size=64, payloads="hybrid", swa_window=10),
             RequestScenario(3000, 700, "decode", page_size=64, prefix=33, payloads="swa", swa_window=3000),
             StepScenario(3, "fixed:700", page_size=64, payloads="dsa", dtype="int64")]


def test_a_send_carries_its_payloads_after_its_main_slice():
    step = StepScenario(2, "fixed:10000", page_size=64, payloads="hybrid")
    assert [(c.row, c.start, c.end, c.payload, c.send) for c in step.calls()] == [
        (0, 0, 10000, "main", 0), (0, 5888, 10000, "swa", 0), (0, 0, 10000, "indexer", 0),  # window floored to a page
        (1, 0, 10000, "main", 1), (1, 5888, 10000, "swa", 1), (1, 0, 10000, "indexer", 1)]
    prefill = RequestScenario(20000, 8192, "prefill", page_size=64, payloads="hybrid")
    assert [c.payload for c in prefill.calls()] == ["main", "main", "main", "swa", "indexer"]  # the last chunk's send
    assert [c.send for c in prefill.calls()] == [0, 1, 2, 2, 2] and sends_of(prefill) == 3
    decode = RequestScenario(20000, 8192, "decode", page_size=64, prefix=100, payloads="dsa")
    assert [(c.start, c.end) for c in decode.calls()] == [(100, 20000), (0, 20000)]  # a prefix shortens the main KV
    assert step.id == "step-B2-fixed_10000-p64-int32-hybrid-w4096" and decode.id.endswith("-int32-dsa")
    assert dataclasses.replace(step, payloads="full").id == "step-B2-fixed_10000-p64-int32"  # today's ids unchanged


@pytest.mark.parametrize("prompt_len, window, page_size, expected", [
    (1000, 10, 64, (960, 1000)),  # a window shorter than a page: the page it ends in
    (1000, 1000, 64, (0, 1000)),  # a window of L: the whole row
    (1000, 5000, 16, (0, 1000)),
    (1000, 300, 1, (700, 1000)),
])
def test_the_window_starts_a_page_before_l_minus_w(prompt_len, window, page_size, expected):
    assert (window_start(prompt_len, window, page_size), prompt_len) == expected


@pytest.mark.parametrize("make, words", [
    (lambda: StepScenario(2, "fixed:100", page_size=16, payloads="mamba"),
     "unknown payload preset 'mamba'; valid: full, swa, dsa, hybrid"),
    (lambda: StepScenario(2, "fixed:100", page_size=16, payloads="swa", swa_window=0), "SWA window must be"),
    (lambda: BenchOptions.parse({"--kv-payloads": "hybrid,nope"}.get),
     "--kv-payloads: unknown value 'nope'; valid: full, swa, dsa, hybrid"),
    (lambda: BenchOptions.parse({"--kv-swa-window": "0"}.get), "--kv-swa-window: 0 is not >= 1"),
])
def test_an_unknown_payload_preset_or_a_bad_window_is_refused_in_one_line(make, words):
    with pytest.raises(ValueError) as err:
        make()
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_option_makes_each_scenario_once_per_payload_preset():
    options = BenchOptions.parse({"--kv-preset": "quick", "--kv-payloads": "full,dsa", "--kv-swa-window": "128"}.get)
    quick = PRESETS["quick"].scenarios
    assert [s.id for s in options.scenario_set] == [s.id for q in quick for s in (q, dataclasses.replace(q, payloads="dsa"))]
    assert with_payloads(quick, None, None) == quick
    default = {s.payloads for s in PRESETS["default"].scenarios}
    assert default == {"full", "hybrid"} and {s.payloads for s in PRESETS["full"].scenarios} == set(PAYLOAD_PRESETS)


def test_the_strategies_run_on_several_payloads_and_the_rest_on_one():
    names = step_variant_names()
    assert set(STRATEGIES) <= set(names)
    several = [n for n in names if runs_on(n, "hybrid")]
    assert several == [n for n in names if n in STRATEGIES]
    assert not {GATHERED, STAGED} & {n for n in names if runs_on(n, "full")}
    blocks = plan_scenarios(names, [ScenarioTarget(StepScenario(2, "fixed:64", page_size=16)), ScenarioTarget(STEP)], 2, 0)
    assert {b.variant for b in blocks if b.target.scenario is STEP} == set(STRATEGIES)


def test_the_registry_does_what_the_strategies_declare():
    for name, strategy in STRATEGIES.items():
        v = get_step_variant(name)
        assert (v.batched, v.per_send, v.staged) == (strategy.copies == PER_STEP, strategy.copies == PER_SEND, strategy.staged)
        assert v.syncs.cuda == v.syncs.cpu == (0 if strategy.staged else 1)  # what the model reads off a CPU run's rows


def test_the_swa_translation_is_a_device_gather_that_matches_the_host():
    sigma = shuffled_pages(50, seed=3)
    kv = torch.arange(64 * 3, 64 * 7, dtype=torch.int32)[5:]
    device = translate(swa_mapping(sigma, 64, "cpu"), kv)
    assert device.dtype == torch.int32 and torch.equal(device, host_translation(sigma, kv, 64))
    assert not torch.equal(device, kv) and sorted(sigma) == list(range(51)) and sigma[0] == 0


@pytest.mark.parametrize(("scenario", "name"), [
    pytest.param(s, name, id=f"{name}-{s.id}") for s in SCENARIOS for name in STRATEGIES
    if not (s.kind == "request" and get_step_variant(name).batched)])  # a batched strategy is a step's
def test_every_strategy_matches_the_per_payload_reference_and_is_metered_as_declared(scenario, name):
    target = ScenarioTarget(scenario)
    workload = make_scenario_workload(scenario, "cpu", copies=2)
    inputs = target.inputs_for(name, workload)
    assert all(isinstance(x, Conversions) for x in inputs)
    for x, expected in zip(inputs, workload.expected, strict=True):
        assert target.check(target.call_here(name, x), expected) is None
    reading = measure(target, name, inputs[0]).reading()
    check_metered(target, name, reading, "cpu")  # bytes, copies, host syncs and device ops as declared
    assert reading.device_ops == target.expected_ops(name)


def test_per_payload_pays_three_copies_a_request_and_the_others_fewer():
    target = ScenarioTarget(STEP)
    inputs = make_scenario_workload(STEP, "cpu", copies=1).inputs[0]
    counted = {n: measure(target, n, inputs).reading() for n in STRATEGIES}
    b = STEP.batch
    assert (counted[STEP_CANDIDATE].d2h_transfers, counted[STEP_CANDIDATE].host_syncs) == (3 * b, 3 * b)
    assert (counted[GATHERED].d2h_transfers, counted[GATHERED].host_syncs) == (b, b)
    assert (counted[BATCHED].d2h_transfers, counted[BATCHED].host_syncs) == (1, 1)
    assert (counted[STAGED].d2h_transfers, counted[STAGED].host_syncs) == (1, 0)  # its hand-off is non-blocking
    assert len({counted[n].d2h_bytes for n in (STEP_CANDIDATE, GATHERED, BATCHED, STAGED)}) == 1
    assert counted[STEP_BASELINE].device_ops == 2 * b  # the SWA gathers and casts, nothing else on the device


def test_a_device_op_too_many_is_a_mismatch_naming_it(monkeypatch):
    batched = get_step_variant(BATCHED)

    def one_more(kv_slices, page_size):
        return batched.fn([kv.clone() for kv in kv_slices], page_size)

    from kvpages.measure import steps

    monkeypatch.setitem(steps._REGISTRY, BATCHED, dataclasses.replace(batched, fn=one_more))
    target = ScenarioTarget(STEP)
    reading = measure(target, BATCHED, make_scenario_workload(STEP, "cpu", copies=1).inputs[0]).reading()
    with pytest.raises(Stop, match=f"measured {target.expected_ops(BATCHED) + 3 * STEP.batch} device ops, expected"):
        check_metered(target, BATCHED, reading, "cpu")


def test_kvpages_scenarios_lists_each_payload_call():
    lines = list(describe(StepScenario(2, "fixed:1000", page_size=64, payloads="hybrid", swa_window=100)))
    assert "2 send(s) of payloads hybrid: main + swa (window 100, translated to the SWA pool) + indexer" in lines[0]
    assert lines[2].startswith("  call 1: swa req_to_token[row 0, 896:1000]  104 tokens -> 2 pages")
    done = subprocess.run([sys.executable, "-m", "kvpages", "scenarios", "--preset", "default"], capture_output=True,
                          text=True, check=True)
    assert "step-B32-fixed_32768-p64-int32-hybrid-w4096: step, 32 request(s), 96 call(s)" in done.stdout


@pytest.fixture
def steps_bench(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_kv_steps=(REPO / "bench" / "test_steps.py").read_text())
    return pytester


def test_a_hybrid_step_writes_its_strategies_rows_and_the_reports_finding(steps_bench):
    result = steps_bench.runpytest(*FAST, "--kv-step-sizes", "4", "--kv-step-lens", "fixed:2048", "--kv-page-sizes", "64",
                                   "--kv-payloads", "full,swa,hybrid", "--kv-swa-window", "512", "--kv-analyze")
    assert result.ret == 0, result.stdout.str()[-3000:]
    [folder] = list((steps_bench.path / "results").iterdir())
    frame = pd.read_csv(folder / "scenarios.csv")
    hybrid = frame[frame["payloads"] == "hybrid"].set_index("variant")
    assert set(hybrid.index) == set(STRATEGIES) and (hybrid["status"] == "ok").all()
    assert (hybrid["swa_window"] == 512).all() and (frame[frame["payloads"] == "full"]["swa_window"] == 0).all()
    copies = {STEP_BASELINE: (12, 12), STEP_CANDIDATE: (12, 12), GATHERED: (4, 4), BATCHED: (1, 1), STAGED: (1, 0)}
    assert {v: (r["d2h_transfers"], r["host_syncs"]) for v, r in hybrid.iterrows()} == copies
    assert (hybrid["blocked_median_us"] == hybrid["ready_median_us"]).all()
    assert "blocked = ready" in hybrid.loc[STAGED, "note"] and "--kv-payloads hybrid --kv-swa-window 512" in hybrid.loc[
        STAGED, "repro"]
    assert set(frame[frame["payloads"] == "full"]["variant"]).isdisjoint({GATHERED, STAGED})
    analysis = analyze(load_run(folder))
    report = render(analysis)
    [finding] = [line for line in report.splitlines() if line.startswith("| Per step, payloads hybrid |")]
    for said in ("B=4, p=64, hybrid: per payload 12 D2H/12 syncs, per request 4/4, batched 1/1, staged 1/0 (metered)",
                 "predicted scheduler-thread time vs per payload's: per request ", "Blocked equals ready here",
                 "model: pcie5_pageable "):
        assert said in finding, said
    [cpu] = [f for f in findings(analysis) if f.question == "Per step, payloads hybrid"]
    assert max(len(cpu.answer), len(cpu.figure)) <= CELL_CHARS and cpu.status == MODEL
    # its row: staging against per payload, as its figure (not the staged step against pre-PR), which cite prints
    assert cpu.id == "rec-stage-payloads" and f"; on a GPU box, {cpu.figure}; rows " in cite(analysis, cpu.id)
    # staging is set on the hybrid preset alone: the swa step's finding cites its staged row against pre-PR, and says so
    assert [r.id for r in recommendations(analysis) if r.candidate == STAGED] == ["rec-stage-payloads"]
    [swa] = [f for f in findings(analysis) if f.question == "Per step, payloads swa"]
    assert swa.id.endswith("-swa-w512:staged_device_stride") and "; figure: staged / pre-PR per payload." in swa.answer
    assert f"; on a GPU box, {swa.figure}; " in cite(analysis, swa.id) and max(len(swa.answer), len(swa.figure)) <= CELL_CHARS
    assert "### A hybrid model's payloads" in report
    # relabelled as a CUDA run that crossed PCIe, each row's link as a GPU's meter reads it (staging copies into pinned
    # memory, the rest .cpu() into pageable): the finding is measured, each strategy against per payload
    frame["link"] = ["pcie pinned" if v == STAGED else "pcie pageable" for v in frame["variant"]]
    frame.to_csv(folder / "scenarios.csv", index=False)
    on_cuda = analyze(load_run(cuda_labelled(folder)))
    [measured] = [f for f in findings(on_cuda) if f.question == "Per step, payloads hybrid"]
    assert measured.status == MEASURED and "measured blocked time vs per payload's: per request " in (
        measured.answer) and "interval" in measured.figure
    [staging] = [r for r in recommendations(on_cuda) if r.id == measured.id]  # the same pair, judged
    assert (staging.id, staging.candidate, staging.against) == ("rec-stage-payloads", STAGED, STEP_CANDIDATE)
    assert measured.figure.startswith(f"{staging.gain}, ") and staging.basis == "measured here"
    [swa_measured] = [f for f in findings(on_cuda) if f.question == "Per step, payloads swa"]
    assert f"blocked = {swa_measured.figure} (" in cite(on_cuda, swa_measured.id)  # its row against pre-PR, as cited
    assert max(len(measured.answer), len(measured.figure)) <= CELL_CHARS


def test_a_run_written_before_the_payload_columns_reads_them_as_the_main_kv_alone():
    frame = load_run(REPO / "results" / "20261204T181656Z-cuda-nvidia-h200").scenarios  # the first H200 run's
    assert frame is not None and set(frame["payloads"]) == {"full"} and frame["device_ops"].isna().all()


def test_only_the_staged_strategy_translates_before_the_forward_the_others_in_their_readback():
    """SGLang's send path translates a SWA payload just before its copy, after the next forward is launched; only a
    staged strategy moves that work ahead of the forward. The gathers' order is read from torch itself."""
    seen: list[str] = []

    class Order(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.index_select:
                seen.append("translate")
            return func(*args, **(kwargs or {}))

    target, workload = ScenarioTarget(STEP), make_scenario_workload(STEP, "cpu", copies=1)
    with ThreadPoolExecutor(1) as thread:
        for name in STRATEGIES:
            run = step_call(get_step_variant(name), finish_for(STEP), thread, Stamps(), lambda: seen.append("forward"))
            args, kwargs = call_args(target.inputs_for(name, workload)[0], STEP.page_size)
            seen.clear()
            with Order():
                run(*args, **kwargs)
            translations = [i for i, what in enumerate(seen) if what == "translate"]
            assert len(translations) == STEP.batch and seen.count("forward") == 1, (name, seen)
            forward = seen.index("forward")
            assert all(i < forward for i in translations) if name == STAGED else forward < translations[0], (name, seen)


@pytest.mark.cuda
def test_cuda_strategies_match_the_reference_and_stage_off_the_scheduler_thread():
    scenario = dataclasses.replace(STEP, swa_window=256)
    target = ScenarioTarget(scenario)
    workload = make_scenario_workload(scenario, "cuda", copies=2)
    counted = {}
    for name in STRATEGIES:
        inputs = target.inputs_for(name, workload)
        for x, expected in zip(inputs, workload.expected, strict=True):
            assert target.check(target.call_here(name, x), expected) is None, name
        measured = measure(target, name, inputs[0])
        check_metered(target, name, measured.reading(), "cuda")
        counted[name] = (measured.host_syncs, measured.transfer_syncs)
    assert counted[STEP_CANDIDATE] == (3 * scenario.batch, 0) and counted[GATHERED] == (scenario.batch, 0)
    assert counted[STAGED] == (0, 1)  # the transfer worker's wait on the event


@pytest.mark.cuda
def test_cuda_behind_the_busy_queue_staging_blocks_the_scheduler_thread_less_than_per_payload(steps_bench):
    result = steps_bench.runpytest(
        "--benchmark-only", "--kv-time-budget", "0.05", "-p", "no:cacheprovider", "--kv-device", "cuda",
        "--kv-preset", "quick", "--kv-repetitions", "2", "--kv-crosscheck", "off", "--kv-payloads", "hybrid",
        "--kv-step-variants", f"{STEP_CANDIDATE},{STAGED}")
    assert result.ret == 0, result.stdout.str()[-3000:]
    [folder] = list((steps_bench.path / "results").iterdir())
    frame = pd.read_csv(folder / "scenarios.csv")
    busy = frame[(frame["busy_us"] > 0) & (frame["kind"] == "step")].set_index("variant")
    [busy_step] = busy["scenario"].unique()
    quiet = frame[frame["scenario"] == busy_step.rsplit("-busy", 1)[0]].set_index("variant")
    added = busy["blocked_median_us"] - quiet.loc[busy.index, "blocked_median_us"]  # what the queue adds to each
    queued = busy["busy_measured_us"]
    # per payload: its first .cpu() waits for the forward, so the scheduler thread is blocked at least that long (not
    # "the queue adds 80% of it": the SWA translations it launches after the forward, before that .cpu(), overlap the
    # forward: in the H200's quick run, batching, 9 launches before its first sync, was blocked 581 µs behind a 503 µs
    # forward, of which the queue added 398 µs, under 80% of it)
    assert busy.loc[STEP_CANDIDATE, "blocked_median_us"] > 0.9 * queued[STEP_CANDIDATE]
    assert added[STAGED] < 0.5 * queued[STAGED]  # launched before the forward, read by the transfer worker
    assert (busy.loc[STAGED, "host_syncs"], busy.loc[STEP_CANDIDATE, "host_syncs"]) == (0, 24)
