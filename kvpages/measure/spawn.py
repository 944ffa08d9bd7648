"""Where a sweep's worker processes come from (kvpages.measure.workers): the command that starts them, the session's
start of them before it imports torch and collects (`start_early`). No torch at import: every pytest session loads the
plugin, a sweep or not."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import pytest

from kvpages.core.capacity import host_available_bytes
from kvpages.core.options import BenchOptions, crosscheck_enabled
from kvpages.measure.signals import interrupt
from kvpages.measure.workers import Started, WorkerCommand, wants_spare
from kvpages.measure.worklog import WORKER_FLAG

STARTED_KEY = pytest.StashKey[Started]()
FREE_HOST_KEY = pytest.StashKey["int | None"]()
"""The free host memory the session read before it started its workers early (`start_early`)."""


def worker_command(config: pytest.Config, options: BenchOptions) -> WorkerCommand:
    """How the session starts its workers, their folder made (and removed at the end)."""
    try:  # RAM-backed /dev/shm when it has 2 GiB free: the input pools are written there once, read by every process
        parent = "/dev/shm" if shutil.disk_usage("/dev/shm").free >= 2 << 30 else None
    except OSError:
        parent = None
    folder = Path(tempfile.mkdtemp(prefix="kvpages-workers-", dir=parent))
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    option = config.option
    return WorkerCommand(
        paths=tuple(str(arg).split("[", 1)[0] for arg in config.args),
        kv_args=options.replace(crosscheck="off", results_dir=None, link_profiles=None).to_args(),  # meta: the session
        timed_as=("--benchmark-timer", option.benchmark_timer) + (
            ("--benchmark-disable-gc",) if option.benchmark_disable_gc else ()),
        rootdir=str(config.rootpath), cwd=config.invocation_params.dir, folder=folder,
        json_out=bool(option.benchmark_json or option.benchmark_save or option.benchmark_autosave),
    )


def start_early(config: pytest.Config, options: BenchOptions) -> None:
    """A timed sweep of several processes on one rank, with no cross-check child to run: its workers started now,
    before the session imports torch and collects (kvpages.measure.workers.Started), once; the free host memory read
    first, for the check that refuses a sweep that does not fit (`FREE_HOST_KEY`), and SIGTERM from now on a
    KeyboardInterrupt, so that pytest's end stops them. Where the device is not known to be the CPU without torch (a
    torch that is not a +cpu build, say), they start after the collection as before."""
    o = config.option
    if (STARTED_KEY in config.stash or config.getoption(WORKER_FLAG) is not None or o.collectonly or o.showfixtures
            or o.show_fixtures_per_test or config.getoption("benchmark_disable", False) or options.sweep.processes <= 1
            or "WORLD_SIZE" in os.environ or crosscheck_enabled(options.crosscheck_mode, "cpu")):
        return
    try:
        cpu_build = importlib.metadata.version("torch").endswith("+cpu")
    except importlib.metadata.PackageNotFoundError:
        cpu_build = False
    if not (options.device_choice == "cpu" or (options.device_choice == "auto" and cpu_build)):
        return
    config.stash[FREE_HOST_KEY] = host_available_bytes()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)
    started = Started.of(worker_command(config, options), options.sweep.processes,
                         wants_spare(options.remeasure_fraction, multi_rank=False))  # outside torchrun: one rank
    config.stash[STARTED_KEY] = started
    config.add_cleanup(started.stop)


def benchmark_output(config: pytest.Config) -> bool:
    """Whether pytest-benchmark shows or keeps its statistics of the blocks (its table, JSON, saved runs, ...)."""
    o = config.option
    return not getattr(o, "benchmark_quiet", False) or any(getattr(o, name, None) for name in (
        "benchmark_json", "benchmark_save", "benchmark_autosave", "benchmark_compare", "benchmark_compare_fail",
        "benchmark_histogram", "benchmark_save_data", "benchmark_cprofile", "benchmark_csv"))
