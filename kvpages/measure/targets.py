"""What the runner measures at: a sweep point (one call of a variant) or a whole request or step (a step variant).

Points are timed by pytest-benchmark, one call per round; requests and steps record per round `blocked` (until the
calling thread gets control back) and `ready` (until the page indices are usable on the host), a busy scenario's
queued forward left out of both (kvpages.measure.steps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from kvpages.core.options import BY_HAND, BenchOptions
from kvpages.core.payloads import DEFAULT_PAYLOADS, STRATEGIES, get_payloads
from kvpages.core.scenarios import EXTRA_UPKEEP, SCENARIO_ROTATION, RequestScenario, Scenario, StepScenario, Upkeep, sends_of
from kvpages.core.stats import latency_statistics, row_statistics
from kvpages.core.sweep import ITEMSIZE, Point
from kvpages.measure.busy import BusyQueue
from kvpages.measure.group import Group
from kvpages.measure.inputs import PoolCache, PoolSpec, Workload, make_scenario_workload, make_workload, point_pool, scenario_pool
from kvpages.measure.meter import D2HMeasurement, measure_call
from kvpages.measure.order import Stamps, step_call
from kvpages.measure.outcome import MeterReading
from kvpages.measure.payloads import device_inputs
from kvpages.measure.schedule import Block
from kvpages.measure.steps import Arrays, get_step_variant
from kvpages.measure.timer import US_DECIMALS, synchronizer, to_us
from kvpages.measure.variants import WithExtras, call_args, get_variant
from kvpages.schema.rows import POINTS, SCENARIOS, RankRow, Row, Samples, SampleSet, ScenarioRow, ScenarioSampleSet, timing_columns


@dataclass
class Context:
    """What a target needs of the session that runs it."""

    device: str
    device_name: str
    options: BenchOptions
    busy_queues: dict[int, BusyQueue] = field(default_factory=dict)
    group: Group | None = None
    """The ranks of a multi-rank run (kvpages.measure.ranks); None: one rank."""
    transfer_thread: ThreadPoolExecutor = field(init=False)
    """Where a step variant's `Pending` wait runs, as SGLang's transfer worker thread does; on CUDA with this thread's
    current device (the rank's: a thread starts on device 0, and a wait there would open a context on GPU 0)."""

    def __post_init__(self) -> None:
        start: dict[str, Any] = {}
        if torch.device(self.device).type == "cuda":
            start = {"initializer": torch.cuda.set_device, "initargs": (torch.cuda.current_device(),)}
        self.transfer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvpages-transfer-thread", **start)

    def busy_queue(self, busy_us: int) -> BusyQueue:
        """The busy queue of `busy_us` (calibrated once per duration; none off CUDA)."""
        if busy_us not in self.busy_queues:
            self.busy_queues[busy_us] = BusyQueue(busy_us if self.device == "cuda" else 0)
        return self.busy_queues[busy_us]


@dataclass
class Timer:
    """How one block's rounds are timed: the call, the untimed setup before each round, and the per-round series."""

    fn: Callable[[Any, int], Any]
    before_round: Callable[[], None]
    series: Callable[[Any, int], tuple[tuple[float, ...], ...]]
    """After the block: (benchmark, rounds) -> the per-round series in microseconds."""
    start: Callable[[], None] = lambda: None
    """Right before the timed rounds (after the warm-up): forget what the warm-up recorded."""
    agree_rounds: Callable[[int], int] = lambda rounds: rounds
    """The rounds to time, from those this process's warm-up asked for (the ranks of a multi-rank run agree)."""


def outputs_match(out: object, expected: np.ndarray) -> str | None:
    """None when `out` equals `expected` exactly (type, dtype, shape, values), else what differs."""
    if not isinstance(out, np.ndarray):
        return f"returned {type(out).__name__}, expected numpy.ndarray"
    if out.dtype != expected.dtype or out.shape != expected.shape:
        return f"returned {out.dtype}{list(out.shape)}, expected {expected.dtype}{list(expected.shape)}"
    differ = np.flatnonzero(out != expected)
    if differ.size:
        i = int(differ[0])
        return f"{differ.size} page indices differ; first at {i}: got {out[i]}, expected {expected[i]}"
    return None


def arrays_match(out: object, expected: Sequence[np.ndarray]) -> str | None:
    if not isinstance(out, list):
        return f"returned {type(out).__name__}, expected a list of numpy.ndarray"
    if len(out) != len(expected):
        return f"returned {len(out)} arrays for {len(expected)} calls"
    for i, (o, e) in enumerate(zip(out, expected, strict=True)):
        problem = outputs_match(o, e)
        if problem:
            return f"call {i}: {problem}"
    return None


def measure(target: Target, variant: str, inputs: Any) -> D2HMeasurement:
    """What one call of `variant` at `target` hands to the host; an extra's upkeep copies count as device side too."""
    (slices, _), extras = call_args(inputs, 0)
    tensors = device_inputs(slices)
    tensors += tuple(t for e in extras.values() for t in getattr(e, "device_tensors", ()))
    return measure_call(lambda: target.call_here(variant, inputs), tensors)


def with_extras(names: tuple[str, ...], workload: Workload, one_call: bool) -> tuple[Any, ...]:
    """The workload's input sets, each with the declared extras (per call of a point, per request or step)."""
    if not names:
        return workload.inputs
    built = {name: workload.extra(name) for name in names}
    return tuple(WithExtras(x, {n: b[i].calls[0] if one_call else b[i] for n, b in built.items()})
                 for i, x in enumerate(workload.inputs))


def _measured(reading: MeterReading | None) -> dict[str, Any]:
    """What a row says of the meter's reading: a point's and a scenario's (a scenario's adds its device ops)."""
    if reading is None:
        return {"d2h_bytes": None, "d2h_transfers": None, "host_syncs": None, "link": ""}
    return {k: v for k, v in asdict(reading).items() if k != "device_ops"}


@dataclass(frozen=True)
class PointTarget:
    """A sweep point: one call of a variant (kvpages.measure.variants) on a request slice."""

    point: Point
    table = POINTS

    id = property(lambda self: self.point.id, doc="The point's id (the benchmark group).")
    page_size = property(lambda self: self.point.page_size)

    def unavailable_reason(self, variant: str, device: str) -> str | None:
        return get_variant(variant).unavailable_reason(device)

    def build(self, device: str, rotation: int | None = None, cache: PoolCache | None = None) -> Workload:
        """`rotation`: input sets instead of the target's own number; `cache`: pools an earlier process built."""
        return make_workload(self.point, rotation, cache=cache,
                             validate=rotation is None)  # the profiling processes profile, they check nothing

    def pool(self) -> PoolSpec:
        """The pool its blocks' inputs are cut from (kvpages.measure.inputs.keep_pools)."""
        return point_pool(self.point)

    def inputs_for(self, variant: str, workload: Workload) -> tuple[Any, ...]:
        return with_extras(get_variant(variant).extras, workload, one_call=True)

    def call_here(self, variant: str, inputs: Any) -> Any:
        args, kwargs = call_args(inputs, self.point.page_size)
        return get_variant(variant).fn(*args, **kwargs)

    def check(self, out: Any, expected: Any) -> str | None:
        return outputs_match(out, expected)

    def expected_d2h(self, variant: str) -> tuple[int, int | None]:
        p, v = self.point, get_variant(variant)
        return v.expected_d2h_bytes(p.seq_len, p.page_size, p.itemsize), v.moves.expected_transfers

    def expected_syncs(self, variant: str, device: str) -> int:
        return get_variant(variant).syncs.on(device)

    def expected_ops(self, variant: str) -> int | None:
        """The device ops a call declares: none declared (the meter's count is not checked)."""
        return None

    def budget_s(self, options: BenchOptions) -> float:
        return options.sweep.time_budget_s

    def timer(self, variant: str, ctx: Context) -> Timer:
        return Timer(get_variant(variant).fn, synchronizer(ctx.device),
                     lambda benchmark, rounds: (to_us(benchmark.stats.stats.data),))

    def extra_info(self, variant: str, reading: MeterReading) -> dict[str, Any]:
        p = self.point
        return {"variant": variant, "device": p.device, "dtype": p.dtype, "layout": p.layout, "seq_len": p.seq_len,
                "page_size": p.page_size, "num_pages": p.num_pages, "rotation": p.rotation,
                "expected_d2h_bytes": self.expected_d2h(variant)[0], **_measured(reading)}

    def samples(self, variant: str, block: Block, series: tuple[tuple[float, ...], ...]) -> tuple[Samples, ...]:
        p = self.point
        return (SampleSet(variant, p.dtype, p.layout, p.seq_len, p.page_size, block.repetition, block.order,
                          block.process, series[0]),)

    def rows(self, variant: str, ctx: Context, reading: MeterReading | None, status: str, note: str,
             blocks: Sequence[Samples], repro: str) -> tuple[Row]:
        p = self.point
        timings: dict[str, Any] = dict.fromkeys(timing_columns(Row))
        if blocks:
            series = [np.asarray(b.samples_us) for b in blocks if isinstance(b, SampleSet)]
            timings.update(row_statistics(series), rounds=sum(len(s) for s in series), iterations=1,
                           repetitions=len(series))
        return (Row(variant=variant, device=p.device, device_name=ctx.device_name, dtype=p.dtype, layout=p.layout,
                    seq_len=p.seq_len, page_size=p.page_size, num_pages=p.num_pages,
                    rotation=p.rotation if blocks else 0, expected_d2h_bytes=self.expected_d2h(variant)[0],
                    **_measured(reading), **timings, status=status, note=note, repro=repro),)

    def narrowed(self, variant: str, options: BenchOptions, device: str) -> tuple[str, BenchOptions]:
        p = self.point
        return "bench/", options.without_scenarios(
            variants=(variant,), seq_lens=(p.seq_len,), page_sizes=(p.page_size,), dtypes=(p.dtype,),
            layouts=(p.layout,), seed=p.seed, device=device, results_dir=None)

    def as_json(self) -> dict[str, Any]:
        return {"kind": "point", **asdict(self.point)}


def finish_for(scenario: Scenario) -> Callable[[Arrays], Arrays]:
    """What follows the conversion on the host: the decode side's `.astype(np.int32)` (for ZMQ)."""
    if scenario.kind == "step" or scenario.side == "decode":
        return lambda arrays: [a.astype(np.int32) for a in arrays]
    return lambda arrays: arrays


@dataclass(frozen=True)
class ScenarioTarget:
    """A whole request (every call it makes) or a whole scheduler step, with a step variant (kvpages.measure.steps)."""

    table = SCENARIOS
    scenario: Scenario

    id = property(lambda self: self.scenario.id, doc="The scenario's id (the benchmark group).")
    page_size = property(lambda self: self.scenario.page_size)

    def unavailable_reason(self, variant: str, device: str) -> str | None:
        reason = get_step_variant(variant).unavailable_reason(device)
        if reason is None and self.scenario.busy_us and device != "cuda":
            reason = "a busy-queue scenario needs CUDA: a CPU run has no device queue to wait behind"
        return reason

    def build(self, device: str, rotation: int | None = None, cache: PoolCache | None = None) -> Workload:
        return make_scenario_workload(self.scenario, device, rotation or SCENARIO_ROTATION, cache=cache)

    def pool(self) -> PoolSpec:
        return scenario_pool(self.scenario, SCENARIO_ROTATION)

    def inputs_for(self, variant: str, workload: Workload) -> tuple[Any, ...]:
        return with_extras(get_step_variant(variant).extras, workload, one_call=False)

    def call_here(self, variant: str, inputs: Any) -> Any:
        """One request or step with any wait in this thread (for the check and the meter, not the timing)."""
        args, kwargs = call_args(inputs, self.scenario.page_size)
        return finish_for(self.scenario)(get_step_variant(variant).arrays(*args, **kwargs))

    def check(self, out: Any, expected: Any) -> str | None:
        return arrays_match(out, finish_for(self.scenario)(list(expected)))

    def upkeep(self, variant: str) -> list[Upkeep]:
        """The upkeep copies of the variant's extras: each one blocking D2H."""
        return [u for extra in get_step_variant(variant).extras if extra in EXTRA_UPKEEP
                for u in EXTRA_UPKEEP[extra](self.scenario)]

    def expected_d2h(self, variant: str) -> tuple[int, int | None]:
        s, v, upkeep = self.scenario, get_step_variant(variant), self.upkeep(variant)
        calls = s.calls()
        return v.expected_d2h_bytes([c.tokens for c in calls], s.page_size, ITEMSIZE[s.dtype]) \
            + sum(len(u.pages) for u in upkeep) * ITEMSIZE[s.dtype], \
            v.expected_transfers(len(calls), sends_of(s)) + len(upkeep)

    def expected_syncs(self, variant: str, device: str) -> int:
        s = self.scenario
        return get_step_variant(variant).expected_syncs(len(s.calls()), device, sends_of(s)) + len(self.upkeep(variant))

    def expected_ops(self, variant: str) -> int | None:
        """The device ops a strategy declares on a scenario of several payloads (kvpages.core.payloads); else None."""
        s, strategy = self.scenario, STRATEGIES.get(variant)
        preset = get_payloads(s.payloads)
        if strategy is None or len(preset.payloads) == 1:
            return None
        return strategy.device_ops(len(s.calls()), sends_of(s), s.requests * preset.translated, s.dtype)

    def budget_s(self, options: BenchOptions) -> float:
        return options.scenario_budget_s

    def timer(self, variant: str, ctx: Context) -> Timer:
        stamps, busy, sync = Stamps(), ctx.busy_queue(self.scenario.busy_us), synchronizer(ctx.device)
        fn = step_call(get_step_variant(variant), finish_for(self.scenario), ctx.transfer_thread, stamps, busy)

        def start() -> None:
            stamps.clear()
            busy.reset()

        def series(benchmark, rounds: int) -> tuple[tuple[float, ...], ...]:
            return (to_us(stamps.blocked[-rounds:]), to_us(stamps.ready[-rounds:]),
                    tuple(round(us, US_DECIMALS) for us in busy.measured_us()[-rounds:]))

        return Timer(fn, sync, series, start)  # each round starts on an idle device; the forward is in the round

    def extra_info(self, variant: str, reading: MeterReading) -> dict[str, Any]:
        s = self.scenario
        return {"scenario": s.id, "variant": variant, "kind": s.kind, "calls": len(s.calls()), **_measured(reading)}

    def samples(self, variant: str, block: Block, series: tuple[tuple[float, ...], ...]) -> tuple[Samples, ...]:
        blocked, ready, busy = series
        return (ScenarioSampleSet(self.scenario.id, variant, block.repetition, block.order, block.process, blocked,
                                  ready, busy),)

    def rows(self, variant: str, ctx: Context, reading: MeterReading | None, status: str, note: str,
             blocks: Sequence[Samples], repro: str) -> tuple[ScenarioRow | RankRow, ...]:
        s = self.scenario
        timings: dict[str, Any] = dict.fromkeys(timing_columns(ScenarioRow))
        sets = [b for b in blocks if isinstance(b, ScenarioSampleSet)]
        if sets:
            busy = [t for b in sets for t in b.busy_us]
            timings.update(latency_statistics(sets), busy_measured_us=float(np.median(busy)) if busy else None)
        calls = s.calls()
        if status == "ok" and get_step_variant(variant).cpu_note and ctx.device != "cuda":
            note = "; ".join(n for n in (note, get_step_variant(variant).cpu_note) if n)
        return (ScenarioRow(
            scenario=s.id, kind=s.kind, side=s.side, variant=variant, device=ctx.device, dtype=s.dtype,
            layout=s.layout, requests=s.requests, tokens=sum(c.tokens for c in calls), chunk_size=s.chunk_size,
            page_size=s.page_size, busy_us=s.busy_us, calls=len(calls), expected_d2h_bytes=self.expected_d2h(variant)[0],
            **_measured(reading), **timings, status=status, note=note, repro=repro, payloads=s.payloads,
            swa_window=s.swa_window if get_payloads(s.payloads).windowed else 0,
            device_ops=None if reading is None else reading.device_ops),)

    def narrowed(self, variant: str, options: BenchOptions, device: str) -> tuple[str, BenchOptions]:
        s = self.scenario
        windowed = get_payloads(s.payloads).windowed
        common = options.replace(step_variants=(variant,), page_sizes=(s.page_size,), dtypes=(s.dtype,), device=device,
                                 time_budget_s=options.scenario_budget_s, results_dir=None, scenarios=None,
                                 **dict.fromkeys(BY_HAND),  # its own below
                                 payloads=None if s.payloads == DEFAULT_PAYLOADS else (s.payloads,),
                                 swa_window=s.swa_window if windowed else None)
        if isinstance(s, StepScenario):
            return "bench/test_steps.py", common.replace(step_sizes=(s.batch,), step_lens=s.lengths_spec,
                                                         busy_us=s.busy_us or None)
        return "bench/test_steps.py", common.replace(request_lens=(s.prompt_len,), chunk_size=s.chunk_size,
                                                     prefix=s.prefix)

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.scenario.kind, **asdict(self.scenario)}


Target = PointTarget | ScenarioTarget
"""One thing the runner measures each of its variants at (a multi-rank step is a ScenarioTarget too)."""


def target_from_json(data: dict[str, Any]) -> Target:
    """The inverse of `as_json` (the cross-check process rebuilds its targets from it)."""
    kinds: dict[str, type[Point | RequestScenario | StepScenario]] = {
        "point": Point, "request": RequestScenario, "step": StepScenario}
    spec = kinds[data["kind"]](**{k: v for k, v in data.items() if k != "kind"})
    return PointTarget(spec) if isinstance(spec, Point) else ScenarioTarget(spec)
