"""Process-level repetition: the schedule's processes, real worker processes, and intervals at the levels that vary."""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import pytest
from conftest import assert_phases_add_up, synthetic_run
from test_analysis import covers
from test_plugin import BENCH, CPU, run_dirs
from test_ranks import left_behind

from kvpages.analysis.cite import percent_up
from kvpages.analysis.compare import compare_runs
from kvpages.analysis.noise import CALIBRATED, TARGETS, WIDTHS_CAP, Held, aa_figures, allocation_text, calibrated
from kvpages.analysis.ratios import NoiseFloor, analyze
from kvpages.core.estimator import mean_estimate
from kvpages.core.presets import PRESETS
from kvpages.core.stats import Levels
from kvpages.core.sweep import Point, Sweep
from kvpages.measure.outcome import BlockOutcome, MeterReading
from kvpages.measure.schedule import in_run_order, plan
from kvpages.measure.worklog import BlocksSpent, LogReader, WorkerEnd, WorkerLog
from kvpages.render.report import caveats
from kvpages.schema.meta import ProcessInfo
from kvpages.schema.reader import load_run
from kvpages.schema.rows import PARTIAL, POINTS, RESULTS_CSV, SAMPLES_CSV, SampleSet

# --------------------------------------------------------------------------------------------- the schedule


def test_repetitions_are_dealt_to_processes():
    points = [Point(32, 4), Point(64, 4)]
    blocks = plan(("a", "b"), points, repetitions=6, seed=0, passes=1, processes=3)
    assert {(b.repetition, b.process) for b in blocks} == {(r, r % 3) for r in range(6)}
    for process in range(3):  # every process times every case
        assert {(b.variant, b.target) for b in blocks if b.process == process} == {(v, p) for v in "ab" for p in points}
    for process in range(3):
        own = [b for b in blocks if b.process == process]
        assert sum(b.last_in_process for b in own) == len(points)
        assert own[-1].last_in_process
    with pytest.raises(ValueError, match="processes must be between 1 and the repetitions"):
        plan(("a",), points, 2, 0, 1, processes=3)


def test_run_order_goes_process_by_process_through_every_family():
    points = plan(("a", "b"), [Point(32, 4)], 4, 0, 1, processes=2)
    steps = plan(("s",), [Point(64, 4)], 4, 1, 1, processes=2)
    numbered = in_run_order(points, steps)
    order = sorted((b.order, b.process, family) for family, blocks in enumerate(numbered) for b in blocks)
    assert [o for o, _, _ in order] == list(range(len(points) + len(steps)))
    assert [(p, f) for _, p, f in order] == sorted((p, f) for _, p, f in order)  # process 0 first, points then steps


def test_more_processes_than_repetitions_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"7 processes but 6 repetitions.*at most 6"):
        Sweep("x", (32,), (4,), repetitions=6, processes=7)


def test_the_default_preset_samples_processes():
    sweep = PRESETS["default"].sweep
    assert sweep.processes >= 2 and sweep.repetitions % sweep.processes == 0


# --------------------------------------------------------------------------------------------- the statistics


def _two_level(rng: np.random.Generator, processes: int, per_process: int, between: float, within: float,
               outliers: float = 0.0) -> Levels:
    shifts = rng.normal(0.0, between, processes)
    values, owners = [], []
    for p in range(processes):
        for _ in range(per_process):
            noise = rng.normal(0.0, 0.4) if rng.random() < outliers else rng.normal(0.0, within)
            values.append(shifts[p] + noise)
            owners.append(p)
    return Levels(np.array(values), np.array(owners))


@pytest.mark.parametrize("per_process", [2, 1])
@pytest.mark.parametrize("between, within, outliers", [(0.2, 0.03, 0.0), (0.0, 0.1, 0.0)])
def test_the_process_level_interval_is_calibrated_where_a_repetition_level_one_is_not(between, within, outliers,
                                                                                       per_process):
    """6 processes of 2 repetitions, or of 1 (the default preset), true value 1: the estimator's two-stage bootstrap
    holds it about 95% of the time, for a strong process effect and no process effect at all (block outliers:
    tests/test_estimator.py); with 2 per process, the same values taken as one process's repetitions do not."""
    rng = np.random.default_rng(7)
    hits = naive_hits = 0
    trials = 300
    for _ in range(trials):
        levels = _two_level(rng, 6, per_process, between, within, outliers)
        hits += covers(mean_estimate(levels), 1.0)
        naive_hits += covers(mean_estimate(Levels(levels.values, np.zeros(levels.values.size, dtype=int))), 1.0)
    assert 0.90 <= hits / trials <= 0.99
    if between >= 0.2 and per_process > 1:  # repetitions alone cannot see a shift of a whole process
        assert naive_hits / trials < 0.90


def test_variance_components_recover_the_levels():
    rng = np.random.default_rng(3)
    parts = [_two_level(rng, 8, 4, 0.10, 0.05).components() for _ in range(200)]
    assert np.median([p.between_process for p in parts]) == pytest.approx(0.10, rel=0.25)
    assert np.median([p.within_process for p in parts]) == pytest.approx(0.05, rel=0.15)
    one = Levels(np.array([0.1, 0.2, 0.3]), np.zeros(3, dtype=int)).components()
    assert math.isnan(one.between_process) and one.within_process == pytest.approx(0.1)


def test_one_process_gives_a_repetition_level_interval():
    levels = Levels(np.array([0.0, 0.01, -0.01, 0.02, 0.0, 0.01]), np.zeros(6, dtype=int))
    interval = mean_estimate(levels)
    assert interval.unit == "repetition" and interval.n == 6
    two = mean_estimate(Levels(levels.values, np.array([0, 1, 0, 1, 0, 1])))
    assert two.unit == "process" and two.n == 2 and two.confidence == 0.95


# --------------------------------------------------------------------------------------------- compare and noise

MEDIANS = {(v, s, p): m for s in (512, 8192, 131072) for p in (1, 64)
           for v, m in (("host_stride", 10.0), ("device_stride", 20.0))}


def test_compare_judges_processes_against_processes_and_catches_a_regression(tmp_path):
    kw = dict(processes=6, repetitions=12, process_spread=0.05, rep_spread=0.05)
    a = load_run(synthetic_run(tmp_path / "a", MEDIANS, seed=1, **kw))
    b = load_run(synthetic_run(tmp_path / "b", MEDIANS, seed=2, **kw))
    slow = {k: m * (1.3 if k[0] == "device_stride" else 1.0) for k, m in MEDIANS.items()}
    c = load_run(synthetic_run(tmp_path / "c", slow, seed=3, **kw))
    same = compare_runs(a, b)
    assert same.unit == "process" and same.caveat() is None
    assert all(p.interval.unit == "process" for p in same.relative.points)
    assert not same.regressions(10)
    slower = compare_runs(a, c)
    assert slower.regressions(10) and slower.relative.counts()["slower"] == len(slower.relative.points)
    single = load_run(synthetic_run(tmp_path / "d", MEDIANS, seed=4))
    assert compare_runs(single, b).caveat().startswith("note: run A was timed in one process, so")
    assert compare_runs(single, single).caveat().startswith("note: runs A and B were each timed in one process, so")


def test_noise_states_both_levels_and_whether_the_box_is_fit(tmp_path):
    kw = dict(processes=6, repetitions=12, process_spread=0.05, rep_spread=0.05)
    a = analyze(load_run(synthetic_run(tmp_path / "a", MEDIANS, seed=1, **kw)))
    b = analyze(load_run(synthetic_run(tmp_path / "b", MEDIANS, seed=2, **kw)))
    assert a.noise.processes == 6 and a.noise.interval_unit == "process"
    assert 0 < a.noise.time_between_process < 0.2 and 0 < a.noise.time_within_process < 0.2
    text = aa_figures(a, b, "device_stride", 10).text()
    assert "between processes" in text and "between repetitions within one" in text
    assert text.splitlines()[-1].startswith("fit for comparisons: ") and "note: A and B ran" not in text
    rebooted = analyze(load_run(synthetic_run(tmp_path / "c", MEDIANS, seed=3, environment={"boot_id": "2"}, **kw)))
    a_booted = analyze(load_run(synthetic_run(tmp_path / "d", MEDIANS, seed=1, environment={"boot_id": "1"}, **kw)))
    lines = aa_figures(a_booted, rebooted, "device_stride", 10).text().splitlines()  # not back to back: it says so
    assert lines[-2].startswith("note: A and B ran in different boots of machines whose recorded identity matches")


def test_noise_names_a_shift_of_the_whole_runs_ratios_and_what_the_intervals_would_be_without_it(tmp_path):
    """B's device_stride 6% slower in every process (what the box's state over minutes can do to a whole run): the
    pair misses its targets, the shift is measured (all 6 points up), and without it the intervals would meet theirs;
    the pair the other way round says the same of -6%; a pair of runs of the same code says nothing of the kind."""
    kw = dict(processes=6, repetitions=12, process_spread=0.005, rep_spread=0.005)
    a = analyze(load_run(synthetic_run(tmp_path / "a", MEDIANS, seed=1, **kw)))
    b = analyze(load_run(synthetic_run(tmp_path / "b", MEDIANS, seed=2, own_shifts={"device_stride": (1.06,) * 6},
                                       **kw)))
    for first, second, sign in ((a, b, 1), (b, a, -1)):
        figures = aa_figures(first, second, "device_stride", 10)
        shift, held = figures.run_shift.moved, figures.run_shift.held
        assert shift.factor ** sign == pytest.approx(1.06, rel=0.01)
        assert (held.points, shift.up, shift.down) == ((6, 6, 0) if sign > 0 else (6, 0, 6))
        assert shift.sign_p() == pytest.approx(2 / 2**6)  # six of six the same way
        assert figures.held.a_in_b == figures.held.b_in_a == 0 and not figures.held.meets_targets()
        assert held.a_in_b >= 5 and held.b_in_a >= 5 and held.overlap == 6
        text = figures.text()
        moved = f"{shift.factor - 1:+.1%}"  # 6% give or take the runs' own noise
        assert moved.startswith("+" if sign > 0 else "-")
        assert (f"shift of the whole run's ratios: B's sit at a median of {moved} from A's, "
                f"{shift.up} of 6 points up and {shift.down} down (sign test p = 0.031)") in text
        fit = text.splitlines()[-1]
        assert fit.startswith("fit for comparisons: NO (short of the targets: intervals overlapping 0.0% < 95.0%; A's "
                              "ratio inside B's CI 0.0% < ")  # what fell short, first
        assert "; B's ratio inside A's CI 0.0% < " in fit.split("): ")[0]
        assert (f"without the shift of the whole run's ratios ({moved}, sign test p = 0.031), intervals overlap at "
                f"100.0% of points") in fit
        assert f"a difference of about {moved[1:]} between two runs may be the box's, not the code's" in fit
    same = aa_figures(a, analyze(load_run(synthetic_run(tmp_path / "c", MEDIANS, seed=3, **kw))), "device_stride", 10)
    assert same.held.meets_targets() and not same.run_shift.explains(same.held)
    assert "without the shift" not in same.text()
    shift = same.run_shift.moved
    assert dataclasses.replace(shift, up=3, down=3).sign_p() == 1.0
    assert dataclasses.replace(shift, up=0, down=0).sign_p() == 1.0  # every point a tie, or none
    assert dataclasses.replace(shift, up=3, down=11).sign_p() == pytest.approx(0.0574, abs=1e-4)  # the binomial's


def test_noise_asks_of_each_direction_what_calibrated_intervals_of_these_widths_hold(tmp_path):
    """A's processes spread 1%, B's 6%: B's intervals are several times as wide, so even calibrated ones hold A's ratio
    almost always and A's narrow ones hold B's far less often. The pair is judged against what intervals of these
    widths hold (one ratio of widths for the run, at most WIDTHS_CAP), not against equal widths' 75%; equal widths
    ask for 75% and 95% exactly, and a narrow run whose intervals hold too little still fails."""
    def within(x: float) -> float:  # P(|Z| < x)
        return math.erf(x / math.sqrt(2))

    z = 1.959963984540054
    assert calibrated(2.0, 1.0) == pytest.approx((within(z * 3 / math.sqrt(5)), within(z / math.sqrt(5)),
                                                  within(z * 2 / math.sqrt(5))), rel=1e-9)
    assert (CALIBRATED["overlap"], CALIBRATED["coverage"]) == pytest.approx((within(z * math.sqrt(2)),
                                                                             within(z / math.sqrt(2))), rel=1e-9)

    kw = dict(processes=6, repetitions=12, rep_spread=0.01)
    a = analyze(load_run(synthetic_run(tmp_path / "a", MEDIANS, seed=1, process_spread=0.01, **kw)))
    b = analyze(load_run(synthetic_run(tmp_path / "b", MEDIANS, seed=11, process_spread=0.06, **kw)))
    figures = aa_figures(a, b, "device_stride", 10)
    held = figures.held
    assert figures.median_width_b > 3 * figures.median_width_a and held.widths == 1 / WIDTHS_CAP  # the cap
    (e_overlap, e_a, e_b), (n_overlap, n_a, n_b) = held.expected, held.needs()
    assert (e_overlap, e_a, e_b) == calibrated(1.0, WIDTHS_CAP)
    assert n_a == pytest.approx(TARGETS["coverage"] - (CALIBRATED["coverage"] - e_a))
    assert n_a > TARGETS["coverage"]
    assert e_b < 0.5 < CALIBRATED["coverage"] < e_a and e_overlap < CALIBRATED["overlap"]
    assert n_b == pytest.approx(TARGETS["coverage"] - (CALIBRATED["coverage"] - e_b))
    assert n_overlap == pytest.approx(TARGETS["overlap"] - (CALIBRATED["overlap"] - e_overlap))
    assert n_overlap < TARGETS["overlap"]
    overlap, a_in_b, b_in_a = held.shares()
    assert overlap == a_in_b == 1 and n_b <= b_in_a < TARGETS["coverage"]  # equal widths' 75% would say NO
    assert held.meets_targets() and not dataclasses.replace(held, widths=1.0).meets_targets()
    fit = figures.text().splitlines()[-1]
    assert fit.startswith(f"fit for comparisons: yes: {held.held_text()}, false verdicts 0.0%")
    assert "calibrated at these widths, A's 0.33x B's (the most it is taken as): " in fit
    assert f"the intervals are {percent_up(figures.median_width_a)} (A) and {percent_up(figures.median_width_b)} (B) wide" in fit
    too_narrow = dataclasses.replace(held, b_in_a=max(round(n_b * held.points) - 1, 0))  # A's hold too few of B's
    assert not too_narrow.meets_targets()
    assert not dataclasses.replace(held, overlap=held.points - 1).meets_targets()  # 83% overlapping, 94% asked

    itself = Held.of([(r, r) for r in a.ratios_of("device_stride")])  # equal widths: what was always asked
    assert itself.widths == 1.0 and itself.needs() == (TARGETS["overlap"], TARGETS["coverage"], TARGETS["coverage"])
    assert "(calibrated at equal widths: 99.4%, needs >= 95.0%)" in itself.held_text()
    wider = [(dataclasses.replace(r, ci_low=r.ratio * 0.5, ci_high=r.ratio * 2.0), r) for r in a.ratios_of("device_stride")]
    assert Held.of(wider).widths == WIDTHS_CAP  # far wider than 3x is taken as 3x
    unknown = [(dataclasses.replace(r, ci_low=math.nan, ci_high=math.inf), r) for r in a.ratios_of("device_stride")]
    assert Held.of(unknown).widths == 1.0 and Held.of([]).needs() == Held(0, 0, 0, 0).needs()


def test_the_repetitions_per_process_follow_from_the_noise_and_the_costs(tmp_path):
    meta = load_run(synthetic_run(tmp_path / "a", MEDIANS, processes=6, repetitions=12)).meta
    phased = [ProcessInfo(p, 1000 + p, "worker", 2.0, 1.0, 6.0, 0, 0.5, 0.5, 1.0, 0.5, 0.5) for p in range(6)]
    meta = dataclasses.replace(meta, processes=phased)  # a process costs 4 s besides 2 repetitions of 1 s each
    noise = NoiseFloor(12, 0.2, 0.3, 0.05, processes=6, ratio_between_process=0.05, ratio_within_process=0.2)
    text = allocation_text(noise, meta)  # sqrt(4 s * 0.2^2 / (1 s * 0.05^2)) = 8
    assert "a process costs 4.0 s" in text and "8.0 repetitions per process" in text and "this run: 2" in text
    assert allocation_text(dataclasses.replace(noise, ratio_within_process=math.nan), meta) == ""
    assert allocation_text(noise, dataclasses.replace(meta, processes=[ProcessInfo(0, 1, "session", 2, 1, 6, 0)] * 6)) == ""
    one_each = dataclasses.replace(meta, repetitions=6)  # the default: the within-process spread is not measured
    text = allocation_text(dataclasses.replace(noise, ratio_within_process=math.nan), one_each)
    assert "a process costs 4.0 s" in text and "one repetition per process" in text and "not measured" in text


# --------------------------------------------------------------------------------------------- worker processes


def test_a_worker_log_is_read_as_it_grows_and_a_torn_last_line_waits(tmp_path):
    """Each outcome as it was logged, its samples bit for bit (kvpages.measure.outcome.SERIES); a torn line waits."""
    log, reader = WorkerLog(tmp_path / "process-0.jsonl"), LogReader(tmp_path / "process-0.jsonl")
    samples = SampleSet("host_stride", "int32", "fragmented", 32, 4, 0, 0, 0, (1.0, 0.1, 13.061, 5e-324, 1.7976931348623157e308))
    block = BlockOutcome("host_stride-s32-p4-int32-fragmented", POINTS, 0, (samples,), MeterReading(128, 1, "none (cpu)", 1))
    stop = BlockOutcome("device_stride-s32-p4-int32-fragmented", POINTS, 0, status="mismatch", note="wrong output",
                        fail=True)
    log.write(block)
    [read] = reader.new_outcomes()
    assert read == block and [x.hex() for x in read.samples[0].samples_us] == [x.hex() for x in samples.samples_us]
    log.write(stop)
    with open(tmp_path / "process-0.jsonl", "a") as f:
        f.write('{"case_id": "ho')
    assert reader.new_outcomes() == [stop] and reader.new_outcomes() == []
    assert reader.end is None
    with open(tmp_path / "process-0.jsonl", "a") as f:
        f.write('st_stride-s32-p4-int32-fragmented", "table": "results.csv", "process": 0, "status": "ok", "note": "", '
                '"fail": false, "reading": null, "samples": []}\n')
    end = WorkerEnd(123, 1.5, BlocksSpent(1, 0.5, 0.25, 0.05, 0.01, 0.1))
    log.end(end)
    assert reader.new_outcomes() == [BlockOutcome("host_stride-s32-p4-int32-fragmented", POINTS, 0)]
    assert reader.end == end


TIMED = ("--benchmark-only", "--kv-time-budget", "0.001", "-p", "no:cacheprovider", "--kv-breakdown", "off")
TWO = ("--kv-seq-lens", "512", "--kv-page-sizes", "1,64", "--kv-variants", "host_stride,device_stride",
       "--kv-scenarios", "none", "--kv-repetitions", "4", "--kv-processes", "2", "--kv-passes", "1",
       "--kv-remeasure-budget", "0")  # the planned processes alone: re-measurement has its own tests (test_remeasure.py)


def test_processes_time_their_share_in_fresh_pytest_workers_into_one_run_folder(pytester):
    pytester.makepyfile(test_kv_sweep=BENCH)
    out = pytester.path / "bench.json"
    result = pytester.runpytest(*TWO, *CPU, *TIMED, "--benchmark-json", str(out))
    result.assert_outcomes(passed=8)  # this session's share: 2 of 4 repetitions of 4 cases
    result.stdout.fnmatch_lines(["kvpages: process 1 of 2 (pid *): 8 blocks in *", "*process 2 of 2*this session*"])
    [folder] = run_dirs(pytester.path)
    run = load_run(folder)
    assert len(run.rows) == 4 and (run.rows["status"] == "ok").all() and (run.rows["repetitions"] == 4).all()
    assert all(run.processes[key] == (0, 1, 0, 1) for key in run.samples)
    roles = [(p.index, p.role) for p in run.meta.processes]
    assert roles == [(0, "worker"), (1, "session")] and len({p.pid for p in run.meta.processes}) == 2
    assert run.meta.completed and all(p.startup_s > 0 and p.blocks == 8 for p in run.meta.processes)
    assert_phases_add_up(run.meta)
    names = {b["name"] for b in json.loads(out.read_text())["benchmarks"]}
    assert len(names) == 16 and {n.rsplit("-r", 1)[1].rstrip("]") for n in names} == {"0", "1", "2", "3"}
    assert analyze(run).ratios[0].interval_unit == "process"


WHEN = '''
import json
import os
import sys
import time
from pathlib import Path

import kvpages.measure.runner as runner

WHO = sys.argv[sys.argv.index("--kv-worker") + 1] if "--kv-worker" in sys.argv else "session"
STARTED, FIRST, METERED = time.time(), [], []
measure = runner.measure
runner.measure = lambda *args: METERED.append(1) or measure(*args)


def pytest_runtest_call(item):
    FIRST.append(FIRST[0] if FIRST else time.time())
    if WHO == "0" and {fail}:
        os._exit(3)


def pytest_sessionfinish(session, exitstatus):
    Path(__file__).with_name(f"when-{{WHO}}.json").write_text(json.dumps(
        {{"started": STARTED, "first": FIRST[0] if FIRST else None, "ended": time.time(), "status": int(exitstatus),
          "metered": len(METERED)}}))
'''
THREE = [a if a not in ("4", "2") else "3" for a in TWO]  # 3 processes of one repetition each


def _when(pytester, who: str) -> dict:
    return json.loads((pytester.path / f"when-{who}.json").read_text())


def test_workers_start_together_and_time_one_at_a_time_on_process_0s_readings(pytester):
    pytester.makeconftest(WHEN.format(fail=False))
    pytester.makepyfile(test_kv_sweep=BENCH)
    result = pytester.runpytest_subprocess(*THREE, *CPU, *TIMED)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["kvpages: 2 worker processes started together with this session's collection, "
                                 "all ready in *"])  # no spare: budget 0
    first, second, session = (_when(pytester, who) for who in ("0", "1", "session"))
    assert second["started"] < first["first"]  # both started before either timed
    assert first["ended"] <= second["first"] and second["ended"] <= session["first"]  # never two at once
    assert (first["metered"], second["metered"], session["metered"]) == (4, 0, 0)  # process 0's readings stand
    [folder] = run_dirs(pytester.path)
    meta = load_run(folder).meta
    assert meta.completed and [p.role for p in meta.processes][:3] == ["worker", "worker", "session"]
    assert [p.role for p in meta.processes][3:] == ["remeasure"] * meta.remeasure.rounds
    assert meta.timing is not None and meta.timing.startup_overlap_s > 0  # their start-ups overlapped
    assert_phases_add_up(meta)


CHILDREN = """
import os
import sys
from pathlib import Path


def pytest_collection_finish(session):
    if "--kv-worker" not in sys.argv:  # the session, its collection done: which processes has it started?
        children = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == os.getpid()]
        Path(__file__).with_name("children.txt").write_text(" ".join(children))


def _parent(process: Path) -> int | None:
    try:
        return int((process / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
"""


@pytest.mark.parametrize("more, ends", [((), "passed=4"), (("-k", "no_such_case"), "deselected=4"),
                                        (("--kv-dtypes", "int64", "--kv-seq-lens", "100000000000"), "usage error")])
def test_workers_start_before_the_session_collects_and_none_outlives_it(pytester, more, ends):
    """A CPU sweep's workers (and its spare) start as its session starts to collect, so their start-ups run beside
    the session's; where it then needs none (nothing selected, a sweep refused before anything runs) they are stopped:
    no process of the sweep is left, and no run folder."""
    pytester.makeconftest(CHILDREN)
    pytester.makepyfile(test_kv_sweep=BENCH)
    args = [a if a != "0" else "0.5" for a in THREE]  # a re-measurement budget: a spare starts too
    result = pytester.runpytest_subprocess(*args, *CPU, *TIMED, *more, timeout=100)
    if ends == "usage error":  # refused in the session's collection, after the workers started
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["*--kv-seq-lens: seq_len 100000000000 at page_size 1 (int64) needs about*"])
        assert "Traceback" not in result.stderr.str()
    else:
        result.assert_outcomes(**{ends.split("=")[0]: int(ends.split("=")[1])})
    assert len((pytester.path / "children.txt").read_text().split()) == 3  # two planned workers and the spare
    if ends != "passed=4":
        assert run_dirs(pytester.path) == []
    assert left_behind(pytester.path) == []


def test_a_worker_started_early_that_exits_before_it_is_ready_fails_the_run_naming_it(pytester):
    pytester.makeconftest("import os\nimport sys\n\nif '--kv-worker' in sys.argv:\n    os._exit(3)\n")
    pytester.makepyfile(test_kv_sweep=BENCH)
    result = pytester.runpytest_subprocess(*THREE, *CPU, *TIMED, timeout=100)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(["*kvpages: worker process [01] of 3 exited with status 3 before it was ready*"])  # either
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert left_behind(pytester.path) == []


def test_when_a_worker_fails_the_ones_still_waiting_exit_without_timing(pytester):
    pytester.makeconftest(WHEN.format(fail=True))
    pytester.makepyfile(test_kv_sweep=BENCH)
    result = pytester.runpytest_subprocess(*THREE, *CPU, *TIMED, timeout=100)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(["*kvpages: worker process 0 of 3 exited with status 3 before its end*"])
    waiting = _when(pytester, "1")
    assert waiting["first"] is None and waiting["status"] == pytest.ExitCode.INTERRUPTED


def test_a_worker_keeps_the_cases_the_session_selected(pytester):
    pytester.makepyfile(test_kv_sweep=BENCH)
    result = pytester.runpytest(*TWO, *CPU, *TIMED, "-k", "host_stride")
    result.assert_outcomes(passed=4, deselected=4)
    [folder] = run_dirs(pytester.path)
    run = load_run(folder)
    assert set(run.rows["variant"]) == {"host_stride"} and (run.rows["repetitions"] == 4).all()
    assert not run.meta.completed and "deselected" in run.meta.end_note


def test_a_case_a_worker_stopped_is_recorded_once_naming_its_process(pytester):
    pytester.makepyfile(test_kv_sweep=BENCH)
    args = [a if a != "host_stride,device_stride" else "host_stride,device_stride_pinned" for a in TWO]
    result = pytester.runpytest(*args, *CPU, *TIMED)
    result.assert_outcomes(passed=4, skipped=4)  # the pinned variant needs CUDA: its later tests skip
    [folder] = run_dirs(pytester.path)
    run = load_run(folder)
    pinned = run.rows[run.rows["variant"] == "device_stride_pinned"]
    assert len(pinned) == 2 and (pinned["status"] == "skipped").all()
    assert pinned["note"].str.contains("CUDA").all() and pinned["note"].str.endswith("(in process 0)").all()
    assert run.meta.completed


SLOW_SESSION = '''
import sys
import time


def pytest_runtest_call(item):
    if "--kv-worker" not in sys.argv:  # 0.15 s before each of the session's own blocks (untimed): its share lasts
        time.sleep(0.15)  # seconds, not the tenth of one its 12 short blocks take, so the signal lands in the run
'''
"""The session's share made to last: a signal sent once the worker's first blocks are recorded comes before the run's
end however late the test sees them (a loaded box once let the run finish first)."""


def wait_while_running(session: subprocess.Popen, done: Callable[[], bool], limit_s: float = 60.0) -> None:
    """Until `done()`, the session's end, or `limit_s`, looking every 0.05 s: when to send a signal into a run."""
    deadline = time.monotonic() + limit_s
    while not done() and session.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_keeps_every_finished_block_and_marks_its_rows_partial(pytester, stop):
    pytester.makepyfile(test_kv_sweep=BENCH)
    pytester.makeconftest(SLOW_SESSION)
    args = [a if a != "4" else "6" for a in TWO]  # 6 repetitions, 3 in the worker, 3 in the session
    timed = [a if a != "0.001" else "1" for a in TIMED]  # blocks long enough to interrupt the worker's share
    session = pytester.popen([sys.executable, "-m", "pytest", *args, *CPU, *timed], stdin=subprocess.DEVNULL)
    def blocks_written() -> int:
        samples = list(pytester.path.glob(f"results/*/{SAMPLES_CSV}"))
        return len(samples[0].read_text().splitlines()) - 1 if samples else 0

    wait_while_running(session, lambda: blocks_written() >= 2)  # the first blocks written (the worker's)
    seen = blocks_written()
    session.send_signal(stop)
    session.communicate(timeout=120)
    assert seen >= 2, "no block was written before the session ended"
    [folder] = run_dirs(pytester.path)
    run = load_run(folder)
    assert not run.meta.completed and run.meta.end_note.startswith("interrupted after")
    blocks = sum(len(b) for b in run.samples.values())
    assert blocks >= seen  # every block finished by the signal, and those finished while the worker stopped
    partial = run.rows[run.rows["status"] == PARTIAL]
    assert len(partial) >= 1 and (partial["repetitions"] < 6).all()
    assert partial["note"].str.contains("of 6 repetitions").all()
    assert int(run.rows["repetitions"].sum()) == blocks  # each kept block is in its row's count
    analysis = analyze(run)
    for r in analysis.ratios:  # one process's blocks cannot give this run's process-level interval
        key = (r.variant, r.dtype, r.layout, r.seq_len, r.page_size)
        if set(run.processes[key]) == {0}:
            assert not math.isfinite(r.ci_high)
    assert "row(s) are partial" in "\n".join(caveats(analysis))


def signal_as_turn_ends(first: int = 0) -> str:
    """A conftest in which a SIGINT lands just as the turn of a worker of process index `first` or later ends."""
    return f'''
import kvpages.measure.workers as workers

run = workers.Worker.run


def run_then_signal(self, *args, **kwargs):
    run(self, *args, **kwargs)
    if self.process >= {first}:
        raise KeyboardInterrupt("signal SIGINT")  # as a signal landing just as the worker's turn ended


workers.Worker.run = run_then_signal
'''


def test_a_signal_as_a_workers_turn_ends_keeps_that_worker_in_the_run(pytester):
    """A signal landing as a worker's turn ends interrupts the run with that worker recorded in meta.json's
    processes: its blocks are a cut-short two-process run's (no interval from one process), not a one-process run's."""
    pytester.makepyfile(test_kv_sweep=BENCH)
    pytester.makeconftest(signal_as_turn_ends())
    result = pytester.runpytest_subprocess(*TWO, *CPU, *TIMED, timeout=100)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    run = load_run(run_dirs(pytester.path)[0])
    assert [(p.index, p.role) for p in run.meta.processes] == [(0, "worker"), (1, "session")]
    assert not run.meta.completed and {p for key in run.samples for p in run.processes[key]} == {0}
    assert all(not math.isfinite(r.ci_high) for r in analyze(run).ratios)


HELD_SESSION = '''
import sys
import time
from pathlib import Path

OWN = []


def pytest_runtest_call(item):
    if "--kv-worker" not in sys.argv:
        OWN.append(item.nodeid)
        if len(OWN) == 10:  # 9 of its 12 blocks are done, so at least one case is complete: its row is held
            Path(__file__).with_name("nine-own-blocks").write_text("")
        time.sleep(0.15)  # its share lasts seconds, so the signal lands in it
'''


def test_a_session_stopped_in_its_own_share_writes_the_rows_it_held(pytester):
    """With a spare waiting for a round, the session holds back the rows its own blocks complete while it times them
    (kvpages.measure.recorder.Recorder.hold), and appends their samples as they end: an interruption then writes
    every row it held, and the rest as partial."""
    pytester.makepyfile(test_kv_sweep=BENCH)
    pytester.makeconftest(HELD_SESSION)
    args = [a if a != "4" else "6" for a in TWO[:-2]]  # re-measurement on: a spare, so the session holds
    session = pytester.popen([sys.executable, "-m", "pytest", *args, *CPU, *TIMED], stdin=subprocess.DEVNULL)
    marker = pytester.path / "nine-own-blocks"
    wait_while_running(session, marker.exists)
    assert marker.exists(), "the session ended before its tenth block"
    [written] = pytester.path.glob(f"results/*/{SAMPLES_CSV}")
    processes = [line.split(",")[7] for line in written.read_text().splitlines()[1:]]  # the process column
    rows_then = (written.parent / RESULTS_CSV).read_text().splitlines()[1:]
    session.send_signal(signal.SIGINT)
    session.communicate(timeout=120)
    assert processes.count("1") >= 9 and rows_then == []  # its samples on disk, the rows they completed held
    run = load_run(run_dirs(pytester.path)[0])
    done = run.rows[run.rows["status"] == "ok"]
    assert len(done) >= 1 and (done["repetitions"] == 6).all()  # the held rows, written
    assert not run.meta.completed and run.meta.end_note.startswith("interrupted after")
    assert int(run.rows["repetitions"].sum()) == sum(len(b) for b in run.samples.values())


HUNG_WORKER = '''
import sys
import time

import kvpages.measure.session as session

session.WORKER_START_S = 2.0  # every worker hangs: the limit decides only how soon one is stopped
session.WORKER_PER_TARGET_S = session.WORKER_PER_BLOCK_S = session.WORKER_BUDGET_FACTOR = 0.0
HANG = "{hang}"
if HANG == "turn":  # only the turn's limit is under test: start-up keeps a wide one, however loaded the box is
    run_workers = session.run_workers
    session.run_workers = lambda command, start_limit_s, *rest, **named: run_workers(command, 60.0, *rest, **named)
if "--kv-worker" in sys.argv and HANG == "start":  # the worker hangs before it is ready
    time.sleep(120)


def pytest_runtest_call(item):
    if "--kv-worker" in sys.argv and HANG == "turn":  # the worker hangs in its turn (a stand-in for a wedged device)
        time.sleep(120)
'''


@pytest.mark.early
@pytest.mark.parametrize("hang, says", [("start", "was not ready within its limit of 2 s"),
                                        ("turn", "did not finish within its limit of 2 s")])
def test_a_worker_past_its_limit_is_stopped_and_the_run_fails_naming_it(pytester, hang, says):
    pytester.makeconftest(HUNG_WORKER.format(hang=hang))
    pytester.makepyfile(test_kv_sweep=BENCH)
    result = pytester.runpytest_subprocess(*TWO, *CPU, *TIMED, timeout=100)  # stopped at its limit, not left to hang
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines([f"*kvpages: worker process 0 of 2 {says} and was stopped*"])
