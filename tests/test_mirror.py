"""The zero-D2H floor: host_mirror reads a host-side page table (a declared extra input), moves nothing, and pays
its upkeep in whole requests and steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import call_on, devices

from kvpages.core.scenarios import RequestScenario, StepScenario, mirror_upkeep
from kvpages.core.sweep import Point
from kvpages.measure.inputs import make_scenario_workload, make_workload
from kvpages.measure.targets import PointTarget, ScenarioTarget, measure
from kvpages.measure.variants import Moves, get_variant, variant

STEP = StepScenario(6, "uniform:100,700", page_size=16)
PREFILL = RequestScenario(3000, 1024, page_size=16)
DECODE = RequestScenario(3000, 1024, page_size=16, side="decode", prefix=37)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_host_mirror_matches_the_reference_and_moves_nothing(device, page_size):
    target = PointTarget(Point(5000, page_size, device=device))
    workload = make_workload(target.point, rotation=3, chunk_offset_pages=2)
    for out, expected in zip(call_on(target, "host_mirror", workload), workload.expected, strict=True):
        np.testing.assert_array_equal(out, expected)
        assert out.dtype == expected.dtype
    measured = measure(target, "host_mirror", target.inputs_for("host_mirror", workload)[0])
    assert (measured.d2h_bytes, measured.d2h_transfers, measured.link) == (0, 0, "none (no transfer)")
    assert target.expected_d2h("host_mirror") == (0, 0)


def test_the_upkeep_model():
    [decode] = mirror_upkeep(STEP)
    assert decode.before_call == 0
    assert decode.pages == tuple((row, (length - 1) // 16) for row, length in enumerate(STEP.lengths))
    chunks = mirror_upkeep(PREFILL)
    assert [u.before_call for u in chunks] == list(range(len(PREFILL.calls())))
    assert [len(u.pages) for u in chunks] == [-(-c.tokens // 16) for c in PREFILL.calls()]
    assert [len(u.pages) for u in mirror_upkeep(DECODE)] == [1]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("scenario", [STEP, PREFILL, DECODE], ids=lambda s: s.id)
def test_per_request_mirror_pays_its_upkeep_and_the_meter_sees_it(device, scenario):
    target = ScenarioTarget(scenario)
    name = "per_request[host_mirror]"
    workload = make_scenario_workload(scenario, device, copies=2)
    for out, expected in zip(call_on(target, name, workload), workload.expected, strict=True):
        assert target.check(out, expected) is None
    upkeep = mirror_upkeep(scenario)
    expected_bytes = sum(len(u.pages) for u in upkeep) * 4
    assert target.expected_d2h(name) == (expected_bytes, len(upkeep))
    measured = measure(target, name, target.inputs_for(name, workload)[1])
    assert (measured.d2h_bytes, measured.d2h_transfers) == (expected_bytes, len(upkeep))


def test_the_upkeep_writes_the_pages_it_copies_into_the_table():
    target = ScenarioTarget(STEP)
    workload = make_scenario_workload(STEP, "cpu", copies=1)
    [inputs] = target.inputs_for("per_request[host_mirror]", workload)
    [refresh] = inputs.extras["host_pages"].upkeep.values()
    table = refresh.table
    table[refresh.rows, refresh.pages] = -1  # stale entries: the step's upkeep must bring them back
    out = target.call_here("per_request[host_mirror]", inputs)
    assert target.check(out, workload.expected[0]) is None
    assert (table[refresh.rows, refresh.pages] >= 0).all()


def test_extras_are_declared_and_checked():
    with pytest.raises(ValueError, match="unknown extra input 'gpu_pages'; valid: host_pages"):
        variant("x_bad_extra", moves=Moves.NONE, extras=("gpu_pages",))
    with pytest.raises(TypeError, match="takes the extra inputs host_pages, got none"):
        get_variant("host_mirror")(torch.arange(8, dtype=torch.int32), 4)
