"""The named presets, `PRESETS`, that the parametrization, the options, the CLI, the docs and the tests read. No torch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvpages.core.checks import check_choice
from kvpages.core.payloads import DEFAULT_PAYLOADS, PAYLOAD_PRESETS
from kvpages.core.scenarios import BUSY_US, MIXED_LENGTHS, RequestScenario, Scenario, StepScenario, scenarios_from, with_payloads
from kvpages.core.sweep import DTYPES, Sweep


@dataclass(frozen=True)
class Preset:
    """A named run: the sweep's points, the scenarios, and what the run is for."""

    sweep: Sweep
    scenarios: tuple[Scenario, ...]
    scenario_budget_s: float
    """Timed seconds per (scenario, step variant), all repetitions together."""
    purpose: str

    @property
    def name(self) -> str:
        return self.sweep.name


DEFAULT_PROCESSES, DEFAULT_REPETITIONS = 6, 6
"""6 fresh processes of one repetition each: Kalibera and Jones's allocation gives one per process, and 6 is the fewest
processes the two-stage bootstrap holds its coverage with (docs/method.md; tests/test_processes.py)."""

PARTIAL_PAGE_LEN = 3000
"""A per-call length that is no whole number of pages at any swept page size above 1 (16 to 256): the last page
of every such point is partial, so the bytes check covers ceil(L / p) * itemsize there too."""
_DEFAULT_SEQ_LENS = (512, 2048, PARTIAL_PAGE_LEN, 8192, 32768, 131072, 524288)
_HYBRID_STEP = StepScenario(32, "fixed:32768", page_size=64, payloads="hybrid")
"""A hybrid model's decode step (kvpages.core.payloads): 32 requests of 32768 tokens, each sending main KV, SWA and
indexer pages; with its busy-queue twin, what the step pays and what staging saves, in `make bench`'s minute."""
_DEFAULT_SCENARIOS: tuple[Scenario, ...] = (
    *scenarios_from((1, 64), ("int32",), request_lens=(2048, 8192, 32768, 131072), step_sizes=(1, 8, 32, 128)),
    StepScenario(32, MIXED_LENGTHS, page_size=64, busy_us=BUSY_US),
    _HYBRID_STEP, dataclasses.replace(_HYBRID_STEP, busy_us=BUSY_US),
)
_PAYLOAD_MATRIX = with_payloads(
    (*scenarios_from((1, 64), ("int32",), request_lens=(32768,)), _HYBRID_STEP,
     dataclasses.replace(_HYBRID_STEP, busy_us=BUSY_US)),
    tuple(name for name in PAYLOAD_PRESETS if name != DEFAULT_PAYLOADS), None)
"""Every payload preset beyond the main KV: both sides of an L=32768 request at p = 1, 64, and the hybrid step."""

PRESETS: dict[str, Preset] = {preset.name: preset for preset in (
    Preset(Sweep("quick", seq_lens=(512, 8192), page_sizes=(1, 64), time_budget_s=0.06, repetitions=6, passes=6),
           (RequestScenario(32768, 8192, "prefill", page_size=64), StepScenario(8, MIXED_LENGTHS, page_size=64),
            StepScenario(8, MIXED_LENGTHS, page_size=64, busy_us=BUSY_US)),
           0.03, "seconds: what CI and the GPU check run"),
    # 0.4 s per (variant, point) over its 6 processes, as before re-measurement (whose first round runs in a spare
    # started with the planned workers, and a later one only when it times more than a start costs); at most 2000
    # rounds a block (a short call's 12 ms: its median is settled long before, and samples.csv stays ~2.6 MB)
    Preset(Sweep("default", seq_lens=_DEFAULT_SEQ_LENS, page_sizes=(1, 16, 64, 128), time_budget_s=0.4,
                 processes=DEFAULT_PROCESSES, repetitions=DEFAULT_REPETITIONS, passes=1, max_rounds=2000),
           _DEFAULT_SCENARIOS, 0.10, "`make bench`: about a minute on two CPU cores"),
    # 1M and 2M tokens: the longest contexts served today; a point that does not fit is skipped (out of memory)
    Preset(Sweep("full", seq_lens=_DEFAULT_SEQ_LENS + (1048576, 2097152), page_sizes=(1, 16, 32, 64, 128, 256),
                 dtypes=DTYPES, time_budget_s=0.5, processes=DEFAULT_PROCESSES, repetitions=DEFAULT_REPETITIONS, passes=1),
           tuple({s.id: s for s in _DEFAULT_SCENARIOS + _PAYLOAD_MATRIX}.values()), 0.2,
           "every page size, both dtypes, up to 2M tokens, every payload preset"),
    Preset(Sweep("ranks", seq_lens=(8192,), page_sizes=(1, 64), time_budget_s=0.05, processes=1, repetitions=12, passes=1),
           scenarios_from((1, 64), ("int32",), step_sizes=(8, 32, 128)), 0.1,
           "the steps under torchrun: every rank at once against each alone"),
)}


def get_preset(name: str) -> Preset:
    check_choice("preset", name, PRESETS)
    return PRESETS[name]
