"""Re-measuring unstable points (kvpages.measure.remeasure): a disturbed process is re-measured in a fresh one and
does not move the ratio; with a budget of 0 the run is the plan's blocks and no more; the rule and the estimator."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from test_plugin import BENCH, CPU, run_dirs

from kvpages.analysis.ratios import analyze
from kvpages.analysis.verdicts import FASTER, UNCLEAR, judge
from kvpages.core.estimator import paired_ratio, trimmed_ratio
from kvpages.core.stability import outlying, settled
from kvpages.core.stats import Interval, Levels
from kvpages.core.sweep import Point
from kvpages.measure.schedule import plan
from kvpages.render.report import render
from kvpages.schema.reader import load_run, sample_file
from kvpages.schema.rows import POINTS, RESULTS_CSV

SLEEPERS = '''
import time

from kvpages.measure.variants import Moves, device_stride, host_stride, variant


@variant("slow_host", moves=Moves.TOKENS)
def slow_host(kv_indices, page_size):
    """Test only: pre-PR after a 4 ms sleep, so its time is known.

    Hypothesis: none; a fixed time.
    """
    time.sleep(0.004)
    return host_stride(kv_indices, page_size)


@variant("slow_device", moves=Moves.PAGES)
def slow_device(kv_indices, page_size):
    """Test only: the merged PR after a 2 ms sleep, so its time is known.

    Hypothesis: none; a fixed time.
    """
    time.sleep(0.002)
    return device_stride(kv_indices, page_size)
'''
"""Two variants whose calls are a sleep each (4 and 2 ms): their ratio, about 0.5, holds within a few percent on a
loaded box, so a disturbance of 3x cannot hide in the noise."""

SWEEP = ("--kv-seq-lens", "8192", "--kv-page-sizes", "64", "--kv-variants", "slow_host,slow_device",
         "--kv-baseline", "slow_host", "--kv-scenarios", "none", "--kv-repetitions", "3", "--kv-processes", "3",
         "--kv-time-budget", "0.15", "--kv-breakdown", "off", "--benchmark-only", "-p", "no:cacheprovider")
DISTURBED = "0:slow_host:3"  # process 0's slow_host calls take 3x as long (kvpages.measure.disturb)
POINT = "s8192-p64-int32-fragmented"


def sweep(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str):
    pytester.makeconftest(SLEEPERS)
    pytester.makepyfile(test_kv_sweep=BENCH)
    monkeypatch.setenv("KVPAGES_TEST_DISTURB", DISTURBED)  # the workers inherit it
    result = pytester.runpytest_subprocess(*SWEEP, *CPU, *args, timeout=200)
    [folder] = run_dirs(pytester.path)
    return result, load_run(folder)


def test_a_disturbed_process_is_re_measured_and_does_not_move_the_ratio(pytester, monkeypatch):
    # 10 x the 2 x 0.5 s planned: a round costs a fresh process's start-up (~3 s) and its blocks
    result, run = sweep(pytester, monkeypatch, "--kv-remeasure-budget", "10", "--kv-time-budget", "0.5")
    result.stdout.fnmatch_lines(["kvpages: re-measuring 1 unstable point(s) in a fresh process, round 1"])
    record = run.meta.remeasure
    assert record.remeasured == (POINT,) and record.rounds >= 1 and record.extra_blocks == 2 * record.rounds
    assert record.unstable == () and record.spent_s > 0, record
    assert [p.role for p in run.meta.processes][3:] == ["remeasure"] * record.rounds
    assert (run.rows["repetitions"] == 3 + record.rounds).all() and run.meta.completed
    key = ("slow_host", "int32", "fragmented", 8192, 64)
    assert run.processes[key][:3] == (0, 1, 2) and set(run.processes[key][3:]) == set(range(3, 3 + record.rounds))
    medians = np.array([np.median(b) for b in run.samples[key]])
    assert medians[0] > 2 * np.median(medians[1:])  # the disturbance was there, large and obvious
    [ratio] = analyze(run).ratios
    undisturbed = [np.log(np.median(d) / np.median(h)) for p, d, h in zip(
        run.processes[key], run.samples[("slow_device", *key[1:])], run.samples[key], strict=True) if p != 0]
    assert ratio.ratio == pytest.approx(math.exp(np.mean(undisturbed)), rel=0.05)  # the undisturbed processes' ratio
    assert ratio.ci_low <= ratio.ratio <= ratio.ci_high and not ratio.unstable
    analysis = analyze(run)
    for variant, time in ((ratio.variant, ratio.variant_median_us), (ratio.baseline, ratio.baseline_median_us)):
        band = analysis.time_band(variant, "int32", "fragmented", 64, 8192)  # a chart's marker is the table's time
        assert band is not None and band.ratio == pytest.approx(time, rel=1e-12) and band.ci_low <= band.ratio <= band.ci_high


def test_a_budget_of_0_runs_the_plan_and_nothing_more(pytester, monkeypatch):
    """Today's behaviour: the planned blocks, in the planned processes and order, the rows as ever, nothing flagged."""
    _, run = sweep(pytester, monkeypatch, "--kv-remeasure-budget", "0")
    assert run.meta.remeasure.note == "off: --kv-remeasure-budget 0" and run.meta.remeasure.rounds == 0
    assert [p.role for p in run.meta.processes] == ["worker", "worker", "session"]
    planned = plan(("slow_host", "slow_device"), [Point(8192, 64)], repetitions=3, seed=0, passes=1, processes=3)
    samples = pd.read_csv(sample_file(run.path, "samples.csv"))
    assert list(zip(samples["variant"], samples["repetition"], samples["order"], samples["process"], strict=True)) == [
        (b.variant, b.repetition, b.order, b.process) for b in planned]
    assert tuple(pd.read_csv(run.path / RESULTS_CSV).columns) == POINTS.columns
    assert (run.rows["repetitions"] == 3).all() and (run.rows["status"] == "ok").all()
    assert run.rows.set_index("variant").loc["slow_host", "rep_spread"] > 0.1  # it would have been re-measured
    [ratio] = analyze(run).ratios
    assert ratio.ratio == paired_ratio(*(levels_of(run, v) for v in ("slow_host", "slow_device"))).interval.ratio
    assert not ratio.unstable and "**Re-measurement** of unstable points: off: --kv-remeasure-budget 0" in render(analyze(run))


def levels_of(run, variant: str) -> Levels:
    key = (variant, "int32", "fragmented", 8192, 64)
    return Levels(np.log([np.median(b) for b in run.samples[key]]), np.array(run.processes[key]))


def test_a_process_apart_from_the_others_is_outlying_and_a_point_settles_without_it():
    values = np.log([3.0, 1.0, 1.02, 0.99])
    levels = Levels(values, np.arange(4))
    assert outlying(levels, 0.10) == {0}
    assert settled(levels, 3, 0.10) and not settled(levels, 4, 0.10)  # 3 processes agree; the plan asked for 3
    assert not settled(Levels(values[:3], np.arange(3)), 3, 0.10)  # with only 3, the disturbed one cannot be left out
    assert outlying(Levels(np.log([1.0, 1.08, 0.95]), np.arange(3)), 0.10) == set()  # the usual spread is not outlying


def test_a_re_measured_ratio_leaves_out_a_disturbed_process_and_its_interval_keeps_it():
    base = Levels(np.log([12.0, 4.0, 4.1, 3.9, 4.0]), np.arange(5))
    other = Levels(np.log([2.0, 2.0, 2.1, 1.95, 2.02]), np.arange(5))
    left_out = outlying(Levels(other.values - base.values, base.processes), 0.10)
    assert left_out == {0}
    every, trimmed = paired_ratio(base, other), trimmed_ratio(base, other, left_out)
    assert every.interval.ratio < 0.45 and trimmed.interval.ratio == pytest.approx(0.5, rel=0.02)
    assert trimmed.interval.ratio == pytest.approx(trimmed.variant_us / trimmed.baseline_us, rel=1e-12)
    assert trimmed.interval.ci_low <= every.interval.ci_low and trimmed.interval.ci_high >= trimmed.interval.ratio
    assert trimmed.repetitions == 5 and trimmed.processes == 5


def test_an_unstable_point_is_never_faster_or_slower():
    clear = Interval(0.5, 0.45, 0.55, 6, 0.95, "process")
    assert judge(clear, 0.02) == FASTER and judge(clear, 0.02, unstable=True) == UNCLEAR


def test_a_finding_on_a_point_still_unstable_says_so_and_a_bytes_finding_does_not(tmp_path, reported_reference):
    import json
    import shutil

    from kvpages.analysis.findings import findings
    from kvpages.render.report import UNSTABLE_SAID, findings_section

    folder = tmp_path / "run"
    shutil.copytree(reported_reference.path, folder)
    meta = json.loads((folder / "meta.json").read_text())
    cited = {f.question: f.id for f in findings(analyze(load_run(folder)))}
    points = sorted({i.split("-", 2)[2] for i in (cited["Bytes per call"], cited["Crossover"])})  # r-<variant>-<point>
    meta["remeasure"] = {"stable_spread": 0.1, "budget_fraction": 0.25, "budget_s": 10.0, "planned_processes": 6,
                         "note": "stopped", "remeasured": points, "rounds": 1, "extra_repetitions": 2, "extra_blocks": 10,
                         "spent_s": 4.0, "timed_s": 1.0, "unstable": points}
    (folder / "meta.json").write_text(json.dumps(meta))
    analysis = analyze(load_run(folder))
    rows = {line.split(" | ")[0].lstrip("| "): line for line in findings_section(analysis).splitlines()}
    assert rows["Crossover"].endswith(f"`{cited['Crossover']}` | {findings(analysis)[2].status}{UNSTABLE_SAID} |")
    assert "**unstable**" not in rows["Bytes per call"]  # metered bytes are exact whatever the timing did
    assert all(r.verdict not in ("faster", "slower") for r in analysis.ratios if r.unstable) and analysis.unstable


def test_a_box_whose_every_point_stays_unstable_is_told_which_spread_it_has_and_what_to_do(tmp_path):
    """The H200 VM's default grid: every point's block medians spread 14%, no round could settle any; the method
    section names the box's spread and the option that lets such points be judged. A run whose few unstable points
    are disturbances (the box's spread under the threshold) is told nothing of the kind."""
    import json

    from conftest import synthetic_run

    from kvpages.render.report import remeasure_paragraph

    points = {(v, L, 64): m for v, m in (("host_stride", 10.0), ("device_stride", 8.0)) for L in (512, 8192)}
    for spread, said in ((0.20, True), (0.01, False)):
        folder = synthetic_run(tmp_path / f"s{spread}", points, rep_spread=spread, processes=6, repetitions=6)
        meta = json.loads((folder / "meta.json").read_text())
        every = ["s512-p64-int32-fragmented", "s8192-p64-int32-fragmented"]
        meta["remeasure"] = {"stable_spread": 0.1, "budget_fraction": 0.25, "budget_s": 2.0, "planned_processes": 6,
                             "note": "stopped", "remeasured": every, "rounds": 0, "extra_repetitions": 0,
                             "extra_blocks": 0, "spent_s": 0.0, "timed_s": 0.0, "unstable": every}
        (folder / "meta.json").write_text(json.dumps(meta))
        text = remeasure_paragraph(analyze(load_run(folder)))
        assert ("raise `--kv-stable-spread` above" in text) is said, text
