"""meta.json: where a run ran (`Environment`), the processes and ranks that timed it, and whether it finished (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpages.core.links import LinkProfile
from kvpages.core.names import BASELINE
from kvpages.core.stability import DEFAULT_FACTOR
from kvpages.schema.rows import SCHEMA_VERSION


@dataclass(frozen=True)
class Environment:
    """Where a run ran. Fields that do not apply (no CUDA) are None."""

    kvpages_version: str
    python_version: str
    torch_version: str
    numpy_version: str
    pytest_benchmark_version: str
    platform: str
    cpu_model: str
    cpu_count: int
    torch_threads: int  # of each timed process (--kv-threads) since cpu_affinity is recorded; before, torch's default
    device: str
    device_name: str
    cuda_version: str | None
    driver_version: str | None
    pcie_link: str | None
    git_commit: str | None
    git_dirty: bool | None
    link_crossed: bool
    link_note: str
    gpu_uuid: str | None = None
    pcie_link_loaded: str | None = None  # nvidia-smi's, right after the first timed block (an idle link downshifts)
    sm_clock_mhz_loaded: int | None = None  # clocks.sm at the same moment (boosted: each process spins the GPU up)
    hostname: str | None = None  # socket.gethostname(); None in runs written before it was recorded
    cpu_affinity: str | None = None  # where each process timed: '1 (auto: one core, not core 0)'; None: not recorded
    code_tree: str | None = None
    """The git tree ids of kvpages/ and bench/ as they were on disk ('kvpages:<id> bench:<id>'), dirty tree or not:
    `git rev-parse <commit>:kvpages` of the commit with the same code gives the same id (docs/guide.md)."""
    cpu_id: str | None = None
    """What tells CPUs of one `cpu_model` apart: vendor, family, model, stepping, microcode, L3 ('vendor AuthenticAMD
    family 25 model 1 stepping 1 microcode 0x1000065, L3 32768K'); None: not recorded (runs before it) or not found."""
    boot_id: str | None = None  # Linux's id of the boot the run ran in: runs with one ran in one boot of one machine


REMEASURE = "remeasure"
"""ProcessInfo.role of a re-measurement round's process (its repetitions come after the planned ones)."""


@dataclass(frozen=True)
class ProcessInfo:
    """One process that timed part of a run (samples lines name it by `index`), and where its wall time went: its
    phases, in the order they come, add up to `wall_s` (None: a run from before they were recorded)."""

    index: int
    pid: int
    role: str  # 'worker' (a fresh pytest process started for its share), 'session' (the pytest session the user ran) or
    # REMEASURE (a re-measurement round's process: kvpages.measure.remeasure)
    startup_s: float  # until its first block: imports, collection (the session's: less the cross-check and the workers meanwhile)
    inputs_s: float  # building, loading and validating its inputs
    wall_s: float  # the session's: less the workers it ran one after another
    blocks: int
    checks_s: float | None = None  # checking and metering each case, in its first block here
    warmup_s: float | None = None  # the untimed calls before each block's timed rounds
    timed_s: float | None = None  # the sum of its blocks' samples
    untimed_s: float | None = None
    """The rest of its blocks: pytest's protocol of each test, pytest-benchmark's set-up of each round, recording."""
    end_s: float | None = None  # after its last block, until it (the session's: its sweep) ended


PHASES = ("startup_s", "inputs_s", "checks_s", "warmup_s", "timed_s", "untimed_s", "end_s")  # ProcessInfo's, in order


@dataclass(frozen=True)
class RunTiming:
    """meta.json's `timing`: the session's wall time and where it went, each phase summed over the processes (which
    ran one after another, so their phases and the session's own add up to its wall)."""

    wall_s: float  # from the session's start to the end of its sweep, before the breakdown and the analysis
    startup_s: float | None = None
    inputs_s: float | None = None
    checks_s: float | None = None
    warmup_s: float | None = None
    timed_s: float | None = None  # the sum of every sample of samples.csv and scenario_samples.csv
    untimed_s: float | None = None
    end_s: float | None = None
    crosscheck_s: float = 0.0  # the profiler cross-check, in a process of its own, before the first block
    breakdown_s: float | None = None  # breakdown.csv, after the sweep, in a process of its own
    probe_s: float | None = None  # bandwidth.csv, after the sweep, in the session's process (CUDA runs)
    startup_overlap_s: float = 0.0  # the workers start together: how much of their start-ups overlapped
    analysis_s: float | None = None  # the summary, charts and report (None: not run, or not finished yet)

    @classmethod
    def of(cls, wall_s: float, processes: list[ProcessInfo], crosscheck_s: float, overlap_s: float = 0.0
           ) -> RunTiming:
        sums = {name: sum(getattr(p, name) or 0.0 for p in processes) for name in PHASES}
        sums["startup_s"] -= overlap_s
        return cls(wall_s, crosscheck_s=crosscheck_s, startup_overlap_s=overlap_s, **sums)

    @property
    def measured_s(self) -> float:
        """What measuring the run took: its breakdown, not its analysis (so a report re-made later says the same)."""
        return self.wall_s + (self.breakdown_s or 0.0) + (self.probe_s or 0.0)

    @classmethod
    def from_json(cls, data: dict[str, float]) -> RunTiming:
        """meta.json's `timing`; a run from before the phases were recorded has only the session's wall."""
        if "wall_s" not in data:
            return cls(data["session_s"], crosscheck_s=data.get("crosscheck_s", 0.0),
                       breakdown_s=data.get("breakdown_s"))
        return cls(**data)


@dataclass(frozen=True)
class Remeasurement:
    """meta.json's `remeasure`: what the re-measurement of disturbed pairs did (kvpages.measure.remeasure). Targets
    (a point, `s8192-p64-int32-fragmented`, or a whole request or step) are named by their id; each round is one fresh
    process after the planned ones, timing one more repetition of the worst targets that fit what is left of the
    budget, each the baseline and the variants disturbed there, interleaved as in the plan."""

    budget_fraction: float  # --kv-remeasure-budget
    budget_s: float  # that fraction of the sweep's planned timed seconds (0: off)
    planned_processes: int  # the processes the plan dealt repetitions to; the rounds' come after them
    note: str  # what it did, or why it did nothing, in words
    remeasured: tuple[str, ...] = ()  # targets a round timed again (a run before 2026-12-05: those found unstable)
    rounds: int = 0  # extra processes
    extra_repetitions: int = 0  # extra repetitions of a target
    extra_blocks: int = 0
    spent_s: float = 0.0  # the rounds' processes' wall, start-up included (a spare's before its round: not)
    timed_s: float = 0.0  # of which timed rounds
    unstable: tuple[str, ...] = ()  # targets with a pair still disturbed at the end (a run before 2026-12-05: unstable)
    stable_spread: float | None = None  # the old rule's --kv-stable-spread (a run before 2026-12-05); None since
    disturb_factor: float = DEFAULT_FACTOR  # --kv-disturb-factor (kvpages.core.stability)
    found: tuple[str, ...] = ()  # targets with a disturbed pair after the planned repetitions
    spare: bool = False  # the first round ran in the spare started beside the planned workers (no start of its own)

    @classmethod
    def from_json(cls, data: dict) -> Remeasurement:
        return cls(**{**data, **{k: tuple(data.get(k, ())) for k in ("remeasured", "unstable", "found")}})


@dataclass
class RunMeta:
    run_id: str
    preset: str
    options: dict[str, str]
    command: str
    started_utc: str
    environment: Environment
    finished_utc: str | None = None
    completed: bool = False
    end_note: str = "running (or killed before it could finish)"
    schema_version: int = SCHEMA_VERSION
    timing: RunTiming | None = None  # None: still running, or killed
    repetitions: int = 1
    order_seed: int = 0
    crosscheck: str = "off"
    processes: list[ProcessInfo] = field(default_factory=list)  # the processes the repetitions were dealt to
    breakdown: str = "off"  # breakdown.csv: what the profiled pass wrote, or why it wrote nothing
    bandwidth_probe: str = "off"  # bandwidth.csv: what the probe wrote, or why it wrote nothing
    ranks: RanksMeta | None = None  # a multi-rank run's process group; None: one rank
    baseline: str = BASELINE  # the variant every ratio of the run is against (--kv-baseline)
    link_profiles: list[LinkProfile] = field(default_factory=list)
    """A user's link profiles the predictions add (--kv-link-profile, `kvpages report --link-profile`): each with
    its terms, the file's path (`origin`) and SHA-256."""
    remeasure: Remeasurement | None = None  # None: a run from before re-measurement was recorded

    def efficiency_text(self) -> str:
        """How much of the session's wall time was timed, in one line (the report's method and `kvpages noise`)."""
        timing = self.timing
        if timing is None:
            return "timed seconds unknown: the run did not finish (interrupted or killed)"
        if timing.timed_s is None:
            return f"timed seconds not recorded (a run from before they were), of {timing.measured_s:.1f} s"
        until = "its sweep" if timing.breakdown_s is None else "its breakdown"
        return (f"timed {timing.timed_s:.1f} s of {timing.measured_s:.1f} s ({timing.timed_s / timing.measured_s:.0%}), "
                f"the session's wall from its start to the end of {until}")


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    hostname: str
    pid: int
    device: str  # the device it converted on: cuda:<local rank>, or cpu
    device_name: str


@dataclass(frozen=True)
class RanksMeta:
    world_size: int
    backend: str  # of the barriers and gathers: gloo, host-side, so no collective kernel runs on a timed device
    timeout_s: float  # how long a rank waits at a barrier or gather for the others before the run stops
    launcher: str  # how the ranks were started; every repro command of the run starts with it
    ranks: tuple[RankInfo, ...]

    @property
    def one_host(self) -> bool:
        return len({r.hostname for r in self.ranks}) == 1
