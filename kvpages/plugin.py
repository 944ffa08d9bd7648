"""The pytest plugin (a `pytest11` entry point): `--kv-*` options, the generated benchmarks and the run folder.

`kv_case` (bench/test_d2h.py) and `kv_scenario` (bench/test_steps.py) are parametrized from the schedule of blocks,
so a new variant is benchmarked without touching bench/.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kvpages.core.affinity import CPU_CHOICES, chosen
from kvpages.core.capacity import check_fits, host_available_bytes
from kvpages.core.options import OPTIONS, BenchOptions
from kvpages.measure.spawn import FREE_HOST_KEY, STARTED_KEY, benchmark_output, start_early, worker_command
from kvpages.measure.worklog import (  # torch-free: every pytest session loads this plugin, a sweep or not
    WORKER_DIR_FLAG,
    WORKER_FLAG,
    WORKER_GO_FLAG,
    WORKER_SPARE_FLAG,
    WorkerLog,
    collector_paused,
    collector_resumed,
    exit_at_once,
    exit_without_collecting,
    process_started_at,
    round_path,
)

if TYPE_CHECKING:
    from kvpages.measure.group import Launch
    from kvpages.measure.session import KvSession

OPTIONS_KEY = pytest.StashKey[BenchOptions]()
SESSION_KEY = pytest.StashKey["KvSession"]()
START_KEY = pytest.StashKey[float]()
LAUNCH_KEY = pytest.StashKey["Launch"]()
FINISHED_KEY = pytest.StashKey[pytest.Session]()
SPARE_KEY = pytest.StashKey[WorkerLog]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvpages", "kvpages D2H sweep (benchmarks in bench/)")
    for option in OPTIONS:
        group.addoption(option.flag, default=None, help=option.help)
    group.addoption("--kv-analyze", action="store_true", default=False,
                    help="after the run, write its charts and REPORT.md into the run folder")
    group.addoption(WORKER_FLAG, type=int, default=None, metavar="K",
                    help="internal: time only process K's share and log it (the session starts its workers)")
    group.addoption(WORKER_DIR_FLAG, default=None, metavar="DIR", help="internal: where a worker logs its blocks")
    group.addoption(WORKER_GO_FLAG, type=int, default=None, metavar="FD",
                    help="internal: the pipe a worker waits on for its turn")
    group.addoption(WORKER_SPARE_FLAG, action="store_true", default=False,
                    help="internal: a spare worker, which waits for its re-measurement round before it collects")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[START_KEY] = process_started_at()
    try:
        options = BenchOptions.parse(config.getoption)
    except (ValueError, TypeError) as exc:
        raise pytest.UsageError(str(exc)) from None
    for path in options.link_profiles or ():  # each read and checked now; the session records them in meta.json
        from kvpages.schema.profiles import read_profile

        try:
            read_profile(path)
        except ValueError as exc:
            raise pytest.UsageError(f"--kv-link-profile: {exc}") from None
    if options.sglang:  # SGLang's own functions become variants before any name is checked
        collector_paused()  # torch is imported here: paused until collected, as pytest_generate_tests pauses it
        from kvpages.measure.sglang import register_specs

        try:
            register_specs(options.sglang)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    if options.variants or options.baseline or options.step_variants:  # each name registered, or the valid ones listed
        collector_paused()  # (torch imported here too; so below)
        from kvpages.measure.steps import get_step_variant
        from kvpages.measure.variants import check_runnable, get_variant

        for flag, names, lookup in (("--kv-variants", options.variants or (), get_variant),
                                    ("--kv-baseline", (options.baseline,) if options.baseline else (), get_variant),
                                    ("--kv-step-variants", options.step_variants or (), get_step_variant)):
            for name in names:
                try:
                    lookup(name)
                except ValueError as exc:
                    raise pytest.UsageError(f"{flag}: {exc}") from None
        try:  # a run of points alone must time some variant on its device
            check_runnable(options.variants if options.scenarios == "none" else None, options.device_choice)
        except ValueError as exc:
            raise pytest.UsageError(f"--kv-variants: {exc}") from None
    if options.cpus not in (None, *CPU_CHOICES):
        try:
            chosen(options.cpus, os.sched_getaffinity(0))
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    if options.device == "cuda":
        collector_paused()
        import torch  # only when a CUDA device is asked for

        if not torch.cuda.is_available():
            raise pytest.UsageError(f"--kv-device: 'cuda' is not available here (torch {torch.__version__}, "
                                    f"CUDA build: {torch.version.cuda}); valid here: auto, cpu")
    if "WORLD_SIZE" in os.environ:  # started by torchrun: one pytest session per rank (kvpages.measure.ranks)
        options = _ranked(config, options)
    worker, worker_dir = config.getoption(WORKER_FLAG), config.getoption(WORKER_DIR_FLAG)
    if config.getoption(WORKER_SPARE_FLAG) and worker is not None and worker_dir is not None:
        _wait_as_spare(config, options, worker, Path(worker_dir))
    a_round = worker is not None and worker_dir is not None and round_path(Path(worker_dir), worker).exists()
    if worker is not None and not a_round and (worker_dir is None or not 0 <= worker < options.sweep.processes - 1):
        raise pytest.UsageError(f"{WORKER_FLAG} {worker}: internal option; the session starts processes "
                                f"0..{options.sweep.processes - 2} itself, each with {WORKER_DIR_FLAG}")
    config.stash[OPTIONS_KEY] = options


def _wait_as_spare(config: pytest.Config, options: BenchOptions, worker: int, folder: Path) -> None:
    """A spare worker (kvpages.measure.workers): import what timing needs (and start CUDA, where asked for), say it is
    ready, and wait for its round before collecting, for its blocks are that round's; exit quietly if none comes."""
    collector_paused()
    import torch

    import kvpages.measure.session  # noqa: F401 (the measuring side's imports, before the wait)
    from kvpages.measure.worklog import log_path

    if options.device_choice != "cpu" and torch.cuda.is_available():
        torch.empty(1, device="cuda")  # its CUDA context, started while it waits as the planned workers' are
    log = WorkerLog(log_path(folder, worker), config.getoption(WORKER_GO_FLAG))
    if not log.wait_for_turn():
        pytest.exit("kvpages: spare worker not needed", pytest.ExitCode.OK)
    config.stash[SPARE_KEY] = log


def _ranked(config: pytest.Config, options: BenchOptions) -> BenchOptions:
    """The options of one rank of a multi-rank run, its launch stashed; unchanged outside one (a world of one rank)."""
    collector_paused()
    from kvpages.measure.group import Launch, check_devices, ranked_options

    try:
        launch = Launch.from_env(os.environ)
        if launch is None:
            return options
        check_devices(launch, options.device_choice)
        options = ranked_options(options, launch)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[LAUNCH_KEY] = launch
    if launch.rank != 0:  # rank 0 writes the run folder and pytest-benchmark's files; the others would overwrite them
        config.option.benchmark_json = config.option.benchmark_save = None
        config.option.benchmark_autosave = False
    return options


def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse a sweep that will not fit in memory, before anything runs, then start the kvpages session (its
    cross-check, its run folder); only when a kvpages benchmark was collected (a plain test session estimates nothing)."""
    config = session.config
    if SESSION_KEY not in config.stash:
        return
    kv = config.stash[SESSION_KEY]
    if config.getoption(WORKER_FLAG) is None:  # a worker's sweep was checked by its session, before any worker ran
        free: dict[str, int | None] = {  # (a round's session holds its own memory); before any worker started
            "host": config.stash[FREE_HOST_KEY] if FREE_HOST_KEY in config.stash else host_available_bytes()}
        if kv.device == "cuda":
            import torch

            free["cuda"] = torch.cuda.mem_get_info()[0]
        try:
            check_fits(kv.options.sweep, kv.device, free)
        except ValueError as exc:
            raise pytest.UsageError(f"--kv-seq-lens: {exc}") from None
    if not config.option.collectonly:
        kv.start([b for item in session.items if (b := _block_of(item)) is not None])


@pytest.hookimpl(specname="pytest_collection_finish", wrapper=True)  # pytest takes only pytest_* names
def pytest_collection_finish_resumed(session: pytest.Session):  # the cyclic collector as it was once collected
    result = yield  # (where it raises, pytest_unconfigure resumes it)
    collector_resumed()
    return result


def kv_session(config: pytest.Config) -> KvSession:
    """The session's `KvSession`, created (and torch imported) on first use."""
    if SESSION_KEY not in config.stash:
        start_early(config, config.stash[OPTIONS_KEY])  # its workers' start-ups beside its own
        from kvpages.measure.session import KvSession

        worker_dir = config.getoption(WORKER_DIR_FLAG)
        launch: Launch | None = config.stash.get(LAUNCH_KEY, None)  # torchrun's ranks: kvpages.measure.ranks
        config.stash[SESSION_KEY] = KvSession(
            config.stash[OPTIONS_KEY], Path(str(config.rootpath)), tuple(config.invocation_params.args),
            timing=not config.getoption("benchmark_disable", False), worker=config.getoption(WORKER_FLAG),
            worker_dir=None if worker_dir is None else Path(worker_dir), started_at=config.stash[START_KEY],
            launch=launch, go_fd=config.getoption(WORKER_GO_FLAG), benchmark_output=benchmark_output(config),
            released=config.stash.get(SPARE_KEY, None),
        )
        exit_without_collecting()  # a process of the sweep (torch imported) exits without the last GC passes
        kv, started = config.stash[SESSION_KEY], config.stash.get(STARTED_KEY, None)
        if started is not None and (kv.device != "cpu" or kv.crosscheck_on):  # not what start_early took it for
            started.stop()
            del config.stash[STARTED_KEY]
    return config.stash[SESSION_KEY]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for fixture, family in (("kv_case", "point_blocks"), ("kv_scenario", "scenario_blocks")):
        if fixture in metafunc.fixturenames:
            collector_paused()  # torch's import (kv_session) and the collection; resumed once collected
            session = kv_session(metafunc.config)
            blocks = session.plan.collected(getattr(session.plan, family))
            metafunc.parametrize(fixture, blocks, ids=[block.id for block in blocks])


@pytest.fixture(name="kv_session")
def kv_session_fixture(request: pytest.FixtureRequest):
    """The sweep session: `kv_session.run(benchmark, block)` checks, meters, times and records one block."""
    return kv_session(request.config)


def _block_of(item: pytest.Item):
    """The kvpages block an item times, or None (another test, or an empty parametrization)."""
    from kvpages.measure.schedule import Block

    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    block = params.get("kv_case", params.get("kv_scenario"))
    return block if isinstance(block, Block) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker, keep only the cases the session selected (its -k, -m or node ids: its cases file, once it says
    so, kvpages.measure.worklog.COLLECT); after the first, only those that can run on the device (process 0 records
    the others as skipped)."""
    folder = config.getoption(WORKER_DIR_FLAG)
    if folder is None or config.getoption(WORKER_FLAG) is None or SESSION_KEY not in config.stash:
        return
    from kvpages.measure.worklog import read_cases, wait_to_collect

    go, kv, waiting = config.getoption(WORKER_GO_FLAG), config.stash[SESSION_KEY], time.perf_counter()
    if go is not None and SPARE_KEY not in config.stash:  # (a spare's round is its cases)
        if not wait_to_collect(go):
            pytest.exit("kvpages: worker not needed", pytest.ExitCode.OK)
        if kv.log is not None:
            kv.log.waited_s = time.perf_counter() - waiting

    cases = read_cases(Path(folder))
    keep = [item for item in items if (block := _block_of(item)) is not None and block.case_id in cases
            and (kv.process == 0 or block.target.unavailable_reason(block.variant, kv.device) is None)]
    if len(keep) < len(items):
        kept = set(keep)
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = keep


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtestloop(session: pytest.Session):
    """With --kv-processes >= 2: the earlier processes' shares run first, in fresh pytest workers, one after another."""
    config = session.config
    kv, started = config.stash.get(SESSION_KEY, None), config.stash.get(STARTED_KEY, None)
    if kv is None or kv.processes <= 1 or kv.recorder is None or config.option.collectonly or session.testsfailed:
        if started is not None:  # none needed after all
            started.stop()
        return (yield)
    from kvpages.measure.workers import WorkerFailed

    command = started.command if started is not None else worker_command(config, kv.options)
    reporter = config.pluginmanager.get_plugin("terminalreporter")  # None under -p no:terminal
    say = reporter.write_line if reporter is not None else lambda line: None
    try:
        kv.run_workers(command, say, started)
    except WorkerFailed as exc:
        pytest.exit(str(exc), returncode=pytest.ExitCode.INTERNAL_ERROR)
    result = yield
    if not session.shouldstop:  # the planned repetitions are done: the unstable points get more (kvpages.measure.remeasure)
        try:
            kv.remeasure(command, say)
        except WorkerFailed as exc:
            pytest.exit(str(exc), returncode=pytest.ExitCode.INTERNAL_ERROR)
    return result


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config: pytest.Config, benchmarks, output_json: dict) -> None:
    """--benchmark-json (and --benchmark-save) hold every process's benchmarks, the workers' too."""
    kv = config.stash.get(SESSION_KEY, None)
    with_data = any("data" in b.get("stats", {}) for b in output_json["benchmarks"])
    for entry in [] if kv is None else kv.workers.benchmarks:
        stats = {k: v for k, v in entry.get("stats", {}).items() if with_data or k != "data"}
        output_json["benchmarks"].append({**entry, "stats": stats})


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if SESSION_KEY in config.stash:
        config.stash[SESSION_KEY].finish(exitstatus, time.perf_counter() - config.stash[START_KEY])


@pytest.hookimpl(specname="pytest_sessionfinish", wrapper=True, tryfirst=True)
def pytest_sessionfinish_cleanly(session: pytest.Session, exitstatus: int):  # pytest takes only pytest_* names
    """pytest's end ran without an error (every plugin's, the terminal summary's): a worker may leave at once."""
    result = yield
    session.config.stash[FINISHED_KEY] = session
    return result


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A sweep's worker leaves as soon as pytest is done, with pytest's exit status (kvpages.measure.worklog); after an
    error in pytest's end it leaves as pytest does, with its traceback and status."""
    collector_resumed()  # after a collection that never finished
    kv, session = config.stash.get(SESSION_KEY, None), config.stash.get(FINISHED_KEY, None)
    if kv is not None and kv.log is not None and session is not None:
        exit_at_once(int(session.exitstatus))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if SESSION_KEY not in config.stash or config.stash[SESSION_KEY].log is not None:  # a worker: its log says it
        return
    kv = config.stash[SESSION_KEY]
    writer, group = kv.writer, kv.context.group
    if group is not None and group.rank != 0:
        terminalreporter.write_line(f"kvpages: {group.who(group.rank)}: rank 0 writes the run folder")
        return
    if writer is None:
        terminalreporter.write_line("kvpages: timing disabled or nothing ran; no run folder written")
        return
    started = time.perf_counter()
    charts, analyze_too = None, config.getoption("--kv-analyze")
    try:
        if analyze_too:  # `kvpages plot`'s drawing, in a process that warms up meanwhile
            from kvpages.render.drawing import Beside

            charts = Beside.start()
        from kvpages.analysis.ratios import analyze
        from kvpages.render.summary import summary_text
        from kvpages.schema.reader import load_run

        analysis = analyze(load_run(_as_named_here(writer.path)))
        terminalreporter.section("kvpages summary")
        terminalreporter.write_line(summary_text(analysis))
        terminalreporter.write_line(f"run folder: {writer.path} ({writer.meta.end_note})")
        if analyze_too:
            if charts is None:  # pandas is: the summary was made
                raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")
            from kvpages.analysis.gpu_answer import gpu_answer
            from kvpages.render.kept import write_files
            from kvpages.render.report import made_report

            charts.give(analysis)  # drawn while the GPU answer is analysed
            gpu = gpu_answer(analysis)
            drawn, formats = charts.wait(), charts.formats
            for chart in drawn:  # the report links the charts written
                terminalreporter.write_line(f"chart: {chart}")
            report = made_report(analysis, gpu)
            terminalreporter.write_line(f"report: {write_files(analysis.run.path, report)} (with ratios.csv)")
        kv.analysed(time.perf_counter() - started)
        if analyze_too:  # kept for later commands on the folder as it stands now (meta.json with those seconds)
            from kvpages.analysis.cache import keep
            from kvpages.render.kept import KeptCharts, KeptReport

            keep(dataclasses.replace(analysis, run=analysis.run.meta_read_again()))
            if (kept := KeptReport.of(analysis.run.path, None)) is not None:  # its GPU answer: the one found beside it
                kept.keep(report)
            if (kept_charts := KeptCharts.of(analysis.run.path, formats)) is not None:
                kept_charts.keep(drawn)
        timing = writer.meta.timing
        after = f"; then its analysis {timing.analysis_s:.1f} s" if timing and timing.analysis_s else ""
        terminalreporter.write_line(f"kvpages: {writer.meta.efficiency_text()}{after}")
    except ModuleNotFoundError as exc:
        if exc.name not in ANALYSIS_PACKAGES:
            raise
        missing = "chart or report" if exc.name == "matplotlib" else "summary, chart or report"  # (summed up above)
        terminalreporter.write_line(f"kvpages: the run folder {writer.path} is complete, but {exc.name} is not installed, "
                                    f"so there is no {missing}; pip install {' '.join(ANALYSIS_PACKAGES)} "
                                    "(or run `kvpages report` on another machine)")
    finally:
        if charts is not None:
            charts.stop()


def _as_named_here(folder: Path) -> Path:
    """`folder` relative to the current folder where it lies under it (`results/<run-id>`, as the README's commands name
    it), else as it is: an analysis is kept under its run's path as given (kvpages.analysis.cache), so the session's
    is found by `kvpages plot results/<run-id>` run from here. Nothing it writes depends on which (the charts' lines
    it prints are relative)."""
    try:
        return folder.relative_to(Path.cwd())
    except ValueError:
        return folder


ANALYSIS_PACKAGES = ("pandas", "matplotlib")
