"""Many ranks at once: torchrun's ranks on this CPU box (gloo), their gathered rows, and a rank that fails or hangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import built_once

from kvpages.analysis.contention import paired_ratio
from kvpages.core.options import BenchOptions
from kvpages.measure.group import HostBarrier, Launch, ranked_options
from kvpages.measure.ranks import TOGETHER, round_modes
from kvpages.schema.ranks import ALONE, ALONE_MAX, CONTENTION_COLUMNS, CONTENTION_CSV, RANK, STEP
from kvpages.schema.reader import sample_file
from kvpages.schema.rows import RankRow, columns

STEPS = '''
def test_scenario(benchmark, kv_scenario, kv_session):
    kv_session.run(benchmark, kv_scenario)
'''
TWO_STEPS = ("--kv-step-sizes", "2,4", "--kv-step-lens", "fixed:256", "--kv-page-sizes", "16", "--kv-repetitions", "3",
             "--kv-passes", "1", "--kv-time-budget", "0.003", "-p", "no:cacheprovider")
VARIANTS = ("per_request[host_stride]", "per_request[device_stride]")


def torchrun(folder: Path, *args: str, ranks: int = 2, timeout: float = 240) -> subprocess.CompletedProcess:
    """torchrun --standalone --nproc-per-node `ranks` -m pytest ... in `folder`, as a user runs it."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               "-m", "pytest", "test_steps.py", "--benchmark-only", "--kv-results", "results", *args]
    env = {**os.environ, "TMPDIR": str(folder)}  # torchrun's log folder (torchelastic_*), which it leaves behind
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)


def left_behind(folder: Path) -> list[str]:
    """Processes still running from `folder` (their command line names it, or their working directory is it), this one
    aside (pytester runs a test in the folder it makes)."""
    found = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    pids = [line.split()[0] for line in found[1:] if ("torch.distributed.run" in line or "pytest" in line)
            and line.split()[0] != str(os.getpid())]
    return [pid for pid in pids if Path(f"/proc/{pid}/cwd").exists() and _cwd(pid) == folder]


def _cwd(pid: str) -> Path | None:
    try:
        return Path(f"/proc/{pid}/cwd").resolve()
    except OSError:
        return None


@pytest.fixture(scope="module")
def two_ranks(request: pytest.FixtureRequest) -> tuple[Path, subprocess.CompletedProcess]:
    """One run of two ranks with its analysis, made once per session (`built_once`), and how torchrun ended."""
    def build(folder: Path) -> None:
        (folder / "test_steps.py").write_text(STEPS)
        done = torchrun(folder, *TWO_STEPS, "--kv-step-variants", ",".join(VARIANTS), "--kv-analyze",
                        "--benchmark-json", "benchmarks.json")
        (folder / "torchrun.json").write_text(json.dumps([done.returncode, done.stdout, done.stderr]))

    folder = built_once(request.config, "two-ranks", build)
    code, out, err = json.loads((folder / "torchrun.json").read_text())
    return folder, subprocess.CompletedProcess(["torchrun"], code, out, err)


@pytest.mark.early
def test_two_ranks_write_one_run_folder_with_every_rank_in_meta(two_ranks):
    folder, done = two_ranks
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    [run] = list((folder / "results").iterdir())
    meta = json.loads((run / "meta.json").read_text())
    assert meta["completed"], meta["end_note"]
    ranks = meta["ranks"]
    assert ranks["world_size"] == 2 and ranks["backend"] == "gloo"
    assert [r["rank"] for r in ranks["ranks"]] == [0, 1]
    assert [r["device"] for r in ranks["ranks"]] == ["cpu", "cpu"]
    assert len({r["pid"] for r in ranks["ranks"]}) == 2
    assert meta["command"].startswith("torchrun --nproc-per-node 2 -m pytest test_steps.py")
    assert "rank 1 of 2: rank 0 writes the run folder" in done.stdout
    benchmarks = json.loads((folder / "benchmarks.json").read_text())["benchmarks"]  # rank 0's, not overwritten
    assert len(benchmarks) == 2 * len(VARIANTS) * 3  # steps x variants x repetitions


def test_rank_rows_hold_every_rank_at_once_and_alone_and_the_step_at_once_and_alone(two_ranks):
    folder, _ = two_ranks
    [run] = list((folder / "results").iterdir())
    rows = pd.read_csv(run / "ranks.csv")
    assert list(rows.columns) == list(columns(RankRow))
    assert len(rows) == 2 * len(VARIANTS) * 6  # two steps (B=2, B=4) x variants x (2 ranks at once and alone, step x 2)
    assert (rows["status"] == "ok").all()
    for (_, _), case in rows.groupby(["scenario", "variant"]):
        assert sorted(zip(case["role"], case["rank"].fillna(-1), strict=True)) == sorted(
            [(RANK, 0), (RANK, 1), (ALONE, 0), (ALONE, 1), (STEP, -1), (ALONE_MAX, -1)])
        step = case[case["role"] == STEP].iloc[0]
        one = case[case["role"] == RANK].iloc[0]
        assert step["d2h_bytes"] == 2 * one["d2h_bytes"]  # the step moves what both ranks move
        assert case[case["role"] == ALONE_MAX].iloc[0]["d2h_bytes"] == step["d2h_bytes"]
        assert step["repro"].startswith("torchrun --nproc-per-node 2 -m pytest bench/test_steps.py --benchmark-only")


def test_per_cycle_the_step_is_the_slowest_rank_at_once_and_alone(two_ranks):
    folder, _ = two_ranks
    [run] = list((folder / "results").iterdir())
    samples = pd.read_csv(sample_file(run, "rank_samples.csv"), dtype=str, keep_default_na=False)
    for _, block in samples.groupby(["scenario", "variant", "repetition"]):
        series = {(r["role"], r["rank"]): np.array(r["ready_us"].split(), dtype=float) for _, r in block.iterrows()}
        np.testing.assert_allclose(series[STEP, ""], np.maximum(series[RANK, "0"], series[RANK, "1"]))
        np.testing.assert_allclose(series[ALONE_MAX, ""], np.maximum(series[ALONE, "0"], series[ALONE, "1"]))
        assert len({len(s) for s in series.values()}) == 1  # one value per cycle in every role


def test_the_report_gives_the_contention_of_the_step_and_of_each_rank_with_its_interval(two_ranks):
    folder, _ = two_ranks
    [run] = list((folder / "results").iterdir())
    contention = pd.read_csv(run / CONTENTION_CSV)
    assert list(contention.columns) == list(CONTENTION_COLUMNS)
    assert len(contention) == 2 * len(VARIANTS) * 3 * 2  # two steps x variants x (step, rank 0, rank 1) x latencies
    assert sorted(contention["rank"].fillna(-1).unique()) == [-1, 0, 1]
    assert ((contention["ci_low"] <= contention["ratio"]) & (contention["ratio"] <= contention["ci_high"])).all()
    np.testing.assert_allclose(contention["ratio"], contention["at_once_median_us"] / contention["alone_median_us"])
    report = (run / "REPORT.md").read_text()
    assert "## Findings: what a scheduler step pays when 2 ranks convert at once" in report
    assert (run / "contention.png").stat().st_size > 0 and "![contention.png](contention.png)" in report
    for row_id in contention["id"]:
        assert row_id in report or row_id.endswith("-blocked")


FAILING = '''
import os
import time
from kvpages.measure.steps import step_variant
from kvpages.measure.variants import Moves

@step_variant("fails_on_rank_one", moves=Moves.PAGES, batched=False)
def fails_on_rank_one(kv_slices, page_size):
    """Right on every rank but rank 1, which {what} at the step of 4 requests."""
    if os.environ["RANK"] == "1" and len(kv_slices) == 4:
        {action}
    return [(kv[::page_size] // page_size).cpu().numpy() for kv in kv_slices]
'''


@pytest.mark.parametrize("what, action, message", [
    ("raises", "raise RuntimeError('boom on purpose')", "rank 1 of 2: fails_on_rank_one-step-B4*RuntimeError: boom on purpose*"),
    pytest.param("hangs", "time.sleep(120)", "*rank(s) 1 did not arrive within 5 s*", marks=pytest.mark.early),
])
def test_a_rank_that_fails_or_hangs_stops_the_run_naming_it(tmp_path, what, action, message):
    (tmp_path / "test_steps.py").write_text(STEPS)
    (tmp_path / "conftest.py").write_text(FAILING.replace("{what}", what).replace("{action}", action))
    done = torchrun(tmp_path, *TWO_STEPS, "--kv-step-variants", "fails_on_rank_one", "--kv-rank-timeout", "5")
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert any(pytest_fnmatch(line, f"*{message}") for line in output.splitlines()), output[-4000:]
    assert left_behind(tmp_path) == []
    [run] = list((tmp_path / "results").iterdir())  # the step of 2 requests finished before: its rows are kept
    rows = pd.read_csv(run / "ranks.csv")
    assert set(rows[rows["status"] == "ok"]["scenario"]) == {"step-B2-fixed_256-p16-int32"}
    assert not json.loads((run / "meta.json").read_text())["completed"]


def pytest_fnmatch(line: str, pattern: str) -> bool:
    from fnmatch import fnmatch

    return fnmatch(line, pattern)


def test_torchrun_s_environment_describes_the_launch():
    assert Launch.from_env({}) is None
    assert Launch.from_env({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}) is None
    launch = Launch.from_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"})
    assert launch == Launch(3, 3, 8, 4)
    assert launch.command == ("torchrun", "--nproc-per-node", "4", "--nnodes", "2", "-m", "pytest")
    with pytest.raises(ValueError, match="LOCAL_RANK='x' is not an integer"):
        Launch.from_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "x", "LOCAL_WORLD_SIZE": "2"})


@pytest.mark.parametrize("given, refused", [
    ({"processes": 3}, "--kv-processes"),
    ({"crosscheck": "on"}, "--kv-crosscheck on"),
    ({"breakdown": "on"}, "--kv-breakdown on"),
    ({"scenarios": "none"}, "times the step scenarios, and these options have none; leave out --kv-scenarios none$"),
    ({"preset": "quick", "request_lens": (1000,)}, "have none; use a preset with steps .* or --kv-step-sizes$"),
])
def test_options_a_multi_rank_run_cannot_honour_are_refused(given, refused):
    with pytest.raises(ValueError, match=refused):
        ranked_options(BenchOptions(**given), Launch(0, 0, 2, 2))


def test_a_rank_times_in_one_process_without_crosscheck_or_breakdown():
    options = ranked_options(BenchOptions(preset="ranks"), Launch(0, 0, 2, 2))
    assert (options.sweep.processes, options.crosscheck, options.breakdown) == (1, "off", "off")


def test_rounds_cycle_each_rank_alone_in_turn_then_every_rank():
    assert round_modes(2, 2) == (TOGETHER, TOGETHER)  # fewer rounds than a cycle: every rank in each
    assert round_modes(6, 2) == (0, 1, TOGETHER, 1, 0, TOGETHER)  # the turn starts one rank later in each cycle
    assert round_modes(8, 3) == (0, 1, 2, TOGETHER, 1, 2, 0, TOGETHER)


COVERAGE_SEEDS = 1000
REPETITIONS, CYCLES, RANKS = 12, 20, 2


def no_contention(seed: int) -> tuple[np.ndarray, ...]:
    """Per repetition, the block medians of the step at once and alone, and of rank 0 at once and alone, when every
    round (at once or alone, any rank) is drawn from one heavy-tailed distribution: the ranks do not interfere."""
    rng = np.random.default_rng(seed)
    rounds = 30 * np.exp(rng.normal(0, 0.2, size=(REPETITIONS, CYCLES, 2, RANKS)))  # [.., 0 alone / 1 at once, rank]
    rounds[rng.random(rounds.shape) < 0.03] *= 5
    step = rounds.max(axis=3)
    return (np.median(step[:, :, 1], axis=1), np.median(step[:, :, 0], axis=1),
            np.median(rounds[:, :, 1, 0], axis=1), np.median(rounds[:, :, 0, 0], axis=1))


def test_without_contention_the_interval_contains_1_at_its_stated_rate():
    found = {"step": [], "rank 0": []}
    for seed in range(COVERAGE_SEEDS):
        step_at, step_alone, rank_at, rank_alone = no_contention(seed)
        found["step"].append(paired_ratio(step_at, step_alone))
        found["rank 0"].append(paired_ratio(rank_at, rank_alone))
    for who, intervals in found.items():
        [stated] = {i.confidence for i in intervals}
        covered = np.mean([i.ci_low <= 1.0 <= i.ci_high for i in intervals])
        tolerance = 3 * np.sqrt(stated * (1 - stated) / COVERAGE_SEEDS)  # 3 binomial standard errors: 2 points
        assert abs(covered - stated) <= tolerance, f"{who}: contains 1 in {covered:.1%} of {COVERAGE_SEEDS} seeds, " \
                                                   f"stated {stated:.1%}"


@pytest.mark.cuda
def test_on_a_machine_with_two_gpus_each_rank_converts_on_its_own(tmp_path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA devices, one per rank; this machine has {torch.cuda.device_count()}")
    (tmp_path / "test_steps.py").write_text(STEPS)
    done = torchrun(tmp_path, *TWO_STEPS, "--kv-step-variants", ",".join(VARIANTS), "--kv-device", "cuda")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    [run] = list((tmp_path / "results").iterdir())
    ranks = json.loads((run / "meta.json").read_text())["ranks"]["ranks"]
    assert [r["device"] for r in ranks] == ["cuda:0", "cuda:1"]
    rows = pd.read_csv(run / "ranks.csv")
    assert set(rows[rows["role"] == RANK]["device"]) == {"cuda:0", "cuda:1"}


def test_the_start_barrier_releases_when_every_rank_arrived_and_names_the_late_ones(tmp_path):
    path = tmp_path / "barrier"
    path.write_bytes(bytes(8 * 3))
    ranks = [HostBarrier(str(path), 3, r) for r in range(3)]  # three ranks' views of one shared file
    assert ranks[0].wait(0.01) == [1, 2]  # alone at the barrier: it gives up, naming who did not come
    assert ranks[1].wait(0.01) == [2]
    assert ranks[2].wait(0.01) == []  # the last to arrive finds everyone there
    assert ranks[0].generation == ranks[2].generation == 1
