"""Drawing on two CPUs (kvpages.render.drawing): the same files in the same order, and the other process's error
raised here, as if one process had drawn everything."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import synthetic_run

from kvpages.analysis.cache import Pickled
from kvpages.analysis.ratios import analyze
from kvpages.render.drawing import cpus, draw_run, side_by_side
from kvpages.render.plots import plot_run
from kvpages.schema.reader import RunError, load_run

FORKS = sys.platform.startswith("linux") and cpus() >= 2
forks = pytest.mark.skipif(not FORKS, reason="draws in a second process on Linux with two CPUs only")


def drawing(tmp_path: Path, name: str):
    def draw() -> list[Path]:
        path = tmp_path / name
        path.write_text(f"{name} by {os.getpid()}")
        return [path]
    return draw


def two_lengths(tmp_path: Path) -> Path:
    """A run folder of host_stride and device_stride at two lengths: enough rows for the per-point charts."""
    return synthetic_run(tmp_path / "run", {("host_stride", 512, 64): 2.0, ("device_stride", 512, 64): 3.0,
                                            ("host_stride", 8192, 64): 8.0, ("device_stride", 8192, 64): 4.0})


def drawn_alone(tmp_path: Path, run: Path) -> list[Path]:
    """The charts one process draws from `run`'s whole analysis, into a folder of their own."""
    alone = tmp_path / "alone"
    alone.mkdir()
    return plot_run(analyze(load_run(run)), out_dir=alone)


def assert_same_charts(drawn: list[Path], run: Path, alone: list[Path]) -> None:
    """`drawn` (into `run`) are the files `alone` are, in their order, byte for byte."""
    assert [p.name for p in drawn] == [p.name for p in alone]
    for chart in alone:
        assert chart.read_bytes() == (run / chart.name).read_bytes(), chart.name


SAMPLES_CHART = '''
from kvpages.render import plots

def samples_chart(analysis, frame, dtype, layout, stem, formats):
    path = stem.with_suffix(".txt")
    path.write_text(f"{sum(len(blocks) for blocks in analysis.run.samples.values())} blocks")
    return [path]

plots.CHARTS = (*plots.CHARTS, ("samples", samples_chart))
'''
"""A chart that reads the raw samples (a text file of their count), added to kvpages' charts where it runs."""


def add_samples_chart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """SAMPLES_CHART run in this process (kvpages' charts put back after the test); the folder that holds it as a
    sitecustomize, for a process started with it on PYTHONPATH."""
    import importlib.util

    from kvpages.render import plots

    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "sitecustomize.py").write_text(SAMPLES_CHART)
    spec = importlib.util.spec_from_file_location("samples_chart", extra / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    monkeypatch.setattr(plots, "CHARTS", plots.CHARTS)  # put back after the test; the module adds its chart
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return extra


@pytest.mark.parametrize("processes", [1, 2])
def test_the_files_come_back_in_order_whoever_draws_them(tmp_path, processes):
    here, there = drawing(tmp_path, "here.png"), drawing(tmp_path, "there.png")
    assert side_by_side(here, there, processes) == [tmp_path / "here.png", tmp_path / "there.png"]
    drawn_by = {p.name: p.read_text().split(" by ")[1] for p in tmp_path.iterdir()}
    assert drawn_by["here.png"] == str(os.getpid())
    assert (drawn_by["there.png"] != str(os.getpid())) == (processes == 2 and FORKS)


@forks
def test_the_other_process_error_is_raised_here(tmp_path):
    def fails() -> list[Path]:
        raise IsADirectoryError(21, "Is a directory", str(tmp_path / "scenario_requests.png"))

    with pytest.raises(IsADirectoryError, match=r"scenario_requests\.png"):
        side_by_side(drawing(tmp_path, "here.png"), fails, 2)
    assert (tmp_path / "here.png").exists()


@forks
def test_an_error_here_wins_and_the_other_process_is_waited_for(tmp_path):
    def fails() -> list[Path]:
        raise PermissionError("here")

    with pytest.raises(PermissionError, match="here"):
        side_by_side(fails, drawing(tmp_path, "there.png"), 2)
    assert (tmp_path / "there.png").exists()  # finished before side_by_side returned


def test_plot_draws_what_one_process_draws_without_matplotlib_in_its_own(tmp_path):
    """`kvpages plot` (kvpages.render.drawing.draw_run): the charts one process draws from the same analysis, byte for
    byte, while the command's own process imports no matplotlib where others draw."""
    run = two_lengths(tmp_path)
    code = ("import sys; from kvpages.cli import main; code = main(['plot', sys.argv[1]]); "
            "print('matplotlib' in sys.modules); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    *charts, imported = done.stdout.splitlines()
    assert imported == str(not FORKS)
    again = drawn_alone(tmp_path, run)
    assert_same_charts([Path(c) for c in charts], run, again)
    assert len(again) >= 3


@forks
def test_an_analysis_that_fails_is_raised_here_after_the_drawing_process_left(tmp_path):
    def fails() -> Pickled:
        raise RunError(f"{tmp_path}: no results.csv here; not a kvpages run folder")

    with pytest.raises(RunError, match="not a kvpages run folder"):
        draw_run(fails, ("png",))
    assert not list(tmp_path.iterdir())


class Refused(Exception):
    """An exception that pickles but does not unpickle (its argument is keyword-only)."""

    def __init__(self, *, why: str) -> None:
        super().__init__(why)


def fails_once(started: Path | None = None) -> Callable[[], Pickled]:
    """An analysis that fails (after `started` exists, where given: what runs meanwhile has begun)."""
    def fails() -> Pickled:
        deadline = time.monotonic() + 60
        while started is not None and not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        raise RunError("the analysis failed")
    return fails


@forks
@pytest.mark.parametrize("outcome", ["made", "raised", "refused"])
def test_what_is_made_meanwhile_at_the_lowest_priority_is_kept_here_and_its_error_dropped(tmp_path, monkeypatch,
                                                                                            outcome):
    """`draw_run`'s `meanwhile` (`kvpages plot`: its GPU answer's analysis, for the report): made in another process
    at niceness 19, then kept by this one (`Pickled.keep`), also when the analysis fails; what it raises, even an
    exception that does not unpickle, is not raised here."""
    from kvpages.render import drawing

    monkeypatch.setattr(drawing, "ASIDE_GRACE_S", 60)  # however loaded the box
    kept = tmp_path / "kept.txt"

    def meanwhile() -> Pickled:
        made = f"{os.getpid()} {os.nice(0)}"
        if outcome != "made":
            raise ValueError(made) if outcome == "raised" else Refused(why=made)
        return Pickled(made.encode(), functools.partial(Path.write_text, kept, made))

    with pytest.raises(RunError, match="the analysis failed"):
        draw_run(fails_once(), ("png",), meanwhile)
    if outcome == "made":
        pid, niceness = kept.read_text().split()
        assert int(pid) != os.getpid() and int(niceness) == 19
    assert kept.exists() == (outcome == "made")


@forks
def test_what_is_not_made_soon_after_the_rest_is_killed_and_nothing_kept(tmp_path, monkeypatch):
    """On a busy box the lowest priority gets almost no CPU: `draw_run` kills what it makes meanwhile ASIDE_GRACE_S
    after the rest is done (here: the analysis failed), keeps nothing of it, and returns with it gone."""
    from kvpages.render import drawing

    monkeypatch.setattr(drawing, "ASIDE_GRACE_S", 0.2)
    started, kept = tmp_path / "started", tmp_path / "kept.txt"

    def meanwhile() -> Pickled:
        started.write_text(str(os.getpid()))
        time.sleep(60)
        return Pickled(b"", functools.partial(Path.write_text, kept, "late"))

    began = time.monotonic()
    with pytest.raises(RunError, match="the analysis failed"):
        draw_run(fails_once(started), ("png",), meanwhile)
    assert time.monotonic() - began < 30 and not kept.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(int(started.read_text()), 0)


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_a_chart_is_drawn_unhinted_and_leaves_the_callers_rcparams_as_they_were(tmp_path, suffix):
    """savefig draws with RASTER's rcParams (FreeType's hinter off) and only for that draw: a notebook that draws its
    own figures beside kvpages' keeps its settings, also when a save fails."""
    import matplotlib

    from kvpages.render.figures import RASTER, new_figure, savefig

    fig = new_figure(1.0, 1.0)
    fig.text(0.5, 0.5, "0.5 µs")
    seen: list[str] = []
    fig.canvas.mpl_connect("draw_event", lambda _: seen.append(matplotlib.rcParams["text.hinting"]))
    before = dict(matplotlib.rcParams)
    savefig(fig, tmp_path / f"chart{suffix}")
    assert seen == [RASTER["text.hinting"]] == ["none"] and before["text.hinting"] != "none"
    assert dict(matplotlib.rcParams) == before
    with pytest.raises(OSError):
        savefig(fig, tmp_path / "no such folder" / f"chart{suffix}")
    assert dict(matplotlib.rcParams) == before


def test_log_axes_label_powers_of_ten_in_plain_text_and_no_chart_holds_math_text(tmp_path):
    from kvpages.render.figures import power_label

    assert [power_label(v) for v in (1, 1000, 1e6, 0.01, 2000, 0.5)] == ["10⁰", "10³", "10⁶", "10⁻²", "2000", "0.5"]
    medians = {(v, s, p): 2.0 + s / 1000 for v in ("host_stride", "device_stride") for s in (512, 65536) for p in (1, 64)}
    run = synthetic_run(tmp_path / "run", medians, repetitions=4)
    drawn = plot_run(analyze(load_run(run)), ("svg",))  # matplotlib's SVG names each text it draws in a comment
    texts = {path.name: path.read_text() for path in drawn}
    assert "latency_int32_fragmented.svg" in texts and "bytes_int32_fragmented.svg" in texts
    assert not any("mathdefault" in text or "<!-- $" in text for text in texts.values())
    for name in ("latency_int32_fragmented.svg", "bytes_int32_fragmented.svg"):  # seq_len from 512 to 65536
        assert "<!-- 10³ -->" in texts[name] and "<!-- 10⁴ -->" in texts[name], name


def test_a_run_without_its_samples_keeps_its_memo_and_refuses_a_read_of_them(tmp_path):
    import pickle

    from kvpages.schema.reader import SamplesWithheld

    run = load_run(synthetic_run(tmp_path / "run", {("host_stride", 512, 64): 2.0, ("device_stride", 512, 64): 3.0}))
    run.cached(("made",), lambda: 7)
    light = pickle.loads(pickle.dumps(run.without_samples()))
    assert light.cached(("made",), lambda: 0) == 7 and light.rows.equals(run.rows) and light.scenario_samples is None
    for read in (lambda s: s[next(iter(run.samples))], lambda s: s.get(("x",)), lambda s: ("x",) in s, len, list,
                 lambda s: s.items()):
        with pytest.raises(SamplesWithheld):
            read(light.samples)


@forks
def test_a_chart_that_reads_the_raw_samples_is_drawn_here_from_the_whole_analysis(tmp_path, monkeypatch):
    """The drawing process gets the analysis without its raw samples; were a chart to read them, this process draws
    every chart itself from the whole analysis: the same files as one process drawing alone."""
    from kvpages.analysis.cache import pickled

    add_samples_chart(tmp_path, monkeypatch)
    run = synthetic_run(tmp_path / "run", {("host_stride", 512, 64): 2.0, ("device_stride", 512, 64): 3.0})
    drawn = draw_run(lambda: pickled(run), ("png",))
    assert (run / "samples_int32_fragmented.txt").read_text() == "20 blocks"  # 2 rows of 10 repetitions
    assert_same_charts(drawn, run, drawn_alone(tmp_path, run))


@pytest.fixture
def beside():
    """A sweep's drawing process (kvpages.render.drawing.Beside), stopped at the end whatever the test did."""
    from kvpages.render.drawing import Beside

    started: list[Beside] = []

    def start() -> Beside:
        charts = Beside.start()
        assert charts is not None  # matplotlib and pandas are installed here
        started.append(charts)
        return charts

    yield start
    for charts in started:
        charts.stop()


def test_a_sweeps_drawing_process_draws_what_one_process_draws_from_the_analysis_it_is_handed(tmp_path, beside):
    """`--kv-analyze`: a process started before the analysis exists, handed it without its raw samples, writes the
    charts one process draws from the whole analysis, byte for byte."""
    run = two_lengths(tmp_path)
    charts = beside()
    charts.give(analyze(load_run(run)))
    drawn = charts.wait()
    assert charts.child.returncode == 0
    again = drawn_alone(tmp_path, run)
    assert_same_charts(drawn, run, again)
    assert len(again) >= 3


def test_a_sweeps_drawing_process_handed_nothing_is_stopped_and_one_drawing_is_waited_for(tmp_path, beside):
    """The session's analysis failed (or was interrupted) before it handed anything over: the process, still warming
    up, is killed. Stopped once handed the analysis (the GPU answer failed, say), it finishes every chart first, so
    none is left half-written."""
    waiting = beside()
    waiting.stop()
    assert waiting.child.returncode == -signal.SIGKILL and waiting.give_fd == -1 and waiting.out.closed
    run = two_lengths(tmp_path)
    drawing = beside()
    drawing.give(analyze(load_run(run)))
    drawing.stop()
    assert drawing.child.returncode == 0
    for chart in drawn_alone(tmp_path, run):
        assert chart.read_bytes() == (run / chart.name).read_bytes(), chart.name


def test_a_sweeps_drawing_process_that_fails_is_raised_with_its_last_line(tmp_path, beside):
    run = two_lengths(tmp_path)
    (run / "latency_int32_fragmented.png").mkdir()  # where the first chart goes
    charts = beside()
    charts.give(analyze(load_run(run)))
    with pytest.raises(RuntimeError, match=r"kvpages plot .*run: IsADirectoryError: .*latency_int32_fragmented\.png"):
        charts.wait()


def test_a_chart_that_reads_the_raw_samples_in_a_sweeps_drawing_process_is_drawn_here_from_the_whole_analysis(
        tmp_path, monkeypatch, beside):
    """Were a chart to read the raw samples the drawing process was not handed, the session draws every chart
    itself from the whole analysis. The chart is added in both processes: in the drawing one by a sitecustomize."""
    from kvpages.render.drawing import WITHHELD

    extra = add_samples_chart(tmp_path, monkeypatch)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(extra), *filter(None, [os.environ.get("PYTHONPATH")])]))
    run = synthetic_run(tmp_path / "run", {("host_stride", 512, 64): 2.0, ("device_stride", 512, 64): 3.0})
    charts = beside()
    charts.give(analyze(load_run(run)))
    drawn = charts.wait()
    assert charts.child.returncode == WITHHELD  # the drawing process's: it read no samples, and said so
    assert (run / "samples_int32_fragmented.txt").read_text() == "20 blocks"  # 2 rows of 10 repetitions
    assert "samples_int32_fragmented.txt" in [p.name for p in drawn]
