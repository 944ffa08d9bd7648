"""Capture the environment of a run: versions, device, link, CPU, git state."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

import kvpages
from kvpages.results import Environment

CPU_LINK_NOTE = (
    "CPU run: no PCIe link was crossed. `.cpu()` is a no-op on a CPU tensor, so d2h_bytes count "
    "the bytes handed to the host boundary and latencies contain no transfer time."
)
CUDA_LINK_NOTE = "CUDA run: d2h_bytes crossed the device-host link, as the CUDA profiler cross-check confirmed."


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    """stdout of `cmd`, or None if the tool is missing or fails (optional facts only)."""
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_state(repo: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout at `repo`; run folders under results/ do not count as dirty."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd=repo)
    if commit is None:
        return None, None
    status = _run(["git", "status", "--porcelain", "--", ".", ":(exclude)results"], cwd=repo)
    return commit, bool(status)


def nvidia_smi_facts(index: int) -> tuple[str | None, str | None]:
    """(driver version, 'GenN xW (max GenM xV)') from nvidia-smi, if it is there."""
    out = _run([
        "nvidia-smi",
        f"--id={index}",
        "--query-gpu=driver_version,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max",
        "--format=csv,noheader,nounits",
    ])
    if not out:
        return None, None
    driver, gen, width, gen_max, width_max = (part.strip() for part in out.splitlines()[0].split(","))
    return driver, f"Gen{gen} x{width} (max Gen{gen_max} x{width_max})"


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return cpu_model()


def capture(device: str, repo: Path) -> Environment:
    """The environment of a run on `device` ('cpu' or 'cuda'), from the checkout at `repo`."""
    commit, dirty = git_state(repo)
    driver = pcie = None
    if device == "cuda":
        driver, pcie = nvidia_smi_facts(torch.cuda.current_device())
    return Environment(
        kvpages_version=kvpages.__version__,
        python_version=sys.version.split()[0],
        torch_version=torch.__version__,
        numpy_version=np.__version__,
        pytest_benchmark_version=metadata.version("pytest-benchmark"),
        platform=platform.platform(),
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count() or 0,
        torch_threads=torch.get_num_threads(),
        device=device,
        device_name=device_name(device),
        cuda_version=torch.version.cuda if device == "cuda" else None,
        driver_version=driver,
        pcie_link=pcie,
        git_commit=commit,
        git_dirty=dirty,
        link_crossed=device == "cuda",
        link_note=CPU_LINK_NOTE if device == "cpu" else CUDA_LINK_NOTE,
    )
