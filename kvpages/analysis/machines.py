"""The machine a run ran on, and one machine's runs pooled into one run (no torch; docs/method.md, "Many machines")."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvpages.core.stats import quartiles, row_statistics
from kvpages.schema.meta import Environment, ProcessInfo, RunMeta
from kvpages.schema.reader import Run, RunError, row_key

_LINK_MAX = re.compile(r"\(max ([^)]+)\)")


@dataclass(frozen=True)
class Machine:
    """What tells machines apart: runs of equal identities ran on one machine (None hostnames count as equal)."""

    device: str
    device_name: str
    driver_version: str | None
    pcie_link: str | None  # the link the slot trains to (nvidia-smi's `max`), not the one it idled at: an idle link downshifts
    hostname: str | None
    cpu_id: str | None = None  # the CPU beyond its model name (Environment.cpu_id); None in runs before it was recorded
    gpu_uuid: str | None = None  # the GPU itself (CUDA runs): two VMs of one name and model may hold different GPUs

    @classmethod
    def of(cls, environment: Environment) -> Machine:
        link = environment.pcie_link
        found = _LINK_MAX.search(link) if link else None
        return cls(environment.device, environment.device_name, environment.driver_version,
                   found.group(1) if found else link, environment.hostname, environment.cpu_id, environment.gpu_uuid)

    def describe(self) -> str:
        cpu = f" ({self.cpu_id})" if self.cpu_id else ""
        where = f"{self.device_name}{cpu if self.device != 'cuda' else ''} @ {self.hostname or 'host unknown'}"
        if self.device != "cuda":
            return where
        gpu = f", {self.gpu_uuid[:12]}" if self.gpu_uuid else ""
        return f"{where}, driver {self.driver_version}, PCIe {self.pcie_link}{gpu}{f', CPU {self.cpu_id}' if cpu else ''}"

    def differences(self, other: Machine) -> list[tuple[str, str, str]]:
        """(what, this one's, the other's) for each part of the identity known for both that differs: a part one run
        did not record (None, 'unknown') tells nothing."""
        return [(MACHINE_PARTS[part.name], str(mine), str(theirs)) for part in dataclasses.fields(self)
                if (mine := getattr(self, part.name)) not in (None, "unknown")
                and (theirs := getattr(other, part.name)) not in (None, "unknown") and mine != theirs]


MACHINE_PARTS = {"device": "device", "device_name": "device name", "driver_version": "driver", "pcie_link": "PCIe link",
                 "hostname": "host", "cpu_id": "CPU", "gpu_uuid": "GPU"}
"""What each field of `Machine` is, as `Machine.differences` names it (every field has one)."""


def machine_of(run: Run) -> Machine:
    if run.meta is None:
        raise RunError(f"{run.path}: no meta.json, so its machine is unknown; give the run folder")
    return Machine.of(run.meta.environment)


def meta_of(run: Run) -> RunMeta:
    assert run.meta is not None  # every run of a fleet has one: `machine_of` refuses a run without
    return run.meta


def _processes(run: Run, offset: int) -> list[ProcessInfo]:
    """A run's processes renumbered from `offset`; a run that lists none stands as one process of unknown timings."""
    if meta_of(run).processes:
        return [dataclasses.replace(p, index=p.index + offset) for p in meta_of(run).processes]
    return [ProcessInfo(offset, 0, "session", math.nan, math.nan, math.nan, sum(len(b) for b in run.samples.values()))]


def _pooled_frame(frames: list[pd.DataFrame], keys: list[list[tuple]], poolable: Callable[[tuple], bool],
                  timing: Callable[[tuple], dict[str, object]]) -> pd.DataFrame:
    """One row per key of a machine's runs (`keys[i]`: frame i's): a key timed in every run (`poolable`) is the first
    run's row with the pooled blocks' `timing`; else the first row that says why (skipped, ...), or none."""
    by_run = [dict(zip(k, (r for _, r in frame.iterrows()), strict=True)) for frame, k in zip(frames, keys, strict=True)]
    records = []
    for key in dict.fromkeys(k for run_keys in keys for k in run_keys):
        found = [rows.get(key) for rows in by_run]
        if all(r is not None and r["status"] == "ok" for r in found) and poolable(key):
            records.append({**found[0].to_dict(), **timing(key)})  # type: ignore[union-attr]
        elif (bad := next((r for r in found if r is not None and r["status"] != "ok"), None)) is not None:
            records.append(bad.to_dict())
    return pd.DataFrame(records, columns=frames[0].columns).astype(frames[0].dtypes.to_dict())


def _numbered(runs: Sequence[Run], offsets: list[int], key: tuple, counts: list[int]) -> tuple[int, ...]:
    """The processes of `key`'s blocks (`counts[k]` in run k) in every run, renumbered from each run's offset."""
    return tuple(int(p) + o for r, o, n in zip(runs, offsets, counts, strict=True) for p in r.block_processes(key, n))


def pooled(runs: Sequence[Run]) -> Run:
    """One machine's runs as one run: run k's process p becomes p + the processes of the runs before it, so each
    repetition stays paired within its run; a pooled scenario row leaves `busy_measured_us` empty."""
    if len(runs) == 1:
        return runs[0]
    offsets = [sum(r.process_count for r in runs[:i]) for i in range(len(runs))]  # each run's first process
    spans = [1 + max((max(ids, default=-1) for ids in (r.repetition_ids or {}).values()), default=-1) for r in runs]
    first_repetition = [sum(spans[:i]) for i in range(len(runs))]  # each run's repetition ids after the runs before
    processes: dict[tuple, tuple[int, ...]] = {}
    repetitions: dict[tuple, tuple[int, ...]] = {}
    samples: dict[tuple, list[np.ndarray]] = {}

    def number(key: tuple, counts: list[int]) -> None:
        processes[key] = _numbered(runs, offsets, key, counts)
        found = [r.block_repetitions(key, n) for r, n in zip(runs, counts, strict=True)]
        if all(f is not None for f in found):  # a re-measured case's baseline has blocks its variants lack
            repetitions[key] = tuple(int(x) + o for f, o in zip(found, first_repetition, strict=True)
                                     for x in (f if f is not None else ()))

    def point(key: tuple) -> dict[str, object]:
        blocks = samples[key] = [b for run in runs for b in run.samples[key]]
        number(key, [len(r.samples[key]) for r in runs])
        return {**row_statistics(blocks), "rounds": sum(b.size for b in blocks), "repetitions": len(blocks)}

    rows = _pooled_frame([r.rows for r in runs], [[row_key(r) for _, r in run.rows.iterrows()] for run in runs],
                            lambda key: all(key in r.samples for r in runs), point)
    scenarios, scenario_samples = _pooled_scenarios(runs, number)
    metas = [meta_of(r) for r in runs]
    meta = dataclasses.replace(
        metas[0], run_id=" + ".join(m.run_id for m in metas), completed=all(m.completed for m in metas),
        end_note="; ".join(f"{m.run_id}: {m.end_note}" for m in metas), repetitions=sum(m.repetitions for m in metas),
        processes=[p for r, o in zip(runs, offsets, strict=True) for p in _processes(r, o)])
    return Run(runs[0].path, rows, samples, meta, scenarios, scenario_samples, processes,
               repetition_ids=repetitions or None)


def _pooled_scenarios(runs: Sequence[Run], number: Callable[[tuple, list[int]], None]
                      ) -> tuple[pd.DataFrame | None, dict[tuple, dict[str, list[np.ndarray]]] | None]:
    """The runs' scenario rows pooled as `pooled` pools the point rows (`number`ing each pooled key's blocks)."""
    if any(r.scenarios is None or r.scenario_samples is None for r in runs):
        return None, None
    found = [r.scenario_samples or {} for r in runs]
    samples: dict[tuple, dict[str, list[np.ndarray]]] = {}

    def scenario(key: tuple) -> dict[str, object]:
        entry = samples[key] = {latency: [b for f in found for b in f[key][latency]] for latency in ("blocked", "ready")}
        number(key, [len(f[key]["blocked"]) for f in found])
        blocked = entry["blocked"]
        return {**quartiles(blocked, "blocked_"), **quartiles(entry["ready"], "ready_"),
                "rounds": sum(b.size for b in blocked), "repetitions": len(blocked), "busy_measured_us": math.nan}

    frames = [r.scenarios for r in runs if r.scenarios is not None]
    keys = [list(zip(f["scenario"], f["variant"], strict=True)) for f in frames]
    return _pooled_frame(frames, keys, lambda key: all(key in f for f in found), scenario), samples
