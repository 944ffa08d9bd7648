"""The names the measuring and the analysis sides share, each built and parsed here once. No torch."""

from __future__ import annotations

from collections.abc import Iterable

BASELINE = "host_stride"
"""Pre-PR SGLang (<= 0.5.15): every ratio is a variant over this one."""
CANDIDATE = "device_stride"
"""The merged PR (SGLang >= 0.5.16): the variant the report's main tables and charts are about."""

FLOOR = "host_mirror"
"""The zero-D2H floor: page indices read from a host-side page table (a reference line in the charts)."""

def per_request_name(variant: str) -> str:
    """The step variant that converts each request of a step on its own with `variant`."""
    return f"per_request[{variant}]"


def per_request_of(step_variant: str) -> str | None:
    """The variant inside `per_request[<v>]`, or None for a step variant of its own (a batched one)."""
    inner = step_variant.removeprefix("per_request[")
    return inner[:-1] if inner != step_variant and inner.endswith("]") else None


def point_id(seq_len: int, page_size: int, dtype: str, layout: str) -> str:
    """A sweep point's id, e.g. 's8192-p64-int32-fragmented': its benchmark group, and how meta.json names it."""
    return f"s{seq_len}-p{page_size}-{dtype}-{layout}"


def case_id(variant: str, target_id: str) -> str:
    """The id of one (variant, target) case: what its blocks, rows and profiled ranges are keyed by."""
    return f"{variant}-{target_id}"


STEP_BASELINE = per_request_name(BASELINE)
STEP_CANDIDATE = per_request_name(CANDIDATE)
STEP_FLOOR = per_request_name(FLOOR)


def step_baseline(baseline: str, step_variants: Iterable[str]) -> str:
    """The step variant whole requests and steps are against: per_request[baseline] where it ran, else pre-PR's."""
    own = per_request_name(baseline)
    return own if own in set(step_variants) else STEP_BASELINE


def called(baseline: str, quote: str = "`") -> str:
    """A baseline as text names it: 'pre-PR' for host_stride and per_request[host_stride], else `quote`d (a chart: '')."""
    return "pre-PR" if (per_request_of(baseline) or baseline) == BASELINE else f"{quote}{baseline}{quote}"


def variant_sort_key(name: str) -> tuple:
    """The baseline, then the candidate (each followed by its per_request[...]), then the rest by name, per-request last."""
    inner = per_request_of(name)
    plain = name if inner is None else inner
    return (plain != BASELINE, plain != CANDIDATE, inner is not None, name)


LABELS: dict[str, str] = {
    BASELINE: "pre-PR (SGLang ≤ 0.5.15)",
    CANDIDATE: "merged PR (SGLang ≥ 0.5.16)",
    FLOOR: "zero-D2H floor (a host-side page table)",
}
"""What each reader-facing name stands for: the one table every report, chart, summary and citation reads."""


def label(name: str) -> str:
    """`name` with what it stands for, e.g. 'host_stride, pre-PR (SGLang ≤ 0.5.15)'; per_request[v] inherits v's label."""
    meaning = LABELS.get(per_request_of(name) or name)
    return name if meaning is None else f"{name}, {meaning}"
