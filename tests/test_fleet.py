"""`kvpages fleet` on real run folders: copies of the committed reference run, each copy's meta.json changed to stand
for another machine (nothing under results/ is edited)."""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, built_once, kvpages_here, reference_runs, synthetic_run

from kvpages.analysis.cache import Loaded
from kvpages.analysis.cite import sig
from kvpages.analysis.findings import findings
from kvpages.analysis.fleet import Fleet, analysed, fleet_of
from kvpages.analysis.intervals import levels
from kvpages.analysis.machines import Machine
from kvpages.core.estimator import paired_ratio
from kvpages.core.stats import Levels, aligned
from kvpages.render.fleet import FLEET_MD, render, write_fleet
from kvpages.render.fleet_chart import CHART_PNG
from kvpages.render.report import write_report
from kvpages.schema.meta import Environment
from kvpages.schema.reader import load_run, sample_file
from kvpages.schema.rows import ratio_id

pytestmark = pytest.mark.skipif(not reference_runs(), reason="no run committed under results/")
REF = reference_runs()[-1] if reference_runs() else Path("none")
REF_ID = REF.name
REF_ENV = json.loads((REF / "meta.json").read_text())["environment"] if reference_runs() else {}
REF_HOST = REF_ENV.get("hostname")
"""The reference run's id and host (None in a run recorded before meta.json had it: host unknown)."""
REF_MACHINE = Machine.of(Environment(**REF_ENV)).describe() if REF_ENV else ""
"""How the reference run's machine is named (with its cpu_id where it recorded one)."""
SLOWER_BY = 2.0
"""Machine B's device_stride takes this many times as long as the reference's (exact in binary: medians scale exactly)."""


def machine(tmp: Path, name: str, run_id: str | None = None, source: Path = REF, **environment: object) -> Path:
    """A copy of the reference run (or of `source`, a copy of it) as the run of another machine (`environment`
    fields changed in meta.json)."""
    folder = tmp / name
    shutil.copytree(source, folder)
    meta = json.loads((folder / "meta.json").read_text())
    meta["environment"].update(environment)
    if run_id is not None:
        meta["run_id"] = run_id
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def rewrite(path: Path, change) -> None:
    path = sample_file(path.parent, path.name)  # a finished run's per-round files are .csv.gz (pandas writes it back)
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    fast = {"method": "gzip", "compresslevel": 1, "mtime": 0} if path.suffix == ".gz" else None  # a test's copy: level 1
    change(frame).to_csv(path, index=False, compression=fast)


def slow_down(folder: Path, variant: str, factor: float) -> None:
    """Every timed sample of `variant` `factor` times as long (results.csv's times with it), then re-reported from an
    analysis kept for the folder as it now stands (the fleet's `analysed` reads it, instead of analysing it again)."""
    def samples(frame: pd.DataFrame) -> pd.DataFrame:
        mask = frame["variant"] == variant
        frame.loc[mask, "samples_us"] = [" ".join(repr(float(x) * factor) for x in s.split())
                                         for s in frame.loc[mask, "samples_us"]]
        return frame

    def results(frame: pd.DataFrame) -> pd.DataFrame:
        mask = (frame["variant"] == variant) & (frame["status"] == "ok")
        for column in ("median_us", "q1_us", "q3_us", "iqr_us", "min_us", "max_us", "mean_us", "stddev_us"):
            frame.loc[mask, column] = [repr(float(v) * factor) for v in frame.loc[mask, column]]
        return frame

    rewrite(folder / "samples.csv", samples)
    rewrite(folder / "results.csv", results)
    write_report(Loaded.of(folder).analysis)


def drop(folder: Path, variant: str, page_size: int, scenario: str) -> None:
    """Remove `variant`'s rows at `page_size` and the scenario `scenario`, as a machine that did not time them."""
    def points(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[~((frame["variant"] == variant) & (frame["page_size"] == str(page_size)))]

    def scenarios(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[frame["scenario"] != scenario]

    for name, change in (("results.csv", points), ("samples.csv", points), ("scenarios.csv", scenarios),
                         ("scenario_samples.csv", scenarios)):
        rewrite(folder / name, change)


@pytest.fixture(scope="module")
def folders(request: pytest.FixtureRequest) -> dict[str, Path]:
    """a: the reference as it is; a2: a second run of a's machine; b: another host whose device_stride is 2x slower;
    c: a third host that did not time device_shift at page size 16, nor one scenario. Each is a copy of the reference
    as this code reports it (its ratios.csv), b's re-reported once slowed down; made once per session (`built_once`)."""
    def build(tmp: Path) -> None:
        reported = request.getfixturevalue("reported_reference").path
        for name, changes in MACHINES.items():
            machine(tmp, name, source=reported, **changes)
        slow_down(tmp / "b", "device_stride", SLOWER_BY)
        scenario = pd.read_csv(tmp / "c" / "scenarios.csv")["scenario"].iloc[0]
        drop(tmp / "c", "device_shift", 16, scenario)

    tmp = built_once(request.config, "fleet", build)
    return {name: tmp / name for name in MACHINES}


MACHINES: dict[str, dict[str, str]] = {
    "a": {}, "a2": {"run_id": "20261205T000000Z-cpu"},
    "b": {"run_id": "20261206T000000Z-cpu", "hostname": "box-b", "device_name": "AMD EPYC 9654"},
    "c": {"run_id": "20261207T000000Z-cpu", "hostname": "box-c"}}
"""The fleet's run folders (`folders`), each a copy of the reference with these meta.json changes."""


@pytest.fixture(scope="module")
def a_b(folders, tmp_path_factory) -> tuple[Fleet, str]:
    fleet = fleet_of(analysed([folders["a"], folders["b"]]))
    out = tmp_path_factory.mktemp("out")
    write_fleet(fleet, out)
    return fleet, (out / FLEET_MD).read_text()


def ratio_count(folder: Path) -> int:
    """The rows of a run's ratios.csv: every (variant, point) against pre-PR."""
    return len(pd.read_csv(folder / "ratios.csv"))


def section(report: str, title: str) -> str:
    return report.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("|---")]


def side_by_side(report: str) -> dict[str, list[str]]:
    """The ratio table's cells by ratios.csv id: one cell per machine."""
    cells: dict[str, list[str]] = {}
    for part in section(report, "Ratios per point, side by side").split("### page_size ")[1:]:
        page_size, rest = part.split(" ", 1)
        dtype, layout = rest[1:].split(")", 1)[0].split(", ")
        for row in table_rows(part)[1:]:
            variant, seq_len, *machines, _ = row
            cells[ratio_id(variant.strip("`"), "host_stride", dtype, layout, int(seq_len), int(page_size))] = machines
    return cells


def csv_cell(r: pd.Series) -> str:
    """A row as its fleet cell prints it: a fragile or disturbed verdict says so."""
    marked = "" if r["stability"] == "stable" else f", *{r['stability']}*"
    return f"{sig(r['ratio'])} [{sig(r['ci_low'])}, {sig(r['ci_high'])}] {r['verdict']}{marked}"


@pytest.mark.early
def test_each_single_run_machine_shows_its_own_ratios_csv(folders, a_b):
    fleet, report = a_b
    cells = side_by_side(report)
    own = [pd.read_csv(folders[name] / "ratios.csv").set_index("id") for name in ("a", "b")]
    assert set(cells) == set(own[0].index) == set(own[1].index) and len(cells) == ratio_count(folders["a"])
    for row_id, machines in cells.items():
        assert machines == [csv_cell(ratios.loc[row_id]) for ratios in own], row_id
    for matched in fleet.ratios:  # the analysis, to full precision
        for row, ratios in zip(matched.rows, own, strict=True):
            written = ratios.loc[row.id]
            assert (row.ratio, row.ci_low, row.ci_high) == pytest.approx(
                (written["ratio"], written["ci_low"], written["ci_high"]), rel=1e-12)
            assert row.verdict == written["verdict"]
    candidate = "r-device_stride-s8192-p64-int32-fragmented"  # the columns differ where the machines do
    assert own[1].loc[candidate, "ratio"] == pytest.approx(SLOWER_BY * own[0].loc[candidate, "ratio"])


def test_findings_and_scenarios_are_each_machines_own(folders, a_b):
    fleet, report = a_b
    rows = table_rows(section(report, "Findings per machine"))
    assert rows[0] == ["question", "M1", "M2"]
    page1 = next(r for r in rows if r[0] == "Page size 1: per call and per step")
    for cell, name in zip(page1[1:], ("a", "b"), strict=True):  # a CPU run's prediction, from each machine's own run
        own = next(f for f in findings(Loaded.of(folders[name]).analysis)  # that folder's analysis (kept, or made now)
                   if f.question == "Page size 1: per call and per step")
        assert own.figure in cell and f"`{own.id}`" in cell
    scenario_ratios = pd.read_csv(folders["b"] / "scenario_ratios.csv")
    blocked = scenario_ratios[scenario_ratios["latency"] == "blocked"].iloc[0]
    line = next(r for r in table_rows(section(report, "Whole requests and steps, side by side"))
                if r[0] == f"`{blocked['id']}`" and r[1] == "blocked")
    assert line[3] == csv_cell(blocked)
    assert len(fleet.scenario_ratios) == len(scenario_ratios) and not fleet.scenario_missing


def test_the_environments_table_tells_the_machines_apart(a_b):
    fleet, report = a_b
    assert [m.machine.hostname for m in fleet.members] == [REF_HOST, "box-b"]
    table = {row[0]: row[1:] for row in table_rows(section(report, "Machines"))}
    assert table[""] == ["M1", "M2"]
    assert table["host"] == [REF_HOST or "-", "box-b"] and table["device name"] == ["AMD EPYC", "AMD EPYC 9654"]
    assert table["runs"] == [f"`{REF_ID}`", "`20261206T000000Z-cpu`"]
    assert table["torch"] == ["2.13.0+cpu"] * 2 and table["sweep"] == ["preset default"] * 2
    assert "All 2 runs are of one sweep (preset default)." in report


def test_two_runs_of_one_machine_are_one_column_whose_intervals_resample_both_runs(folders):
    fleet = fleet_of(analysed([folders["a"], folders["b"], folders["a2"]]))
    assert [len(m.runs) for m in fleet.members] == [2, 1]
    pooled = fleet.members[0].analysis
    a, a2 = load_run(folders["a"]), load_run(folders["a2"])
    assert a.meta is not None
    # a2 is a copy of the reference run a; a re-measured row holds more than the plan's repetitions, so the run's count
    # is its rows' most (as the noise floor gives it), each point's its own
    reps, procs = 2 * int(a.rows["repetitions"].max()), 2 * len(a.meta.processes)
    assert pooled.noise.processes == procs and pooled.noise.repetitions == reps
    # at each point whose pooled pair left no process out, the pooled ratio is the paired ratio of the two runs'
    # levels side by side, each run's pair aligned on the repetitions both variants timed (a re-measurement round
    # times the baseline again at a target where any variant was not settled, not every variant)
    compared, a_alone = 0, Loaded.of(folders["a"]).analysis  # a's own analysis (kept, or made now)
    for seq_len in sorted(set(a.rows["seq_len"])):
        keys = [(v, "int32", "fragmented", seq_len, 64) for v in ("host_stride", "device_stride")]
        found = pooled.ratio_at("device_stride", "int32", "fragmented", 64, seq_len)
        runs = [aligned(*(levels(run, key) for key in keys)) for run in (a, a2)]
        if found is None or found.left_out:
            continue
        pooled_levels = [Levels(np.concatenate([runs[0][k].values, runs[1][k].values]),
                                np.concatenate([runs[0][k].processes, runs[1][k].processes + procs // 2]))
                         for k in (0, 1)]
        expected = paired_ratio(*pooled_levels).interval
        assert (found.ratio, found.ci_low, found.ci_high) == (expected.ratio, expected.ci_low, expected.ci_high)
        own = runs[0][1]
        assert found.repetitions == 2 * own.values.size and found.processes == 2 * np.unique(own.processes).size
        alone = a_alone.ratio_at("device_stride", "int32", "fragmented", 64, seq_len)
        assert alone is not None and (found.ci_low, found.ci_high) != (alone.ci_low, alone.ci_high)
        compared += 1
    assert compared >= 3
    # a re-measured point's baseline has blocks its variant lacks: pooled, each run's are paired by repetition id
    assert all(0 < r.ci_low <= r.ratio <= r.ci_high < float("inf") for r in pooled.ratios)
    report = render(fleet)
    table = {row[0]: row[1:] for row in table_rows(section(report, "Machines"))}
    assert table[""] == ["M1", "M2"] and table["runs"][0] == f"`{REF_ID}`, `20261205T000000Z-cpu`"
    from kvpages.analysis.wording import repetitions_text  # each run's plan and what its re-measurement added

    said = repetitions_text(a)
    assert table["repetitions, processes"][0] == said and said.startswith(f"{a.meta.repetitions} interleaved repetition(s)")



def test_points_one_machine_lacks_are_listed_not_guessed(folders):
    fleet = fleet_of(analysed([folders["a"], folders["c"]]))
    lacking = {ratio_id(*m.key) for m in fleet.missing}
    lengths = sorted(set(pd.read_csv(folders["a"] / "results.csv")["seq_len"]))
    expected = {ratio_id("device_shift", "host_stride", "int32", "fragmented", s, 16) for s in lengths}
    assert lacking == expected and {(m.on, m.not_on) for m in fleet.missing} == {(("M1",), ("M2",))}
    assert len(fleet.ratios) == ratio_count(folders["a"]) - len(lengths) and not {ratio_id(*m.key) for m in fleet.ratios} & expected
    scenario = pd.read_csv(folders["a"] / "scenarios.csv")["scenario"].iloc[0]
    assert fleet.scenario_missing and {m.key[0] for m in fleet.scenario_missing} == {scenario}
    report = render(fleet)
    listed = {row[0].strip("`"): row[1:] for row in table_rows(section(report, "Not on every machine"))}
    assert all(listed[i] == ["M1", "M2"] for i in expected)
    assert not set(side_by_side(report)) & expected


def test_runs_of_different_sweeps_compare_their_shared_points_and_say_so(folders, tmp_path):
    other = machine(tmp_path, "d", hostname="box-d")
    meta = json.loads((other / "meta.json").read_text())
    meta.update(preset="quick", options={"--kv-preset": "quick", "--kv-page-sizes": "1,16,64,128", "--kv-device": "cpu"})
    (other / "meta.json").write_text(json.dumps(meta))
    fleet = fleet_of(analysed([folders["a"], other]))
    assert not fleet.one_sweep and len(fleet.ratios) == ratio_count(folders["a"])
    assert (f"**The runs are of different sweeps** (`{REF_ID}`: preset default; `{REF_ID}`: "
            "preset quick --kv-page-sizes 1,16,64,128)") in render(fleet)


def test_machine_identity_and_the_host_name(tmp_path):
    names = [f.name for f in fields(Environment)]
    assert all(f.default is not MISSING for f in fields(Environment)[names.index("hostname"):])  # old files load
    older = machine(tmp_path, "older")  # a meta.json written before the field: host unknown
    meta = json.loads((older / "meta.json").read_text())
    meta["environment"].pop("hostname", None)
    (older / "meta.json").write_text(json.dumps(meta))
    reference = load_run(older).meta
    assert reference is not None and reference.environment.hostname is None
    env = reference.environment
    idle = Environment(**{**env.__dict__, "device": "cuda", "pcie_link": "Gen1 x16 (max Gen5 x16)", "hostname": "h",
                          "cpu_id": None})  # a CUDA box that did not record its CPU
    loaded = Environment(**{**idle.__dict__, "pcie_link": "Gen5 x16 (max Gen5 x16)"})
    assert Machine.of(idle) == Machine.of(loaded) and Machine.of(idle).pcie_link == "Gen5 x16"
    assert Machine.of(idle) != Machine.of(Environment(**{**idle.__dict__, "hostname": "other"}))
    assert Machine.of(idle).describe() == f"{env.device_name} @ h, driver {env.driver_version}, PCIe Gen5 x16"
    milan, genoa = ("vendor AuthenticAMD family 25 model 1 stepping 1 microcode 0x1000065, L3 32768K",
                    "vendor AuthenticAMD family 25 model 17 stepping 1 microcode 0xa101148, L3 32768K")
    cpu = Environment(**{**env.__dict__, "hostname": "h", "cpu_id": milan})
    assert Machine.of(cpu).describe() == f"{env.device_name} ({milan}) @ h"
    assert Machine.of(Environment(**{**idle.__dict__, "cpu_id": milan})).describe().endswith(f", CPU {milan}")
    unrecorded = Environment(**{**cpu.__dict__, "cpu_id": None})
    assert Machine.of(cpu) != Machine.of(unrecorded)  # not pooled with a run that cannot say...
    assert Machine.of(cpu).differences(Machine.of(unrecorded)) == []  # ...nor said to differ
    assert Machine.of(cpu).differences(Machine.of(Environment(**{**cpu.__dict__, "cpu_id": genoa}))) == [
        ("CPU", milan, genoa)]
    gpus = [Machine.of(Environment(**{**loaded.__dict__, "gpu_uuid": f"GPU-{n}" * 4})) for n in "ab"]  # one VM name
    assert gpus[0] != gpus[1] and gpus[0].differences(gpus[1]) == [("GPU", "GPU-aGPU-aGPU-aGPU-a", "GPU-bGPU-bGPU-bGPU-b")]
    assert gpus[0].describe().endswith(", PCIe Gen5 x16, GPU-aGPU-aGP")  # its first 12 characters
    from kvpages.measure.environment import capture, cpu_id

    captured = capture("cpu", REPO)
    assert captured.hostname == socket.gethostname()
    if Path("/proc/sys/kernel/random/boot_id").is_file():  # Linux
        assert captured.cpu_id == cpu_id() and captured.cpu_id
        assert captured.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def kvpages_without_torch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`kvpages ARGS` in a fresh interpreter where importing torch fails; it checks torch was never imported."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from kvpages.cli import main\n"
            f"code = main({list(args)!r})\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
            "sys.exit(code)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_the_command_writes_the_report_and_chart_without_torch_and_never_overwrites(folders, tmp_path):
    out = tmp_path / "out"
    done = kvpages_without_torch("fleet", str(folders["a"]), str(folders["b"]), "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(out / FLEET_MD), str(out / CHART_PNG)]
    assert (out / CHART_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"![{CHART_PNG}]({CHART_PNG})" in (out / FLEET_MD).read_text()
    written = (out / FLEET_MD).read_text()
    again = kvpages_here("fleet", folders["a"], folders["b"], "--out", out, cwd=tmp_path)  # torch-free shown above
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "never overwrites" in again.stderr
    assert (out / FLEET_MD).read_text() == written
    default = kvpages_here("fleet", folders["a"], folders["b"], cwd=tmp_path)
    assert default.returncode == 0, default.stderr
    made = [p for p in tmp_path.iterdir() if p.name.startswith("fleet-")]
    assert len(made) == 1 and (made[0] / FLEET_MD).is_file()




@pytest.mark.parametrize(("case", "says"), [
    ("missing", "no such file or folder"),
    ("not a run", "not a kvpages run folder"),
    ("a file", "not a folder; kvpages fleet takes run folders"),
    ("one run", "give two or more run folders"),
    ("twice", "given twice"),
    ("one machine", f"every run is of one machine ({REF_MACHINE})"),
    ("no shared point", "the machines share no timed point"),
    ("out is a file", "not a folder"),
])
def test_bad_input_is_one_line_exit_2_before_any_work(folders, tmp_path, case, says):
    a = str(folders["a"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    out = tmp_path / "out"
    args = {
        "missing": [a, str(tmp_path / "nope")],
        "not a run": [a, str(tmp_path / "empty")],
        "a file": [a, str(tmp_path / "file.txt")],
        "one run": [a],
        "twice": [a, str(folders["a"].parent / ".." / folders["a"].parent.name / "a")],
        "one machine": [a, str(folders["a2"])],
        "no shared point": [a, str(synthetic_run(tmp_path / "synthetic", {("host_stride", 100, 4): 1.0,
                                                                          ("device_stride", 100, 4): 1.0}))],
        "out is a file": [a, str(folders["b"])],
    }[case]
    given_out = tmp_path / "file.txt" if case == "out is a file" else out
    done = kvpages_here("fleet", *args, "--out", given_out, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr and says in done.stderr, done.stderr
    assert not out.exists()
    if case == "no shared point":
        assert f"{REF_ID}: preset default" in done.stderr and "synthetic: preset test" in done.stderr


def test_a_fleet_is_not_a_gate_and_the_chart_covers_every_shared_point(folders, tmp_path):
    fast = machine(tmp_path, "e", run_id="20261208T000000Z-cpu", hostname="box-e")
    slow_down(fast, "device_stride", 0.125)  # e's device_stride 8x as fast (exact in binary): slower becomes faster
    fleet = fleet_of(analysed([folders["a"], fast]))
    report = render(fleet)
    assert any(not m.agree for m in fleet.ratios)  # the verdicts differ, and still no gate
    assert "verdicts differ at" in report and "`kvpages compare A B --fail-above PCT` is the gate" in report
    assert math.isfinite(fleet.ratios[0].rows[0].ratio)


def test_the_committed_h200_runs_are_two_gpus_and_a_pooled_machine_of_two_sweeps_says_so(tmp_path):
    """The three H200 runs ran on two VMs of one name, driver and link but two GPUs (meta.json's `gpu_uuid`): two
    machines, not one; the quick runs' machine pools runs of two sweeps, so its findings are over the points both
    timed, and FLEET.md says so instead of 'as its own report states them'."""
    h200 = sorted(p for p in (REPO / "results").glob("*-cuda-*") if (p / "meta.json").is_file())
    if len(h200) < 3:
        pytest.skip("the three H200 runs are not committed here")
    fleet = fleet_of(analysed(h200))
    uuids = [json.loads((p / "meta.json").read_text())["environment"]["gpu_uuid"] for p in h200]
    assert [m.machine.gpu_uuid for m in fleet.members] == list(dict.fromkeys(uuids)) and len(fleet.members) == 2
    assert [len(m.runs) for m in fleet.members] == [uuids.count(u) for u in dict.fromkeys(uuids)]
    pooled = next(m for m in fleet.members if len(m.runs) > 1)
    text = render(fleet)
    from kvpages.analysis.fleet import sweep_of

    assert len({sweep_of(r.meta) for r in pooled.runs if r.meta is not None}) == 2  # quick, and quick in 2 processes
    assert f"({pooled.id}: runs of different sweeps, pooled where every one of its runs timed a row" in text
