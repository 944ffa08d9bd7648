"""`kvpages fleet`: runs of one sweep from several machines, each machine pooled and analysed as one run, matched
point by point (no torch). What some machine lacks is listed, never filled in; nothing here gates."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from kvpages.analysis.cache import Loaded
from kvpages.analysis.families import ScenarioRatio
from kvpages.analysis.machines import Machine, machine_of, meta_of, pooled
from kvpages.analysis.ratios import Analysis, analyze
from kvpages.core.names import variant_sort_key
from kvpages.core.options import OPTIONS
from kvpages.schema.meta import RunMeta
from kvpages.schema.reader import Run, RunError, load_run, row_key
from kvpages.schema.rows import RESULTS_CSV, RatioRow

POINT_KEY = ("variant", "baseline", "dtype", "layout", "seq_len", "page_size")  # matches a ratio between machines
SCENARIO_KEY = ("scenario", "variant", "latency")  # matches a scenario ratio between machines
_NOT_THE_SWEEP = frozenset(o.flag for o in OPTIONS if o.field in ("preset", "device", "results_dir", "crosscheck",
                                                                    "breakdown"))
"""Options that do not change which points a run measures (the preset is named on its own)."""

T = TypeVar("T", RatioRow, ScenarioRatio)


@dataclass(frozen=True)
class Member:
    id: str  # M1, M2, ... in the order the machines' first runs were given
    machine: Machine
    runs: tuple[Run, ...]
    analysis: Analysis

    @property
    def label(self) -> str:
        return f"{self.id}: {self.machine.describe()}"


@dataclass(frozen=True)
class Matched(Generic[T]):
    """A ratio every machine has: its key, and each machine's ratio, in member order."""

    key: tuple
    rows: tuple[T, ...]

    @property
    def verdicts(self) -> tuple[str, ...]:
        return tuple(r.verdict for r in self.rows)

    @property
    def agree(self) -> bool:
        return len(set(self.verdicts)) == 1


@dataclass(frozen=True)
class Missing:
    key: tuple
    on: tuple[str, ...]
    not_on: tuple[str, ...]


@dataclass(frozen=True)
class Fleet:
    members: tuple[Member, ...]
    ratios: tuple[Matched[RatioRow], ...]
    scenario_ratios: tuple[Matched[ScenarioRatio], ...]
    missing: tuple[Missing, ...]
    scenario_missing: tuple[Missing, ...]
    sweeps: tuple[tuple[str, str], ...]  # (run id, its sweep in words) of every run, in the order given

    @property
    def one_sweep(self) -> bool:
        return len({sweep for _, sweep in self.sweeps}) == 1

    @property
    def run_count(self) -> int:
        return len(self.sweeps)


def sweep_of(meta: RunMeta) -> str:
    """A run's sweep in words: its preset, and the options it was given that change which points it measures."""
    given = [f"{flag} {value}" for flag, value in meta.options.items() if flag not in _NOT_THE_SWEEP]
    return " ".join([f"preset {meta.preset}", *given])


def analysed(paths: Sequence[Path]) -> list[Analysis]:
    """The run folders of a fleet, each checked, read and analysed (the analysis kept since the folder's last change
    where there is one: kvpages.analysis.cache); RunError (one line) for anything that is not one, before any is
    analysed. A machine of several runs is analysed once more, as their pooled run (`fleet_of`)."""
    if len(paths) < 2:
        raise RunError(f"give two or more run folders (runs of one sweep on two or more machines); got {len(paths)}")
    seen: dict[Path, Path] = {}
    for path in paths:
        if path.resolve() in seen:
            raise RunError(f"{path}: given twice (as {seen[path.resolve()]} too)")
        seen[path.resolve()] = path
        if path.exists() and not path.is_dir():
            raise RunError(f"{path}: not a folder; kvpages fleet takes run folders, e.g. results/<run-id>")
        if not (path / RESULTS_CSV).is_file():
            load_run(path)  # its one line: no such folder, or not a run folder; before any run is analysed
    return [Loaded.of(path).analysis for path in paths]  # a run folder has a meta.json, so each says where it ran


def _timed(run: Run) -> set[tuple]:
    keys = {row_key(r) for _, r in run.ok_rows().iterrows()}
    if run.scenarios is not None:
        ok = run.scenarios[run.scenarios["status"] == "ok"]
        keys |= set(zip(ok["scenario"], ok["variant"], strict=True))
    return keys


def _match(members: Sequence[Member], rows_of: Callable[[Analysis], Iterable[T]], key: tuple[str, ...]
           ) -> tuple[list[Matched[T]], list[Missing]]:
    """Every machine's rows matched on the fields `key`: (the keys all machines have, the keys only some have)."""
    keyed = [{tuple(getattr(r, f) for f in key): r for r in rows_of(m.analysis)} for m in members]
    matched, missing = [], []
    for k in dict.fromkeys(k for rows in keyed for k in rows):
        found = [rows.get(k) for rows in keyed]
        if all(r is not None for r in found):
            matched.append(Matched(k, tuple(r for r in found if r is not None)))
        else:
            missing.append(Missing(k, tuple(m.id for m, r in zip(members, found, strict=True) if r is not None),
                                   tuple(m.id for m, r in zip(members, found, strict=True) if r is None)))
    return matched, missing


def point_order(key: tuple) -> tuple:
    """A ratio key's place in the report and the chart: by dtype, layout, page size, variant, then seq_len."""
    variant, baseline, dtype, layout, seq_len, page_size = key
    return (dtype, layout, page_size, variant_sort_key(variant), baseline, seq_len)


def fleet_of(analyses: Sequence[Analysis]) -> Fleet:
    """The runs' machines side by side: a machine of one run keeps that run's analysis, a machine of several is
    analysed as their pooled run."""
    grouped: dict[Machine, list[Analysis]] = {}
    for analysis in analyses:
        grouped.setdefault(machine_of(analysis.run), []).append(analysis)
    runs = [a.run for a in analyses]
    names = ", ".join(str(r.path) for r in runs)
    if len(grouped) < 2:
        (machine,) = grouped
        raise RunError(f"{names}: every run is of one machine ({machine.describe()}); kvpages fleet sets machines side "
                       "by side (`kvpages compare` compares two runs of one)")
    machines = [pooled([a.run for a in group]) for group in grouped.values()]
    if not set.intersection(*(_timed(run) for run in machines)):
        sweeps = "; ".join(f"{r.run_id}: {sweep_of(meta_of(r))}" for r in runs)
        raise RunError(f"{names}: the machines share no timed point ({sweeps}); kvpages fleet compares runs of one sweep")
    members = [Member(f"M{i}", machine, tuple(a.run for a in group), group[0] if len(group) == 1 else analyze(run))
               for i, ((machine, group), run) in enumerate(zip(grouped.items(), machines, strict=True), start=1)]
    ratios, missing = _match(members, lambda a: a.ratios, POINT_KEY)
    scenario_ratios, scenario_missing = _match(members, lambda a: a.scenario_ratios, SCENARIO_KEY)
    return Fleet(tuple(members), tuple(sorted(ratios, key=lambda m: point_order(m.key))), tuple(scenario_ratios),
                 tuple(sorted(missing, key=lambda m: point_order(m.key))), tuple(scenario_missing),
                 tuple((r.run_id, sweep_of(meta_of(r))) for r in runs))
