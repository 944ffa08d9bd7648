"""The ranks of a multi-rank run (torchrun): where this process stands among them, and their gloo process group.

gloo runs on the host, so no barrier or gather puts a kernel on a timed device. Every collective is bounded by
--kv-rank-timeout, and a gather starts with gloo's monitored barrier, which names the ranks that did not arrive.
"""

from __future__ import annotations

import datetime
import mmap
import os
import re
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from kvpages.core.options import DEFAULT_RANK_TIMEOUT_S, BenchOptions
from kvpages.measure.variants import device_of
from kvpages.schema.meta import RankInfo, RanksMeta

BACKEND = "gloo"
LAUNCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")  # what torchrun sets for every rank it starts


@dataclass(frozen=True)
class Launch:
    """This process's place among the ranks torchrun started."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Launch | None:
        """The launch torchrun describes in `env`; None outside torchrun, or for a world of one rank."""
        if "WORLD_SIZE" not in env or "RANK" not in env:
            return None
        values = {}
        for name in LAUNCH_ENV:
            text = env.get(name, "1" if name == "LOCAL_WORLD_SIZE" else env.get("RANK", "0"))
            try:
                values[name.lower()] = int(text)
            except ValueError:
                raise ValueError(f"{name}={text!r} is not an integer; kvpages reads torchrun's {', '.join(LAUNCH_ENV)}") \
                    from None
        launch = cls(**values)
        return launch if launch.world_size > 1 else None

    @property
    def command(self) -> tuple[str, ...]:
        """How to start these ranks again: what every repro command of the run starts with."""
        nodes = self.world_size // max(self.local_world_size, 1)
        return ("torchrun", "--nproc-per-node", str(self.local_world_size)) + (
            ("--nnodes", str(nodes)) if nodes > 1 else ()) + ("-m", "pytest")


def ranked_options(options: BenchOptions, launch: Launch) -> BenchOptions:
    """The options of a rank: one process per rank (no worker processes), no cross-check and no breakdown (both are
    single-process passes); a usage error (ValueError) when the options ask for any of them, or for no steps."""
    asked = {"--kv-processes": options.processes not in (None, 1), "--kv-crosscheck on": options.crosscheck == "on",
             "--kv-breakdown on": options.breakdown == "on"}
    for flag, bad in asked.items():
        if bad:
            raise ValueError(f"{flag}: a multi-rank run (torchrun, WORLD_SIZE={launch.world_size}) times one process per "
                             "rank, with no worker processes, cross-check or breakdown; leave it out")
    if not any(s.kind == "step" for s in options.scenario_set):
        raise ValueError(f"a multi-rank run (torchrun, WORLD_SIZE={launch.world_size}) times the step scenarios, and "
                         "these options have none; "
                         + ("leave out --kv-scenarios none" if options.scenarios == "none" else
                            "use a preset with steps (e.g. --kv-preset ranks) or --kv-step-sizes"))
    return options.replace(processes=1, crosscheck="off", breakdown="off")


def check_devices(launch: Launch, device_choice: str) -> None:
    if device_of(device_choice) == "cuda" and launch.local_world_size > torch.cuda.device_count():
        raise ValueError(f"torchrun --nproc-per-node {launch.local_world_size}: this host has "
                         f"{torch.cuda.device_count()} CUDA device(s), one per rank is needed; start at most that many "
                         "ranks, or give --kv-device cpu")


class RankFailure(Exception):
    """A rank raised, or a barrier or gather did not complete in time: the run stops (the message names the rank)."""


MONITORED = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")


class Group:
    """The ranks of one run: barriers, agreement and gathers over gloo, each bounded by the run's timeout."""

    def __init__(self, launch: Launch, device: str, timeout_s: float | None) -> None:
        self.rank, self.size = launch.rank, launch.world_size
        self.timeout = datetime.timedelta(seconds=timeout_s or DEFAULT_RANK_TIMEOUT_S)
        self.failure: str | None = None
        if device == "cuda":
            torch.cuda.set_device(launch.local_rank)  # before anything touches the device: "cuda" is this rank's
        dist.init_process_group(BACKEND, rank=self.rank, world_size=self.size, timeout=self.timeout)
        signal.signal(signal.SIGTERM, _interrupt)  # torchrun stops the ranks with SIGTERM when one fails
        here = RankInfo(self.rank, launch.local_rank, socket.gethostname(), os.getpid(),
                        f"cuda:{torch.cuda.current_device()}" if device == "cuda" else "cpu",
                        torch.cuda.get_device_name() if device == "cuda" else "cpu")
        ranks = tuple(sorted(self.gather("joining the ranks", here), key=lambda r: r.rank))
        self.meta = RanksMeta(self.size, BACKEND, self.timeout.total_seconds(), " ".join(launch.command), ranks)
        self.spin = HostBarrier.shared(self) if self.meta.one_host else None

    def who(self, rank: int) -> str:
        return f"rank {rank} of {self.size}"

    def _collective(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except RuntimeError as exc:  # gloo's timeouts and lost peers
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            missing = MONITORED.search(detail)
            if missing:
                detail = (f"rank(s) {missing.group(1)} did not arrive within {self.timeout.total_seconds():g} s "
                          "(hung, or stopped: see their output above)")
            raise RankFailure(f"{self.who(self.rank)}: {what}: {detail}") from None

    def gather(self, what: str, mine: Any) -> list[Any]:
        """Every rank's `mine`, by rank; first a monitored barrier, so a rank that never comes is named."""
        self._collective(what, lambda: dist.monitored_barrier(timeout=self.timeout, wait_all_ranks=True))
        out: list[Any] = [None] * self.size
        self._collective(what, lambda: dist.all_gather_object(out, mine))
        return out

    def start_together(self, what: str) -> None:
        """The start of a timed round. gloo's barrier releases the ranks over TCP, up to milliseconds apart, so the
        ranks of one host meet at a `HostBarrier` instead."""
        if self.spin is None:
            self._collective(what, dist.barrier)
            return
        late = self.spin.wait(self.timeout.total_seconds())
        if late:
            raise RankFailure(f"{self.who(self.rank)}: {what}: rank(s) {', '.join(map(str, late))} did not arrive "
                              f"within {self.timeout.total_seconds():g} s (hung, or stopped: see their output above)")

    def agree(self, what: str, problem: tuple[str, str, bool] | None) -> tuple[str, str, bool] | None:
        """The first rank's problem (status, note, fail) for every rank, its note naming the rank unless every rank
        had the same problem; None when no rank had one."""
        found = self.gather(what, problem)
        for rank, first in enumerate(found):
            if first is not None:
                status, note, fail = first
                return status, note if all(f == first for f in found) else f"{self.who(rank)}: {note}", fail
        return None

    def agree_rounds(self, what: str, rounds: int, cycle: int) -> int:
        """The rounds every rank times: the fewest any rank's warm-up asked for, in whole cycles, at least one."""
        fewest = min(self.gather(what, rounds))
        return max(cycle, fewest - fewest % cycle)

    def stop(self, what: str) -> None:
        """This rank cannot go on: say why, naming it, and end its session (torchrun then stops the others)."""
        import pytest

        self.failure = what if what.startswith("rank ") else f"{self.who(self.rank)}: {what}"
        pytest.exit(f"kvpages: {self.failure}; the run stops (rank 0 keeps its finished rows)",
                    returncode=pytest.ExitCode.INTERNAL_ERROR)

    def close(self) -> None:
        """After the session: torchrun may stop this rank any moment now (another rank failed); let it, quietly."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if self.failure is None and dist.is_initialized():
            dist.destroy_process_group()


class HostBarrier:
    """A spin barrier in shared memory for the ranks of one host: each rank writes the generation it has reached
    into its own 8-byte slot and spins until every slot holds it (no lock needed: a rank writes only its own slot,
    and generations only grow). The last to arrive releases the others within microseconds."""

    def __init__(self, path: str, size: int, rank: int) -> None:
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), size * 8)
        self._slots = memoryview(self._map).cast("q")
        self.size, self.rank, self.generation = size, rank, 0

    @classmethod
    def shared(cls, group: Group) -> HostBarrier:
        """Rank 0 creates the barrier's file (in /dev/shm where there is one), every rank maps it, rank 0 unlinks it."""
        path = ""
        if group.rank == 0:
            fd, path = tempfile.mkstemp(prefix="kvpages-ranks-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
            os.write(fd, bytes(8 * group.size))
            os.close(fd)
        path = group.gather("sharing the start barrier", path)[0]
        barrier = cls(path, group.size, group.rank)
        group.gather("mapping the start barrier", None)
        if group.rank == 0:
            os.unlink(path)
        return barrier

    def wait(self, timeout_s: float) -> list[int]:
        """Arrive and spin until every rank has; the ranks that had not arrived after `timeout_s` (else [])."""
        self.generation += 1
        self._slots[self.rank] = self.generation
        give_up = time.perf_counter() + timeout_s
        while min(self._slots) < self.generation:
            os.sched_yield()  # a thread that needs this core (gloo's, the kernel's) runs now, not at the release
            if time.perf_counter() > give_up:
                return [r for r in range(self.size) if self._slots[r] < self.generation]
        return []


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}: torchrun stopped this rank (another rank failed)")
