"""bench/gpu_check.sh, run for real in bash: its preflight stops, its usage errors, a CPU rehearsal of every step
with --archive (in order, both runs archived), a failing step and an interrupted one; and the busy-queue chart.

The script's runs see no CUDA device (CUDA_VISIBLE_DEVICES is emptied), so these tests behave the same on a
CUDA machine, where gpu_check.sh itself is the check to run.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import GPU_CHECK_RUN, REHEARSAL, REPO, SCRIPT, Rehearsal, gpu_check, script_env, shadow

from kvpages.analysis.ratios import analyze
from kvpages.render.plots import _busy_reference, plot_run
from kvpages.render.report import write_report
from kvpages.schema.meta import Environment, RunMeta, RunTiming
from kvpages.schema.reader import load_run
from kvpages.schema.rows import SCENARIOS, ScenarioRow, ScenarioSampleSet
from kvpages.schema.writer import RunWriter

SMALL = ("--kv-seq-lens", "256", "--kv-page-sizes", "16", "--kv-scenarios", "none", "--kv-breakdown", "off", "--kv-processes", "1")
"""Fewer points, no scenarios, no breakdown and one process (it overrides sweep-on's 2), for the rehearsals that
check what happens around a sweep rather than in it."""


def in_order(text: str, *markers: str) -> bool:
    """Whether each marker occurs in `text`, each after the one before."""
    at = 0
    for marker in markers:
        at = text.find(marker, at)
        if at < 0:
            return False
        at += len(marker)
    return True


def archived(tarball: Path) -> list[str]:
    with tarfile.open(tarball) as tar:
        return tar.getnames()


# ----------------------------------------------------------------------------- preflight stops


def test_gpu_check_without_pandas_stops_with_one_line_saying_how_to_get_it(tmp_path):
    done = gpu_check(env=shadow(tmp_path, "pandas", "pytest_benchmark"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    line = done.stderr
    assert "lacks pytest-benchmark (the timer (--benchmark-only)), pandas (the summary and report)" in line
    assert "-m pip install pytest-benchmark pandas" in line
    assert "pip download -d wheels pytest-benchmark pandas" in line and "--no-index --find-links wheels" in line


def test_gpu_check_without_cuda_says_so_after_the_packages():
    done = gpu_check()
    assert done.returncode == 3 and "sees no CUDA device; nothing to check here" in done.stderr
    assert done.stderr.count("\n") == 1


def test_gpu_check_without_cuda_still_leaves_its_log_in_the_archive(tmp_path):
    archive = tmp_path / "out"
    done = gpu_check("--archive", "out", cwd=tmp_path)  # relative to the caller's folder
    assert done.returncode == 3
    assert done.stderr == ""  # with --archive, stderr is merged into stdout, in order
    assert "sees no CUDA device; nothing to check here" in done.stdout
    assert [p.name for p in archive.iterdir()] == ["gpu_check.log"]
    assert (archive / "gpu_check.log").read_text() == done.stdout
    assert done.stdout.startswith("== gpu_check.sh --device cuda --archive ") and done.stdout.count("\n") == 2


def test_the_cuda_tests_gpu_check_collects_need_no_hypothesis(tmp_path, rehearsal: Rehearsal):
    env = shadow(tmp_path, "hypothesis")
    no_plugin = ("-p", "no:hypothesispytest")  # without hypothesis installed, its pytest plugin is not registered
    step = SCRIPT.read_text().split("run_step cuda-tests", 1)[1].split(" -m cuda", 1)[0]
    marked = {p.name for p in (REPO / "tests").glob("test_*.py")  # a CUDA-marked test, or one run on devices()
              if p.name != Path(__file__).name and ("pytest.mark.cuda" in (text := p.read_text()) or "devices()" in text)}
    assert set(re.findall(r"tests/(test_\w+\.py)", step)) == marked >= {"test_variants.py", "test_syncs.py"}
    log = (rehearsal.archive / "gpu_check.log").read_text()  # the rehearsal ran its step where hypothesis is missing
    assert "== cuda-tests (" in log and "== cuda-tests failed" not in log and re.search(r"\n\d+ skipped, ", log), log[-3000:]
    properties = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "tests" / "test_properties.py"), "-q",
                                 "-p", "no:cacheprovider", "-rs", *no_plugin], env=env, capture_output=True,
                                text=True, timeout=300, cwd=REPO)
    assert "1 skipped" in properties.stdout and "hypothesis is not installed" in properties.stdout


# ----------------------------------------------------------------------------- usage errors


@pytest.mark.parametrize(
    "args, env, message",
    [
        (("--archive",), {}, "--archive needs a folder, e.g. --archive out"),
        (("--archive", "--kv-page-sizes", "1"), {}, "--archive needs a folder"),
        (("--archive=",), {}, "--archive needs a folder"),
        (("--device", "gpu"), {}, "--device 'gpu': choose cuda or cpu"),
        (("--archiv", "out"), {}, "unknown option '--archiv': this script's own are --archive DIR and --device cuda|cpu"),
        ((), {"GPU_CHECK_SWEEP_S": "2m"}, "GPU_CHECK_SWEEP_S='2m': give a whole number of seconds, e.g. 150"),
    ],
)
def test_a_usage_error_is_one_line_and_runs_nothing(tmp_path, args, env, message):
    done = gpu_check(*args, env=script_env(**env), cwd=tmp_path, timeout=30)
    assert done.returncode == 64
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("gpu_check.sh: ") and message in done.stderr
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


def test_help_prints_the_header_the_one_place_usage_and_exit_codes_are_written(tmp_path):
    done = gpu_check("--help", cwd=tmp_path, timeout=30)
    assert done.returncode == 0 and done.stderr == "" and list(tmp_path.iterdir()) == []
    header = SCRIPT.read_text().split("\nset ", 1)[0].splitlines()[1:]
    assert done.stdout.splitlines() == [line.removeprefix("#").removeprefix(" ") for line in header]
    assert "Usage: bash bench/gpu_check.sh" in done.stdout and "Exit codes: 0 every step passed" in done.stdout
    for page in ("Makefile", "README.md", "docs/guide.md"):
        assert "bench/gpu_check.sh --help" in (REPO / page).read_text(), page


# ----------------------------------------------------------------------------- CPU rehearsals


def test_a_cpu_rehearsal_runs_the_sweeps_then_compare_then_the_tests_and_archives_both_runs(tmp_path,
                                                                                           rehearsal: Rehearsal):
    done, archive, results = rehearsal.done, rehearsal.archive, rehearsal.results
    log = (archive / "gpu_check.log").read_text()
    assert done.returncode == 0, log[-3000:]
    assert log == done.stdout and done.stderr == ""
    off, on = sorted(results.iterdir())
    assert in_order(log, "== rehearsal on the CPU", "== sweep-off (", "--kv-crosscheck off", f"run folder: {off}",
                    f"== archive: {archive}/runs.tar.gz holds results/{off.name}\n",
                    "== profiler: not checked in a CPU rehearsal", "== sweep-on (", "--kv-crosscheck on",
                    f"run folder: {on}", f"holds results/{off.name} results/{on.name}\n",
                    "== compare (", f"A = {off.name}", f"B = {on.name}",
                    f"::test_cuda_quick_sweep_writes_a_complete_run checks {results}/{on.name}, step 4's run, instead",
                    "\n== cuda-tests (", " -m cuda ",
                    f"holds results/{off.name} results/{on.name}\n")
    assert re.search(r"\n\d+ skipped, \d+ deselected", log)  # the CUDA tests, collected and skipped on the CPU
    assert f"export {GPU_CHECK_RUN}=" in SCRIPT.read_text()  # the name the complete-run test reads
    assert (off / "scenario_steps.png").exists() and not (off / "scenario_busy.png").exists()  # busy rows: skipped
    *_, took, last = log.splitlines()
    assert last == f"gpu-check: all 5 steps passed; log and runs in {archive}"
    steps = re.fullmatch(r"== took: (.*); (\d+) of GPU_CHECK_TOTAL_S=280 s in all", took)
    assert steps is not None, took
    seconds = [re.fullmatch(r"([\w-]+) (\d+) of (\d+) s", step).groups() for step in steps[1].split(", ")]
    assert [name for name, *_ in seconds] == ["sweep-off", "sweep-on", "compare", "cuda-tests"]  # the steps run
    assert all(int(s) <= int(limit) for _, s, limit in seconds) and sum(int(s) for _, s, _ in seconds) <= int(steps[2])
    assert sorted(p.name for p in archive.iterdir()) == ["gpu_check.log", "runs.tar.gz"]
    names = archived(archive / "runs.tar.gz")
    assert all(n.startswith("results/") for n in names)
    for run in (off, on):
        assert {f"results/{run.name}/{f}" for f in ("results.csv", "scenarios.csv", "REPORT.md")} <= set(names)
    (tmp_path / "root").mkdir()  # as at the repository root
    subprocess.run(["tar", "xzf", str(archive / "runs.tar.gz")], cwd=tmp_path / "root", check=True, timeout=60)
    assert load_run(tmp_path / "root" / "results" / off.name).meta.crosscheck == "off"
    assert load_run(tmp_path / "root" / "results" / on.name).meta.crosscheck == "on (own process)"


def test_failing_steps_are_named_at_the_end_and_the_later_steps_still_run(tmp_path):
    python = tmp_path / "python"  # the real python, but the first sweep and the CUDA tests fail at once
    python.write_text(f'#!/bin/sh\ncase " $* " in *" --kv-crosscheck off "*) echo "first sweep: no" >&2; exit 7;;\n'
                      f'  *" -m cuda "*) echo "cuda tests: no" >&2; exit 5;; esac\n'
                      f'exec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    archive, results = tmp_path / "archive", tmp_path / "results"
    done = gpu_check("--archive", str(archive), *REHEARSAL, *SMALL, "--kv-results", str(results),
                     env=script_env(PYTHON=str(python)), timeout=300)
    log = (archive / "gpu_check.log").read_text()
    assert done.returncode == 1, log[-3000:]
    [on] = list(results.iterdir())
    assert in_order(log, "== sweep-off (", "first sweep: no\n== sweep-off failed: exit 7\n", "== sweep-on (",
                    f"run folder: {on}", f"== archive: {archive}/runs.tar.gz holds results/{on.name}\n",
                    f"== compare skipped: it needs the run folders of both sweeps (off: none, on: {on})",
                    "== cuda-tests (", "cuda tests: no\n== cuda-tests failed: exit 5\n")
    assert log.endswith(f"gpu-check: FAILED 2 of 4 steps: sweep-off (exit 7), cuda-tests (exit 5); log and runs in "
                        f"{archive}\n")
    assert {n.split("/")[1] for n in archived(archive / "runs.tar.gz")} == {on.name}


def test_a_sigterm_stops_the_running_step_archives_its_run_folder_and_says_so(tmp_path):
    archive, results = tmp_path / "archive", tmp_path / "results"
    with open(tmp_path / "stdout", "w") as out:
        script = subprocess.Popen(["bash", str(SCRIPT), "--archive", str(archive), *REHEARSAL, "--kv-results",
                                   str(results)], env=script_env(), stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while not (results.exists() and any(results.iterdir())):  # the first sweep has begun its run folder
                assert script.poll() is None and time.monotonic() < deadline, (tmp_path / "stdout").read_text()[-3000:]
                time.sleep(0.1)
            script.send_signal(signal.SIGTERM)
            assert script.wait(timeout=60) == 143
        finally:
            if script.poll() is None:
                script.kill()
    log = (archive / "gpu_check.log").read_text()
    [run] = list(results.iterdir())
    assert in_order(log, "== sweep-off (", "== interrupted by SIGTERM\n",
                    f"== archive: {archive}/runs.tar.gz holds results/{run.name}\n")
    assert log.endswith(f"gpu-check: FAILED 1 of 2 steps: sweep-off (interrupted by SIGTERM); "
                        f"log and runs in {archive}\n")
    assert "== sweep-on" not in log and f"results/{run.name}/meta.json" in archived(archive / "runs.tar.gz")


# ----------------------------------------------------------------------------- the busy-queue chart

BUSY_SCENARIO = "step-B8-lognormal_4096_1.0_65536-p64-int32-busy500us"
QUIET_SCENARIO = "step-B8-lognormal_4096_1.0_65536-p64-int32"


def scenario_run(folder: Path, busy_status: str, busy_measured_us: float | None = 512.0,
                 busy_baseline_status: str | None = None) -> Path:
    """A CUDA run folder of scenarios alone: a step without and with a 500 µs busy queue, two step variants each.

    Behind the busy queue, the blocking per-request copy waits for it (blocked = ready), the pinned batched
    one returns at once (blocked small, ready after the queue). `busy_status` 'skipped' gives the busy rows
    as a CPU run records them; `busy_baseline_status` (e.g. 'out_of_memory') only pre-PR's busy row. Works whether
    or not ScenarioRow has `busy_measured_us`.
    """
    folder.mkdir(parents=True)
    env = Environment("0", "3", "t", "n", "b", "p", "cpu-model", 16, 16, "cuda", "NVIDIA H200 (synthetic)", "12.8",
                      "570.1", "Gen5 x16", None, None, True, "the page indices crossed PCIe")
    writer = RunWriter(folder, RunMeta(folder.name, "quick", {}, "pytest bench/", "t0", env, repetitions=3))
    rng = np.random.default_rng(0)
    rows, samples, order = [], [], 0
    names = {f.name for f in dataclasses.fields(ScenarioRow)}
    cases = {(QUIET_SCENARIO, 0): {"per_request[host_stride]": (60.0, 60.0), "batched_device_stride_pinned": (25.0, 40.0)},
             (BUSY_SCENARIO, 500): {"per_request[host_stride]": (560.0, 560.0),
                                    "batched_device_stride_pinned": (20.0, 540.0)}}
    for (scenario, busy_us), variants in cases.items():
        for variant, (blocked_us, ready_us) in variants.items():
            status = (busy_baseline_status or busy_status) if busy_us and variant.endswith("[host_stride]") else (
                busy_status if busy_us else "ok")
            stats: dict[str, float | None] = {f"{w}_{s}_us": None for w in ("blocked", "ready")
                                              for s in ("median", "q1", "q3")}
            if status == "ok":
                blocks = []
                for repetition in range(3):
                    blocked = blocked_us * (1 + 0.05 * rng.standard_normal(40))
                    ready = np.maximum(blocked, ready_us * (1 + 0.05 * rng.standard_normal(40)))
                    blocks.append((blocked, ready))
                    samples.append(ScenarioSampleSet(scenario, variant, repetition, order, 0, tuple(blocked), tuple(ready)))
                    order += 1
                for i, what in enumerate(("blocked", "ready")):
                    values = np.concatenate([b[i] for b in blocks])
                    stats |= {f"{what}_median_us": float(np.median(values)),
                              f"{what}_q1_us": float(np.quantile(values, 0.25)),
                              f"{what}_q3_us": float(np.quantile(values, 0.75))}
            batched = variant.startswith("batched")
            values_of = {"scenario": scenario, "kind": "step", "side": "decode", "variant": variant, "device": "cuda",
                         "dtype": "int32", "layout": "fragmented", "requests": 8, "tokens": 40000, "chunk_size": 0,
                         "page_size": 64, "busy_us": busy_us, "calls": 8, "expected_d2h_bytes": 2500,
                         "d2h_bytes": 2500 if status == "ok" else None,
                         "d2h_transfers": (1 if batched else 8) if status == "ok" else None,
                         "host_syncs": (0 if batched else 8) if status == "ok" else None,
                         "link": ("pcie pinned" if batched else "pcie pageable") if status == "ok" else "",
                         **stats, "rounds": 120 if status == "ok" else None, "repetitions": 3 if status == "ok" else None,
                         "status": status,
                         "note": "" if status == "ok" else "out of memory" if status == "out_of_memory" else
                         "a busy-queue scenario needs CUDA: a CPU run has no device queue",
                         "repro": "pytest bench/test_steps.py",
                         "busy_measured_us": busy_measured_us if busy_us and status == "ok" else None}
            rows.append(ScenarioRow(**{k: v for k, v in values_of.items() if k in names}))
    writer.add_samples(SCENARIOS, samples)
    writer.add_rows(SCENARIOS, rows)
    writer.finish(True, "all rows recorded", RunTiming(10.0))
    return folder


def test_the_busy_queue_chart_shows_blocked_against_ready_per_variant(tmp_path):
    run = load_run(scenario_run(tmp_path / "run", "ok"))
    written = plot_run(analyze(run), ("png", "svg"))
    busy = run.path / "scenario_busy.png"
    assert busy in written and busy.stat().st_size > 0
    assert run.path / "scenario_steps.png" in written  # the quiet step keeps its own chart
    rows = run.scenarios[run.scenarios["busy_us"] > 0]
    assert _busy_reference(rows) == (512.0, "measured busy queue")
    drawn = (run.path / "scenario_busy.svg").read_text()  # each text of the chart as a comment of its own
    for _, row in rows.iterrows():  # each variant's blocked and ready bars carry their medians
        assert all(f"<!-- {row[f'{what}_median_us']:.0f} -->" in drawn for what in ("blocked", "ready")), row["variant"]
    assert "<!-- measured busy queue (512 µs) -->" in drawn


def test_without_a_measured_busy_time_the_reference_line_is_the_nominal_one(tmp_path):
    run = load_run(scenario_run(tmp_path / "run", "ok", busy_measured_us=None))
    assert (run.path / "scenario_busy.png") in plot_run(analyze(run))
    assert _busy_reference(run.scenarios[run.scenarios["busy_us"] > 0]) == (500.0, "nominal busy queue")


def test_a_run_whose_busy_rows_were_skipped_has_no_busy_chart(tmp_path):
    run = load_run(scenario_run(tmp_path / "run", "skipped"))
    written = plot_run(analyze(run))
    assert run.path / "scenario_steps.png" in written
    assert not (run.path / "scenario_busy.png").exists() and all("busy" not in p.name for p in written)


def test_a_report_whose_busy_baseline_failed_says_it_is_missing(tmp_path):
    analysis = analyze(load_run(scenario_run(tmp_path / "run", "ok", busy_baseline_status="out_of_memory")))
    report = write_report(analysis).read_text()
    assert ("`per_request[host_stride]` or the merged PR is missing behind the busy queue (out_of_memory (out of "
            "memory))") in report
