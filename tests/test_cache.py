"""A run's analysis kept between commands (kvpages.analysis.cache): the commands print and write what they would
without it, a changed input is analysed afresh, a damaged entry is not read, and only the newest entries stay."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import synthetic_run

from kvpages.analysis import cache
from kvpages.analysis.ratios import analyze
from kvpages.cli import main
from kvpages.render.drawing import forks
from kvpages.schema import store
from kvpages.schema.reader import load_run

FORKS = forks()
MEDIANS = {("host_stride", 512, 64): 2.0, ("device_stride", 512, 64): 3.0, ("host_stride", 8192, 64): 8.0,
           ("device_stride", 8192, 64): 4.0}


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder the analyses are kept in."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(store.VARIABLE, str(folder))
    return folder


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"*{cache.SUFFIX}"))


def contents(run: Path, charts: bool = True) -> dict[str, bytes]:
    """Every file of a run folder, by name (with `charts` False, the PNGs left out)."""
    return {p.name: p.read_bytes() for p in run.iterdir() if charts or p.suffix != ".png"}


def test_plot_then_report_analyse_once_and_write_what_they_would_without(tmp_path, kept, monkeypatch):
    run = synthetic_run(tmp_path / "run", MEDIANS)
    plain = tmp_path / "plain"
    shutil.copytree(run, plain)
    assert run_cli("plot", str(run))[0] == 0
    assert len(entries(kept)) == 1 and store.key(run) is not None
    before = store.key(run)
    reported = run_cli("report", str(run))
    assert store.key(run) == before and len(entries(kept)) == 1  # the charts and the report are not its inputs
    monkeypatch.setenv(store.VARIABLE, "off")
    for chart in run.glob("*.png"):  # the report lists the charts
        shutil.copy(chart, plain / chart.name)
    assert run_cli("report", str(plain))[1] == reported[1] and reported[0] == 0
    for name in ("REPORT.md", "APPENDIX.md", "ratios.csv", "scenario_ratios.csv", "noisy.csv"):
        assert (run / name).read_bytes() == (plain / name).read_bytes(), name


def test_a_kept_report_is_written_again_for_the_charts_the_folder_holds_then(tmp_path, kept, monkeypatch):
    """A report's files are kept with the analysis: the next report on the folder writes the same texts from there
    (one removed meanwhile comes back whole), and a chart drawn or removed meanwhile is linked or not, as in a report
    with nothing kept."""
    from kvpages.render.report import REPORT_MD

    run = synthetic_run(tmp_path / "run", MEDIANS)
    bare = run_cli("report", str(run))
    assert bare[0] == 0 and "![" not in bare[1]
    (entry,) = entries(kept)
    memo = cache.loads(store.read_entry(entry) or b"").run._cache  # the memo kept with the analysis
    (files,) = [value for key, value in memo.items() if key[0] == "report files"]
    assert [name for name, _ in files][-1] == REPORT_MD
    assert all((run / name).read_text() == text for name, text in files)
    (run / "APPENDIX.md").unlink()
    assert run_cli("report", str(run)) == bare and (run / "APPENDIX.md").read_text() == dict(files)["APPENDIX.md"]
    assert run_cli("plot", str(run))[0] == 0
    charts = sorted(p.name for p in run.glob("*.png"))
    charted = run_cli("report", str(run))
    assert all(f"![{name}]({name})" in charted[1] for name in charts)
    (run / charts[0]).unlink()
    without_one = run_cli("report", str(run))
    assert f"]({charts[0]})" not in without_one[1] and f"]({charts[1]})" in without_one[1]
    monkeypatch.setenv(store.VARIABLE, "off")  # each as a report with nothing kept writes it
    assert run_cli("report", str(run)) == without_one
    for chart in charts[1:]:
        (run / chart).unlink()
    assert run_cli("report", str(run)) == bare


def test_a_changed_input_is_analysed_afresh(tmp_path, kept):
    run = synthetic_run(tmp_path / "run", MEDIANS)
    assert "# kvpages report: run " in run_cli("report", str(run))[1]
    meta = json.loads((run / "meta.json").read_text())
    meta["run_id"] = "20261204T000000Z-renamed"
    (run / "meta.json").write_text(json.dumps(meta))
    assert "# kvpages report: 20261204T000000Z-renamed " in run_cli("report", str(run))[1]
    assert len(entries(kept)) == 2
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(run, elsewhere)  # the same files under another path: another run folder to write into
    assert run_cli("report", str(elsewhere))[0] == 0 and (elsewhere / "REPORT.md").is_file() and len(entries(kept)) == 3


def test_fleet_reads_the_analyses_kept_and_keeps_those_it_makes(tmp_path, kept, monkeypatch):
    """kvpages fleet starts from each run folder's kept analysis, as plot and report do: a folder a report analysed
    is not analysed again, one analysed by no command is analysed and kept, and FLEET.md is what it is without."""
    made = []

    def counted(run):
        made.append(run.path)
        return analyze(run)

    monkeypatch.setattr(cache, "analyze", counted)  # the real analysis, each call counted
    a = synthetic_run(tmp_path / "a", MEDIANS)
    b = synthetic_run(tmp_path / "b", MEDIANS, seed=1)
    meta = json.loads((b / "meta.json").read_text())
    meta["environment"]["hostname"] = "box-b"
    (b / "meta.json").write_text(json.dumps(meta))
    assert run_cli("report", str(a))[0] == 0 and made == [a]
    assert run_cli("fleet", str(a), str(b), "--out", str(tmp_path / "first"))[0] == 0
    assert made == [a, b] and {p.name.removesuffix(cache.SUFFIX) for p in entries(kept)} == {store.key(a), store.key(b)}
    assert run_cli("fleet", str(a), str(b), "--out", str(tmp_path / "again"))[0] == 0 and made == [a, b]
    monkeypatch.setenv(store.VARIABLE, "off")
    assert run_cli("fleet", str(a), str(b), "--out", str(tmp_path / "plain"))[0] == 0 and made == [a, b, a, b]
    texts = {(tmp_path / out / "FLEET.md").read_text() for out in ("first", "again", "plain")}
    assert len(texts) == 1 and "2 machines, 2 runs" in texts.pop()


def test_compare_reads_the_runs_kept_and_prints_what_it_prints_without(tmp_path, kept, monkeypatch):
    """kvpages compare reads each run as its kept analysis holds it where one is kept (its CSVs not parsed again) and
    keeps nothing itself: the same output with both runs read now, one kept, or the cache off."""
    read = []

    def counted(path):
        read.append(Path(path))
        return load_run(path)

    monkeypatch.setattr(cache, "load_run", counted)  # the real reading, each call counted
    a = synthetic_run(tmp_path / "a", MEDIANS)
    b = synthetic_run(tmp_path / "b", MEDIANS, seed=1)
    plain = run_cli("compare", str(a), str(b), "--format", "markdown")
    assert "| " in plain[1] and read == [a, b] and not entries(kept)
    assert run_cli("report", str(a))[0] == 0 and read == [a, b, a] and len(entries(kept)) == 1
    assert run_cli("compare", str(a), str(b), "--format", "markdown") == plain and read == [a, b, a, b]
    monkeypatch.setenv(store.VARIABLE, "off")
    assert run_cli("compare", str(a), str(b), "--format", "markdown") == plain and read == [a, b, a, b, a, b]


def test_a_damaged_entry_is_not_read_and_is_replaced(tmp_path, kept):
    run = synthetic_run(tmp_path / "run", MEDIANS)
    first = run_cli("summary", str(run))
    (entry,) = entries(kept)
    damaged = bytearray(entry.read_bytes())
    damaged[-100] ^= 0xFF
    entry.write_bytes(bytes(damaged))
    assert run_cli("summary", str(run)) == first
    assert entry.read_bytes() not in (bytes(damaged), b"")  # analysed again and kept again, whole
    assert run_cli("summary", str(run)) == first


def test_an_entry_interrupted_before_its_rename_is_not_left_half_written(tmp_path, monkeypatch):
    """A command stopped (Ctrl-C) between writing an entry's partial file and renaming it over the entry: the
    interruption is raised and no file is left."""
    def interrupted(src: object, dst: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(store.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.write_entry(tmp_path / "cache" / f"key{cache.SUFFIX}", b"payload")
    assert list((tmp_path / "cache").iterdir()) == []


def test_only_the_newest_entries_stay_and_off_keeps_none(tmp_path, kept, monkeypatch):
    monkeypatch.setattr(store, "KEEP", 2)
    runs = [synthetic_run(tmp_path / f"run{i}", MEDIANS, seed=i) for i in range(3)]
    for run in runs:
        run_cli("summary", str(run))
    assert len(entries(kept)) == 2
    assert {p.name.removesuffix(cache.SUFFIX) for p in entries(kept)} == {store.key(r) for r in runs[1:]}
    monkeypatch.setenv(store.VARIABLE, "off")
    shutil.rmtree(kept)
    assert run_cli("summary", str(runs[0]))[0] == 0 and not kept.exists()


def test_a_folder_that_cannot_be_written_keeps_nothing_and_the_command_works(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(store.VARIABLE, str(blocked / "cache"))
    run = synthetic_run(tmp_path / "run", MEDIANS)
    code, out, _ = run_cli("summary", str(run))
    assert code == 0 and "page_size=64" in out
    assert blocked.read_text() == "not a folder" and sorted(tmp_path.iterdir()) == sorted([blocked, run])  # kept: none


def test_a_report_keeps_what_it_made_and_another_gpu_answer_in_its_place_is_answered_afresh(tmp_path, kept,
                                                                                             monkeypatch):
    """The committed CPU reference run reported against its H200 answer: the report's findings and recommendations
    are kept with the CPU analysis (its memo grew; the next report reads them and writes the same bytes); then the
    answer's folder holds another H200 run: that report gives the other run's figures, as one with nothing kept does."""
    from conftest import REPO, reference_runs

    if not reference_runs():
        pytest.skip("no run committed under results/")
    cpu, gpu = tmp_path / "results" / "cpu", tmp_path / "results" / "gpu"
    shutil.copytree(reference_runs()[-1], cpu)
    shutil.copytree(REPO / "results" / "20261204T181656Z-cuda-nvidia-h200", gpu)
    first_id = json.loads((gpu / "meta.json").read_text())["run_id"]
    first = run_cli("report", str(cpu), "--gpu-run", str(gpu))
    assert first[0] == 0 and "Measured on NVIDIA H200" in first[1]
    made = cache.loads(store.read_entry(kept / f"{store.key(cpu)}{cache.SUFFIX}") or b"")
    assert {"findings", "report files"} <= {key[0] for key in made.run._cache}  # what the report made, kept
    assert run_cli("report", str(cpu), "--gpu-run", str(gpu)) == first
    shutil.rmtree(gpu)
    shutil.copytree(REPO / "results" / "20261204T184229Z-cuda-nvidia-h200", gpu)  # another H200 run, same folder
    meta = json.loads((gpu / "meta.json").read_text())
    (gpu / "meta.json").write_text(json.dumps({**meta, "run_id": first_id}, indent=1))  # and the same run id
    other = run_cli("report", str(cpu), "--gpu-run", str(gpu))
    monkeypatch.setenv(store.VARIABLE, "off")
    assert other == run_cli("report", str(cpu), "--gpu-run", str(gpu)) != first


@pytest.mark.skipif(not FORKS, reason="kvpages plot analyses the GPU answer beside its drawing on Linux with two CPUs")
def test_plot_keeps_the_gpu_answer_beside_the_run_and_its_report_analyses_nothing(tmp_path, kept, monkeypatch):
    """A CPU run of the quick preset's points beside a committed quick H200 run: `kvpages plot` analyses and keeps that
    answer too, so the report after it analyses no run and writes what it writes with nothing kept."""
    from conftest import REPO

    from kvpages.render import drawing

    monkeypatch.setattr(drawing, "ASIDE_GRACE_S", 120)  # the answer made at the lowest priority, however loaded the box

    gpu = REPO / "results" / "20261204T184229Z-cuda-nvidia-h200"
    if not gpu.is_dir():
        pytest.skip(f"{gpu.name} is not committed under results/")
    cpu = synthetic_run(tmp_path / "results" / "cpu", MEDIANS)
    meta = json.loads((cpu / "meta.json").read_text())
    (cpu / "meta.json").write_text(json.dumps({**meta, "preset": json.loads((gpu / "meta.json").read_text())["preset"]}))
    shutil.copytree(gpu, tmp_path / "results" / gpu.name)
    plain = tmp_path / "plain" / "results"
    shutil.copytree(tmp_path / "results", plain)
    assert run_cli("plot", str(cpu))[0] == 0
    assert (kept / f"{store.key(tmp_path / 'results' / gpu.name)}{cache.SUFFIX}").is_file()
    analysed: list[Path] = []
    monkeypatch.setattr(cache, "analyze", lambda run, *a: analysed.append(run.path) or analyze(run, *a))
    reported = run_cli("report", str(cpu))
    assert reported[0] == 0 and f"measured on NVIDIA H200, run {gpu.name}" in (cpu / "REPORT.md").read_text()
    assert analysed == []
    monkeypatch.setenv(store.VARIABLE, "off")
    for chart in cpu.glob("*.png"):  # the report lists the charts
        shutil.copy(chart, plain / "cpu" / chart.name)
    assert run_cli("report", str(plain / "cpu"))[1] == reported[1].replace(str(tmp_path / "results"), str(plain))
    for name in ("REPORT.md", "APPENDIX.md", "ratios.csv"):
        assert (cpu / name).read_bytes() == (plain / "cpu" / name).read_bytes(), name
    assert analysed == [plain / "cpu", plain / gpu.name]


def test_a_memo_pickle_cannot_take_leaves_the_entry_as_it_was(tmp_path, kept):
    run = synthetic_run(tmp_path / "run", MEDIANS)
    assert run_cli("report", str(run))[0] == 0
    (entry,) = entries(kept)
    loaded = cache.Loaded.kept(cache.Pickled(store.read_entry(entry) or b"", lambda: None, entry))
    before = entry.read_bytes()
    loaded.analysis.run.cached(("a value pickle cannot take",), lambda: lambda: None)
    loaded.remember()
    assert entry.read_bytes() == before
    loaded.analysis.run.cached(("a value it can",), lambda: 1)  # the memo grew beyond the unpicklable one: still not kept
    loaded.remember()
    assert entry.read_bytes() == before


def test_a_sweeps_analysis_is_kept_as_its_folder_stands_after_it(pytester, kept, monkeypatch):
    """--kv-analyze keeps the session's analysis once meta.json holds the analysis's seconds, under the folder as the
    README's commands name it from where the sweep ran (results/<run-id>), so that plot and report on it afterwards
    analyse nothing; what they read is what a fresh load gives (meta.json read again). It keeps the report it wrote
    too: the next report writes those files again, byte for byte, without making them, and they are what a report
    with nothing kept writes."""
    from conftest import FAST
    from test_plugin import BENCH, CPU

    from kvpages.render import report
    from kvpages.schema.reader import load_run

    pytester.makepyfile(test_kv_sweep=BENCH)
    result = pytester.runpytest("--kv-seq-lens", "512", "--kv-page-sizes", "64", "--kv-variants",
                                "host_stride,device_stride", "--kv-scenarios", "none", "--kv-repetitions", "2",
                                "--kv-analyze", *CPU, *FAST)
    result.assert_outcomes(passed=4)
    [folder] = [p.relative_to(pytester.path) for p in (pytester.path / "results").iterdir() if p.is_dir()]
    written, made, make = contents(folder, charts=False), [], report.made_report
    monkeypatch.setattr(cache, "analyze", lambda run: made.append(run.path) or analyze(run))
    monkeypatch.setattr(report, "made_report", lambda *given: pytest.fail("the sweep's report was not kept"))
    assert [p.name.removesuffix(cache.SUFFIX) for p in entries(kept)] == [store.key(folder)]  # results/<run-id>
    for name in ("REPORT.md", "APPENDIX.md", "ratios.csv"):
        (folder / name).unlink()
    code, printed, _ = run_cli("report", str(folder))
    assert code == 0 and printed.encode() == written["REPORT.md"] and contents(folder, charts=False) == written
    charts = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.glob("*.png"))}
    plotted = run_cli("plot", str(folder))
    assert plotted[0] == 0 and sorted(plotted[1].split()) == [str(p) for p in charts]  # the sweep's charts, kept: none drawn
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.glob("*.png")} == charts
    assert run_cli("report", str(folder))[1] == printed and made == []
    found = cache.loads(store.read_entry(entries(kept)[0]) or b"").run.meta
    assert found == load_run(folder).meta and found is not None and found.timing is not None
    assert found.timing.analysis_s is not None and found.timing.analysis_s > 0
    monkeypatch.setattr(report, "made_report", make)
    monkeypatch.setenv(store.VARIABLE, "off")
    assert run_cli("report", str(folder))[1] == printed and contents(folder, charts=False) == written and made == [folder]
    assert run_cli("plot", str(folder)) == plotted  # drawn afresh: what the sweep drew, byte for byte
    assert {p: p.read_bytes() for p in folder.glob("*.png")} == {p: b for p, (b, _) in charts.items()}


def test_a_kept_report_is_written_again_without_numpy_or_pandas(tmp_path, kept):
    """The second report on a folder that did not change writes every file the first wrote, byte for byte, and prints
    the same, in a process that imports neither numpy nor pandas (kvpages.render.kept); a damaged entry is made
    afresh, and kept again."""
    from kvpages.render.kept import SUFFIX

    run = synthetic_run(tmp_path / "run", MEDIANS)
    first = run_cli("report", str(run))
    written = contents(run)
    (entry,) = kept.glob(f"*{SUFFIX}")
    for name in ("REPORT.md", "APPENDIX.md", "ratios.csv"):
        (run / name).unlink()
    program = ("import sys\nfrom kvpages.cli import main\ncode = main(sys.argv[1:])\n"
               "print(code, [m for m in ('numpy', 'pandas', 'matplotlib') if m in sys.modules], file=sys.stderr)")
    again = subprocess.run([sys.executable, "-c", program, "report", str(run)], capture_output=True, text=True, check=True)
    assert again.stdout == first[1] and again.stderr.splitlines()[-1] == "0 []"
    assert contents(run) == written
    damaged = bytearray(entry.read_bytes())
    damaged[-1] ^= 1
    entry.write_bytes(bytes(damaged))
    assert run_cli("report", str(run)) == first and entry.read_bytes() not in (bytes(damaged), b"")


def test_a_kept_reports_key_names_its_gpu_answer_and_the_charts(tmp_path, kept):
    """A kept report is found under the run's inputs, its GPU answer's (given, else the CUDA run of the same preset and
    points beside it, kvpages.schema.beside) and the charts in the folder: a CUDA run appearing beside it, a change to
    that run, a chart drawn, or an answer given make another key; a CUDA run's own report has no answer."""
    from kvpages.render.kept import KeptReport
    from kvpages.schema.beside import gpu_run_beside

    results = tmp_path / "results"
    cpu = synthetic_run(results / "20261204T000000Z-cpu", MEDIANS)
    alone = KeptReport.of(cpu, None)
    assert alone is not None and gpu_run_beside(cpu) is None
    gpu = results / "20261204T010000Z-cuda"
    shutil.copytree(cpu, gpu)
    meta = json.loads((gpu / "meta.json").read_text())
    (gpu / "meta.json").write_text(json.dumps({**meta, "environment": {**meta["environment"], "device": "cuda"}}))
    assert gpu_run_beside(cpu) == gpu and gpu_run_beside(gpu) is None
    beside = KeptReport.of(cpu, None)
    assert beside is not None and beside != alone and KeptReport.of(cpu, gpu) == beside
    (gpu / "meta.json").write_text(json.dumps({**meta, "environment": {**meta["environment"], "device": "cuda"},
                                               "run_id": "changed"}))
    changed = KeptReport.of(cpu, None)
    assert changed is not None and changed not in (alone, beside)
    (gpu / "meta.json").write_text(json.dumps({**meta, "environment": {**meta["environment"], "device": "cuda"},
                                               "preset": "another"}))
    assert KeptReport.of(cpu, None) == alone  # another preset's CUDA run is not its answer
    (gpu / "meta.json").write_text("{ cut off")
    assert gpu_run_beside(cpu) is None and KeptReport.of(cpu, None) == alone  # nor is a folder whose meta.json is no JSON
    (cpu / "latency_int32_fragmented.png").write_bytes(b"a chart")
    assert KeptReport.of(cpu, None) not in (alone, beside, changed, None)
    assert KeptReport.of(cpu, tmp_path / "no-such-run") is None  # not kept: the report says what is wrong
    assert KeptReport.of(cpu / "results.csv", None) is None


def test_a_plot_on_the_charts_it_drew_writes_nothing_and_a_changed_chart_draws_all_again(tmp_path, kept, monkeypatch):
    """The second plot on a folder that did not change prints the same and writes nothing, in a process that imports
    neither numpy, pandas nor matplotlib; a chart removed or changed meanwhile has every chart drawn again, each the
    bytes a plot with nothing kept draws."""
    from kvpages.render.kept import CHARTS_SUFFIX

    run = synthetic_run(tmp_path / "run", MEDIANS)
    first = run_cli("plot", str(run))
    drawn = {p: p.read_bytes() for p in run.glob("*.png")}
    assert first[0] == 0 and sorted(first[1].split()) == sorted(map(str, drawn))
    assert len(list(kept.glob(f"*{CHARTS_SUFFIX}"))) == 1
    stamps = {p: p.stat().st_mtime_ns for p in drawn}
    program = ("import sys\nfrom kvpages.cli import main\ncode = main(sys.argv[1:])\n"
               "print(code, [m for m in ('numpy', 'pandas', 'matplotlib') if m in sys.modules], file=sys.stderr)")
    again = subprocess.run([sys.executable, "-c", program, "plot", str(run)], capture_output=True, text=True, check=True)
    assert again.stdout == first[1] and again.stderr.splitlines()[-1] == "0 []"
    assert {p: p.stat().st_mtime_ns for p in run.glob("*.png")} == stamps
    removed, changed = sorted(drawn)[:2]
    for gone in (lambda: removed.unlink(), lambda: changed.write_bytes(b"a chart edited by hand")):
        gone()
        assert run_cli("plot", str(run)) == first and {p: p.read_bytes() for p in run.glob("*.png")} == drawn
        assert all(p.stat().st_mtime_ns != stamps[p] for p in drawn)  # drawn again, each of them
        stamps = {p: p.stat().st_mtime_ns for p in drawn}
    monkeypatch.setenv(store.VARIABLE, "off")
    assert run_cli("plot", str(run)) == first and {p: p.read_bytes() for p in run.glob("*.png")} == drawn


def test_kept_charts_are_keyed_by_the_run_the_formats_and_every_matplotlibrc(tmp_path, kept, monkeypatch):
    """Another input, another format or a matplotlibrc a drawing would read (the current folder's, $MATPLOTLIBRC's,
    the configuration folder's) names another entry; a file that is no run folder keeps none."""
    from kvpages.render.kept import KeptCharts

    run = synthetic_run(tmp_path / "run", MEDIANS)
    config = tmp_path / "config"
    monkeypatch.setenv("MPLCONFIGDIR", str(config))
    monkeypatch.delenv("MATPLOTLIBRC", raising=False)
    monkeypatch.chdir(tmp_path)
    png = KeptCharts.of(run, ("png",))
    assert png is not None and png == KeptCharts.of(run, ("png",))
    names = {png, KeptCharts.of(run, ("png", "svg"))}
    (tmp_path / "matplotlibrc").write_text("font.size: 14\n")
    names.add(KeptCharts.of(run, ("png",)))
    (tmp_path / "matplotlibrc").unlink()
    config.mkdir()
    (config / "matplotlibrc").write_text("font.size: 14\n")
    names.add(KeptCharts.of(run, ("png",)))
    (config / "matplotlibrc").write_text("font.size: 15\n")
    names.add(KeptCharts.of(run, ("png",)))
    (config / "matplotlibrc").unlink()
    (tmp_path / "rc").write_text("lines.linewidth: 3\n")
    monkeypatch.setenv("MATPLOTLIBRC", str(tmp_path / "rc"))
    names.add(KeptCharts.of(run, ("png",)))
    monkeypatch.delenv("MATPLOTLIBRC")
    assert KeptCharts.of(run, ("png",)) == png
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "run_id": "changed"}))
    names.add(KeptCharts.of(run, ("png",)))
    assert len(names) == 7 and None not in names
    assert KeptCharts.of(run / "results.csv", ("png",)) is None and KeptCharts.of(tmp_path / "no-such-run", ("png",)) is None
