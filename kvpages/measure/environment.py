"""Capture the environment of a run: versions, device, link, CPU, git state."""

from __future__ import annotations

import io
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

import kvpages
from kvpages.schema.meta import Environment

CPU_LINK_NOTE = (
    "CPU run: no PCIe link was crossed. `.cpu()` is a no-op on a CPU tensor, so d2h_bytes count "
    "the bytes handed to the host boundary and latencies contain no transfer time."
)
CUDA_LINK_NOTE = "CUDA run: d2h_bytes crossed the device-host link"
CROSSCHECK_NOTES = {True: ", as the CUDA profiler cross-check (in its own process) confirmed.",
                    False: "; the profiler cross-check was off, so only the meter counted them."}


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    """stdout of `cmd`, or None if the tool is missing, not executable, hangs or fails (optional facts only)."""
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cpu_fields(cpuinfo: str, wanted: Collection[str]) -> dict[str, str]:
    """The `wanted` `key: value` lines of /proc/cpuinfo's first block that holds any of them: the first processor's,
    or the block older Arm and PowerPC kernels write once after the processors. It reads no further (a box of 192
    cores writes thousands of lines, and every timed process asks for its model name)."""
    fields: dict[str, str] = {}
    for line in io.StringIO(cpuinfo):
        if not line.strip():
            if fields:
                break
            continue
        key, colon, value = line.partition(":")
        if colon and key.strip() in wanted and value.strip():
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_model(cpuinfo: str | None = None) -> str:
    """/proc/cpuinfo's model name (`cpuinfo`: its text; None: read it), else what `platform` says."""
    text = cpuinfo if cpuinfo is not None else _read("/proc/cpuinfo") or ""
    return _cpu_fields(text, ("model name",)).get("model name") or platform.processor() or platform.machine()


CPU_ID_FIELDS = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping",
                 "microcode": "microcode", "CPU implementer": "implementer", "CPU part": "part",
                 "CPU variant": "variant", "CPU revision": "revision"}
"""What /proc/cpuinfo says of a CPU beyond its model name (x86's, then Arm's fields), as `cpu_id` names them."""


def cpu_id(cpuinfo: str | None = None, l3: str | None = None) -> str | None:
    """What tells apart CPUs of one model name ('AMD EPYC' names every box of the dev fleet, whatever its generation):
    'vendor AuthenticAMD family 25 model 1 stepping 1 microcode 0x1000065, L3 32768K', from /proc/cpuinfo (its first
    processor: CPU 0, not necessarily the core a run was pinned to, which on a CPU of two kinds of core may differ)
    and the size of CPU 0's level-3 cache (`cpuinfo`, `l3`: their text; None: read them); None where neither is
    found (not Linux, say)."""
    fields = _cpu_fields(cpuinfo if cpuinfo is not None else _read("/proc/cpuinfo") or "", CPU_ID_FIELDS)
    named = " ".join(f"{label} {fields[key]}" for key, label in CPU_ID_FIELDS.items() if key in fields)
    cache = l3 if l3 is not None else _l3_size()
    found = ", ".join(part for part in (named, f"L3 {cache}" if cache else "") if part)
    return found or None


def _l3_size() -> str | None:
    """The size of CPU 0's level-3 cache as sysfs writes it ('32768K'); None where there is none or it is not said."""
    caches = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(caches.glob("index*")) if caches.is_dir() else ():
        if (_read(str(index / "level")) or "").strip() == "3":
            return (_read(str(index / "size")) or "").strip() or None
    return None


def boot_id() -> str | None:
    """This boot's id (Linux: a random UUID per boot): two runs with one ran in one boot of one machine."""
    found = (_read("/proc/sys/kernel/random/boot_id") or "").strip()
    return found or None


SMI_FIELDS = "driver_version,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max"
_SMI_LINE = re.compile(r"^\s*([0-9][0-9.]*)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*$")


def gpu_uuid() -> str | None:
    """The UUID of torch's current CUDA device as nvidia-smi names it ('GPU-...'), or None."""
    uuid = str(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", "") or "")
    if not uuid:
        return None
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def parse_smi(out: str | None) -> tuple[str | None, str | None]:
    """(driver, 'GenN xW (max GenM xV)') from the first five-number line of nvidia-smi's CSV, else (None, None)."""
    for line in (out or "").splitlines():
        match = _SMI_LINE.match(line)
        if match:
            driver, gen, width, gen_max, width_max = match.groups()
            return driver, f"Gen{gen} x{width} (max Gen{gen_max} x{width_max})"
    return None, None


def query_smi(uuid: str | None, fields: str) -> str | None:
    """nvidia-smi's CSV of `fields` for the GPU with `uuid` (it ignores CUDA_VISIBLE_DEVICES); None if it cannot tell."""
    if uuid is None:
        return None
    return _run(["nvidia-smi", f"--id={uuid}", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])


def nvidia_smi_facts(uuid: str | None) -> tuple[str | None, str | None]:
    """(driver version, PCIe link) of the GPU with `uuid`; (None, None) when nvidia-smi cannot tell."""
    return parse_smi(query_smi(uuid, SMI_FIELDS))


@dataclass(frozen=True)
class Loaded:
    """What nvidia-smi reads of the device right after a timed loop, while it is loaded: None where it cannot tell."""

    pcie_link: str | None
    sm_clock_mhz: int | None


def loaded_now() -> Loaded:
    """The current device's PCIe link and SM clock now (call it right after a timed loop: an idle link downshifts
    and an idle clock drops), from the first well-formed line of nvidia-smi's CSV."""
    for line in (query_smi(gpu_uuid(), f"{SMI_FIELDS},clocks.sm") or "").splitlines():
        head, _, clock = line.rpartition(",")
        pcie = parse_smi(head)[1]
        if pcie is not None:
            return Loaded(pcie, int(clock) if clock.strip().isdigit() else None)
    return Loaded(None, None)


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else cpu_model()


CODE_FOLDERS = ("kvpages", "bench")


def code_tree(repo: Path) -> str | None:
    """The git tree ids of CODE_FOLDERS as they are on disk, tracked or not ('kvpages:<id> bench:<id>'), from a
    throw-away index, so a run from a dirty tree still names the code it ran; None outside a git checkout."""
    folder_tmp = Path(tempfile.mkdtemp(prefix="kvpages-code-tree-"))
    env = {**os.environ, "GIT_INDEX_FILE": str(folder_tmp / "index")}
    parts = []
    try:
        for folder in CODE_FOLDERS:
            added = subprocess.run(["git", "add", "-A", "--", folder], cwd=repo, env=env, capture_output=True, timeout=20,
                                   check=False)
            tree = subprocess.run(["git", "write-tree", f"--prefix={folder}/"], cwd=repo, env=env, capture_output=True,
                                  text=True, timeout=20, check=False)
            if added.returncode or tree.returncode:
                return None
            parts.append(f"{folder}:{tree.stdout.strip()}")
    except (OSError, subprocess.TimeoutExpired):
        return None
    finally:
        shutil.rmtree(folder_tmp, ignore_errors=True)
    return " ".join(parts)


def capture(device: str, repo: Path, crosschecked: bool = False, threads: int | None = None,
            affinity: str | None = None) -> Environment:
    """The environment of a run on `device`, from the checkout at `repo` (run folders in results/ leave it clean);
    `threads` and `affinity`: those of the timed processes (kvpages.measure.pinning)."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd=repo)
    status = _run(["git", "status", "--porcelain", "--", ".", ":(exclude)results"], cwd=repo)
    uuid = gpu_uuid() if device == "cuda" else None
    driver, pcie = nvidia_smi_facts(uuid)
    cpuinfo = _read("/proc/cpuinfo") or ""
    return Environment(
        kvpages_version=kvpages.__version__,
        python_version=sys.version.split()[0],
        torch_version=torch.__version__,
        numpy_version=np.__version__,
        pytest_benchmark_version=metadata.version("pytest-benchmark"),
        platform=platform.platform(),
        cpu_model=cpu_model(cpuinfo),
        cpu_id=cpu_id(cpuinfo),
        boot_id=boot_id(),
        cpu_count=os.cpu_count() or 0,
        torch_threads=torch.get_num_threads() if threads is None else threads,
        device=device,
        device_name=device_name(device),
        cuda_version=torch.version.cuda if device == "cuda" else None,
        driver_version=driver or "unknown",
        pcie_link=pcie or "unknown",
        git_commit=commit,
        git_dirty=None if commit is None else bool(status),
        link_crossed=device == "cuda",
        link_note=CPU_LINK_NOTE if device == "cpu" else CUDA_LINK_NOTE + CROSSCHECK_NOTES[crosschecked],
        gpu_uuid=uuid,
        hostname=socket.gethostname(),
        cpu_affinity=affinity,
        code_tree=None if commit is None else code_tree(repo),
    )
