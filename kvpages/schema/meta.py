"""meta.json: where a run ran (`Environment`), the processes and ranks that timed it, and whether it finished
(`RunMeta`). No torch import; kvpages.schema.reader reads it back, kvpages.schema.writer writes it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpages.core.names import BASELINE
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
    torch_threads: int
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
    pcie_link_loaded: str | None = None
    """The PCIe link as nvidia-smi saw it right after the first timed block (an idle link downshifts)."""
    sm_clock_mhz_loaded: int | None = None
    """The SM clock (nvidia-smi's clocks.sm) at the same moment; each process spins the GPU up before its first
    timed block, so this should read the boosted clock (an H200: 1980 MHz, 345 MHz idle)."""
    hostname: str | None = None
    """The host's name (socket.gethostname()); None in runs written before it was recorded."""


@dataclass(frozen=True)
class ProcessInfo:
    """One process that timed part of a run (samples lines name it by `index`)."""

    index: int
    pid: int
    role: str
    """'worker' (a fresh pytest process started for its share) or 'session' (the pytest session the user ran)."""
    startup_s: float
    """From its start to its first block: the interpreter, torch and pytest imports, collection (workers;
    the session's counts from pytest_configure on)."""
    generate_s: float
    """Building (and validating) its inputs: the rest of what a process start costs."""
    wall_s: float
    blocks: int


@dataclass
class RunMeta:
    """meta.json: what ran, where, how, and whether it finished."""

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
    timing: dict[str, float] = field(default_factory=dict)
    repetitions: int = 1
    order_seed: int = 0
    crosscheck: str = "off"
    processes: list[ProcessInfo] = field(default_factory=list)
    """The processes the repetitions were dealt to, in run order (empty before schema version 3: one process)."""
    breakdown: str = "off"
    """Where the time goes (breakdown.csv): what the profiled pass wrote, or why it wrote nothing."""
    ranks: RanksMeta | None = None
    """A multi-rank run's process group (schema version 4); None: one rank."""
    baseline: str = BASELINE
    """The variant every ratio of the run is against (--kv-baseline); a run written without it: host_stride."""


@dataclass(frozen=True)
class RankInfo:
    """One rank of a multi-rank run (kvpages.measure.ranks): where it ran."""

    rank: int
    local_rank: int
    hostname: str
    pid: int
    device: str
    """The device it converted on: cuda:<local rank>, or cpu."""
    device_name: str


@dataclass(frozen=True)
class RanksMeta:
    """meta.json's `ranks`: the process group of a multi-rank run."""

    world_size: int
    backend: str
    """The backend of the barriers and gathers: gloo, host-side, so no collective kernel runs on a timed device."""
    timeout_s: float
    """How long a rank waits at a barrier or gather for the others before the run stops, naming them."""
    launcher: str
    """How the ranks were started; every repro command of the run starts with it."""
    ranks: tuple[RankInfo, ...]

    @property
    def one_host(self) -> bool:
        return len({r.hostname for r in self.ranks}) == 1
