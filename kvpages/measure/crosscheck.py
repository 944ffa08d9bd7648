"""The profiler cross-check of the D2H meter: one profiler session, in a process of its own.

No timing process ever profiles: Kineto keeps CUPTI attached after a profile (pytorch#144455). `run_crosscheck`
starts `python -m kvpages.measure.crosscheck` once, before anything is timed, which profiles one call of every
planned case in ONE session (with CUPTI 12.6u2-13.0 a process's later sessions lose GPU records: pytorch#192021,
pytorch#175790), each in a range `kvpages:<case id>` after a warm-up range; a memcpy belongs to the case whose
range holds the `cudaMemcpy*` call with its correlation id.

A case's answer is one of OUTCOMES: `lost_records` is a copy call with no GPU record (nothing can be concluded).
A child that fails, times out or sees no GPU activity makes the cross-check unavailable (`CrosscheckError`).
No torch import at module level.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from kvpages.core.names import case_id

if TYPE_CHECKING:
    from kvpages.measure.meter import D2HMeasurement
    from kvpages.measure.targets import Target

OUTCOMES = ("agree", "mismatch", "lost_records")
TRACE_FILE = "crosscheck_trace.json.gz"
RANGE_PREFIX = "kvpages:"
WARM_UP_RANGE = RANGE_PREFIX + "warm-up"
BASE_TIMEOUT_S = 30.0
PER_CASE_TIMEOUT_S = 0.5
"""The child's limit: 30 s to start (interpreter, torch, CUDA, the profiler and its trace) plus 0.5 s a case, well
inside a sweep step of bench/gpu_check.sh, so a hung child stops the cross-check, not the sweep."""

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset")
"""Chrome-trace categories of device activity (kernels, copies, sets), current and older Kineto."""
MEMCPY_CATEGORIES = ("gpu_memcpy", "Memcpy")
"""Chrome-trace categories of GPU memcpy records: current Kineto, and older Kineto."""
RUNTIME_CATEGORIES = ("cuda_runtime", "Runtime", "cuda_driver")
"""Chrome-trace categories of the CPU-side CUDA API calls."""
COPY_CALLS = ("cudaMemcpy", "cuMemcpy")
"""How the names of the CUDA API's copy calls begin (runtime and driver; Async and 2D ones among them)."""


def sync_call(name: str) -> bool:
    """Whether a CUDA API call of this name synchronizes, the host waiting in it: the runtime's and the driver's
    stream, event, device and context synchronizes (cudaStreamSynchronize, cuEventSynchronize, ..., per-thread ones
    among them). The cross-check counts them, the breakdown counts the host's time in them."""
    return name.startswith("cu") and "Synchronize" in name


NO_GPU_ACTIVITY = ("the profiler saw no GPU activity at all (CUPTI may be missing, or held by another tool such as "
                   "nsys or ncu)")
"""Why a CUDA profile is unusable; the cross-check and the breakdown each say what it costs them."""


@dataclass(frozen=True)
class CheckCase:
    """One (variant, target) to profile: a sweep point or a whole request or step (kvpages.measure.targets)."""

    variant: str
    target: Target

    @property
    def id(self) -> str:
        return case_id(self.variant, self.target.id)


class CrosscheckError(RuntimeError):
    """The cross-check is unavailable (module doc)."""


@dataclass(frozen=True)
class CheckAnswer:
    """One case's answer: `outcome` is one of OUTCOMES; `detail` says what differs or what was lost."""

    outcome: str
    detail: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"unknown cross-check outcome {self.outcome!r}; valid: {', '.join(OUTCOMES)}")


AGREE = CheckAnswer("agree")


def timeout_for(cases: int) -> float:
    return BASE_TIMEOUT_S + PER_CASE_TIMEOUT_S * cases


def child_request(cases: Sequence[CheckCase]) -> dict:
    """What a child process needs to rebuild `cases` and run them as the sweep does: the modules of variants
    registered outside kvpages (a conftest, a plugin), the SGLang sources registered by --kv-sglang, the sweep's
    `adaptive` threshold (--kv-adaptive-threshold), and each case's variant and target."""
    from kvpages.core import adaptive
    from kvpages.measure.sglang import loaded_sources
    from kvpages.measure.steps import get_step_variant
    from kvpages.measure.targets import PointTarget
    from kvpages.measure.variants import get_variant

    modules = {get_variant(c.variant).fn.__module__ if isinstance(c.target, PointTarget)
               else get_step_variant(c.variant).module for c in cases}
    modules -= {"kvpages.measure.variants", "kvpages.measure.steps", "kvpages.measure.sglang"}
    return {"modules": sorted(modules), "sglang": loaded_sources(), "adaptive_threshold": adaptive.threshold(),
            "cases": [{"variant": c.variant, "target": c.target.as_json()} for c in cases]}


def cases_of(request: dict) -> list[CheckCase]:
    """The child's side of `child_request`."""
    import importlib

    from kvpages.core import adaptive
    from kvpages.measure.sglang import register_sources
    from kvpages.measure.targets import target_from_json

    for name in request["modules"]:
        importlib.import_module(name)
    register_sources(request.get("sglang", []))
    adaptive.use_threshold(int(request.get("adaptive_threshold", adaptive.DEFAULT_THRESHOLD)))  # before any call
    return [CheckCase(item["variant"], target_from_json(item["target"])) for item in request["cases"]]


def case_inputs(cases: Sequence[CheckCase], device: str) -> dict[str, object]:
    """One input set per case, with its variant's extras, each slice in memory of its own (its pool freed)."""
    import torch

    from kvpages.measure.payloads import Conversions
    from kvpages.measure.variants import WithExtras

    workloads = {t: t.build(device, rotation=1) for t in dict.fromkeys(c.target for c in cases)}
    owned = {t: w.inputs[0].clone() if isinstance(w.inputs[0], torch.Tensor)
             else w.inputs[0].moved(torch.Tensor.clone) if isinstance(w.inputs[0], Conversions)
             else tuple(x.clone() for x in w.inputs[0]) for t, w in workloads.items()}

    def own(x, target):
        return WithExtras(owned[target], x.extras) if isinstance(x, WithExtras) else owned[target]

    return {c.id: own(c.target.inputs_for(c.variant, workloads[c.target])[0], c.target) for c in cases}


def run_child(module: str, request: dict, limit_s: float, what: str, error: type[Exception]) -> dict:
    """Run `python -m module` with `request` (JSON) on its stdin and return its reply, the JSON object on the last
    line of its stdout, else raise `error` naming `what`. A child that replied and then crashed at exit (CUPTI's
    teardown has, on H100-class machines) still answers."""
    cases = len(request.get("cases", ()))
    try:
        done = subprocess.run([sys.executable, "-m", module], input=json.dumps(request), capture_output=True,
                              text=True, timeout=limit_s, check=False)
    except subprocess.TimeoutExpired:
        raise error(f"the {what} process did not finish within {limit_s:g} s ({cases} cases)") from None
    lines = done.stdout.strip().splitlines()
    try:
        reply = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        reply = None
    if isinstance(reply, dict):
        return reply
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise error(f"the {what} process exited {done.returncode}: {tail}")
    last = repr(lines[-1][:200]) if lines else "nothing"
    raise error(f"the {what} process exited 0 without a reply: its last line of output was {last}")


def reply_and_exit(reply: dict) -> NoReturn:
    """The child's last act: print `reply` as one JSON line and leave at once, skipping the interpreter's teardown
    (and CUPTI's, which has crashed at exit on H100-class machines)."""
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def representative(cases: Sequence[CheckCase]) -> list[CheckCase]:
    """The cases the cross-check profiles, in their order: every variant at the shortest and the longest length of
    each page size (and dtype, layout), every step variant on the shortest request or step of each kind and payload
    preset, idle queue and busy. The meter is one code path whatever the length; these confirm it on every variant,
    page size and kind of call; of the first H200 default grid's 345 cases, 72 (docs/method.md)."""
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for i, c in enumerate(cases):
        point = getattr(c.target, "point", None)
        if point is not None:
            groups.setdefault(("point", c.variant, point.dtype, point.layout, point.page_size), []).append(
                (point.seq_len, i))
        else:
            scenario = c.target.scenario  # type: ignore[union-attr]  # a ScenarioTarget
            groups.setdefault(("scenario", c.variant, scenario.kind, scenario.payloads, scenario.busy_us > 0), []).append(
                (scenario.prompt_len, i))
    chosen = set()
    for key, found in groups.items():
        found.sort()
        chosen |= {found[0][1]} | ({found[-1][1]} if key[0] == "point" else set())
    return [c for i, c in enumerate(cases) if i in chosen]


def run_crosscheck(cases: Sequence[CheckCase], device: str, timeout_s: float | None = None,
                   trace_out: Path | None = None) -> dict[str, CheckAnswer]:
    """{case id: answer} from one profiler session of a fresh interpreter, which writes its trace to `trace_out`."""
    request = {**child_request(cases), "device": device, "trace_out": None if trace_out is None else str(trace_out)}
    limit = timeout_for(len(cases)) if timeout_s is None else timeout_s
    reply = run_child("kvpages.measure.crosscheck", request, limit, "profiler cross-check", CrosscheckError)
    if reply.get("unavailable"):
        raise CrosscheckError(str(reply["unavailable"]))
    answers = reply.get("answers")
    try:
        return {c.id: CheckAnswer(**answers[c.id]) for c in cases}  # type: ignore[index]
    except (TypeError, KeyError, ValueError) as exc:
        raise CrosscheckError(f"the profiler cross-check process replied without a well-formed answer for every "
                              f"case ({type(exc).__name__}: {exc})") from None


# ----------------------------------------------------------------------------- the trace (no torch)


@dataclass(frozen=True)
class ProfiledCopy:
    """One `Memcpy DtoH` record of the CUDA profiler."""

    name: str
    nbytes: int
    pinned = property(lambda self: "Pinned" in self.name, doc="'Memcpy DtoH (Device -> Pinned)'")


@dataclass(frozen=True)
class CaseProfile:
    """What the profiler saw inside one case's range: its DtoH copies, and its copy calls without a GPU record."""

    copies: tuple[ProfiledCopy, ...]
    copy_calls: int
    lost: int
    syncs: int | None = None
    """Its cu*Synchronize calls (`sync_call`) but the range's closing one; None when it holds none at all (no CUDA
    runtime records: unchecked)."""


class TraceError(ValueError):
    """A Chrome trace that cannot be read as a kvpages profile."""


def _dtoh_copy(event: dict) -> ProfiledCopy | None:
    if event.get("cat") not in MEMCPY_CATEGORIES or not str(event.get("name", "")).startswith("Memcpy DtoH"):
        return None
    nbytes = event.get("args", {}).get("bytes")
    if nbytes is None:
        raise TraceError(f"the profiler's {event['name']!r} record carries no byte count; cannot cross-check")
    return ProfiledCopy(event["name"], int(nbytes))


def gpu_events(trace: dict) -> int:
    return sum(1 for e in trace.get("traceEvents", []) if e.get("cat") in GPU_CATEGORIES)


def case_profiles(trace: dict) -> dict[str, CaseProfile]:
    """Per `kvpages:<case id>` range of a Chrome trace but the warm-up: the DtoH copies of the copy calls that start
    inside it (their GPU records: the memcpys of the same correlation ids)."""
    events = trace.get("traceEvents", [])
    ranges = [e for e in events if str(e.get("name", "")).startswith(RANGE_PREFIX) and e.get("ph") == "X"
              and e.get("cat") != "gpu_user_annotation" and e["name"] != WARM_UP_RANGE]
    calls = [e for e in events if e.get("cat") in RUNTIME_CATEGORIES
             and str(e.get("name", "")).startswith(COPY_CALLS)]
    syncs = [float(e["ts"]) for e in events if e.get("cat") in RUNTIME_CATEGORIES and sync_call(str(e.get("name", "")))]
    by_correlation = {int(e["args"]["correlation"]): e for e in events
                      if e.get("cat") in MEMCPY_CATEGORIES and "correlation" in e.get("args", {})}
    out = {}
    for r in ranges:
        start, end = float(r["ts"]), float(r["ts"]) + float(r.get("dur", 0))
        inside = [c for c in calls if start <= float(c["ts"]) <= end]
        copies, lost = [], 0
        for call in inside:
            gpu = by_correlation.get(int(call.get("args", {}).get("correlation", -1)))
            if gpu is None:
                lost += 1
            elif (copy := _dtoh_copy(gpu)) is not None:
                copies.append(copy)
        synced = sum(start <= ts <= end for ts in syncs)
        out[r["name"][len(RANGE_PREFIX):]] = CaseProfile(tuple(copies), len(inside), lost, synced - 1 if synced else None)
    return out


def judge(measured: D2HMeasurement, seen: CaseProfile) -> CheckAnswer:
    """The meter's link-crossing transfers against what the profiler saw of the same call (zero-byte hand-offs
    issue no memcpy: left out)."""
    if seen.lost:
        return CheckAnswer("lost_records", f"the profiler lost records: {seen.lost} of {seen.copy_calls} copy call(s) "
                                           "in this case have no GPU record (CUPTI before CUDA 13.1, pytorch#192021); "
                                           "the meter's count stands, unchecked")
    metered = sorted((t.nbytes, t.pinned) for t in measured.transfers if t.crossed_link and t.nbytes)
    profiled = sorted((c.nbytes, c.pinned) for c in seen.copies if c.nbytes)
    if metered != profiled:
        return CheckAnswer("mismatch",
                           f"the meter counted {sum(b for b, _ in metered)} bytes in {len(metered)} D2H transfers "
                           f"{metered}, the CUDA profiler recorded {sum(b for b, _ in profiled)} bytes in "
                           f"{len(profiled)} 'Memcpy DtoH' copies {profiled}")
    if seen.syncs is not None and seen.syncs != measured.host_syncs + measured.transfer_syncs:
        return CheckAnswer("mismatch", f"the meter counted {measured.host_syncs} host syncs (+{measured.transfer_syncs} "
                                       f"in a transfer thread's wait), the CUDA profiler {seen.syncs} cu*Synchronize calls")
    return AGREE


def answers_of(trace: dict, measured: dict[str, D2HMeasurement]) -> dict[str, CheckAnswer]:
    crossed = any(t.crossed_link and t.nbytes for m in measured.values() for t in m.transfers)
    if crossed and gpu_events(trace) == 0:
        raise CrosscheckError(f"{NO_GPU_ACTIVITY}, so the meter cannot be cross-checked")
    seen = case_profiles(trace)
    return {case: judge(m, seen.get(case, CaseProfile((), 0, 0))) for case, m in measured.items()}


# ----------------------------------------------------------------------------- the child's side


def profile_cases(cases: Sequence[CheckCase], device: str, trace_out: str | None = None) -> dict[str, CheckAnswer]:
    """Meter every case, then profile one call of each in one session, and judge."""
    import torch
    from torch.autograd.profiler import record_function

    from kvpages.measure.targets import measure

    inputs = case_inputs(cases, device)
    measured = {}
    for case in cases:
        case.target.call_here(case.variant, inputs[case.id])  # lazy initialisation outside the profile
        measured[case.id] = measure(case.target, case.variant, inputs[case.id])
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    with kineto(cuda) as prof:
        with record_function(WARM_UP_RANGE):  # a session may lose records at its start: lose them here
            if cuda:
                torch.arange(8, device="cuda").cpu()
            sync()
        for case in cases:
            with record_function(RANGE_PREFIX + case.id):
                case.target.call_here(case.variant, inputs[case.id])
                sync()
    trace = trace_of(prof)
    if trace_out:
        with gzip.open(trace_out, "wt") as f:
            json.dump(trace, f)
    return answers_of(trace, measured)


def kineto(cuda: bool):
    """A Kineto session over the CPU and, with `cuda`, the CUDA device: torch.autograd.profiler.profile, which
    torch.profiler.profile wraps, asked for the CUDA device as the installed torch's wrapper asks (use_device from
    torch 2.4, use_cuda before it). The same events and trace, but the wrapper's start imports torch._inductor (and with
    it dynamo and sympy: 0.9 s of CPU, more before their bytecode is written) to read a CUDA-graphs setting that nothing
    here uses. A session that records no GPU activity is the caller's NO_GPU_ACTIVITY, as before."""
    import torch
    from torch.autograd.profiler import profile
    from torch.torch_version import TorchVersion

    if not cuda:
        return profile(use_kineto=True)
    if TorchVersion(torch.__version__) >= "2.4":  # compared as versions: 2.13 >= 2.4
        return profile(use_device="cuda", use_kineto=True)
    return profile(use_cuda=True, use_kineto=True)


def trace_of(prof) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvpages-trace-") as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)


def main() -> NoReturn:
    request = json.loads(sys.stdin.read())
    cases = cases_of(request)
    try:
        answers = profile_cases(cases, request["device"], request.get("trace_out"))
        reply: dict = {"unavailable": None, "answers": {k: asdict(v) for k, v in answers.items()}}
    except (CrosscheckError, TraceError) as exc:
        reply = {"unavailable": str(exc), "answers": {}}
    reply_and_exit(reply)


if __name__ == "__main__":
    main()
