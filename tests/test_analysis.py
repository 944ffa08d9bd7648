"""Loading, bootstrap, crossover, compare and the analysis CLI, on real files."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, kvpages_here, reference_runs, synthetic_run

from kvpages.analysis.cite import sig
from kvpages.analysis.compare import compare_runs
from kvpages.analysis.ratios import analyze, crossovers
from kvpages.cli import main
from kvpages.core.estimator import between_runs, paired_ratio
from kvpages.core.stats import Levels, block_medians
from kvpages.render.report import ci_text, render, render_appendix, write_report
from kvpages.schema.reader import load_run, sample_file
from kvpages.schema.rows import RATIO_COLUMNS

SEQ = (512, 8192, 131072)


def medians(device_stride_factor: dict[tuple[int, int], float]) -> dict:
    out = {}
    for (seq_len, page_size), factor in device_stride_factor.items():
        out[("host_stride", seq_len, page_size)] = 10.0
        out[("device_stride", seq_len, page_size)] = 10.0 * factor
    return out


@pytest.fixture
def crossing_run(tmp_path: Path) -> Path:
    # page 64: device_stride loses at 512, wins from 8192; page 1: never wins
    factors = {(512, 64): 1.5, (8192, 64): 0.6, (131072, 64): 0.2, (512, 1): 1.4, (8192, 1): 1.3, (131072, 1): 1.2}
    return synthetic_run(tmp_path / "run-a", medians(factors))


def covers(interval, value: float) -> bool:
    return interval.ci_low <= value <= interval.ci_high


@pytest.mark.parametrize("processes, per_process, between", [(6, 2, 0.1), (6, 2, 0.0), (1, 12, 0.0), (6, 1, 0.1)])
def test_between_runs_is_the_ratio_of_the_printed_figures_calibrated_and_finds_shifts(processes, per_process,
                                                                                     between):
    """Two independent runs (6 processes x 2 repetitions with and without a process effect, and one process x 12
    without one: one process cannot see its own shift): B/A is exactly B's figure over A's, an A/A holds 1 about
    95% of the time, and a 1.3x shift is found."""
    rng = np.random.default_rng(3)
    owners = np.repeat(np.arange(processes), per_process)

    def draw(shift: float = 0.0) -> Levels:
        return Levels(shift + rng.normal(0, between, processes)[owners] + rng.normal(0, 0.05, owners.size), owners)

    trials = 200
    hits = sum(covers(between_runs(draw(), draw()).interval, 1.0) for _ in range(trials))
    assert 0.90 <= hits / trials <= 0.995
    a, b = draw(), draw(np.log(1.3))
    found = between_runs(a, b)
    assert found.interval.ratio == pytest.approx(found.b / found.a, rel=1e-12)
    assert found.a == pytest.approx(np.exp(a.values.mean())) and found.b == pytest.approx(np.exp(b.values.mean()))
    if between == 0:
        assert 1 < found.interval.ci_low < 1.3 < found.interval.ci_high and found.p_value < 0.01
    one = between_runs(Levels(np.array([0.1]), np.zeros(1, dtype=int)), a)
    assert not one.interval.known and one.p_value == 1.0


def test_pairing_cancels_drift_shared_by_a_repetition():
    rng = np.random.default_rng(0)
    drift = np.exp(rng.normal(0, 0.3, 10))  # each repetition's machine state: +-30%
    base = 10 * drift * np.exp(rng.normal(0, 0.01, 10))
    cand = 20 * drift * np.exp(rng.normal(0, 0.01, 10))
    owners = np.zeros(10, dtype=int)
    paired = paired_ratio(Levels(np.log(base), owners), Levels(np.log(cand), owners)).interval
    unpaired = between_runs(Levels(np.log(base), owners), Levels(np.log(cand), owners)).interval
    assert 1.95 < paired.ci_low < 2 < paired.ci_high < 2.05
    assert unpaired.ci_high - unpaired.ci_low > 10 * (paired.ci_high - paired.ci_low)
    assert block_medians([np.array([1.0, 3.0, 2.0]), np.array([5.0])]).tolist() == [2.0, 5.0]


def test_crossover_per_page_size_including_not_within_range(crossing_run):
    found = {c.page_size: c for c in analyze(load_run(crossing_run)).crossovers}
    assert found[64].seq_len == 8192 and found[64].describe() == "seq_len 8192 (crossing in (512, 8192])"
    assert found[1].after is None
    assert found[1].seq_len is None
    assert found[1].describe() == "not within the swept range (512..131072)"
    assert crossovers(analyze(load_run(crossing_run)).ratios, "nobody") == []


def test_every_ratio_and_interval_in_the_report_is_a_row_of_ratios_csv(crossing_run):
    analysis = analyze(load_run(crossing_run))
    report = write_report(analysis).read_text() + (crossing_run / "APPENDIX.md").read_text()
    table = pd.read_csv(crossing_run / "ratios.csv")
    assert len(table) == len(analysis.ratios) == 6
    assert set(RATIO_COLUMNS) <= set(table.columns)
    for r in analysis.ratios:
        row = table[(table["variant"] == r.variant) & (table["seq_len"] == r.seq_len) & (table["page_size"] == r.page_size)]
        assert row["ratio"].item() == pytest.approx(r.ratio, rel=1e-12)
        assert (row["ci_low"].item(), row["ci_high"].item()) == pytest.approx((r.ci_low, r.ci_high), rel=1e-12)
        assert f"| {sig(r.ratio)} | {ci_text(r)} |" in report
    printed = re.findall(r"\| ([\d.,]+) \| \[([\d.,]+), ([\d.,]+)\] \|", report)
    assert printed, "the report prints ratios with their intervals"
    table_cells = {(sig(r.ratio), sig(r.ci_low), sig(r.ci_high)) for r in table.itertuples()}
    assert set(printed) <= table_cells
    assert "no PCIe link was crossed" in report and "pytest bench/" in report and "Kalibera and Jones" in report
    assert "| 64 | int32 | fragmented | seq_len 8192 (crossing in (512, 8192]) |" in report


def test_noisy_rows_and_the_noise_floor_are_stated(tmp_path):
    folder = synthetic_run(tmp_path / "noisy", medians({(512, 16): 1.0}), rep_spread=0.3)
    analysis = analyze(load_run(folder))
    write_report(analysis)
    text = render(analysis)
    assert "2 of 2 rows are noisy (block medians vary by >= 10% between repetitions)" in text
    assert f"**minimum effect is {analysis.noise.min_effect:.1%}**" in text and analysis.noise.min_effect > 0.1
    assert "The list is `noisy.csv`" in text and len(pd.read_csv(folder / "noisy.csv")) == 2


def test_compare_gates_on_ratios_quiet_on_a_rerun_and_catches_a_regression(tmp_path, capsys):
    points = {(512, 16): 1.0, (8192, 16): 1.0, (131072, 16): 1.0}
    a = synthetic_run(tmp_path / "a", medians(points), seed=1, rep_spread=0.05)
    rerun = synthetic_run(tmp_path / "rerun", {k: 1.7 * v for k, v in medians(points).items()}, seed=2,
                          rep_spread=0.05)  # another process: everything 1.7x slower, ratios unchanged
    assert main(["compare", str(a), str(rerun), "--fail-above", "10"]) == 0
    out = capsys.readouterr().out
    assert "OK: no point slower relative to host_stride by more than 10% beyond noise" in out
    assert "absolute: 6 points: 0 faster, 6 slower, 0 same, 0 unclear" in out
    slower = medians(points)
    slower[("device_stride", 8192, 16)] = 13.0  # 30% slower
    slower[("device_stride", 2048, 16)] = 5.0  # only in B
    b = synthetic_run(tmp_path / "b", slower, seed=3, rep_spread=0.05)
    result = compare_runs(load_run(a), load_run(b))
    verdicts = {p.key[3]: p.verdict for p in result.relative.points}
    assert verdicts[8192] == "slower" and {verdicts[512], verdicts[131072]} <= {"same", "unclear"}  # not moved
    assert [k[3] for k in result.only_b] == [2048] and result.only_a == []
    assert main(["compare", str(a), str(b), "--fail-above", "10"]) == 1
    captured = capsys.readouterr()
    assert "FAIL: 1 point(s) slower relative to host_stride by more than 10% beyond noise" in captured.err
    assert "only in B: device_stride int32 fragmented 2048 16" in captured.out
    assert main(["compare", str(a), str(b), "--fail-above", "60"]) == 0
    assert main(["compare", str(a), str(b)]) == 0


def test_noise_prints_the_aa_figures(tmp_path, capsys):
    points = {(512, 16): 1.0, (8192, 16): 2.0, (131072, 16): 0.5}
    a = synthetic_run(tmp_path / "a", medians(points), seed=1, rep_spread=0.05)
    b = synthetic_run(tmp_path / "b", medians(points), seed=2, rep_spread=0.05)
    assert main(["noise", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    for words in ("A/A noise check of device_stride/host_stride", "points with the ratio in both runs: 3",
                  "intervals overlap: 3/3 (100.0%)", "A's ratio inside B's CI:", "median CI width / ratio:",
                  "crossover A: p16: seq_len 131072", "--fail-above 10: OK", "fit for comparisons: "):
        assert words in out


def test_load_run_refuses_a_results_csv_that_its_samples_contradict(tmp_path, crossing_run):
    csv = crossing_run / "results.csv"
    frame = pd.read_csv(csv)
    frame.loc[1, "median_us"] = frame.loc[1, "median_us"] * 1.01  # a hand edit
    frame.to_csv(csv, index=False)
    done = cli("report", str(crossing_run))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "row device_stride int32 fragmented 512 64 says median_us" in done.stderr
    assert "its samples in samples.csv.gz give" in done.stderr  # the file the run holds, as it is named
    assert "the folder was edited or mixed up" in done.stderr


@pytest.mark.parametrize("name", ["samples.csv", "scenario_samples.csv"])
def test_a_run_folder_without_its_samples_is_refused_in_one_line_naming_the_file(tmp_path, name):
    """A sweep's folder copied without a samples file (it had loaded with every interval n/a and every verdict
    unclear, saying nothing); a results CSV with no meta.json beside it still loads without samples."""
    folder = tmp_path / "run"
    shutil.copytree(reference_runs()[-1], folder)
    (folder / f"{name}.gz").unlink()
    done = cli("summary", str(folder))
    table = "results.csv" if name == "samples.csv" else "scenarios.csv"
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"{folder / table}: its " in done.stderr
    assert f"neither {name} nor {name}.gz is beside it" in done.stderr
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(folder / "results.csv", bare / "results.csv")
    assert load_run(bare / "results.csv").samples == {}


def test_a_run_of_an_older_schema_is_refused_in_one_line_naming_its_version(tmp_path):
    folder = synthetic_run(tmp_path / "v3", {("host_stride", 512, 64): 2.0, ("device_stride", 512, 64): 3.0})
    meta = json.loads((folder / "meta.json").read_text())
    meta["schema_version"] = 3
    (folder / "meta.json").write_text(json.dumps(meta))
    done = kvpages_here("report", folder)
    assert done.returncode != 0 and done.stderr.count("\n") == 1 and "schema version 3;" in done.stderr

def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run the kvpages CLI in a fresh interpreter in which `import torch` fails."""
    code = "import sys; sys.modules['torch'] = None; from kvpages.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


EACH = """
import contextlib, io, json, sys, traceback
sys.modules['torch'] = None
from kvpages.cli import main
done = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        except BaseException:  # what the interpreter would print, and its exit status
            traceback.print_exc()
            code = 1
    done.append((argv, code, out.getvalue(), err.getvalue()))
assert not [m for m in sys.modules if m.split(".")[0] == "torch" and sys.modules[m] is not None]
json.dump(done, sys.__stdout__)
"""


def cli_each(*commands: list[str], cwd: Path = REPO) -> list[subprocess.CompletedProcess]:
    """Run kvpages commands one after the other in one fresh interpreter in which `import torch` fails, each command's
    exit status, stdout and stderr kept apart as `cli` gives them: one interpreter's start-up, not one per command."""
    done = subprocess.run([sys.executable, "-c", EACH, json.dumps(commands)], cwd=cwd, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [subprocess.CompletedProcess(argv, code, out, err) for argv, code, out, err in json.loads(done.stdout)]


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


BAD_INPUTS = {
    "missing": (lambda t: t / "missing", "no such file or folder"),
    "empty folder": (lambda t: (t / "empty").mkdir() or t / "empty", "no results.csv here; not a kvpages run folder"),
    "empty file": (lambda t: write(t / "e.csv", b""), "e.csv: empty file"),
    "binary file": (lambda t: write(t / "b.csv", b"\x89PNG\r\n\x1a\n\x00\x00"), "b.csv: binary file"),
    "columns": (lambda t: write(t / "c.csv", b"variant,seq_len\nx,1\n"), "c.csv: missing required columns: device, device_name"),
    "not a csv": (lambda t: write(t / "meta.json", b"{}"), "meta.json: not a CSV; give a run folder or its results.csv"),
}
"""Each bad input a command can be given: how it is made in a folder, and what the error says of it."""
READERS = ("plot", "report", "summary")


@pytest.fixture(scope="module")
def bad_input_errors(tmp_path_factory) -> dict[str, tuple[Path, list[subprocess.CompletedProcess]]]:
    """Each of READERS on each of BAD_INPUTS: the input, and what each command did, all in one torch-less interpreter
    (one start-up, not one per input)."""
    made = {name: make(tmp_path_factory.mktemp("bad")) for name, (make, _) in BAD_INPUTS.items()}
    done = cli_each(*([command, str(target)] for target in made.values() for command in READERS))
    return {name: (target, done[i * len(READERS):(i + 1) * len(READERS)]) for i, (name, target) in enumerate(made.items())}


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_2(bad_input_errors, name):
    target, results = bad_input_errors[name]
    words = BAD_INPUTS[name][1]
    assert [done.args for done in results] == [[command, str(target)] for command in READERS]
    for done in results:
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1 and words in done.stderr and "Traceback" not in done.stderr
        assert done.stderr.startswith(f"kvpages: error: {target}")


def test_nothing_to_plot_and_an_unwritable_folder_are_one_line_errors(tmp_path, crossing_run):
    skipped_only = tmp_path / "skipped"
    skipped_only.mkdir()
    (skipped_only / "meta.json").write_bytes((crossing_run / "meta.json").read_bytes())
    lines = (crossing_run / "results.csv").read_text().splitlines()
    (skipped_only / "results.csv").write_text(lines[0] + "\n" + lines[1].replace(",ok,", ",skipped,") + "\n")
    (crossing_run / "latency_int32_fragmented.png").mkdir()  # a folder where a chart must go
    nothing, unwritable = cli_each(["plot", str(skipped_only)], ["plot", str(crossing_run)])
    assert nothing.returncode == 2 and "no timed rows (status ok), so there is nothing to plot" in nothing.stderr
    assert unwritable.returncode == 2 and unwritable.stderr.count("\n") == 1 and "Traceback" not in unwritable.stderr


def test_a_reader_that_leaves_stops_the_program_quietly_and_another_broken_pipe_is_an_error(monkeypatch, capsys):
    """`kvpages scenarios | head -1`: once the reader is gone, the program stops with exit status 1 and prints nothing
    (it said "kvpages: error: [Errno 32] Broken pipe"); a pipe of its own that breaks is still a one-line error."""
    import os

    from kvpages import cli

    read, write_end = os.pipe()
    os.close(read)  # the reader left before the first line
    with os.fdopen(write_end, "wb") as out:
        done = subprocess.run([sys.executable, "-m", "kvpages", "scenarios", "-v"], stdout=out, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    assert (done.returncode, done.stderr) == (1, "")

    def cmd_list(args) -> int:  # as when a drawing process it writes to has died
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "cmd_list", cmd_list)
    assert main(["list"]) == 2 and capsys.readouterr().err == "kvpages: error: [Errno 32] Broken pipe\n"


def test_incompatible_schema_version_and_nothing_in_common(tmp_path, crossing_run):
    meta = json.loads((crossing_run / "meta.json").read_text())
    meta["schema_version"] = 99
    write(tmp_path / "old" / "meta.json", json.dumps(meta).encode())
    write(tmp_path / "old" / "results.csv", (crossing_run / "results.csv").read_bytes())
    other = synthetic_run(tmp_path / "other", {("host_stride", 77, 7): 1.0})
    old, apart, negative, endless, twice, unknown = cli_each(
        ["report", str(tmp_path / "old")], ["compare", str(crossing_run), str(other)],
        ["compare", str(crossing_run), str(other), "--fail-above", "-3"],
        ["noise", str(crossing_run), str(other), "--fail-above", "inf"],
        ["compare", str(crossing_run), f"{crossing_run}/../{crossing_run.name}"], ["frobnicate"])
    assert old.returncode == 2 and "meta.json: schema version 99; this kvpages reads schema version 5 only" in old.stderr
    assert apart.returncode == 2 and "no timed (variant, point) in common" in apart.stderr
    assert negative.returncode == 2 and negative.stderr.endswith("--fail-above -3.0: give a finite percentage >= 0, e.g. 10\n")
    assert endless.returncode == 2 and "--fail-above inf: give a finite percentage >= 0" in endless.stderr  # gates nothing
    assert twice.returncode == 2 and twice.stderr.count("\n") == 1 and f"given twice (as {crossing_run} too)" in twice.stderr
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1 and "invalid choice: 'frobnicate'" in unknown.stderr


@pytest.mark.skipif(not reference_runs(), reason="no run committed under results/")
def test_plot_report_compare_on_the_committed_reference_run_without_torch(tmp_path):
    import shutil

    run = tmp_path / reference_runs()[-1].name
    shutil.copytree(reference_runs()[-1], run)
    plot, report, compare, summary = cli_each(["plot", str(run), "--svg"], ["report", str(run)],
                                              ["compare", str(run), str(run / "results.csv"), "--fail-above", "0"],
                                              ["summary", str(run)])
    assert plot.returncode == 0, plot.stderr
    charts = [Path(line) for line in plot.stdout.splitlines()]
    assert {p.suffix for p in charts} == {".png", ".svg"} and all(p.stat().st_size > 1000 for p in charts)
    assert report.returncode == 0, report.stderr
    assert (run / "REPORT.md").read_text() == report.stdout.rstrip("\n") + "\n"
    assert "## Crossover" in report.stdout and (run / "ratios.csv").stat().st_size > 0
    assert compare.returncode == 0, compare.stderr
    assert "relative: " in compare.stdout and " 0 slower" in compare.stdout.split("relative: ")[-1]
    assert summary.returncode == 0 and "page_size=64" in summary.stdout


def test_kvpages_list_prints_the_registry():
    from kvpages.measure.variants import all_variants

    done = kvpages_here("list")
    assert done.returncode == 0, done.stderr
    for v in all_variants():
        assert v.name in done.stdout and v.description in done.stdout
    variants, steps = done.stdout.split("\n\n")
    for table in (variants.splitlines(), steps.splitlines()[1:]):  # each a table: its columns line up
        assert len(table) > 1 and len({line.index(" requires=") for line in table}) == 1
        assert len({line.index(v.description) for line in table for v in all_variants() if v.description in line}) <= 1


def test_summary_and_cite_mark_a_fragile_verdict_as_the_reports_tables_do():
    """The reference run's fragile per-call row: 'slower, *fragile*' in `kvpages summary`'s table and in its `kvpages
    cite` line, as in REPORT.md (both had printed 'slower' alone)."""
    reference = reference_runs()[-1]
    ratios = pd.read_csv(reference / "ratios.csv")
    fragile = ratios[ratios["stability"] == "fragile"]
    assert len(fragile) == 1, "the reference run's one fragile row this test reads"
    row = fragile.iloc[0]
    summary, cited = cli_each(["summary", str(reference)], ["cite", str(reference), str(row["id"])])
    assert summary.returncode == 0 and cited.returncode == 0, summary.stderr + cited.stderr
    line = next(x for x in summary.stdout.splitlines() if x.split()[:2] == [str(row["seq_len"]), str(row["variant"])]
                and f"{row['ratio']:.3g}" in x)
    assert line.endswith(f"{row['verdict']}, *fragile*")
    assert f"({row['verdict']}, *fragile*); " in cited.stdout
    assert f"{row['verdict']}, *fragile*" in (reference / "REPORT.md").read_text()


def test_an_argument_a_command_does_not_take_is_refused_by_that_command_naming_its_options(tmp_path):
    """`kvpages list -x` used to say only "kvpages: error: unrecognized arguments: -x"; a file a command cannot read
    is named with the reason, without Python's errno prefix."""
    page = tmp_path / "nope.md"
    listed, plotted, cited, options, first = cli_each(
        ["list", "-x"], ["plot", "results", "--svgg"], ["cite", "results", "r-1", "r-2"],
        ["options", "--markdown", str(page)], ["--bogus", "list"])
    assert first.returncode == 2 and first.stderr == "kvpages: error: unrecognized arguments: --bogus (see kvpages --help)\n"
    assert listed.returncode == 2 and listed.stderr == (
        "kvpages list: error: unrecognized arguments: -x; its options: -v/--verbose (see kvpages list --help)\n")
    assert plotted.returncode == 2 and plotted.stderr == ("kvpages plot: error: unrecognized arguments: --svgg; its "
                                                          "options: --svg, --link-profile (see kvpages plot --help)\n")
    assert cited.returncode == 2 and cited.stderr.startswith("kvpages cite: error: unrecognized arguments: r-2; its")
    assert options.returncode == 2 and options.stderr == f"kvpages: error: {page}: No such file or directory\n"


def test_a_cuda_run_compares_the_model_with_the_measurement(tmp_path):
    from kvpages.core.links import profile_for
    from kvpages.schema.profiles import built_in_profiles

    profiles = built_in_profiles()
    times = medians({(8192, 64): 0.5, (8192, 1): 2.0}) | {("host_stride", 8192, 1): 4.0}  # pre-PR's stride: 6 µs
    folder = synthetic_run(tmp_path / "cuda", times)
    csv = (folder / "results.csv").read_text().replace("none (cpu)", "pcie pageable")
    (folder / "results.csv").write_text(csv)
    meta = json.loads((folder / "meta.json").read_text())
    meta["environment"].update(device="cuda", pcie_link="Gen1 x16 (max Gen5 x16)", link_crossed=True,
                               pcie_link_loaded="Gen5 x16 (max Gen5 x16)",
                               link_note="CUDA run: d2h_bytes crossed the device-host link.")
    (folder / "meta.json").write_text(json.dumps(meta))
    run = load_run(folder)
    profile = profile_for("Gen1 x16 (max Gen5 x16)", "pcie pageable", profiles)  # an idle link: the maximum counts
    assert profile is not None and profile.name == "pcie5_pageable"
    assert profile_for("Gen4 x16", "pcie pinned", profiles).name == "pcie4_pinned"
    assert profile_for(None, "pcie pinned", profiles) is None and profile_for("Gen5 x16", "none (cpu)", profiles) is None
    assert profile_for("unknown", "pcie pinned", profiles) is None
    text = render(analyze(run)) + render_appendix(analyze(run))
    assert "#### Model vs measurement" in text and "no PCIe link was crossed" not in text
    assert "under load Gen5 x16 (max Gen5 x16)" in text
    rows = run.ok_rows()
    host = rows[(rows["variant"] == "host_stride") & (rows["page_size"] == 64)].iloc[0]
    analysis = analyze(run)
    time = analysis.time_of(host.to_dict())
    twin = analysis.time_of(rows[(rows["variant"] == "host_stride") & (rows["page_size"] == 1)].iloc[0].to_dict())
    modeled = profile.predicted_us("host_stride", 64, 1, host["d2h_bytes"], host["d2h_transfers"], time - twin)
    assert modeled == pytest.approx(time - twin + profile.us("sync_us") + profile.us("copy_us")  # its copy priced once
                                    + host["d2h_bytes"] / (profile.us("bandwidth_gb_s") * 1e3))
    assert f"| {sig(time)} | {sig(modeled)} | {sig(time - modeled)} |" in text


def test_a_finished_runs_sample_files_are_gzip_and_read_back_the_same(tmp_path):
    """A finished run keeps its per-round files gzip-compressed (the CSV it appended while running, byte for byte
    inside); load_run reads them as it reads a plain CSV (an interrupted run's); a cut-off one is a one-line error."""
    folder = synthetic_run(tmp_path / "run", {("device_stride", 512, 1): 3.0, ("host_stride", 512, 1): 2.0})
    packed = folder / "samples.csv.gz"
    assert packed.is_file() and not (folder / "samples.csv").exists() and sample_file(folder, "samples.csv") == packed
    text = gzip.decompress(packed.read_bytes()).decode()
    assert text.splitlines()[0].startswith("variant,dtype,layout,seq_len,page_size,repetition")
    plain = tmp_path / "plain"
    shutil.copytree(folder, plain)
    (plain / "samples.csv").write_text(text)
    (plain / "samples.csv.gz").unlink()
    a, b = load_run(folder), load_run(plain)
    assert a.samples.keys() == b.samples.keys()
    assert all(np.array_equal(x, y) for k in a.samples for x, y in zip(a.samples[k], b.samples[k], strict=True))
    packed.write_bytes(packed.read_bytes()[:40])
    done = kvpages_here("report", folder)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "samples.csv.gz: not a complete gzip file" in done.stderr


def test_the_sample_files_are_compressed_as_they_grow_byte_for_byte_or_from_the_file(tmp_path):
    """The session compresses each per-round file as its blocks are appended (kvpages.schema.writer.Gzipping): the
    finished .gz holds what was appended, byte for byte, and no hidden stream is left. A CSV that changed behind the
    stream (a digit edited by hand, the size the same) is compressed from the file itself: the .gz holds the file."""
    from kvpages.schema.meta import RunTiming
    from kvpages.schema.rows import POINTS, SampleSet
    from kvpages.schema.writer import RunWriter

    source = load_run(synthetic_run(tmp_path / "source", {("host_stride", 512, 1): 2.0}, repetitions=3))
    for edited in (False, True):
        folder = tmp_path / f"run-{edited}"
        folder.mkdir()
        writer = RunWriter(folder, source.meta)
        for r, block in enumerate(source.samples[("host_stride", "int32", "fragmented", 512, 1)]):
            writer.add_samples(POINTS, [SampleSet("host_stride", "int32", "fragmented", 512, 1, r, r, 0,
                                                  tuple(float(x) for x in block))])
        plain = folder / "samples.csv"
        if edited:  # the same size, another byte: the file is what the .gz holds
            data = bytearray(plain.read_bytes())
            data[-2] = ord("9") if data[-2] != ord("9") else ord("8")
            plain.write_bytes(bytes(data))
        appended = plain.read_bytes()
        writer.finish(True, "all rows recorded", RunTiming(1.0))
        assert not plain.exists() and sorted(p.name for p in folder.iterdir()) == ["meta.json", "results.csv",
                                                                                   "samples.csv.gz"]
        assert gzip.decompress((folder / "samples.csv.gz").read_bytes()) == appended


def test_a_cuda_run_prices_pre_prs_copy_once(tmp_path):
    """On a CUDA run pre-PR's time holds its copy: its host work is what its stride adds to the same copy at page size
    1, never its whole time, so a prediction of it is host work + one copy, and one of the merged PR at p=1 is one
    kernel more than pre-PR's (the H200 run's 2.2 against a measured 2.3, where adding its whole time gave 0.33-1.05)."""
    from kvpages.analysis.hostwork import point_host_work
    from kvpages.analysis.predict import point_predictions

    times = {("host_stride", 8192, 1): 40.0, ("device_stride", 8192, 1): 60.0, ("host_stride", 8192, 64): 70.0,
             ("device_stride", 8192, 64): 30.0}
    folder = synthetic_run(tmp_path / "cuda", times, spread=0.001, rep_spread=0.001)
    csv = (folder / "results.csv").read_text().replace("none (cpu)", "pcie pageable")
    (folder / "results.csv").write_text(csv)
    meta = json.loads((folder / "meta.json").read_text())
    meta["environment"].update(device="cuda", pcie_link="Gen5 x16", link_crossed=True, link_note="CUDA run.")
    (folder / "meta.json").write_text(json.dumps(meta))
    analysis = analyze(load_run(folder))
    rows = {(r["variant"], r["page_size"]): r for r in analysis.run.ok_rows().to_dict("records")}
    assert point_host_work(analysis, "host_stride", rows[("host_stride", 1)]).us == 0.0
    assert point_host_work(analysis, "host_stride", rows[("host_stride", 64)]).us == pytest.approx(30.0, rel=0.01)
    for r in analysis.ratios_of("device_stride"):
        for p in point_predictions(analysis, r):
            copy = p.profile.modeled_us(r.baseline_d2h_bytes, 1)  # one blocking copy: fixed cost, sync and bytes
            host = 0.0 if r.page_size == 1 else 30.0
            assert p.baseline_us == pytest.approx(host + copy, rel=0.01), (r.page_size, p.profile.name)
            if r.page_size == 1:  # the merged PR: the same copy and one kernel more
                assert p.variant_us - p.baseline_us == pytest.approx(p.profile.us("launch_us") + p.profile.us("kernel_us"))


def test_summary_says_the_plan_and_what_re_measurement_added_and_noise_refuses_a_variant_neither_run_has(tmp_path):
    """The reference run planned 6 repetitions in 6 processes; a re-measurement process added a seventh repetition to
    some rows. `summary` once said '7 interleaved repetitions per (variant, point) in 7 process(es)'. `noise --variant`
    naming a variant the runs lack once ended in a traceback (a NaN width formatted as a bound)."""
    reference = reference_runs()[-1]
    meta = json.loads((reference / "meta.json").read_text())
    rows = pd.read_csv(reference / "results.csv")
    ok = rows[rows["status"] == "ok"]
    extra = sum(p["role"] == "remeasure" for p in meta["processes"])
    twin = tmp_path / reference.name  # a copy: the run itself given twice is refused first
    shutil.copytree(reference, twin)
    summary, noise = cli_each(["summary", str(reference)],
                              ["noise", str(reference), str(twin), "--variant", "no_such_variant"])
    said = (f"{meta['repetitions']} interleaved repetition(s) per (variant, point) in {len(meta['processes']) - extra} "
            "process(es)")
    assert summary.returncode == 0 and said in summary.stdout
    if extra:
        added = int((ok["repetitions"] > meta["repetitions"]).sum())
        assert f", and {extra} re-measurement process(es) that added repetitions to {added} of {len(ok)} per-call rows" \
            in summary.stdout
    assert noise.returncode == 2 and noise.stderr.count("\n") == 1 and "Traceback" not in noise.stderr
    assert noise.stderr.startswith("kvpages: error: --variant 'no_such_variant': no ratio of it in both runs; theirs: ")
