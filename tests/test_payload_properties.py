"""Property tests (hypothesis) of a hybrid model's sends: on random layouts, lengths, page sizes, windows (shorter than a
page, equal to L, longer) and payload presets, every strategy's host result equals the per-payload reference byte for
byte, and the device's SWA translation equals the host's.

Skipped with the reason where hypothesis is not installed (it is in the `test` extra).
"""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install '.[test]')")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kvpages.core.payloads import PAYLOAD_PRESETS, STRATEGIES, SWA  # noqa: E402
from kvpages.core.scenarios import RequestScenario, StepScenario  # noqa: E402
from kvpages.measure.inputs import make_scenario_workload  # noqa: E402
from kvpages.measure.payloads import host_translation, shuffled_pages, swa_mapping, translate  # noqa: E402
from kvpages.measure.steps import get_step_variant  # noqa: E402
from kvpages.measure.targets import ScenarioTarget, finish_for  # noqa: E402
from kvpages.measure.variants import reference_page_indices  # noqa: E402

SEVERAL = [name for name, preset in PAYLOAD_PRESETS.items() if len(preset.payloads) > 1]


@st.composite
def scenarios(draw):
    """A request (either side) or a step of several payloads, its window drawn below a page, at L, or anywhere."""
    page_size = draw(st.sampled_from([1, 2, 16, 64, 128]))
    lengths = draw(st.lists(st.integers(1, 2500), min_size=1, max_size=4))
    longest = max(lengths)
    window = draw(st.one_of(st.integers(1, page_size), st.just(longest), st.integers(1, 3 * longest)))
    pool = {"page_size": page_size, "dtype": draw(st.sampled_from(["int32", "int64"])),
            "layout": draw(st.sampled_from(["fragmented", "contiguous"])), "payloads": draw(st.sampled_from(SEVERAL)),
            "swa_window": window}
    if draw(st.booleans()):
        return StepScenario(len(lengths), ",".join(map(str, lengths)), seed=draw(st.integers(0, 99)), **pool)
    side = draw(st.sampled_from(["prefill", "decode"]))
    prefix = draw(st.integers(0, longest - 1)) if side == "decode" else 0
    return RequestScenario(longest, draw(st.integers(1, 3000)), side, prefix, **pool)


@settings(max_examples=60, deadline=None)
@given(scenario=scenarios(), seed=st.integers(0, 2 ** 16))
def test_every_strategy_equals_the_per_payload_reference_byte_for_byte(scenario, seed):
    target = ScenarioTarget(scenario)
    workload = make_scenario_workload(scenario, "cpu", copies=2, seed=seed)
    for name in STRATEGIES:
        if scenario.kind == "request" and get_step_variant(name).batched:
            continue
        for inputs, expected in zip(target.inputs_for(name, workload), workload.expected, strict=True):
            out, wanted = target.call_here(name, inputs), finish_for(scenario)(list(expected))
            assert len(out) == len(wanted) == len(scenario.calls())
            for got, ref in zip(out, wanted, strict=True):
                assert got.dtype == ref.dtype and got.shape == ref.shape and got.tobytes() == ref.tobytes(), name


@settings(max_examples=60, deadline=None)
@given(scenario=scenarios(), seed=st.integers(0, 2 ** 16))
def test_the_device_translation_equals_the_hosts_and_keeps_the_page_invariant(scenario, seed):
    workload = make_scenario_workload(scenario, "cpu", copies=1, seed=seed)
    p = scenario.page_size
    sigma = shuffled_pages(int(workload.pool.max()) // p, seed)
    mapping = swa_mapping(sigma, p, "cpu")
    for kv, call, expected in zip(workload.inputs[0].slices, workload.calls[0], workload.expected[0], strict=True):
        if call.payload != SWA:
            continue
        on_device = translate(mapping, kv)
        assert torch.equal(on_device, host_translation(sigma, kv, p))
        assert np.array_equal(reference_page_indices(on_device, p), expected)
        # the window's slice: from a page boundary to L, at least min(window, L) tokens, under a page more
        assert call.start % p == 0 and call.end == scenario.lengths[call.row]
        assert min(scenario.swa_window, call.end) <= call.tokens < min(scenario.swa_window, call.end) + p
