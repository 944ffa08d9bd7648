"""`kvpages compare --format json`: the document it prints for CI (no torch); a figure with no value (an interval
one repetition cannot form) is null."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

COMPARE_SCHEMA_VERSION = 3  # 2: `shift`; 3: each run's `machine` and `boot_id`, and `machine_note`


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    device_name: str
    processes: int
    machine: str | None  # kvpages.analysis.machines.Machine.describe(), one line of text; null without its meta.json
    boot_id: str | None  # the boot it ran in (meta.json's environment); null where not recorded


@dataclass(frozen=True)
class PointKey:
    variant: str
    dtype: str
    layout: str
    seq_len: int
    page_size: int


@dataclass(frozen=True)
class ComparedPoint:
    """One point in both runs. family 'relative': a and b are each run's variant/baseline ratio (gated);
    'absolute': each run's median µs (not gated)."""

    family: str
    point: PointKey
    a: float
    b: float
    b_over_a: float
    ci_low: float | None
    ci_high: float | None
    confidence: float | None
    interval_unit: str
    p_value: float
    q_value: float
    verdict: str
    beyond_gate: bool | None  # relative points with --fail-above: whether the whole interval lies above the gate


@dataclass(frozen=True)
class Gate:
    fail_above_pct: float
    threshold: float  # 1 + fail_above_pct / 100
    regressions: int
    passed: bool


@dataclass(frozen=True)
class RelativeShift:
    """How the relative points moved together (kvpages.analysis.compare.Shift): the median of their B/A, how many
    moved up and down, the sign test's p, and the note the text prints (`RunComparison.shift_note`: where p < 0.05 and
    some faster or slower verdict's interval holds the median; else null)."""

    factor: float
    up: int
    down: int
    sign_p: float
    note: str | None


@dataclass(frozen=True)
class ComparisonDocument:
    schema_version: int
    a: RunInfo
    b: RunInfo
    baseline: str
    interval_unit: str
    caveat: str | None
    machine_note: str | None  # RunComparison.machine_note: where A's and B's machines or boots differ
    min_effect: dict[str, float]  # per family ('relative', 'absolute')
    counts: dict[str, dict[str, int]]  # per family: how many points got each verdict
    gate: Gate | None
    shift: RelativeShift
    points: list[ComparedPoint]
    only_a: list[PointKey]
    only_b: list[PointKey]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, allow_nan=False)


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
