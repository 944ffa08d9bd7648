"""Many ranks at once: what a scheduler step pays when every rank of a node converts in the same moment.

Every rank (kvpages.measure.group) runs the same blocks through the one runner, in cycles of rounds (docs/guide.md,
"the rounds and the contention"); rank 0 gathers the times and writes the run folder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpages.core.names import case_id
from kvpages.core.stats import latency_statistics
from kvpages.measure.order import Stamps, step_call
from kvpages.measure.outcome import MeterReading
from kvpages.measure.schedule import Block
from kvpages.measure.steps import get_step_variant
from kvpages.measure.targets import Context, ScenarioTarget, Timer, finish_for
from kvpages.measure.timer import US_DECIMALS, synchronizer
from kvpages.schema.ranks import ALONE, ALONE_MAX, RANK, STEP
from kvpages.schema.rows import RANKS, RankRow, RankSampleSet, ScenarioRow, timing_columns

TOGETHER = -1
"""A round in which every rank converts at once (`round_modes`); any other round is one rank's, alone."""


def round_modes(rounds: int, world_size: int) -> tuple[int, ...]:
    """Who converts in each timed round: the rank converting alone, or TOGETHER; cycles of world_size + 1 rounds,
    each rank alone in turn, then every rank, the turn starting one rank later in each cycle, so no rank always goes
    first (fewer rounds than a cycle: every rank, in each)."""
    cycle = world_size + 1
    if rounds < cycle:
        return (TOGETHER,) * rounds
    return tuple(mode for k in range(rounds // cycle)
                 for mode in (*((k + r) % world_size for r in range(world_size)), TOGETHER))


@dataclass
class _Rounds:
    """Where a block's timed rounds are: who converts in each, and the round now."""

    modes: tuple[int, ...] = (TOGETHER,)
    timing: bool = False
    index: int = -1
    held: Any = None


@dataclass(frozen=True)
class RankTarget(ScenarioTarget):
    """A step scenario timed on every rank at once (see the module doc); built, checked and metered as any step."""

    world_size: int = 1
    table = RANKS

    def timer(self, variant: str, ctx: Context) -> Timer:
        group = ctx.group
        assert group is not None, "a RankTarget runs in a multi-rank session"
        stamps, state = Stamps(), _Rounds()
        busy, sync, case = ctx.busy_queue(self.scenario.busy_us), synchronizer(ctx.device), case_id(variant, self.id)
        call = step_call(get_step_variant(variant), finish_for(self.scenario), ctx.transfer_thread, stamps, busy)

        def before_round() -> None:
            sync()
            if state.timing:
                state.index += 1
                group.start_together(f"{case}: the start of timed round {state.index}")

        def fn(slices, page_size, **extras):
            if state.timing and state.modes[state.index] not in (TOGETHER, group.rank):
                return state.held  # waiting while another rank converts alone
            state.held = call(slices, page_size, **extras)
            return state.held

        def rounds(wanted: int) -> int:
            agreed = group.agree_rounds(f"{case}: agreeing on the rounds", wanted, group.size + 1)  # whole cycles
            state.modes = round_modes(agreed, group.size)
            return agreed

        def start() -> None:
            stamps.clear()
            busy.reset()
            state.timing, state.index = True, -1

        def series(benchmark, count: int) -> tuple[tuple[float, ...], ...]:
            """Who converted in each round, then every rank's per-round (blocked, ready, start) in seconds, gathered;
            NaN where a rank waited."""
            mine = np.full((3, count), np.nan)
            real = [k for k, mode in enumerate(state.modes[:count]) if mode in (TOGETHER, group.rank)]
            mine[:, real] = [stamps.blocked[-len(real):], stamps.ready[-len(real):], stamps.started[-len(real):]]
            if not group.meta.one_host:  # the monotonic clocks of two hosts do not compare: no skew
                mine[2] = np.nan
            gathered = group.gather(f"{case}: gathering the rounds", mine)
            return (tuple(float(m) for m in state.modes[:count]),) + tuple(
                tuple(row) for rank_series in gathered for row in rank_series)

        return Timer(fn, before_round, series, start, rounds)

    def extra_info(self, variant: str, reading: MeterReading) -> dict[str, Any]:
        return {**super().extra_info(variant, reading), "world_size": self.world_size,
                "rounds": "cycles: each rank alone in turn, then every rank at once (kvpages.measure.ranks)"}

    def samples(self, variant: str, block: Block, series: tuple[tuple[float, ...], ...]) -> tuple[RankSampleSet, ...]:
        """The block as each rank saw it at once and alone, and as the step saw it: per cycle, the maximum over the
        ranks at once, and the maximum over the ranks of their alone rounds (us; the k-th values of every line are
        the k-th cycle's)."""
        modes = np.asarray(series[0])
        per_rank = np.round(np.asarray(series[1:]).reshape(self.world_size, 3, modes.size) * 1e6, US_DECIMALS)
        together = modes == TOGETHER
        cycles = int(together.sum())
        alone = [(modes == r).nonzero()[0][:cycles] for r in range(self.world_size)]
        key = (self.scenario.id, variant, block.repetition, block.order, block.process)

        def line(role: str, rank: int | None, blocked: np.ndarray, ready: np.ndarray, skew=()) -> RankSampleSet:
            return RankSampleSet(*key, role, rank, tuple(blocked.tolist()), tuple(ready.tolist()), tuple(skew))

        at_once = per_rank[:, :, together]
        apart = np.stack([per_rank[r][:, alone[r]] for r in range(self.world_size)])
        starts = at_once[:, 2]
        return (*(line(RANK, r, at_once[r, 0], at_once[r, 1]) for r in range(self.world_size)),
                *(line(ALONE, r, apart[r, 0], apart[r, 1]) for r in range(self.world_size)),
                line(STEP, None, at_once[:, 0].max(axis=0), at_once[:, 1].max(axis=0),
                     (starts.max(axis=0) - starts.min(axis=0)).tolist()),
                line(ALONE_MAX, None, apart[:, 0].max(axis=0), apart[:, 1].max(axis=0)))

    def rows(self, variant: str, ctx: Context, reading: MeterReading | None, status: str, note: str,
             blocks: Sequence[Any], repro: str) -> tuple[ScenarioRow | RankRow, ...]:
        """One row per rank at once and alone, the step's at once and alone (`ALONE_MAX`); a case that stopped
        untimed: its step row, with its status."""
        s, group = self.scenario, ctx.group
        devices = [r.device for r in group.meta.ranks] if group is not None else [ctx.device] * self.world_size
        calls = s.calls()

        def made(role: str, rank: int | None, sets: list[RankSampleSet]) -> RankRow:
            timings: dict[str, Any] = dict.fromkeys(timing_columns(RankRow))
            if sets:
                skews = [t for b in sets for t in b.skew_us if np.isfinite(t)]
                timings.update(latency_statistics(sets), skew_median_us=float(np.median(skews)) if skews else None)
            times = 1 if rank is not None else self.world_size
            d2h_bytes, transfers, syncs = (None, None, None) if reading is None else (
                reading.d2h_bytes * times, reading.d2h_transfers * times, reading.host_syncs * times)
            return RankRow(scenario=s.id, variant=variant, role=role, rank=rank, world_size=self.world_size,
                           device=devices[rank] if rank is not None else "+".join(dict.fromkeys(devices)),
                           page_size=s.page_size, requests=s.requests, tokens=sum(c.tokens for c in calls),
                           d2h_bytes=d2h_bytes, d2h_transfers=transfers, host_syncs=syncs, **timings, status=status, note=note,
                           repro=repro)

        if not blocks:
            return (made(STEP, None, []),)
        of = [b for b in blocks if isinstance(b, RankSampleSet)]
        ranks = range(self.world_size)
        roles = [(RANK, r) for r in ranks] + [(ALONE, r) for r in ranks] + [(STEP, None), (ALONE_MAX, None)]
        return tuple(made(role, rank, [b for b in of if (b.role, b.rank) == (role, rank)]) for role, rank in roles)

    def as_json(self) -> dict[str, Any]:
        return {"kind": "ranked step", "world_size": self.world_size, **dataclasses.asdict(self.scenario)}
