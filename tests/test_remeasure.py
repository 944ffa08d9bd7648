"""Disturbed processes and their re-measurement (kvpages.core.stability, kvpages.measure.remeasure): a process
disturbed for a pair is left out of that pair's centre and re-measured in a fresh one; a box whose processes all
move together disturbs nothing; a third variant's noise never vetoes a pair; a centre rests on a majority."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from conftest import synthetic_run
from hypothesis import given, settings
from hypothesis import strategies as st
from test_plugin import BENCH, CPU, run_dirs
from test_processes import signal_as_turn_ends

from kvpages.analysis.findings import findings
from kvpages.analysis.pairs import DISTURBED, STABLE
from kvpages.analysis.ratios import analyze
from kvpages.analysis.verdicts import FASTER, judge
from kvpages.core.estimator import kept_ratio, paired_ratio
from kvpages.core.stability import DEFAULT_FACTOR, disturbance
from kvpages.core.stats import Interval, Levels
from kvpages.core.sweep import Point
from kvpages.measure.schedule import plan
from kvpages.render.report import STABILITY_SAID, findings_section, render
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
DISTURBED_PROCESS = "0:slow_host:3"  # process 0's slow_host calls take 3x as long (kvpages.measure.disturb)
POINT = "s8192-p64-int32-fragmented"
KEY = ("slow_host", "int32", "fragmented", 8192, 64)


def sweep(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str, conftest: str = SLEEPERS):
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_kv_sweep=BENCH)
    monkeypatch.setenv("KVPAGES_TEST_DISTURB", DISTURBED_PROCESS)  # the workers inherit it
    result = pytester.runpytest_subprocess(*SWEEP, *CPU, *args, timeout=200)
    [folder] = run_dirs(pytester.path)
    return result, load_run(folder)


def undisturbed_ratio(run) -> float:
    """The ratio of the processes the injection left alone (every one but process 0)."""
    logs = [np.log(np.median(d) / np.median(h)) for p, d, h in zip(
        run.processes[KEY], run.samples[("slow_device", *KEY[1:])], run.samples[KEY], strict=True) if p != 0]
    return math.exp(np.mean(logs))


def test_a_disturbed_process_is_re_measured_and_does_not_move_the_ratio(pytester, monkeypatch):
    # 10 x the 2 x 0.5 s planned: a round costs a fresh process's start-up (~2-3 s) and its blocks
    result, run = sweep(pytester, monkeypatch, "--kv-remeasure-budget", "10", "--kv-time-budget", "0.5")
    result.stdout.fnmatch_lines(["kvpages: re-measuring 1 target(s) with a disturbed pair in a fresh process, round 1"])
    record = run.meta.remeasure
    assert record.found == (POINT,) and record.remeasured == (POINT,) and record.rounds >= 1
    assert record.extra_blocks == 2 * record.rounds and record.unstable == () and record.spent_s > 0, record
    assert [p.role for p in run.meta.processes][3:] == ["remeasure"] * record.rounds
    first = run.meta.processes[3]  # the spare: started beside the planned workers, charged from its go only
    assert record.spare and (record.rounds > 1 or record.spent_s < first.wall_s - first.startup_s + 0.5)
    assert (run.rows["repetitions"] == 3 + record.rounds).all() and run.meta.completed
    assert run.processes[KEY][:3] == (0, 1, 2) and set(run.processes[KEY][3:]) == set(range(3, 3 + record.rounds))
    written = list(pd.read_csv(sample_file(run.path, "samples.csv"))["process"])  # the session's blocks, then the
    assert written == sorted(written)  # rounds': in the order timed, its held rows and compression notwithstanding
    medians = np.array([np.median(b) for b in run.samples[KEY]])
    assert medians[0] > 2 * np.median(medians[1:])  # the disturbance was there, large and obvious
    analysis = analyze(run)
    [ratio] = analysis.ratios
    assert ratio.ratio == pytest.approx(undisturbed_ratio(run), rel=0.05)  # the undisturbed processes' ratio
    assert ratio.left_out.startswith("0 (") and ratio.processes == 2 + record.rounds and ratio.stability == STABLE
    assert ratio.ci_low <= ratio.ratio <= ratio.ci_high < 1 and ratio.verdict == FASTER  # judged, once replaced
    for variant, time in ((ratio.variant, ratio.variant_median_us), (ratio.baseline, ratio.baseline_median_us)):
        band = analysis.time_band(variant, "int32", "fragmented", 64, 8192)  # a chart's marker is the table's time
        assert band is not None and band.ratio == pytest.approx(time, rel=1e-12) and band.ci_low <= band.ratio <= band.ci_high


def test_a_round_a_signal_cuts_short_is_in_meta_json_with_the_blocks_it_recorded(pytester, monkeypatch):
    """A signal landing in a re-measurement round interrupts the run with that round's worker in meta.json's
    processes (role remeasure) and counted in the record's rounds: every process whose blocks samples.csv holds is
    there (before, the round's worker was left out)."""
    round_cut_short = SLEEPERS + signal_as_turn_ends(3)  # the 3 planned processes are 0-2: the round's worker is 3
    result, run = sweep(pytester, monkeypatch, "--kv-remeasure-budget", "10", conftest=round_cut_short)
    assert result.ret == pytest.ExitCode.INTERRUPTED and run.meta is not None and not run.meta.completed
    assert [(p.index, p.role) for p in run.meta.processes] == [(0, "worker"), (1, "worker"), (2, "session"),
                                                               (3, "remeasure")]
    assert run.meta.remeasure.note == "interrupted during a round" and run.meta.remeasure.rounds == 1
    recorded = set(pd.read_csv(sample_file(run.path, "samples.csv"))["process"])
    assert 3 in recorded and recorded <= {p.index for p in run.meta.processes}


def test_a_budget_of_0_runs_the_plan_and_nothing_more(pytester, monkeypatch):
    """The planned blocks, in the planned processes and order, the rows as ever; the disturbed process is still left
    out of the centre, and the interval, over every process, keeps what the disturbance did."""
    _, run = sweep(pytester, monkeypatch, "--kv-remeasure-budget", "0")
    assert run.meta.remeasure.note == "off: --kv-remeasure-budget 0" and run.meta.remeasure.rounds == 0
    assert [p.role for p in run.meta.processes] == ["worker", "worker", "session"]
    planned = plan(("slow_host", "slow_device"), [Point(8192, 64)], repetitions=3, seed=0, passes=1, processes=3)
    samples = pd.read_csv(sample_file(run.path, "samples.csv"))
    assert list(zip(samples["variant"], samples["repetition"], samples["order"], samples["process"], strict=True)) == [
        (b.variant, b.repetition, b.order, b.process) for b in planned]
    assert tuple(pd.read_csv(run.path / RESULTS_CSV).columns) == POINTS.columns
    assert (run.rows["repetitions"] == 3).all() and (run.rows["status"] == "ok").all()
    analysis = analyze(run)
    [ratio] = analysis.ratios
    every = paired_ratio(*(levels_of(run, v) for v in ("slow_host", "slow_device"))).interval
    assert ratio.ratio == pytest.approx(undisturbed_ratio(run), rel=0.05) and ratio.left_out.startswith("0 (")
    assert ratio.ci_low <= min(every.ci_low, ratio.ratio) and ratio.ci_high >= max(every.ci_high, ratio.ratio)
    assert "**Re-measurement** of disturbed pairs: no round ran (off: --kv-remeasure-budget 0)" in render(analysis)


def levels_of(run, variant: str) -> Levels:
    key = (variant, *KEY[1:])
    return Levels(np.log([np.median(b) for b in run.samples[key]]), np.array(run.processes[key]))


def test_a_process_apart_from_the_others_is_left_out_and_a_pair_settles_without_it():
    values = np.log([3.0, 1.0, 1.02, 0.99])
    found = disturbance(Levels(values, np.arange(4)), spread=0.02)
    assert found.processes == {0} and found.left_out[0].factor == pytest.approx(3.0, rel=0.03)
    assert found.settled(3) and not found.settled(4)  # 3 processes agree; the plan asked for 3
    assert not disturbance(Levels(values[:3], np.arange(3)), 0.02).settled(3)  # left out, but not yet replaced
    assert disturbance(Levels(np.log([1.0, 1.08, 0.95]), np.arange(3)), 0.05).left_out == ()  # the usual spread
    far = disturbance(Levels(np.log([1.0, 1.0, 1.6]), np.arange(3)), spread=1.0)  # a spread that hides nothing at 1.5x
    assert far.processes == {2} and DEFAULT_FACTOR < 1.6


def test_a_box_whose_processes_move_together_disturbs_nothing_and_gets_verdicts(tmp_path):
    """Every process shifts every variant alike, by up to +-15%: the paired ratios cancel it, so no process stands
    apart and the verdicts come from the intervals (the H200 VM: process 3 fastest, 0 and 4 slowest for all)."""
    points = {(v, L, 64): m for v, m in (("host_stride", 10.0), ("device_stride", 5.0), ("device_shift", 9.6))
              for L in (512, 8192)}
    together = (1.15, 0.85, 1.0, 0.9, 1.12, 0.97)
    folder = synthetic_run(tmp_path / "run", points, processes=6, repetitions=6, rep_spread=0.01, shifts=together)
    analysis = analyze(load_run(folder))
    assert analysis.noise.time_between_process > 0.1  # the times do spread between processes
    assert all(r.left_out == "" and r.stability == STABLE for r in analysis.ratios)
    assert {r.verdict for r in analysis.ratios_of("device_stride")} == {FASTER}


def test_a_noisy_third_variant_leaves_the_pair_under_review_judged(tmp_path):
    """host_mirror's sub-µs calls spread 25% between repetitions: its own pair is what that noise touches."""
    points = {(v, L, 64): m for v, m in (("host_stride", 10.0), ("device_stride", 5.0), ("host_mirror", 0.8))
              for L in (512, 8192)}
    folder = synthetic_run(tmp_path / "run", points, processes=6, repetitions=6, rep_spread=0.01,
                           own_spread={"host_mirror": 0.25})
    analysis = analyze(load_run(folder))
    assert {(r.verdict, r.stability, r.left_out) for r in analysis.ratios_of("device_stride")} == {(FASTER, STABLE, "")}


def test_a_pair_with_more_than_a_minority_apart_is_disturbed_and_its_finding_says_so(tmp_path):
    points = {(v, L, 64): m for v, m in (("host_stride", 10.0), ("device_stride", 5.0)) for L in (512, 8192)}
    apart = (1.0, 1.0, 1.0, 3.0, 0.33, 2.5)  # three processes apart, each its own way: not a minority of six
    folder = synthetic_run(tmp_path / "run", points, processes=6, repetitions=6, own_shifts={"device_stride": apart})
    analysis = analyze(load_run(folder))
    assert {(r.verdict, r.stability, r.left_out, r.processes) for r in analysis.ratios} == {(DISTURBED, DISTURBED, "", 6)}
    said = findings_section(analysis)
    cited = next(f for f in findings(analysis) if f.question == "Crossover")
    assert f"`{cited.id}` | {cited.status}{STABILITY_SAID[DISTURBED]} |" in said
    assert "**disturbed**" not in next(line for line in said.splitlines() if line.startswith("| Bytes per call"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=3, max_size=12), st.floats(0.0, 0.5))
def test_a_centre_never_rests_on_fewer_than_a_majority_of_processes(levels, spread):
    found = disturbance(Levels(np.array(levels), np.arange(len(levels))), spread)
    assert found.kept > len(levels) / 2 and found.kept + len(found.left_out) == len(levels)
    assert not (found.left_out and found.beyond)


def test_a_pair_leaves_out_its_disturbed_process_and_keeps_the_interval_of_every_process_until_replaced():
    base = Levels(np.log([12.0, 4.0, 4.1, 3.9, 4.0]), np.arange(5))
    other = Levels(np.log([2.0, 2.0, 2.1, 1.95, 2.02]), np.arange(5))
    left_out = disturbance(Levels(other.values - base.values, base.processes), 0.02).processes
    assert left_out == {0}
    every = paired_ratio(base, other)
    waiting, replaced = kept_ratio(base, other, left_out, settled=False), kept_ratio(base, other, left_out, settled=True)
    assert every.interval.ratio < 0.45 and waiting.interval.ratio == pytest.approx(0.5, rel=0.02)
    assert waiting.interval.ratio == pytest.approx(waiting.variant_us / waiting.baseline_us, rel=1e-12)
    assert waiting.interval.ci_low <= every.interval.ci_low and waiting.interval.ci_high >= waiting.interval.ratio
    assert replaced.interval.ratio == waiting.interval.ratio and replaced.processes == 4
    assert replaced.interval.ci_high - replaced.interval.ci_low < waiting.interval.ci_high - waiting.interval.ci_low


def test_a_disturbed_pair_is_never_faster_or_slower():
    clear = Interval(0.5, 0.45, 0.55, 6, 0.95, "process")
    assert judge(clear, 0.02) == FASTER and judge(clear, 0.02, disturbed=True) == DISTURBED


@pytest.mark.parametrize(("block_s", "rounds"), [(0.01, 1), (2.0, 2)])
def test_a_round_after_the_spare_runs_only_when_it_times_more_than_a_fresh_start_costs(monkeypatch, block_s, rounds):
    """The spare's round is free of a start; a later one starts a fresh process (1.5 s here), so it runs only when its
    cases' blocks so far timed at least that much (twice here: 2 s blocks), and the record says why it stopped."""
    from types import SimpleNamespace

    import kvpages.measure.remeasure as remeasure

    target = SimpleNamespace(id=POINT)
    need = remeasure.Need(target, ("a", "b"), 2.0)  # type: ignore[arg-type]
    monkeypatch.setattr(remeasure, "needs", lambda *args: [need])  # never settled: only the budget or the rule stops it
    block = SimpleNamespace(blocked_us=(block_s * 1e6,))
    recorder = SimpleNamespace(cases={"a": SimpleNamespace(blocks=[block]), "b": SimpleNamespace(blocks=[block])},
                               expect_more=lambda cases: None)
    done = []

    def run_round(round_, rounds):
        done.append(round_)
        info = SimpleNamespace(timed_s=2 * block_s, wall_s=2 * block_s + 0.1)
        rounds.append(SimpleNamespace(spare=len(done) == 1, charged_s=info.wall_s, info=lambda: info))
        return rounds[-1]

    r = remeasure.Remeasurer(recorder, ("a", "a"), 3, 3, 0, DEFAULT_FACTOR, 1.0, 6.0, lambda t: 0.0, 0.1, 1.5)
    record = r.run(run_round, lambda line: None)
    assert len(done) == rounds
    if rounds == 1:
        assert record.note.startswith("stopped: the next round would time about 0.02 s in a fresh process whose start "
                                      "and inputs cost 1.5 s"), record.note
    else:  # 2 rounds of 4.1 s: a third would pass the 6 s budget
        assert record.note == "stopped: the next round's worst target would pass what is left of the 6.0 s budget"
