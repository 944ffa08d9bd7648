"""Host syncs, metered like bytes: what the meter counts, what every variant declares, and a call that syncs once
too often becomes a mismatch (CUDA twins count the waits themselves; they skip here, saying why)."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from kvpages.core.names import STEP_BASELINE
from kvpages.core.scenarios import StepScenario
from kvpages.core.sweep import Point
from kvpages.measure.inputs import make_scenario_workload, make_workload
from kvpages.measure.meter import measure_call, transfer_wait
from kvpages.measure.runner import Stop, check_metered
from kvpages.measure.steps import IN_ORDER, get_step_variant, step_variant_names
from kvpages.measure.targets import PointTarget, ScenarioTarget, measure
from kvpages.measure.variants import get_variant, variant_names

REPO = Path(__file__).resolve().parents[1]
FAST = ("--benchmark-only", "--kv-time-budget", "0.002", "-p", "no:cacheprovider", "--kv-breakdown", "off",
        "--kv-repetitions", "1")
STEP = StepScenario(5, "uniform:100,900", page_size=16)


def syncs(body, kv: torch.Tensor) -> tuple[int, int]:
    """(host syncs, transfers) of one call of `body(kv)`."""
    measured = measure_call(lambda: body(kv), (kv,))
    return measured.host_syncs, measured.d2h_transfers


@pytest.mark.parametrize(
    "body, expected",
    [
        (lambda kv: kv.cpu().numpy(), (1, 1)),  # a blocking copy; numpy of its host result is no second one
        (lambda kv: kv[0].item(), (1, 1)),
        (lambda kv: kv[:3].tolist(), (1, 1)),
        (lambda kv: [kv[:2].cpu(), kv[2:].cpu()], (2, 2)),
        (lambda kv: torch.empty(4, dtype=kv.dtype).copy_(kv[:4], non_blocking=True), (0, 1)),  # waits nowhere here
        (lambda kv: kv.shape[0] + kv.numel(), (0, 0)),
    ],
)
def test_on_a_cpu_run_the_figure_is_the_blocking_hand_offs(body, expected):
    assert syncs(body, torch.arange(10, dtype=torch.int32)) == expected


def test_a_wait_run_as_the_workers_is_not_the_calling_threads():
    kv = torch.arange(10, dtype=torch.int32)

    def step():
        kv[:2].cpu()
        with transfer_wait():
            kv[2:].cpu()

    measured = measure_call(step, (kv,))
    assert (measured.host_syncs, measured.transfer_syncs, measured.d2h_transfers) == (1, 1, 2)


@pytest.mark.parametrize("name", variant_names())
def test_every_variant_makes_the_syncs_it_declares(name):
    v = get_variant(name)
    if v.unavailable_reason("cpu"):
        pytest.skip(v.unavailable_reason("cpu"))
    target = PointTarget(Point(777, 16))
    measured = measure(target, name, target.inputs_for(name, make_workload(target.point, rotation=1))[0])
    assert measured.host_syncs == target.expected_syncs(name, "cpu") == v.syncs.cpu
    assert measured.host_syncs == (0 if name == "host_mirror" else 1)  # no copy, no wait: host_mirror per call


@pytest.mark.parametrize("name", step_variant_names())
def test_every_step_variant_makes_the_syncs_it_declares(name):
    if get_step_variant(name).unavailable_reason("cpu"):
        pytest.skip(get_step_variant(name).unavailable_reason("cpu"))
    target = ScenarioTarget(STEP)
    inputs = target.inputs_for(name, make_scenario_workload(STEP, "cpu", copies=1))[0]
    assert measure(target, name, inputs).host_syncs == target.expected_syncs(name, "cpu")


def test_per_request_makes_b_syncs_batched_one_and_the_mirror_only_its_upkeep():
    target = ScenarioTarget(STEP)
    workload = make_scenario_workload(STEP, "cpu", copies=1)

    def counted(name: str) -> int:
        return measure(target, name, target.inputs_for(name, workload)[0]).host_syncs

    assert counted(STEP_BASELINE) == counted("per_request[device_stride]") == STEP.batch
    assert counted("batched_device_stride") == 1
    assert counted("per_request[host_mirror]") == 1  # 0 per call, and one batched D2H of the step's new pages
    assert counted("deferred_device_stride") == 1  # a CPU run has no streams: its readback is a blocking copy


EXTRA_ITEM = '''
from kvpages.measure.variants import Moves, variant

@variant("extra_item", moves=Moves.PAGES)
def extra_item(kv_indices, page_size):
    """device_stride and one .item() too many."""
    first = kv_indices[0].item()
    return (kv_indices[::page_size] // page_size).cpu().numpy()
'''


def _extra_item_run(pytester: pytest.Pytester, device: str) -> pd.Series:
    pytester.makepyfile(test_kv=(REPO / "bench" / "test_d2h.py").read_text())
    pytester.makeconftest(EXTRA_ITEM)
    result = pytester.runpytest_subprocess(*FAST, "--kv-device", device, "--kv-variants", "extra_item", "--kv-seq-lens", "512",
                                "--kv-page-sizes", "16", "--kv-scenarios", "none", "--kv-crosscheck", "off")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-2000:]
    [folder] = list((pytester.path / "results").iterdir())
    return pd.read_csv(folder / "results.csv").set_index("variant").loc["extra_item"]


def test_an_extra_item_is_a_mismatch_naming_the_syncs(pytester):
    row = _extra_item_run(pytester, "cpu")
    assert row["status"] == "mismatch"
    assert "measured 2 host syncs on the calling thread, expected 1" in row["note"]


# ----------------------------------------------------------------------------- on CUDA: the waits themselves


@pytest.mark.cuda
def test_cuda_each_wait_counts_once_and_the_mode_is_restored():
    kv = torch.arange(64, dtype=torch.int32, device="cuda")
    before, event_sync, device_sync = torch.cuda.get_sync_debug_mode(), torch.cuda.Event.synchronize, torch.cuda.synchronize
    event = torch.cuda.Event()
    event.record()
    assert syncs(lambda kv: kv.cpu().numpy(), kv) == (1, 1)
    assert syncs(lambda kv: kv[0].item(), kv) == (1, 1)
    assert syncs(lambda kv: kv[:3].tolist(), kv) == (1, 1)
    assert syncs(lambda kv: torch.cuda.synchronize(), kv) == (1, 0)
    assert syncs(lambda kv: event.synchronize(), kv) == (1, 0)
    assert syncs(lambda kv: torch.cuda.current_stream().synchronize(), kv) == (1, 0)
    pinned = torch.empty(64, dtype=torch.int32, pin_memory=True)
    assert syncs(lambda kv: pinned.copy_(kv, non_blocking=True), kv) == (0, 1)

    def elsewhere(kv):  # another thread's wait is not the calling thread's
        waiter = threading.Thread(target=lambda: (kv.cpu(), torch.cuda.synchronize()))
        waiter.start()
        waiter.join()

    assert syncs(elsewhere, kv) == (0, 0)
    assert torch.cuda.get_sync_debug_mode() == before
    assert torch.cuda.Event.synchronize is event_sync and torch.cuda.synchronize is device_sync  # unwrapped again


@pytest.mark.cuda
def test_cuda_steps_make_their_declared_syncs_on_the_scheduler_thread():
    scenario = StepScenario(5, "uniform:100,900", page_size=16)
    target = ScenarioTarget(scenario)
    workload = make_scenario_workload(scenario, "cuda", copies=1)
    counted = {}
    for name in step_variant_names():
        measured = measure(target, name, target.inputs_for(name, workload)[0])
        assert measured.host_syncs == target.expected_syncs(name, "cuda"), name
        counted[name] = (measured.host_syncs, measured.transfer_syncs)
    assert counted[STEP_BASELINE] == (scenario.batch, 0)
    assert counted["batched_device_stride"] == (1, 0)
    assert counted["per_request[host_mirror]"] == (1, 0)
    assert counted["per_request[device_stride_pinned]"] == (scenario.batch, 0)  # it waits on its event itself
    assert counted["batched_device_stride_pinned"] == counted["deferred_device_stride"] == (0, 1)  # the worker's


@pytest.mark.cuda
def test_cuda_an_extra_item_is_a_mismatch_naming_the_syncs(monkeypatch):
    """In this process (the GPU check's time is short): the meter and the runner's check of one case."""
    def extra_item(kv_indices, page_size):
        kv_indices[0].item()
        return (kv_indices[::page_size] // page_size).cpu().numpy()

    from kvpages.measure import variants

    monkeypatch.setitem(variants._REGISTRY, "extra_item", dataclasses.replace(
        get_variant("device_stride"), name="extra_item", fn=extra_item))
    target = PointTarget(Point(512, 16, device="cuda"))
    reading = measure(target, "extra_item", make_workload(target.point, rotation=1).inputs[0]).reading()
    with pytest.raises(Stop, match="measured 2 host syncs on the calling thread, expected 1"):
        check_metered(target, "extra_item", reading, "cuda")


def test_the_deferred_variant_says_it_ran_in_order_off_cuda():
    assert "in order" in IN_ORDER and get_step_variant("deferred_device_stride").staged
    out = get_step_variant("deferred_device_stride").arrays(
        make_scenario_workload(STEP, "cpu", copies=1).inputs[0], STEP.page_size)
    assert all(a.dtype == np.int32 for a in out)  # int32, as SGLang's _page_indices_device
