"""The GPU path's first run, tested as far as a CPU allows: nvidia-smi facts, warm-up, out-of-memory rows,
the gpu-check preflight, and the CUDA twins of the sweep (the cross-check: test_crosscheck.py)."""

from __future__ import annotations

import gc
import os
import stat
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FAST, GPU_CHECK_RUN, REPO

from kvpages.core.sweep import Point
from kvpages.measure import environment
from kvpages.measure.breakdown import chosen_points
from kvpages.measure.timer import warm_up
from kvpages.schema.breakdown import read_breakdown
from kvpages.schema.reader import load_run, sample_file

BENCH = (REPO / "bench" / "test_d2h.py").read_text()


# ----------------------------------------------------------------------------- nvidia-smi


def fake_smi(folder: Path, body: str, executable: bool = True) -> Path:
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(stat.S_IRWXU if executable else stat.S_IRUSR | stat.S_IWUSR)
    return folder


@pytest.mark.parametrize(
    "body, executable, expected",
    [
        ('echo "$@" > "$(dirname "$0")/args"; echo "550.54.15, 5, 16, 5, 16"', True,
         ("550.54.15", "Gen5 x16 (max Gen5 x16)")),
        ('echo "WARNING: infoROM is corrupted at gpu 0000:4E:00.0"; echo "550.54.15, 1, 16, 5, 16"', True,
         ("550.54.15", "Gen1 x16 (max Gen5 x16)")),
        ('echo "No devices were found"', True, (None, None)),
        ('echo "550.54.15, [N/A], 16"', True, (None, None)),
        ('exit 9', True, (None, None)),
        ('echo "550.54.15, 5, 16, 5, 16"', False, (None, None)),  # not executable: an OSError, caught
    ],
)
def test_odd_nvidia_smi_output_gives_unknown_not_a_traceback(tmp_path, monkeypatch, body, executable, expected):
    folder = fake_smi(tmp_path / "bin", body, executable)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    assert environment.nvidia_smi_facts("GPU-1234abcd") == expected
    if (folder / "args").exists():  # nvidia-smi is asked by UUID, not by torch's device index
        assert "--id=GPU-1234abcd" in (folder / "args").read_text()


def test_no_nvidia_smi_at_all(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert environment.nvidia_smi_facts("GPU-1") == (None, None) and environment.nvidia_smi_facts(None) == (None, None)


# ----------------------------------------------------------------------------- warm-up


def test_warm_up_holds_each_result_until_the_next_call_returns():
    """As pytest-benchmark's timed loop does: so an allocating variant has as many buffers live as when timed."""
    alive: list[int] = []
    outputs: list[weakref.ref] = []

    def variant(kv, page_size):
        gc.collect()
        alive.append(sum(ref() is not None for ref in outputs))
        out = np.array(kv.numpy()[::page_size] // page_size)
        outputs.append(weakref.ref(out))
        return out

    inputs = [torch.arange(64, dtype=torch.int32) for _ in range(3)]
    warm_up(variant, inputs, 4, lambda: None, min_s=0.0)
    assert len(alive) == 3 and alive[0] == 0 and alive[1:] == [1, 1]


# ----------------------------------------------------------------------------- out of memory

LIMITED = textwrap.dedent('''
    import resource, sys
    import torch, pytest  # loaded before the limit: only the sweep's own allocations may fail
    vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + (400 << 20), resource.RLIM_INFINITY))
    sys.exit(pytest.main(sys.argv[1:]))
''')


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc to set an address-space limit")
def test_a_cpu_allocation_failure_becomes_an_out_of_memory_row(tmp_path):
    (tmp_path / "test_d2h.py").write_text(BENCH)
    done = subprocess.run(
        [sys.executable, "-c", LIMITED, "test_d2h.py", *FAST, "--kv-device", "cpu", "--kv-seq-lens", "64,100000000",
         "--kv-page-sizes", "64", "--kv-variants", "device_stride", "--kv-repetitions", "1",
         "--kv-results", "out"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [folder] = list((tmp_path / "out").iterdir())
    rows = load_run(folder).rows.set_index("seq_len")
    assert rows.loc[64, "status"] == "ok"
    assert rows.loc[100000000, "status"] == "out_of_memory"
    assert "out of memory: " in rows.loc[100000000, "note"] and "can't allocate memory" in rows.loc[100000000, "note"]


# ----------------------------------------------------------------------------- gpu-check preflight


def shadow(folder: Path, *modules: str) -> dict[str, str]:
    """An environment in which importing `modules` fails as if they were not installed."""
    for name in modules:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f'raise ModuleNotFoundError("No module named {name!r}", name={name!r})\n')
    return {**os.environ, "PYTHONPATH": f"{folder}{os.pathsep}{REPO}", "PYTHON": sys.executable}


@pytest.mark.parametrize("missing, without", [("pandas", "summary, chart or report"), ("matplotlib", "chart or report")])
def test_a_sweep_without_pandas_or_matplotlib_still_writes_its_run_and_says_what_is_missing(tmp_path, missing, without):
    """Without matplotlib the summary is still made (pandas is all it needs); nothing is drawn or reported."""
    (tmp_path / "test_d2h.py").write_text(BENCH)
    env = shadow(tmp_path / "shadow", missing)
    done = subprocess.run([sys.executable, "-m", "pytest", "test_d2h.py", *FAST, "--kv-device", "cpu",
                           "--kv-seq-lens", "64", "--kv-page-sizes", "4", "--kv-variants", "host_stride",
                           "--kv-repetitions", "1", "--kv-analyze"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "Traceback" not in done.stdout
    assert f"is complete, but {missing} is not installed, so there is no {without};" in done.stdout
    assert ("kvpages summary" in done.stdout) == (missing == "matplotlib")
    [folder] = list((tmp_path / "results").iterdir())
    assert (folder / "results.csv").exists() and sample_file(folder, "samples.csv").exists()
    assert not list(folder.glob("*.png")) and not (folder / "REPORT.md").exists()


# ----------------------------------------------------------------------------- CUDA twins

HIDDEN_COPY = '''
import torch
from kvpages.measure.variants import Moves, variant

@variant("hidden_copy", moves=Moves.PAGES)
def hidden_copy(kv_indices, page_size):
    """Right values and metered bytes, but one more D2H copy that only the profiler sees."""
    with torch._C.DisableTorchFunction():
        kv_indices.cpu()
    return (kv_indices[::page_size] // page_size).cpu().numpy()
'''


@pytest.mark.cuda
def test_cuda_quick_sweep_writes_a_complete_run(request):
    given = os.environ.get(GPU_CHECK_RUN)
    if given:
        folder = Path(given)
    else:
        pytester = request.getfixturevalue("pytester")
        pytester.makepyfile(test_kv_sweep=BENCH)
        result = pytester.runpytest(*FAST, "--kv-device", "cuda", "--kv-preset", "quick", "--kv-analyze",
                                    "--kv-breakdown", "on")
        assert result.ret == 0
        [folder] = list((pytester.path / "results").iterdir())
    assert "-cuda-" in folder.name
    run = load_run(folder)
    assert run.meta.completed and (run.rows["status"] == "ok").all()
    pinned = run.ok_rows()[run.ok_rows()["variant"] == "device_stride_pinned"]
    assert (pinned["link"] == "pcie pinned").all()
    env = run.meta.environment
    assert env.link_crossed and env.gpu_uuid and env.gpu_uuid.startswith("GPU-")
    assert run.meta.crosscheck == "on (own process)" and env.pcie_link_loaded is not None
    assert (folder / "ratios.csv").exists() and (folder / "REPORT.md").exists()
    floor = run.ok_rows()[run.ok_rows()["variant"] == "host_mirror"]
    assert (floor["d2h_bytes"] == 0).all() and (floor["d2h_transfers"] == 0).all()
    assert run.meta.breakdown.startswith("breakdown.csv: "), run.meta.breakdown
    timed = run.ok_rows()
    points = [Point(int(r.seq_len), int(r.page_size), str(r.dtype), "cuda", str(r.layout))
              for r in timed.drop_duplicates(["dtype", "layout", "seq_len", "page_size"]).itertuples()]
    at = timed[(timed["seq_len"] == 8192) & (timed["page_size"] == 64)]
    if Point(8192, 64, device="cuda") not in chosen_points(points) or not \
            {"device_stride", "host_stride", "host_mirror"} <= set(at["variant"]):  # only in a folder gpu-check gave
        pytest.skip(f"{folder}: its breakdown holds no L=8192, p=64 of device_stride, host_stride and host_mirror "
                    "(a sweep with GPU_CHECK_SEQ_LENS or options that left them out)")
    rows = {r.variant: r for r in read_breakdown(folder) if (r.seq_len, r.page_size) == (8192, 64)}
    assert rows["device_stride"].memcpy_direction == "DtoH" and rows["device_stride"].memcpy_bytes == 128 * 4
    assert rows["device_stride"].kernel_us > 0 and rows["host_stride"].memcpy_bytes == 8192 * 4
    assert rows["host_mirror"].memcpy_bytes == 0 and rows["host_mirror"].kernel_us == 0
    assert (folder / "breakdown_int32_fragmented.png").exists()


@pytest.mark.cuda
def test_cuda_crosscheck_disagreement_becomes_a_mismatch_row(pytester):
    pytester.makeconftest(HIDDEN_COPY)
    pytester.makepyfile(test_kv_sweep=BENCH)
    result = pytester.runpytest_subprocess(*FAST, "--kv-device", "cuda", "--kv-seq-lens", "4096", "--kv-page-sizes",
                                           "64", "--kv-variants", "hidden_copy,device_stride", "--kv-repetitions", "2")
    result.assert_outcomes(passed=2, failed=1, skipped=1)
    [folder] = list((pytester.path / "results").iterdir())
    rows = load_run(folder).rows.set_index("variant")
    assert rows.loc["hidden_copy", "status"] == "mismatch" and rows.loc["device_stride", "status"] == "ok"
    assert "profiler cross-check: " in rows.loc["hidden_copy", "note"] and rows.loc["device_stride", "note"] == ""
    assert "the CUDA profiler recorded 16640 bytes in 2" in rows.loc["hidden_copy", "note"]
