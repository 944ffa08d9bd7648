"""The sweep through real pytest sessions (pytester): options, usage errors, run folders, interruption."""

from __future__ import annotations

import gc
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import FAST, assert_phases_add_up

from kvpages.core.presets import PRESETS
from kvpages.measure.variants import variant_names
from kvpages.schema.reader import load_run, row_key, sample_file

BENCH = (Path(__file__).parents[1] / "bench" / "test_d2h.py").read_text()
CPU = ("--kv-device", "cpu")  # what these tests assert is CPU behaviour; the CUDA twins are marked cuda


@pytest.fixture
def bench(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_kv_sweep=BENCH)
    return pytester


def run_dirs(root: Path) -> list[Path]:
    return sorted(p for p in (root / "results").glob("*") if p.is_dir()) if (root / "results").exists() else []


def test_a_run_with_nothing_timed_is_reported_without_charts(bench):
    """--kv-analyze on a run whose every case was skipped (the pinned variant needs CUDA; this session collects the
    points alone, its scenarios left on): the summary and the report say so, nothing is drawn, and the session passes
    (no chart process failing as `kvpages plot` refuses). With `--kv-scenarios none` it is a usage error (below)."""
    result = bench.runpytest("--kv-variants", "device_stride_pinned", "--kv-seq-lens", "64", "--kv-page-sizes", "4",
                             "--kv-repetitions", "1", "--kv-analyze", *CPU, *FAST)
    result.assert_outcomes(skipped=1)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["no timed rows", "run folder: *", "report: *REPORT.md (with ratios.csv)"])
    result.stdout.no_fnmatch_line("chart: *")
    [folder] = run_dirs(bench.path)
    assert (folder / "REPORT.md").exists() and not list(folder.glob("*.png"))


def test_quick_preset_writes_a_complete_run(bench):
    result = bench.runpytest("--kv-preset", "quick", "--kv-analyze", *CPU, *FAST, "--kv-breakdown", "on")
    n_variants, reps = len(variant_names()), PRESETS["quick"].sweep.repetitions
    result.assert_outcomes(passed=4 * (n_variants - 1) * reps, skipped=4 * reps)  # the pinned variant needs CUDA
    result.stdout.fnmatch_lines(["*kvpages summary*", "*CPU run: no PCIe link was crossed*",
                                 f"{reps} interleaved repetition(s) per (variant, point) in *", "run folder: *",
                                 "kvpages: timed * s of * s (*%), the session's wall from its start to the end of its breakdown; "
                                 "then its analysis * s"])
    [folder] = run_dirs(bench.path)
    assert folder.name.endswith("-cpu")
    run = load_run(folder)
    assert len(run.rows) == 4 * n_variants
    assert set(run.rows["status"]) == {"ok", "skipped"}
    skipped = run.rows[run.rows["status"] == "skipped"]
    assert set(skipped["variant"]) == {"device_stride_pinned"} and skipped["note"].str.contains("CUDA").all()
    ok = run.ok_rows()
    assert (ok["d2h_bytes"] == ok["expected_d2h_bytes"]).all()
    floor = ok["variant"] == "host_mirror"  # the zero-D2H floor hands nothing over
    assert (ok["link"] == floor.map({True: "none (no transfer)", False: "none (cpu)"})).all()
    host = ok[ok["variant"] == "host_stride"]
    assert (host["d2h_bytes"] == host["seq_len"] * 4).all()
    dev = ok[ok["variant"] == "device_stride"]
    assert (dev["d2h_bytes"] == -(-dev["seq_len"] // dev["page_size"]) * 4).all()
    assert (ok["d2h_transfers"] == (~floor).astype(int)).all() and (ok["repetitions"] == reps).all()
    assert (ok["q1_us"] <= ok["median_us"]).all() and (ok["median_us"] <= ok["q3_us"]).all()
    for _, row in ok.iterrows():
        blocks = run.samples[row_key(row)]
        assert len(blocks) == reps and sum(len(b) for b in blocks) == row["rounds"] >= 10 * reps
        assert min(b.min() for b in blocks) == pytest.approx(row["min_us"])
    samples = pd.read_csv(sample_file(folder, "samples.csv"))
    assert samples["order"].is_unique  # every timed block, by its place in the run (skipped blocks have none)
    for _, blocks in samples.groupby(["seq_len", "page_size", "repetition"]):
        assert len(blocks) == n_variants - 1  # a repetition runs its point's variants back to back
        assert blocks["order"].max() - blocks["order"].min() < n_variants
    meta = run.meta
    assert meta.completed and meta.end_note == f"all {4 * n_variants} rows recorded"
    assert meta.preset == "quick" and meta.options["--kv-preset"] == "quick" and meta.repetitions == reps
    assert meta.command.startswith("pytest ") and "--kv-analyze" in meta.command and meta.crosscheck == "off"
    env = meta.environment
    assert env.torch_version == torch.__version__ and env.device == "cpu" and not env.link_crossed
    assert "no PCIe link was crossed" in env.link_note
    assert meta.breakdown.startswith("breakdown.csv: ") and meta.timing is not None
    assert meta.timing.breakdown_s is not None and meta.timing.breakdown_s > 0 and meta.timing.analysis_s is not None
    assert_phases_add_up(meta)
    timed_us = samples["samples_us"].str.split().explode().astype(float).sum()
    assert meta.timing.timed_s == pytest.approx(timed_us / 1e6)  # the timed rounds are the samples
    for name in ("REPORT.md", "ratios.csv", "latency_int32_fragmented.png", "bytes_int32_fragmented.png",
                 "ratio_int32_fragmented.png", "link_model_int32_fragmented.png", "breakdown.csv",
                 "breakdown_int32_fragmented.png"):
        assert (folder / name).stat().st_size > 0


def test_options_narrow_the_sweep_and_feed_benchmark_json(bench):
    result = bench.runpytest(
        "--kv-seq-lens", "100,300", "--kv-page-sizes", "3", "--kv-variants", "host_stride,device_stride",
        "--kv-dtypes", "int64", "--kv-layouts", "contiguous", "--kv-seed", "7", "--kv-results", "out",
        "--kv-repetitions", "3", "--benchmark-json", "bench.json", *CPU, *FAST,
    )
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines(["*s100-p3-int64-contiguous-r2*"])
    [folder] = sorted((bench.path / "out").iterdir())
    rows = load_run(folder).rows
    assert sorted(rows["variant"].unique()) == ["device_stride", "host_stride"]
    assert set(rows["seq_len"]) == {100, 300} and set(rows["dtype"]) == {"int64"}
    data = json.loads((bench.path / "bench.json").read_text())
    assert len(data["benchmarks"]) == 12
    infos = {(b["extra_info"]["variant"], b["extra_info"]["seq_len"], b["extra_info"]["repetition"]): b
             for b in data["benchmarks"]}
    assert len(infos) == 12 and sorted({b["extra_info"]["order"] for b in data["benchmarks"]}) == list(range(12))
    assert infos[("host_stride", 300, 0)]["extra_info"]["d2h_bytes"] == 300 * 8
    assert infos[("device_stride", 300, 1)]["extra_info"]["d2h_bytes"] == 100 * 8
    assert infos[("device_stride", 100, 2)]["extra_info"]["d2h_transfers"] == 1
    assert infos[("device_stride", 100, 2)]["group"] == "s100-p3-int64-contiguous"
    run = load_run(folder)  # pytest-benchmark's record of each block holds every timed round, as samples.csv does
    for (variant, seq_len, repetition), b in infos.items():
        block = run.samples[(variant, "int64", "contiguous", seq_len, 3)][repetition]
        assert b["stats"]["rounds"] == block.size
        assert b["stats"]["median"] * 1e6 == pytest.approx(float(np.median(block)), abs=1e-3)


def test_each_rows_repro_command_reruns_that_case(bench):
    bench.runpytest("--kv-seq-lens", "64", "--kv-page-sizes", "16", "--kv-variants", "device_shift",
                    "--kv-repetitions", "2", *CPU, *FAST)
    [folder] = run_dirs(bench.path)
    repro = load_run(folder).rows["repro"].iloc[0]
    args = shlex.split(repro)
    assert args[:3] == ["pytest", "bench/", "--benchmark-only"]
    assert " --kv-repetitions 2 " in repro and " --kv-scenarios none" in repro  # this run's options, narrowed
    result = bench.runpytest("test_kv_sweep.py", *args[3:], "--kv-results", "again", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*device_shift-s64-p16-int32-fragmented-r1*"])


@pytest.mark.parametrize(
    "args, words",
    [
        (("--kv-page-sizes", "0"), "--kv-page-sizes: 0 is not >= 1; give comma-separated integers >= 1, e.g. 1,64"),
        (("--kv-page-sizes", "1,,4"), "has an empty item"),
        (("--kv-seq-lens", "-5"), "--kv-seq-lens: -5 is not >= 1; give comma-separated integers >= 1, e.g. 2048,8192"),
        (("--kv-seq-lens", "abc"), "--kv-seq-lens: 'abc' is not an integer"),
        (("--kv-variants", "host_stride,bogus"), "--kv-variants: unknown variant 'bogus'; valid: host_stride, device_stride"),
        (("--kv-preset", "huge"), "--kv-preset: unknown preset 'huge'; valid: quick, default, full"),
        (("--kv-dtypes", "float32"), "--kv-dtypes: unknown value 'float32'; valid: int32, int64"),
        (("--kv-layouts", "sparse"), "--kv-layouts: unknown value 'sparse'; valid: fragmented, contiguous"),
        (("--kv-device", "tpu"), "--kv-device: unknown device 'tpu'; valid: auto, cpu, cuda"),
        (("--kv-time-budget", "0"), "--kv-time-budget: '0' must be a positive number of seconds"),
        (("--kv-seed", "x"), "--kv-seed: 'x' is not an integer; give an integer seed >= 0"),
        (("--kv-repetitions", "0"), "--kv-repetitions: 0 is not >= 1"),
        (("--kv-passes", "two"), "--kv-passes: 'two' is not an integer"),
        (("--kv-disturb-factor", "1"), "--kv-disturb-factor: '1' is not a number in (1, 100]; give e.g. 1.5"),
        (("--kv-cpus", "9999"), "--kv-cpus 9999: none of these CPUs is available to this process"),
        (("--kv-cpus", "x"), "--kv-cpus: 'x' is not a CPU list; give e.g. 2,3 or 8-15, or one of auto, off"),
        (("--kv-threads", "0"), "--kv-threads: 0 is not >= 1; give a number of threads >= 1, e.g. 1"),
        (("--kv-adaptive-threshold", "0"), "--kv-adaptive-threshold: 0 is not >= 1"),
        (("--kv-bandwidth-probe", "maybe"), "--kv-bandwidth-probe: unknown bandwidth probe mode 'maybe'"),
        (("--kv-remeasure-budget", "abc"), "--kv-remeasure-budget: 'abc' is not a number in [0, 10]; give e.g. 0.25"),
        (("--kv-crosscheck", "maybe"), "--kv-crosscheck: unknown cross-check mode 'maybe'; valid: auto, on, off"),
        (("--kv-results", "test_kv_sweep.py"), "--kv-results test_kv_sweep.py: a file, not a folder; give a folder"),
        (("--kv-variants", "device_stride_pinned", "--kv-scenarios", "none"), "--kv-variants: none can run on cpu "
         "(device_stride_pinned requires CUDA (pinned host memory, CUDA event); this run's device is cpu), so nothing "
         "would be timed; those that can: host_stride, device_stride"),
        (("--kv-baseline", "sglang@nosuch"), "(an sglang@<label> variant exists once --kv-sglang loads SGLang's functions)"),
        (("--kv-seq-lens", "3000000000"), "--kv-seq-lens 3000000000: seq_len 3000000000 at page_size 1 needs token "
                                          "indices up to"),
        (("--kv-seq-lens", "3000000000"), "the largest valid seq_len for int32 at page_size 1 is"),
        (("--kv-seq-lens", "600000000", "--kv-page-sizes", "1"), "--kv-seq-lens: seq_len 600000000 at page_size 1 "
                                                                 "(int32) needs about"),
    ],
)
def test_bad_options_are_usage_errors_before_anything_runs(bench, args, words):
    start = time.perf_counter()
    result = bench.runpytest(*FAST, *CPU, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert words in result.stderr.str()
    assert run_dirs(bench.path) == []
    print(f"refused in {time.perf_counter() - start:.2f} s: {result.stderr.str().strip()}")


def test_a_session_without_kvpages_benchmarks_estimates_no_memory(pytester):
    pytester.makepyfile(test_plain="def test_one():\n    assert True\n")
    result = pytester.runpytest("--kv-seq-lens", "600000000", "--kv-page-sizes", "1", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)  # the same options refuse a sweep (above): here nothing is measured


def test_a_pytest_session_without_kvpages_benchmarks_never_imports_torch(pytester):
    """The plugin loads in every pytest session of an environment that has kvpages (its entry point): a user's own tests
    pay no torch import for it (it cost about 1 s of CPU a session); the session below checks sys.modules at its end."""
    pytester.makepyfile(test_plain="import sys\n\ndef test_one():\n    assert 'kvpages.plugin' in sys.modules\n"
                                   "    assert 'torch' not in sys.modules\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kv-seq-lens", "512")
    result.assert_outcomes(passed=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_device_without_cuda_is_a_usage_error(bench):
    result = bench.runpytest("--kv-device", "cuda", *FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--kv-device: 'cuda' is not available here" in result.stderr.str()
    assert "valid here: auto, cpu" in result.stderr.str()


def test_timing_disabled_checks_every_benchmark_but_writes_no_run(bench):
    result = bench.runpytest("--benchmark-disable", "--kv-preset", "quick", "-p", "no:cacheprovider", *CPU)
    result.assert_outcomes(passed=4 * (len(variant_names()) - 1), skipped=4)
    result.stdout.fnmatch_lines(["kvpages: timing disabled or nothing ran; no run folder written"])
    assert run_dirs(bench.path) == []


BROKEN = '''
from kvpages.measure.variants import Moves, variant

@variant("broken_off_by_one", moves=Moves.PAGES)
def broken_off_by_one(kv_indices, page_size):
    """Wrong on purpose: adds one to every page index."""
    return (kv_indices[::page_size] // page_size + 1).cpu().numpy()

@variant("broken_copies_twice", moves=Moves.PAGES)
def broken_copies_twice(kv_indices, page_size):
    """Right values, but hands every token index to the host first."""
    kv_indices.cpu()
    return (kv_indices[::page_size] // page_size).cpu().numpy()
'''


def test_a_wrong_variant_fails_loudly_and_its_row_says_so(bench):
    bench.makeconftest(BROKEN)
    result = bench.runpytest_subprocess(
        "--kv-variants", "broken_off_by_one,broken_copies_twice,device_stride", "--kv-seq-lens", "256",
        "--kv-page-sizes", "16", "--kv-repetitions", "2", *CPU, *FAST,
    )
    result.assert_outcomes(passed=2, failed=2, skipped=2)  # a failed case runs no further repetitions
    result.stdout.fnmatch_lines([
        "*broken_off_by_one-s256-p16*wrong output: 16 page indices differ; first at 0*",
        "*broken_copies_twice-s256-p16*measured 1088 D2H bytes, expected 64*",
    ])
    [folder] = run_dirs(bench.path)
    run = load_run(folder)
    status = dict(zip(run.rows["variant"], run.rows["status"], strict=True))
    assert status == {"broken_off_by_one": "mismatch", "broken_copies_twice": "mismatch", "device_stride": "ok"}
    assert not run.meta.completed and "session failed" in run.meta.end_note


def _start_slow_run(path: Path) -> subprocess.Popen:
    """A session of 12 points in one process (the default would deal the repetitions to a worker as well, whose
    blocks give the session its first row only once the worker has timed its share of every point: interrupting
    a session with workers is test_processes.py's), so the first row is written after the first point's 2 blocks.
    At 131072 tokens a point's inputs take longer to build than its blocks to time, and the 11 points after the
    first leave seconds in which to interrupt."""
    (path / "test_d2h.py").write_text(BENCH)
    seq_lens = ",".join(str(131072 + i) for i in range(12))
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "test_d2h.py", "--benchmark-only", "--kv-variants", "device_stride",
         "--kv-page-sizes", "1", "--kv-seq-lens", seq_lens, "--kv-time-budget", "0.5", "-p", "no:cacheprovider",
         "--kv-repetitions", "2", "--kv-passes", "1", "--kv-processes", "1", "--kv-device", "cpu"],
        cwd=path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def _wait_for_rows(path: Path, rows: int, proc: subprocess.Popen) -> Path:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for csv in (path / "results").glob("*/results.csv"):
            if len(csv.read_text().splitlines()) > rows:
                return csv.parent
        assert proc.poll() is None, "the run ended before it could be interrupted"
        time.sleep(0.05)
    raise AssertionError("no rows appeared")


@pytest.mark.parametrize("sig, words", [(signal.SIGINT, "interrupted after"), (signal.SIGKILL, "killed before it could finish")])
def test_an_interrupted_run_keeps_its_finished_rows(tmp_path, sig, words):
    proc = _start_slow_run(tmp_path)
    try:
        folder = _wait_for_rows(tmp_path, 1, proc)
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    run = load_run(folder)
    ok = run.rows[run.rows["status"] == "ok"]
    assert 1 <= len(ok) < 12 and set(run.rows["status"]) <= {"ok", "partial"}  # partial: SIGINT, a point cut short
    assert (ok["repetitions"] == 2).all()
    assert all(len(run.samples[row_key(r)]) == r["repetitions"] for _, r in run.rows.iterrows())
    assert all(sum(map(len, run.samples[row_key(r)])) == r["rounds"] for _, r in run.rows.iterrows())
    assert not run.meta.completed and words in run.meta.end_note
    pd.read_csv(folder / "results.csv")  # parseable by plain pandas too
    assert not list(folder.glob(".*.tmp"))


def test_runs_never_overwrite_each_other(bench):
    for _ in range(2):
        bench.runpytest("--kv-seq-lens", "32", "--kv-page-sizes", "4", "--kv-variants", "host_stride",
                        "--kv-repetitions", "1", *CPU, *FAST)
    folders = run_dirs(bench.path)
    assert len(folders) == 2 and folders[0].name != folders[1].name
    assert all((f / "results.csv").exists() for f in folders)


COLLECTOR = '''
import gc
import os

import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    with open("collector.txt", "a") as f:
        f.write(f"{os.getpid()} configured {gc.isenabled()}\\n")


def pytest_collection_modifyitems(items):
    with open("collector.txt", "a") as f:
        f.write(f"{os.getpid()} collecting {gc.isenabled()}\\n")


def pytest_runtest_call(item):
    with open("collector.txt", "a") as f:
        f.write(f"{os.getpid()} timing {gc.isenabled()}\\n")
'''


def test_a_sweep_collects_without_the_cyclic_collector_and_then_times_with_it(bench):
    """Every process of a sweep (the session and its worker here) imports torch and collects with the cyclic collector
    paused (kvpages.measure.worklog.collector_paused), from its configuration on where an option imports torch there
    (--kv-variants), and has it back for its blocks (pytester runs the session in this process, whose collector is on)."""
    bench.makeconftest(COLLECTOR)
    result = bench.runpytest("--kv-seq-lens", "64", "--kv-page-sizes", "4", "--kv-variants", "host_stride",
                             "--kv-scenarios", "none", "--kv-repetitions", "2", "--kv-remeasure-budget", "0", *CPU,
                             *FAST, "--kv-processes", "2")  # the last --kv-processes given counts
    result.assert_outcomes(passed=1)
    assert gc.isenabled()
    seen = {(pid == str(os.getpid()), what, state) for pid, what, state in
            (line.split() for line in (bench.path / "collector.txt").read_text().splitlines())}
    assert seen == {(mine, what, state) for mine in (True, False)  # the session, in this process, and its worker
                    for what, state in (("configured", "False"), ("collecting", "False"), ("timing", "True"))}


def test_the_collector_is_left_as_the_caller_had_it():
    """A caller that turned the cyclic collector off before the sweep (a test harness, say) finds it off after."""
    from kvpages.measure.worklog import collector_paused, collector_resumed

    was = gc.isenabled()
    try:
        for before in (True, False):
            (gc.enable if before else gc.disable)()
            collector_paused()
            collector_paused()  # once per process, however often asked
            assert not gc.isenabled()
            collector_resumed()
            assert gc.isenabled() is before
            collector_resumed()  # nothing paused: nothing changes
            assert gc.isenabled() is before
    finally:
        (gc.enable if was else gc.disable)()


WHERE = '''
import json
import os

import torch

from kvpages.measure.variants import Moves, device_stride, variant


@variant("where_device", moves=Moves.PAGES)
def where_device(kv_indices, page_size):
    """Test only: the merged PR, noting the CPUs and torch threads of the process that times it.

    Hypothesis: none.
    """
    with open("where.jsonl", "a") as f:
        f.write(json.dumps([sorted(os.sched_getaffinity(0)), torch.get_num_threads()]) + "\\n")
    return device_stride(kv_indices, page_size)
'''


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's (os.sched_getaffinity)")
def test_a_timed_process_runs_on_the_cpus_and_threads_asked_and_meta_json_says_so(bench):
    bench.makeconftest(WHERE)
    cpu = max(os.sched_getaffinity(0))
    result = bench.runpytest("--kv-seq-lens", "64", "--kv-page-sizes", "16", "--kv-variants", "host_stride,where_device",
                             "--kv-cpus", str(cpu), "--kv-threads", "2", *CPU, *FAST)
    assert result.ret == 0, result.stdout.str()[-2000:]
    seen = {(tuple(cpus), threads) for cpus, threads in map(json.loads, (bench.path / "where.jsonl").read_text().splitlines())}
    assert seen == {((cpu,), 2)}  # every call of the process, its checks, meter, warm-up and timed rounds
    environment = load_run(run_dirs(bench.path)[0]).meta.environment
    assert environment.cpu_affinity == f"{cpu} (--kv-cpus)" and environment.torch_threads == 2


def test_a_cpu_run_pins_one_core_that_is_not_core_0_only_where_3_or_more_are_available():
    from kvpages.core.affinity import one_core

    assert one_core({0, 1, 2, 3}) == frozenset({3}) and one_core({0, 5, 9}) == frozenset({9})
    assert one_core({0, 1}) is None and one_core({4}) is None


@pytest.mark.parametrize("smi_out", ["00000000:4E:00.0", "WARNING: infoROM is corrupted at gpu 0000:4E:00.0\n00000000:4E:00.0\n"],
                         ids=["bus-id", "warning-first"])
def test_a_cuda_run_pins_the_cpus_of_the_gpus_numa_node_from_the_bus_id_nvidia_smi_prints(tmp_path, smi_out):
    """`--kv-cpus auto` on CUDA reads the GPU's node from sysfs, by the bus id nvidia-smi prints; a warning nvidia-smi
    prints before it (it still exits 0) is skipped, as environment.parse_smi skips it, not parsed as a bus id. Without
    a line that is one, or where sysfs says nothing, it pins nothing (None)."""
    from kvpages.measure.pinning import gpu_node_cpus, sysfs_bus_id

    pci, nodes = tmp_path / "pci", tmp_path / "node"
    (pci / "0000:4e:00.0").mkdir(parents=True)
    (pci / "0000:4e:00.0" / "numa_node").write_text("1\n")
    (nodes / "node1").mkdir(parents=True)
    (nodes / "node1" / "cpulist").write_text("8-11,24\n")
    assert sysfs_bus_id(smi_out) == "0000:4e:00.0"
    assert gpu_node_cpus(smi_out, pci, nodes) == frozenset({8, 9, 10, 11, 24})
    (pci / "0000:4e:00.0" / "local_cpulist").write_text("12-13\n")  # the device's own list first, where it has one
    assert gpu_node_cpus(smi_out, pci, nodes) == frozenset({12, 13})
    assert gpu_node_cpus("WARNING: infoROM is corrupted at gpu 0000:4E:00.0", pci, nodes) is None
    assert gpu_node_cpus(None, pci, nodes) is None and gpu_node_cpus("00000000:99:00.0", pci, nodes) is None


@pytest.mark.parametrize("terminal", [(), ("-p", "no:terminal")], ids=["summary", "no-terminal"])
def test_a_finished_sweep_leaves_its_per_round_files_compressed(bench, terminal):
    """The session's analysis reads them plain and compresses them beside it; without a terminal summary the session's
    end compresses them: either way the folder keeps only the .gz files."""
    result = bench.runpytest("--kv-seq-lens", "64", "--kv-page-sizes", "16", "--kv-variants", "host_stride,device_stride",
                             *terminal, *CPU, *FAST)
    assert result.ret == 0
    [folder] = run_dirs(bench.path)
    assert sorted(p.name for p in folder.glob("*samples.csv*")) == ["samples.csv.gz"]
    assert load_run(folder).rows["status"].eq("ok").all()
