"""Many ranks at once: what a scheduler step pays when every rank of a node converts in the same moment.

torchrun starts the ranks (`torchrun --nproc-per-node N -m pytest bench/ --benchmark-only ...`):
each rank is a pytest session of its own, on its own device (cuda:LOCAL_RANK, or the CPU), and
kvpages joins them in one gloo process group (host-side: no collective kernel on a timed
device). Every rank plans the same blocks of the step scenarios (`RankTarget`) and runs them
through the one runner (kvpages.measure.runner) in the same order. Per block the ranks agree
twice (`Group.agree`): before the timing (every rank checked and metered the same D2H) and
after it (every rank's last output was right); a case one rank stops, every rank stops.

Each timed round starts on a barrier, and the rounds alternate: rank 0 converts alone while the
other ranks wait (the one-rank baseline, measured in the same run), then every rank converts at
once. After a block, rank 0 gathers every rank's per-round blocked and ready times; the step's
cost per round is the maximum over the ranks, since the step waits for its slowest rank. Rank 0
writes the one run folder. A rank that raises, or a barrier or gather that times out, stops the
run with a message naming the rank (gloo's monitored barrier names the ranks that did not
arrive); torchrun then stops the other ranks, and rank 0 keeps every row it finished.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpages.core.options import BenchOptions
from kvpages.core.scenarios import StepScenario
from kvpages.core.stats import latency_statistics
from kvpages.measure.inputs import PoolCache, Workload
from kvpages.measure.meter import D2HMeasurement
from kvpages.measure.schedule import Block
from kvpages.measure.steps import Stamps, get_step_variant, step_call
from kvpages.measure.targets import Context, ScenarioTarget, Timer, finish_for
from kvpages.measure.timer import synchronizer
from kvpages.schema.ranks import ALONE, RANK, STEP
from kvpages.schema.rows import RANKS, RankRow, RankSampleSet, timing_columns


def round_modes(rounds: int) -> tuple[str, ...]:
    """The role of each timed round: rank 0 alone, then every rank, in turn (one round: every rank)."""
    return (RANK,) if rounds < 2 else (ALONE, RANK) * (rounds // 2)


@dataclass
class _Rounds:
    modes: tuple[str, ...] = (RANK,)
    timing: bool = False
    index: int = -1
    held: Any = None


@dataclass(frozen=True)
class RankTarget:
    """A step scenario timed on every rank at once (see the module doc); its other duties are ScenarioTarget's."""

    scenario: StepScenario
    world_size: int
    table = RANKS

    id = property(lambda self: self.scenario.id, doc="The scenario's id (the benchmark group).")
    page_size = property(lambda self: self.scenario.page_size)

    @property
    def alone(self) -> ScenarioTarget:
        return ScenarioTarget(self.scenario)

    def unavailable_reason(self, variant: str, device: str) -> str | None:
        return self.alone.unavailable_reason(variant, device)

    def build(self, device: str, rotation: int | None = None, cache: PoolCache | None = None) -> Workload:
        return self.alone.build(device, rotation, cache)

    def inputs_for(self, variant: str, workload: Workload) -> tuple[Any, ...]:
        return self.alone.inputs_for(variant, workload)

    def call_here(self, variant: str, inputs: Any) -> Any:
        return self.alone.call_here(variant, inputs)

    def check(self, out: Any, expected: Any) -> str | None:
        return self.alone.check(out, expected)

    def expected_d2h(self, variant: str) -> tuple[int, int | None]:
        return self.alone.expected_d2h(variant)

    def expected_syncs(self, variant: str, device: str) -> int:
        return self.alone.expected_syncs(variant, device)

    def budget_s(self, options: BenchOptions) -> float:
        return options.scenario_budget_s

    def timer(self, variant: str, ctx: Context) -> Timer:
        group = ctx.group
        assert group is not None, "a RankTarget runs in a multi-rank session"
        stamps, state = Stamps(), _Rounds()
        busy, sync, case = ctx.busy_queue(self.scenario.busy_us), synchronizer(ctx.device), f"{variant}-{self.id}"
        call = step_call(get_step_variant(variant), finish_for(self.scenario), ctx.worker, stamps, busy)

        def before_round() -> None:
            sync()
            if state.timing:
                state.index += 1
                group.start_together(f"{case}: the start of timed round {state.index}")

        def fn(slices, page_size, **extras):
            if state.timing and state.modes[state.index] == ALONE and group.rank != 0:
                return state.held  # waiting while rank 0 converts alone
            state.held = call(slices, page_size, **extras)
            return state.held

        def rounds(wanted: int) -> int:
            agreed = group.agree_rounds(f"{case}: agreeing on the rounds", wanted)
            state.modes = round_modes(agreed)
            return agreed

        def start() -> None:
            stamps.clear()
            busy.reset()
            state.timing, state.index = True, -1

        def series(benchmark, count: int) -> tuple[tuple[float, ...], ...]:
            """Every rank's per-round (blocked, ready, start) in seconds, gathered; NaN where a rank waited."""
            mine = np.full((3, count), np.nan)
            real = [k for k, mode in enumerate(state.modes[:count]) if mode == RANK or group.rank == 0]
            mine[:, real] = [stamps.blocked[-len(real):], stamps.ready[-len(real):], stamps.started[-len(real):]]
            if not group.meta.one_host:  # the monotonic clocks of two hosts do not compare: no skew
                mine[2] = np.nan
            gathered = group.gather(f"{case}: gathering the rounds", mine)
            return (tuple(1.0 if m == RANK else 0.0 for m in state.modes[:count]),) + tuple(
                tuple(row) for rank_series in gathered for row in rank_series)

        return Timer(fn, before_round, series, start, rounds)

    def extra_info(self, variant: str, measured: D2HMeasurement) -> dict[str, Any]:
        return {**self.alone.extra_info(variant, measured), "world_size": self.world_size,
                "rounds": "alternating: rank 0 alone, then every rank (kvpages.measure.ranks)"}

    def samples(self, variant: str, block: Block, series: tuple[tuple[float, ...], ...]) -> tuple[RankSampleSet, ...]:
        """The block as each rank, the step (per round the maximum over the ranks) and rank 0 alone saw it (us)."""
        together = np.asarray(series[0]) == 1.0
        per_rank = np.asarray(series[1:]).reshape(self.world_size, 3, len(together)) * 1e6
        key = (self.scenario.id, variant, block.repetition, block.order, block.process)

        def line(role: str, rank: int | None, blocked: np.ndarray, ready: np.ndarray, skew=()) -> RankSampleSet:
            return RankSampleSet(*key, role, rank, tuple(blocked.tolist()), tuple(ready.tolist()), tuple(skew))

        lines = [line(RANK, r, per_rank[r, 0, together], per_rank[r, 1, together]) for r in range(self.world_size)]
        starts = per_rank[:, 2, together]
        lines.append(line(STEP, None, per_rank[:, 0, together].max(axis=0), per_rank[:, 1, together].max(axis=0),
                          (starts.max(axis=0) - starts.min(axis=0)).tolist()))
        lines.append(line(ALONE, 0, per_rank[0, 0, ~together], per_rank[0, 1, ~together]))
        return tuple(lines)

    def row(self, variant: str, ctx: Context, measured: D2HMeasurement | None, status: str, note: str,
            blocks: Sequence[Any], repro: str) -> tuple[RankRow, ...]:
        """One row per rank, the step's and rank 0 alone's; a case that stopped: its step row, with its status."""
        s, group = self.scenario, ctx.group
        devices = [r.device for r in group.meta.ranks] if group is not None else [ctx.device] * self.world_size
        calls = s.calls()

        def made(role: str, rank: int | None, sets: list[RankSampleSet]) -> RankRow:
            timings: dict[str, Any] = dict.fromkeys(timing_columns(RankRow))
            if sets:
                skews = [t for b in sets for t in b.skew_us if np.isfinite(t)]
                timings.update(latency_statistics(sets), skew_median_us=float(np.median(skews)) if skews else None)
            times = self.world_size if role == STEP else 1
            d2h_bytes, transfers, syncs = (None, None, None) if measured is None else (
                measured.d2h_bytes * times, measured.d2h_transfers * times, measured.host_syncs * times)
            return RankRow(scenario=s.id, variant=variant, role=role, rank=rank, world_size=self.world_size,
                           device=devices[rank] if rank is not None else "+".join(dict.fromkeys(devices)),
                           page_size=s.page_size, requests=s.requests, tokens=sum(c.tokens for c in calls),
                           d2h_bytes=d2h_bytes, d2h_transfers=transfers, host_syncs=syncs, **timings, status=status, note=note,
                           repro=repro)

        if status != "ok":
            return (made(STEP, None, []),)
        of = [b for b in blocks if isinstance(b, RankSampleSet)]
        return tuple(made(RANK, r, [b for b in of if (b.role, b.rank) == (RANK, r)]) for r in range(self.world_size)) + (
            made(STEP, None, [b for b in of if b.role == STEP]), made(ALONE, 0, [b for b in of if b.role == ALONE]))

    def narrowed(self, variant: str, options: BenchOptions, device: str) -> tuple[str, BenchOptions]:
        return self.alone.narrowed(variant, options, device)

    def as_json(self) -> dict[str, Any]:
        return {"kind": "ranked step", "world_size": self.world_size, **dataclasses.asdict(self.scenario)}
