"""Shared fixtures: CUDA-marked tests skip with a reason on machines without CUDA.

torch, numpy and kvpages are imported where they are used, not here: under `pytest -n` the controller, which runs no
test, imports this module before it starts the workers, and importing them took it 1.6 s (on the 2-core dev box)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch

    from kvpages.analysis.ratios import Analysis
    from kvpages.schema.meta import RunMeta

os.environ["PYTEST_ADDOPTS"] = f"{os.environ.get('PYTEST_ADDOPTS', '')} -p no:hypothesispytest".strip()
"""The pytest sessions these tests start as plain subprocesses (gpu_check.sh's sweeps and CUDA tests, torchrun's ranks,
an interrupted sweep) hold no property tests: without hypothesis's plugin each costs about 1.1 s of CPU less (0.7
against 1.8 s for a one-test session on the dev box). pytester removes PYTEST_ADDOPTS: its sessions get the option
from the fixture below; `pytest_configure` adds the rest of the lean flags where tests run."""


XDIST_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # one id per `pytest -n` session, the same in each of its workers
for _name in [n for n in os.environ if n.startswith("PYTEST_XDIST_")]:
    del os.environ[_name]
"""Under `pytest -n` (make test), the sessions these tests start are plain sessions, not xdist workers: with
PYTEST_XDIST_WORKER in their environment, pytest-benchmark would turn --benchmark-only into a usage error."""


def pytest_configure(config: pytest.Config) -> None:
    """In a process that runs tests (not the controller of `pytest -n`, whose workers read PYTEST_ADDOPTS as they
    start), the pytest sessions started from here on run lean, as a sweep's workers do (LEAN_PLUGINS): without
    assertion rewriting, the cache, logging's capture and xdist, a sweep's session took 3.3 s of CPU instead of 3.6 s
    on the dev box (`pytest bench/test_d2h.py` as the tests run it, four runs each, alternating, 2026-12-06). Their
    outcomes and kvpages's own output are the same: bench/ asserts nothing."""
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        os.environ["PYTEST_ADDOPTS"] = " ".join(_lean_addopts(os.environ.get("PYTEST_ADDOPTS", "")))


def _lean_addopts(addopts: str) -> list[str]:
    from kvpages.measure.worklog import LEAN_PLUGINS

    return [*addopts.split(), *LEAN_PLUGINS]


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytester, whose sessions (in this process or in a subprocess) run lean too (`pytest_configure`). hypothesis's
    plugin alone cost each about 1 s of CPU, in this process as in a subprocess (a one-test session in this process
    took about 20 times the CPU with it as without, on the dev box)."""
    monkeypatch.setenv("PYTEST_ADDOPTS", " ".join(_lean_addopts("")))
    return pytester


@pytest.fixture(scope="session", autouse=True)
def pandas_imported() -> None:
    """pandas imported before any test, so that pytester's snapshot of sys.modules holds it. Else a session run in
    this process (`pytester.runpytest`) that imports it first leaves, once pytester drops the modules it imported,
    its compiled parser holding the old StringDtype, and every later `read_csv(dtype=str)` here fails ("the dtype
    str is not supported for parsing": `pytest tests/test_breakdown.py` alone did so)."""
    import pandas  # noqa: F401


@pytest.fixture(scope="session", autouse=True)
def analysis_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The analyses the tests' commands keep (kvpages.analysis.cache) go to a folder of the session's, never to the
    user's cache; the commands the tests start as subprocesses inherit it."""
    from kvpages.schema.store import VARIABLE

    folder = tmp_path_factory.mktemp("analysis-cache")
    os.environ[VARIABLE] = str(folder)
    return folder


@pytest.fixture(scope="session", autouse=True)
def matplotlib_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """matplotlib's cache (its font list) in a folder of the session's, which the processes the tests start inherit:
    pytester gives each test a HOME of its own, under which every process that draws (a sweep's drawing process, a
    `kvpages plot`) built the font list again (0.15 s of CPU on the dev box)."""
    folder = tmp_path_factory.mktemp("matplotlib")
    os.environ["MPLCONFIGDIR"] = str(folder)
    return folder


@pytest.fixture(autouse=True)
def registries_kept() -> Iterator[None]:
    """The variants and step variants a test registers (and the SGLang sources loaded as variants) are dropped after
    it: a pytester session run in this process registers its conftest's (broken_off_by_one, slow_host, ...) in the
    same registries, and a later test on this worker that reads every registered variant (the README's table) saw them
    too, as the order of tests fell. (A fixture runs in the workers only: `pytest -n`'s controller imports no torch.)"""
    from kvpages.measure import sglang, steps, variants

    registries: list[dict] = [variants._REGISTRY, steps._REGISTRY, sglang._LOADED]
    kept = [dict(registry) for registry in registries]
    yield
    for registry, before in zip(registries, kept, strict=True):
        registry.clear()
        registry.update(before)


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    no_cuda = f"needs a CUDA device: torch.cuda.is_available() is False (torch {torch.__version__})"
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason=no_cuda))
        if "rehearsal" in getattr(item, "fixturenames", ()) and XDIST_RUN is not None:
            start_rehearsal(config)
    # The tests marked early first. Under `pytest -n`, the waits of those that mostly wait for a limit to run out (a
    # hung rank or worker) fall beside the rehearsal's CPU work, which starts at collection, and not beside another
    # test's wait (a hung rank's 5 s beside a sleeping variant's re-measurement left both cores of the 2-core dev box
    # idle for 4 s); and what the session shares (`built_once`) is built before the tests that read it are dealt, so
    # that no worker waits for the other to build it. There (2026-12-05, sampled every 0.5 s), a `pytest -n 2` left the
    # cores idle for 17.0-17.7 core-seconds before (three runs) and 6.1-8.7 with every early test first (five runs);
    # with the afternoon's other changes, a fresh clone's `make test` went from 145.4-147.8 s to 139.4-142.9 s
    # (Makefile).
    items.sort(key=lambda item: item.get_closest_marker("early") is None)


def call_variant(v, kv: torch.Tensor, page_size: int):
    """Call a registered variant on a bare 1-D tensor; a variant that declares extra inputs gets them built from a
    one-row pool holding that tensor (what the workload builds for a pool row)."""
    if not v.extras:
        return v(kv, page_size)
    from kvpages.core.scenarios import Call
    from kvpages.measure.inputs import Workload

    pool = Workload(kv.reshape(1, -1), (kv,), (), page_size, ((Call(0, 0, kv.numel()),),))
    return v(kv, page_size, **{name: pool.extra(name)[0].calls[0] for name in v.extras})


def call_on(target, variant: str, workload):
    """Each input set of `workload`, called through `target` with the extras `variant` declares: the outputs."""
    return [target.call_here(variant, inputs) for inputs in target.inputs_for(variant, workload)]


def devices() -> list:
    """cpu, plus cuda (marked, so it skips with a reason where there is none)."""
    return ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


# ----------------------------------------------------------------------------- synthetic runs

import functools  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def reference_runs() -> list[Path]:
    """The reference sweeps committed under results/, oldest first: `make bench`'s (default preset, CPU), not the
    multi-rank runs (steps only) nor the CUDA runs of `make gpu-check` (the quick preset, on a device no test has).
    Committed means tracked by git where this is a checkout: a sweep the user has just run into results/ is not
    the reference the tests read."""

    def made_by_make_bench(meta: Path) -> bool:
        data = json.loads(meta.read_text())
        return data.get("preset") == "default" and data.get("environment", {}).get("device") == "cpu"

    found = [p.parent for p in (REPO / "results").glob("*/meta.json")
             if not (p.parent / "ranks.csv").exists() and made_by_make_bench(p)]
    tracked = subprocess.run(["git", "ls-files", "--", "results/*/meta.json"], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode == 0 and tracked.stdout.strip():
        names = {Path(line).parent.name for line in tracked.stdout.split()}
        found = [p for p in found if p.name in names]
    return sorted(found)


@dataclass(frozen=True)
class Reported:
    """A copy of a run folder, analysed with this code, and that analysis."""

    path: Path
    analysis: Analysis


@pytest.fixture(scope="session")
def reported_reference(tmp_path_factory: pytest.TempPathFactory) -> Reported:
    """A copy of the newest committed sweep, re-analysed from its samples with this code and reported (ratios.csv,
    scenario_ratios.csv, noisy.csv, REPORT.md, APPENDIX.md), once for every test that only reads it; a test that
    changes a run folder copies this one first."""
    from kvpages.analysis.ratios import analyze
    from kvpages.render.report import write_report
    from kvpages.schema.reader import load_run

    if not reference_runs():
        pytest.skip("no run committed under results/")
    run = tmp_path_factory.mktemp("reference") / reference_runs()[-1].name
    shutil.copytree(reference_runs()[-1], run)
    analysis = analyze(load_run(run))
    write_report(analysis)
    return Reported(run, analysis)


FAST = ("--benchmark-only", "--kv-time-budget", "0.001", "-p", "no:cacheprovider", "--kv-processes", "1",
        "--kv-breakdown", "off")
"""A timed sweep in seconds, in one process: what these tests check is one session's own behaviour (the worker
processes have tests of their own, in test_processes.py, which give --kv-processes themselves)."""


def synthetic_run(folder: Path, medians_us: dict[tuple[str, int, int], float], spread: float = 0.01,
                  rounds: int = 50, seed: int = 0, run_id: str | None = None, repetitions: int = 10,
                  rep_spread: float = 0.01, processes: int = 1, process_spread: float = 0.0,
                  shifts: tuple[float, ...] = (), own_shifts: dict[str, tuple[float, ...]] | None = None,
                  own_spread: dict[str, float] | None = None, environment: dict[str, object] | None = None) -> Path:
    """A run folder whose (variant, seq_len, page_size) rows have `repetitions` blocks of samples around the
    given medians: repetition r comes from process r % processes, each process shifts each row's level by
    `process_spread`, and by `shifts[process]` (a factor every variant shares: the box moves them together) and
    `own_shifts[variant][process]` (that variant's alone); each block's level varies by `rep_spread` (a variant's
    own: `own_spread`) around that, its rounds by `spread` around it. `environment`: meta.json's environment fields
    that differ from the synthetic machine's.

    For testing the analysis only; it never goes into results/.
    """
    import numpy as np

    from kvpages.core.stats import row_statistics
    from kvpages.schema.meta import Environment, ProcessInfo, RunMeta, RunTiming
    from kvpages.schema.rows import POINTS, Row, SampleSet
    from kvpages.schema.writer import RunWriter

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    env = Environment("0", "3", "t", "n", "b", "p", "cpu-model", 2, 2, "cpu", "test-cpu", None, None, None,
                      None, None, False, "CPU run: no PCIe link was crossed.")
    env = dataclasses.replace(env, **(environment or {}))
    infos = [ProcessInfo(p, 1000 + p, "worker" if p < processes - 1 else "session", 2.0, 1.0, 10.0, 0)
             for p in range(processes)] if processes > 1 else []
    writer = RunWriter(folder, RunMeta(run_id or folder.name, "test", {}, "pytest bench/", "t0", env,
                                       repetitions=repetitions, processes=infos))
    order = 0
    for (variant, seq_len, page_size), median in medians_us.items():
        blocks = []
        moved = np.exp(process_spread * rng.standard_normal(processes)) * np.array(shifts or [1.0] * processes)
        moved = moved * np.array((own_shifts or {}).get(variant, [1.0] * processes))
        noise = (own_spread or {}).get(variant, rep_spread)
        for r in range(repetitions):
            level = median * moved[r % processes] * np.exp(noise * rng.standard_normal())
            blocks.append(SampleSet(variant, "int32", "fragmented", seq_len, page_size, r, order, r % processes,
                                    tuple(level * (1 + spread * rng.standard_normal(rounds)))))
            order += 1
        stats = row_statistics([np.asarray(b.samples_us) for b in blocks])
        itemsize_bytes = (seq_len if variant == "host_stride" else -(-seq_len // page_size)) * 4
        row = Row(variant, "cpu", "test-cpu", "int32", "fragmented", seq_len, page_size, -(-seq_len // page_size),
                  2, itemsize_bytes, itemsize_bytes, 1, 1, "none (cpu)", stats["median_us"], stats["iqr_us"],
                  stats["q1_us"], stats["q3_us"], stats["min_us"], stats["max_us"], stats["mean_us"],
                  stats["stddev_us"], rounds * repetitions, 1, repetitions, stats["rep_spread"], "ok", "",
                  "pytest bench/")
        writer.add_samples(POINTS, blocks)
        writer.add_rows(POINTS, [row])
    writer.finish(True, "all rows recorded", RunTiming(10.0 * processes))
    return folder


def assert_phases_add_up(meta: RunMeta) -> None:
    """meta.json's phases of a real sweep: none negative, each process's adding up to its wall (they are measured
    apart, so this holds only if none is counted twice), and the processes' and the cross-check's to the session's;
    and some of it timed."""
    from kvpages.schema.meta import PHASES

    timing = meta.timing
    assert timing is not None and meta.processes
    for p in meta.processes:
        phases = [getattr(p, name) for name in PHASES]
        assert all(s is not None and s >= 0 for s in phases), p
        assert sum(phases) == pytest.approx(p.wall_s, abs=1e-6)
    sums = [getattr(timing, name) for name in PHASES]
    assert sum(sums) + timing.crosscheck_s == pytest.approx(timing.wall_s, abs=1e-6) and timing.timed_s > 0
    assert sum(p.wall_s for p in meta.processes) - timing.startup_overlap_s <= timing.wall_s <= timing.measured_s


def built_once(config: pytest.Config, name: str, build: Callable[[Path], None]) -> Path:
    """A folder `build(folder)` fills once per session: under `pytest -n`, by the first worker to ask, while the others
    wait for it (up to 300 s) and read it too (a module's tests are dealt to both workers, and each would build the
    module's fixtures again); the tests that read it change nothing in it. One test of each is marked early, so that it
    is built before the others are dealt."""
    factory = config._tmp_path_factory  # type: ignore[attr-defined]
    if XDIST_RUN is None:
        folder = factory.mktemp(name)
        build(folder)
        return folder
    shared = factory.getbasetemp().parent / f"{name}-{XDIST_RUN}"  # the workers' common root, as the rehearsal's
    shared.mkdir(exist_ok=True)
    try:
        os.close(os.open(shared / "started", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        deadline = time.monotonic() + 300
        while not (shared / "done").exists():
            if (shared / "failed").exists() or time.monotonic() > deadline:
                pytest.fail(f"{name}: the worker building it failed or took over 300 s ({shared})")
            time.sleep(0.1)
        return shared / "built"
    try:
        (shared / "built").mkdir()
        build(shared / "built")
    except BaseException:
        (shared / "failed").touch()
        raise
    (shared / "done").touch()
    return shared / "built"


def kvpages_here(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`kvpages ARGS` run in this process (kvpages.cli.main, as `python -m kvpages` runs it but keeping the collector),
    in `cwd`, its exit status, stdout and stderr kept as a subprocess gives them: for the tests of what a command does
    and says, not of starting one (a fresh interpreter costs about 0.5 s of CPU; the tests of a command without torch
    start one)."""
    import contextlib
    import io

    from kvpages.cli import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    before = Path.cwd()
    try:
        os.chdir(cwd or REPO)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(["kvpages", *argv], code, out.getvalue(), err.getvalue())


# ----------------------------------------------------------------------------- bench/gpu_check.sh

SCRIPT = REPO / "bench" / "gpu_check.sh"
GPU_CHECK_RUN = "KVPAGES_GPU_CHECK_RUN"
"""Set by bench/gpu_check.sh's CUDA tests to the absolute path of its cross-checked quick sweep's run folder (its step
4), which tests/test_gpu_path.py's complete-run test checks instead of sweeping again."""
REHEARSAL = ("--device", "cpu", "--kv-time-budget", "0.002")
"""A CPU rehearsal of the script's steps, each sweep timing its points and scenarios briefly."""


def script_env(**extra: str) -> dict[str, str]:
    """The test's python, and no CUDA device visible to the script's steps."""
    return {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", **extra}


def gpu_check(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], env=env or script_env(), cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def shadow(folder: Path, *modules: str) -> dict[str, str]:
    """An environment in which importing `modules` fails as if they were not installed."""
    for name in modules:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f'raise ModuleNotFoundError("No module named {name!r}", name={name!r})\n')
    return {**script_env(), "PYTHONPATH": f"{folder}{os.pathsep}{REPO}"}


@dataclass(frozen=True)
class Rehearsal:
    """What a CPU rehearsal of gpu_check.sh with --archive left: its output, archive and run folders."""

    done: subprocess.CompletedProcess
    archive: Path
    results: Path


@pytest.fixture(scope="session")
def rehearsal(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Rehearsal:
    """bench/gpu_check.sh's CPU rehearsal of every step, once for the session, where hypothesis cannot be imported
    (as on a GPU box that has only what gpu_check.sh asks for). test_gpu_check.py checks its steps; its two sweeps
    (cross-check off, then on in 2 processes) are the two real quick runs test_compare.py compares."""
    if XDIST_RUN is None:
        return _rehearse(tmp_path_factory.mktemp("rehearsal"))
    folder = start_rehearsal(request.config)  # under `pytest -n`: started at collection, in the background, once
    deadline = time.monotonic() + 300
    while not (folder / "rc").exists():
        if time.monotonic() > deadline:
            pytest.fail(f"gpu_check.sh's rehearsal did not finish within 300 s ({folder})")
        time.sleep(0.2)
    done = subprocess.CompletedProcess(["bash", str(SCRIPT)], int((folder / "rc").read_text()),
                                       (folder / "out").read_text(), (folder / "err").read_text())
    return Rehearsal(done, folder / "archive", folder / "results")


def start_rehearsal(config: pytest.Config) -> Path:
    """Under `pytest -n`: the rehearsal started in the background by the first worker to get here (the others find it
    started), so that it runs once, beside the tests that do not need it (pytest 9 drops the xdist_group suffix that
    --dist loadgroup relied on to keep its users on one worker); its folder, where it leaves out, err and rc."""
    shared = config._tmp_path_factory.getbasetemp().parent  # type: ignore[attr-defined]  # the workers' common root
    folder = shared / f"rehearsal-{XDIST_RUN}"  # (pytest keeps the last few roots and removes older ones)
    folder.mkdir(exist_ok=True)
    try:
        os.close(os.open(folder / "started", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return folder
    argv = ["timeout", "300", "bash", str(SCRIPT), "--archive", str(folder / "archive"), *REHEARSAL, "--kv-results",
            str(folder / "results")]
    subprocess.Popen(["bash", "-c", '"$@" > out 2> err; echo $? > rc.tmp; mv rc.tmp rc', "rehearse", *argv],
                     cwd=folder, env=shadow(folder / "shadow", "hypothesis"), start_new_session=True)
    return folder


def _rehearse(tmp: Path) -> Rehearsal:
    archive, results = tmp / "archive", tmp / "results"
    done = gpu_check("--archive", str(archive), *REHEARSAL, "--kv-results", str(results),
                     env=shadow(tmp / "shadow", "hypothesis"), timeout=300)
    return Rehearsal(done, archive, results)
