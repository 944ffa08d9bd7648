"""Where the time goes: profiled passes over a few points, in a process of its own, after the timing.

What a row holds: docs/method.md, "How a block is measured", step 6. No torch import at module level.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from kvpages.core.names import case_id
from kvpages.measure.crosscheck import (
    COPY_CALLS,
    MEMCPY_CATEGORIES,
    NO_GPU_ACTIVITY,
    RANGE_PREFIX,
    RUNTIME_CATEGORIES,
    WARM_UP_RANGE,
    CheckCase,
    case_inputs,
    cases_of,
    child_request,
    gpu_events,
    kineto,
    reply_and_exit,
    run_child,
    sync_call,
    trace_of,
)
from kvpages.schema.breakdown import CALLS, PASSES, BreakdownRow, write_breakdown

if TYPE_CHECKING:
    from kvpages.core.sweep import Point
    from kvpages.measure.schedule import Block

CALL_MARK = "#"
BASE_TIMEOUT_S = 30.0
PER_CASE_TIMEOUT_S = 0.5
"""The child's limit: 30 s to start and 0.5 s per case (its inputs and PASSES x CALLS profiled calls)."""
COPY_OPS = ("aten::copy_", "aten::_to_copy", "aten::to", "aten::clone", "aten::_copy_from",
            "aten::_copy_from_and_resize", "aten::contiguous")
TOP_OPS = 3


class BreakdownError(RuntimeError):
    """The breakdown process failed or timed out, or its profiler saw nothing."""


def chosen_points(points: Sequence[Point]) -> list[Point]:
    """Per page size of the sweep's first dtype and layout: the shortest, a middle and the longest seq_len."""
    if not points:
        return []
    first = points[0]
    same = [p for p in points if (p.dtype, p.layout) == (first.dtype, first.layout)]
    out = []
    for page_size in sorted({p.page_size for p in same}):
        row = sorted((p for p in same if p.page_size == page_size), key=lambda p: p.seq_len)
        out += [row[i] for i in sorted({0, len(row) // 2, len(row) - 1})]
    return out


def planned_cases(blocks: Sequence[Block], planned: set[str], device: str) -> list[CheckCase]:
    """The planned, runnable (variant, point)s of a session at the points the breakdown profiles."""
    from kvpages.measure.targets import PointTarget

    points = list(dict.fromkeys(b.target.point for b in blocks if isinstance(b.target, PointTarget) and b.case_id in planned))
    variants = list(dict.fromkeys(b.variant for b in blocks))
    targets = [PointTarget(p) for p in chosen_points(points)]
    return [CheckCase(v, t) for t in targets for v in variants
            if case_id(v, t.id) in planned and t.unavailable_reason(v, device) is None]


def run_breakdown(cases: Sequence[CheckCase], device: str, timeout_s: float | None = None) -> list[BreakdownRow]:
    """Profile `cases` in one session of a fresh interpreter; raise BreakdownError when that fails."""
    request = {**child_request(cases), "device": device, "calls": CALLS, "passes": PASSES}
    limit = BASE_TIMEOUT_S + PER_CASE_TIMEOUT_S * len(cases) if timeout_s is None else timeout_s
    reply = run_child("kvpages.measure.breakdown", request, limit, "breakdown", BreakdownError)
    if reply.get("error"):
        raise BreakdownError(str(reply["error"]))
    try:
        return [BreakdownRow(**row) for row in reply["rows"]]
    except (TypeError, KeyError) as exc:
        raise BreakdownError(f"the breakdown process replied without well-formed rows ({type(exc).__name__}: "
                             f"{exc})") from None


def write_breakdown_into(folder: Path, cases: Sequence[CheckCase], device: str, timeout_s: float | None = None) -> str:
    """Run the breakdown and write breakdown.csv into the run folder; return meta.json's note, which says why
    there is no breakdown.csv when it failed (never raises)."""
    if not cases:
        return "no case to profile"
    start = time.perf_counter()
    try:  # CUDA: in a process of its own (Kineto leaves CUPTI attached); a CPU run profiles without Kineto, here
        rows = profile_breakdown(cases, device, CALLS, PASSES) if device == "cpu" else run_breakdown(cases, device,
                                                                                                     timeout_s)
        write_breakdown(folder, rows)
    except (BreakdownError, OSError, ValueError, TypeError, KeyError) as exc:
        return f"failed after {time.perf_counter() - start:.1f} s: {exc}"
    where = "in the session's process" if device == "cpu" else "in a process of its own"
    return (f"breakdown.csv: {len(rows)} rows ({len({(r.seq_len, r.page_size) for r in rows})} points), {PASSES} "
            f"profiled pass(es) of {CALLS} calls per case (the median call of each case kept) {where}, "
            f"{time.perf_counter() - start:.1f} s")


# ----------------------------------------------------------------------------- the trace (no torch)


def _inside(events: list[dict], start: float, end: float) -> list[dict]:
    return [e for e in events if start <= float(e["ts"]) and float(e["ts"]) + float(e.get("dur", 0)) <= end + 1e-3]


def self_times(ops: list[dict]) -> list[tuple[str, float]]:
    """(name, self µs) of each op: its duration less that of the ops nested directly inside it."""
    ordered = sorted(ops, key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
    children = [0.0] * len(ordered)
    stack: list[tuple[float, int]] = []
    for i, e in enumerate(ordered):
        ts, dur = float(e["ts"]), float(e.get("dur", 0))
        while stack and stack[-1][0] <= ts + 1e-3:
            stack.pop()
        if stack:
            children[stack[-1][1]] += dur
        stack.append((ts + dur, i))
    return [(str(e["name"]), max(float(e.get("dur", 0)) - c, 0.0)) for e, c in zip(ordered, children, strict=True)]


def _top(named: list[tuple[str, float]]) -> str:
    totals: dict[str, float] = defaultdict(float)
    for name, us in named:
        totals[name] += us
    best = sorted(totals.items(), key=lambda kv: -kv[1])[:TOP_OPS]
    return "; ".join(f"{name} {us:.2f}" for name, us in best if us > 0)


def host_waits(call: dict, gpu: dict[int, dict]) -> bool:
    """Whether the host waits in this CUDA API call (`gpu`: the GPU records by correlation id): a synchronize; a
    synchronous copy; an asynchronous one from or to pageable memory (CUDA stages it: a DtoH copy returns when done,
    an HtoD one when staged). An asynchronous copy between the device and pinned memory, or within the device, only
    queues it (a launch; the wait is the synchronize after it): on the H200, device_stride_pinned's cudaMemcpyAsync
    took 6.9 µs against 14.7 µs into pageable memory (medians, results/20261204T181656Z-cuda-nvidia-h200's
    cross-check trace). A copy whose GPU record was lost counts as a wait."""
    name = str(call["name"])
    if sync_call(name):
        return True
    if not name.startswith(COPY_CALLS):
        return False
    record = gpu.get(int(call.get("args", {}).get("correlation", -1)))
    return "Async" not in name or record is None or "Pageable" in str(record.get("name", ""))


def breakdown_rows(trace: dict, cases: dict[str, dict], device: str, calls: int) -> list[BreakdownRow]:
    """One row per case of a Chrome trace, from its `kvpages:<case id>#<k>` ranges (one per call, `calls` in all):
    the call of median wall time; `cases` maps case ids to their variant and point. On CUDA a trace without any
    GPU activity raises BreakdownError (the profiler saw nothing: the rows would be zeros)."""
    if device == "cuda" and gpu_events(trace) == 0:
        raise BreakdownError(f"{NO_GPU_ACTIVITY}, so there is no breakdown")
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    ranges: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        name = str(e.get("name", ""))
        if name.startswith(RANGE_PREFIX) and CALL_MARK in name and e.get("cat") != "gpu_user_annotation":
            ranges[name[len(RANGE_PREFIX):].rpartition(CALL_MARK)[0]].append(e)
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    runtime = [e for e in events if e.get("cat") in RUNTIME_CATEGORIES]
    gpu = {int(e["args"]["correlation"]): e for e in events
           if e.get("cat") in ("kernel",) + MEMCPY_CATEGORIES and "correlation" in e.get("args", {})}
    rows = []
    for case, meta in cases.items():
        if len(ranges.get(case, ())) != calls:
            raise ValueError(f"the profile has {len(ranges.get(case, ()))} ranges for case {case}, "
                             f"expected {calls}")
        r = sorted(ranges[case], key=lambda e: float(e.get("dur", 0)))[calls // 2]
        start, wall = float(r["ts"]), float(r.get("dur", 0))
        named = self_times(_inside(ops, start, start + wall))
        common = dict(id=case, variant=meta["variant"], device=device, dtype=meta["dtype"], layout=meta["layout"],
                      seq_len=meta["seq_len"], page_size=meta["page_size"], calls=calls, wall_us=wall,
                      top_ops=_top(named))
        if device != "cuda":
            copy = sum(us for name, us in named if name in COPY_OPS)
            other = sum(us for name, us in named if name not in COPY_OPS)
            rows.append(BreakdownRow(**common, host_us=max(wall - copy - other, 0.0), aten_copy_us=copy,
                                     aten_ops_us=other, launch_us=None, wait_us=None, kernel_us=None,
                                     memcpy_us=None, memcpy_bytes=None, memcpy_direction=""))
            continue
        api = _inside(runtime, start, start + wall)
        waits = [e for e in api if host_waits(e, gpu)]
        wait = sum(float(e.get("dur", 0)) for e in waits)
        launch = sum(float(e.get("dur", 0)) for e in api) - wait
        issued = [gpu[c] for c in (int(e.get("args", {}).get("correlation", -1)) for e in api) if c in gpu]
        kernels = [g for g in issued if g.get("cat") == "kernel"]
        copies = [g for g in issued if g.get("cat") in MEMCPY_CATEGORIES]
        directions = sorted({str(g["name"]).split()[1] for g in copies if len(str(g["name"]).split()) > 1})
        rows.append(BreakdownRow(
            **common, host_us=max(wall - wait - launch, 0.0), aten_copy_us=None, aten_ops_us=None, launch_us=launch,
            wait_us=wait, kernel_us=sum(float(g.get("dur", 0)) for g in kernels),
            memcpy_us=sum(float(g.get("dur", 0)) for g in copies),
            memcpy_bytes=sum(int(g.get("args", {}).get("bytes", 0)) for g in copies), memcpy_direction="+".join(directions)))
    return rows


# ----------------------------------------------------------------------------- the child's side


def profile_trace(cases: Sequence[CheckCase], device: str, calls: int, passes: int,
                  sync: Callable[[], None] | None = None) -> dict:
    """The Chrome trace of `passes` passes over `cases`, `calls` calls of each per pass, each call in a range of
    its own; `sync` (default: the device's synchronize) runs after each range, outside it."""
    import torch
    from torch.autograd.profiler import profile, record_function

    from kvpages.measure.timer import synchronizer

    inputs = case_inputs(cases, device)
    for case in cases:  # lazy initialisation and caches outside the profile
        for _ in range(2):
            case.target.call_here(case.variant, inputs[case.id])
    cuda = device == "cuda"
    sync = synchronizer(device) if sync is None else sync
    # CPU: the profiler without Kineto (its first session costs ~1.5 s to start; the aten ops are the same);
    # CUDA: Kineto, for the device's kernels and copies.
    session = kineto(cuda=True) if cuda else profile(use_kineto=False)
    sync()
    with session as prof:
        with record_function(WARM_UP_RANGE):
            if cuda:
                torch.arange(8, device="cuda").cpu()
            sync()
        for p in range(passes):
            for case in cases:
                for k in range(calls):
                    with record_function(f"{RANGE_PREFIX}{case.id}{CALL_MARK}{p * calls + k}"):
                        case.target.call_here(case.variant, inputs[case.id])
                    sync()  # outside the range: the timed call makes no synchronize
    return trace_of(prof)


def profile_breakdown(cases: Sequence[CheckCase], device: str, calls: int, passes: int) -> list[BreakdownRow]:
    meta = {c.id: {"variant": c.variant, **{k: getattr(c.target.point, k) for k in  # type: ignore[union-attr]
                                            ("dtype", "layout", "seq_len", "page_size")}} for c in cases}
    return breakdown_rows(profile_trace(cases, device, calls, passes), meta, device, passes * calls)


def main() -> NoReturn:
    import dataclasses

    start = time.perf_counter()
    request = json.loads(sys.stdin.read())
    try:
        rows = profile_breakdown(cases_of(request), request["device"], int(request["calls"]), int(request["passes"]))
    except (BreakdownError, ValueError) as exc:  # no GPU activity, or a trace that is not a profile of the cases
        reply_and_exit({"error": str(exc), "rows": []})
    print(f"kvpages breakdown: {len(rows)} cases profiled in {time.perf_counter() - start:.2f} s after the imports",
          file=sys.stderr)
    reply_and_exit({"error": None, "rows": [dataclasses.asdict(r) for r in rows]})


if __name__ == "__main__":
    main()
