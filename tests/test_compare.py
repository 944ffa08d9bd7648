"""`kvpages compare`: its verdicts are `judge`'s, its gate keeps its own threshold, and its markdown and JSON formats,
on two real quick runs."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import Rehearsal, kvpages_here, synthetic_run

from kvpages.analysis.cite import sig
from kvpages.analysis.compare import compare_runs
from kvpages.analysis.verdicts import FDR, MIN_EFFECT_FLOOR, SAME, SLOWER, VERDICTS, judge
from kvpages.render.compare import FORMATS
from kvpages.schema.compare import ComparedPoint, ComparisonDocument
from kvpages.schema.reader import load_run

POINTS = {(v, s, p): m for s in (512, 8192, 131072) for p in (1, 64)
          for v, m in (("host_stride", 10.0), ("device_stride", 20.0))}


def cli(*args: str) -> subprocess.CompletedProcess:
    return kvpages_here(*args)


def test_compare_s_verdicts_are_judge_s_with_the_family_s_minimum_effect_and_correction(tmp_path):
    a = synthetic_run(tmp_path / "a", POINTS, seed=1, rep_spread=0.002, spread=0.001)
    shifted = dict(POINTS)
    shifted["device_stride", 8192, 64] = 20.0 * 1.012  # 1.2% slower: beyond this quiet run's noise, not the 2% floor
    shifted["device_stride", 131072, 64] = 20.0 * 1.3  # 30% slower
    b = synthetic_run(tmp_path / "b", shifted, seed=2, rep_spread=0.002, spread=0.001)
    result = compare_runs(load_run(a), load_run(b))
    for family in (result.relative, result.absolute):
        for p in family.points:
            assert p.verdict == judge(p.interval, family.min_effect, p.q_value <= FDR)
    assert result.relative.min_effect == MIN_EFFECT_FLOOR  # the quiet family's noise floor is below the floor
    small = next(p for p in result.relative.points if p.key[3:] == (8192, 64))
    assert small.interval.ci_low > 1 and small.verdict == SAME  # the interval alone would have called it slower
    assert next(p for p in result.relative.points if p.key[3:] == (131072, 64)).verdict == SLOWER
    done = cli("compare", str(a), str(b), "--fail-above", "0.5")  # the gate keeps its own threshold
    assert done.returncode == 1 and "FAIL: 2 point(s) slower relative to host_stride by more than 0.5%" in done.stderr
    assert cli("compare", str(a), str(b), "--fail-above", "10").returncode == 1
    assert cli("compare", str(a), str(b), "--fail-above", "40").returncode == 0


@pytest.fixture(scope="module")
def two_runs(rehearsal: Rehearsal) -> tuple[Path, Path]:
    """Two real quick sweeps of this checkout, one after the other: those of gpu_check.sh's CPU rehearsal (cross-check
    off, then on in 2 processes), shared with test_gpu_check.py."""
    assert rehearsal.done.returncode == 0, rehearsal.done.stdout[-3000:] + rehearsal.done.stderr[-3000:]
    a, b = sorted(rehearsal.results.iterdir())
    return a, b


def test_markdown_is_a_table_ready_for_a_pull_request_comment(two_runs):
    a, b = two_runs
    result = compare_runs(load_run(a), load_run(b))
    done = cli("compare", str(a), str(b), "--format", "markdown")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"### kvpages compare: B `{b.name}` against A `{a.name}`"
    rows = [line for line in lines if line.startswith("| `")]
    assert len(rows) == len(result.relative.points) + len(result.absolute.points)
    for p, row in zip(result.relative.points + result.absolute.points, rows, strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0] == f"`{p.key[0]}`" and cells[-1].strip("*") == p.verdict
        assert cells[7] == sig(p.interval.ratio)  # three significant figures, as every figure (0.0625, not 0.063)
        a_shown, b_shown, ratio_shown = (float(c.replace(",", "")) for c in cells[5:8])  # a reader's own division agrees
        assert abs(b_shown / a_shown / ratio_shown - 1) <= 3 * 0.005 * 1.01  # each within half a unit of its third figure
    assert "<details><summary>Absolute" in done.stdout and "</details>" in done.stdout


def test_json_gives_every_point_its_figures_interval_and_verdict(two_runs):
    a, b = two_runs
    result = compare_runs(load_run(a), load_run(b))
    done = cli("compare", str(a), str(b), "--format", "json", "--fail-above", "10")
    document = json.loads(done.stdout)
    assert set(document) == {f.name for f in dataclasses.fields(ComparisonDocument)}
    assert document["a"]["run_id"] == a.name and document["b"]["run_id"] == b.name
    assert document["gate"]["passed"] == (done.returncode == 0) and document["gate"]["threshold"] == 1.1
    points = document["points"]
    judged = [(f, p) for f, family in (("relative", result.relative), ("absolute", result.absolute))
              for p in family.points]
    assert len(points) == len(judged)
    for written, (family, p) in zip(points, judged, strict=True):
        assert set(written) == {f.name for f in dataclasses.fields(ComparedPoint)}
        assert written["family"] == family and tuple(written["point"].values()) == p.key
        assert written["verdict"] == p.verdict in VERDICTS
        assert written["a"] == p.a_value and written["b"] == p.b_value and written["b_over_a"] == p.interval.ratio
        if written["ci_low"] is not None:
            assert written["ci_low"] <= written["b_over_a"] <= written["ci_high"]
        assert (written["beyond_gate"] is None) == (family == "absolute")
    for family in ("relative", "absolute"):
        assert sum(document["counts"][family].values()) == sum(p["family"] == family for p in points)


def test_a_bad_format_exits_2_naming_the_choices(two_runs):
    a, b = two_runs
    done = cli("compare", str(a), str(b), "--format", "xml")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "invalid choice: 'xml'" in done.stderr and all(f"'{name}'" in done.stderr for name in FORMATS)


def test_a_shift_of_every_ratio_is_named_beside_the_verdicts_it_may_have_made(tmp_path):
    """B's device_stride 6% slower in every process, at every point (what a change to the baseline does, and what the
    box's state over minutes did to one `make noise` pair of 2026-12-07: 17 of 140 relative points slower, the whole
    run's ratios +1.7%): the verdicts go that way, and the text, markdown and JSON say that every ratio moved together
    and that those verdicts may be the shift's. Two runs without it say nothing of the kind."""
    kw = dict(processes=6, repetitions=12, process_spread=0.005, rep_spread=0.005)
    a = synthetic_run(tmp_path / "a", POINTS, seed=1, **kw)
    b = synthetic_run(tmp_path / "b", POINTS, seed=2, own_shifts={"device_stride": (1.06,) * 6}, **kw)
    result = compare_runs(load_run(a), load_run(b))
    shift = result.shift
    assert shift.factor == pytest.approx(1.06, rel=0.01) and (shift.up, shift.down) == (6, 0)
    assert shift.sign_p() == pytest.approx(2 / 2**6) and shift.clear()
    slower = sum(p.verdict == SLOWER for p in result.relative.points)
    assert slower >= 1
    note = result.shift_note()
    assert note is not None and note.startswith(f"note: the relative points moved together: B's sit at a median of "
                                                f"{shift.percent()} from A's (6 up and 0 down of 6; sign test p = 0.031")
    held = re.search(rf": (\d+) of the {slower} faster or slower verdicts hold that {re.escape(shift.percent())} in "
                     r"their interval, and may be the shift's alone \(the absolute family shows whether the baseline "
                     r"moved\)$", note)
    assert held is not None and 1 <= int(held.group(1)) <= slower, note
    text = cli("compare", str(a), str(b))
    assert text.returncode == 0 and note in text.stdout.splitlines()
    assert f"> {note}" in cli("compare", str(a), str(b), "--format", "markdown").stdout.splitlines()
    document = json.loads(cli("compare", str(a), str(b), "--format", "json").stdout)
    assert document["schema_version"] == 3 and document["shift"] == {
        "factor": shift.factor, "up": 6, "down": 0, "sign_p": shift.sign_p(), "note": note}
    same = compare_runs(load_run(a), load_run(synthetic_run(tmp_path / "c", POINTS, seed=3, **kw)))
    assert same.shift_note() is None and not any(p.verdict == SLOWER for p in same.relative.points)
    document = json.loads(cli("compare", str(a), str(tmp_path / "c"), "--format", "json").stdout)
    assert document["shift"]["note"] is None and document["shift"]["up"] + document["shift"]["down"] <= 6
    regressed = dict(POINTS)  # one point 30% slower and nothing else: its verdict is not the run's shift
    regressed["device_stride", 131072, 64] = 20.0 * 1.3
    one = compare_runs(load_run(a), load_run(synthetic_run(tmp_path / "d", regressed, seed=4, **kw)))
    slowed = [p for p in one.relative.points if p.verdict == SLOWER]
    assert [p.key[3:] for p in slowed] == [(131072, 64)] and one.shift_note() is None


MILAN = {"cpu_id": "vendor AuthenticAMD family 25 model 1 stepping 1 microcode 0x1000065, L3 32768K",
         "boot_id": "boot-1", "hostname": "vm"}
MILAN_ID = "test-cpu (vendor AuthenticAMD family 25 model 1 stepping 1 microcode 0x1000065, L3 32768K) @ vm"


def test_a_note_names_what_differs_between_the_machines_or_the_boots_the_runs_ran_in(tmp_path):
    kw = {"rep_spread": 0.002, "spread": 0.001}
    a = synthetic_run(tmp_path / "a", POINTS, seed=1, environment=MILAN, **kw)
    genoa = {**MILAN, "cpu_id": "vendor AuthenticAMD family 25 model 17 stepping 1 microcode 0xa101148, L3 32768K",
             "boot_id": "boot-2"}
    b = synthetic_run(tmp_path / "b", POINTS, seed=2, environment=genoa, **kw)
    note = compare_runs(load_run(a), load_run(b)).machine_note()
    assert note == ("note: A and B ran on machines that differ (CPU: A 'vendor AuthenticAMD family 25 model 1 stepping 1 "
                    "microcode 0x1000065, L3 32768K', B 'vendor AuthenticAMD family 25 model 17 stepping 1 microcode "
                    "0xa101148, L3 32768K'): ratios move between machines, not only absolute times, so a verdict here "
                    "may be the machines' and not the change's; gate runs of one machine")
    text = cli("compare", str(a), str(b), "--fail-above", "40")  # a note, not a verdict: the gate passes
    assert text.returncode == 0 and note in text.stdout.splitlines()
    assert f"> {note}" in cli("compare", str(a), str(b), "--format", "markdown").stdout.splitlines()
    document = json.loads(cli("compare", str(a), str(b), "--format", "json").stdout)
    assert document["machine_note"] == note and document["b"]["boot_id"] == "boot-2"
    assert document["a"]["machine"] == MILAN_ID

    other_device = synthetic_run(tmp_path / "f", POINTS, seed=6, environment={**MILAN, "device": "cuda"}, **kw)
    gate = cli("compare", str(a), str(other_device), "--fail-above", "10")  # host work against transfers: no gate
    assert gate.returncode == 2 and gate.stderr.count("\n") == 1 and "--fail-above: A ran on cpu and B on cuda" in gate.stderr
    assert compare_runs(load_run(a), load_run(other_device)).machine_note().startswith(
        "note: A and B ran in one boot of one box, but not alike (device: A 'cpu', B 'cuda'): ratios move between "
        "devices and set-ups")
    rebooted = synthetic_run(tmp_path / "c", POINTS, seed=3, environment={**MILAN, "boot_id": "boot-3"}, **kw)
    assert compare_runs(load_run(a), load_run(rebooted)).machine_note() == (
        f"note: A and B ran in different boots of machines whose recorded identity matches ('{MILAN_ID}'): a reboot, "
        "or another box of the same model; what differs between boots may move every point, and neither run's "
        "intervals sample it, so a verdict here may be the boots' and not the change's; to gate, rerun A in B's boot")
    one_boot = synthetic_run(tmp_path / "d", POINTS, seed=4, environment=MILAN, **kw)
    older = synthetic_run(tmp_path / "e", POINTS, seed=5, environment={"hostname": "vm"}, **kw)  # recorded neither
    for quiet in (one_boot, older):
        assert compare_runs(load_run(a), load_run(quiet)).machine_note() is None
        assert "note: A and B ran" not in cli("compare", str(a), str(quiet)).stdout
    assert json.loads(cli("compare", str(a), str(older), "--format", "json").stdout)["machine_note"] is None
    bare = tmp_path / "bare"  # a results CSV without its meta.json: that run's machine is unknown, A's is still said
    bare.mkdir()
    for name in ("results.csv", "samples.csv.gz"):
        (bare / name).write_bytes((b / name).read_bytes())
    document = json.loads(cli("compare", str(a), str(bare / "results.csv"), "--format", "json").stdout)
    assert (document["a"]["machine"], document["b"]["machine"], document["machine_note"]) == (MILAN_ID, None, None)
