"""`python -m kvpages.preflight [--cuda] [--profiler]`: can this Python run the sweep? Checked before anything runs.

bench/gpu_check.sh runs it first: stock PyTorch CUDA images ship neither pandas, matplotlib, pytest nor
pytest-benchmark, and a GPU lease must not be spent finding that out one traceback at a time. Exit codes:

- 0: ready;
- 2: packages are missing (one line names them);
- 3: `--cuda`, and torch sees no CUDA device;
- 4: `--profiler`, and one tiny profile (a 16 KiB device-to-host copy, in a child process, through the
  same path as the sweep's cross-check) does not show the copy: the sweep's cross-check would be unavailable.

The package check is standard library only, so it runs on any Python.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Need:
    module: str
    package: str
    why: str


NEEDS: tuple[Need, ...] = (
    Need("torch", "torch", "the variants"),
    Need("numpy", "numpy", "the variants and the analysis"),
    Need("pytest", "pytest", "the runner"),
    Need("pytest_benchmark", "pytest-benchmark", "the timer (--benchmark-only)"),
    Need("pandas", "pandas", "the summary and report"),
    Need("matplotlib", "matplotlib", "the charts"),
    *((Need("tomli", "tomli", "the link profiles (Python 3.11+ has tomllib)"),) if sys.version_info < (3, 11) else ()),
)
"""What a sweep with --kv-analyze needs, and what the CUDA-marked tests of gpu_check.sh's step 6 need (test_payloads.py
reads run folders with pandas): gpu_check.sh checks them all first."""


def missing() -> list[Need]:
    """The needs whose module does not import (an ImportError of another module propagates)."""
    out = []
    for need in NEEDS:
        try:
            importlib.import_module(need.module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and exc.name != need.module and not need.module.startswith(exc.name + "."):
                raise
            out.append(need)
    return out


def advice(absent: list[Need]) -> str:
    names = " ".join(n.package for n in absent if n.package != "torch")
    parts = [f"gpu-check: {sys.executable} lacks " + ", ".join(f"{n.package} ({n.why})" for n in absent) + "."]
    if names:
        parts.append(f"Install with `{sys.executable} -m pip install {names}`; offline, on a connected machine with "
                     f"the same Python run `pip download -d wheels {names}`, copy wheels/ here and run "
                     f"`{sys.executable} -m pip install --no-index --find-links wheels {names}`.")
    if any(n.package == "torch" for n in absent):
        parts.append("torch must be this machine's own CUDA build (kvpages never installs one): set PYTHON to the "
                     "python that has it.")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvpages.preflight", description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true", help="also require a CUDA device visible to torch")
    parser.add_argument("--profiler", action="store_true",
                        help="also profile one device-to-host copy in a child process (exit 4 if it is not seen)")
    args = parser.parse_args(argv)
    absent = missing()
    if absent:
        print(advice(absent), file=sys.stderr)
        return 2
    if args.cuda:
        import torch

        if not torch.cuda.is_available():
            print(f"gpu-check: torch {torch.__version__} (CUDA build {torch.version.cuda}) sees no CUDA device; "
                  "nothing to check here", file=sys.stderr)
            return 3
        print(f"gpu-check on {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    if args.profiler:
        problem = profiler_problem()
        if problem:
            print(f"gpu-check: the profiler cross-check is unavailable here: {problem}", file=sys.stderr)
            return 4
        print("gpu-check: the profiler sees device-to-host copies (one session, in a child process)")
    return 0


PROBE_TIMEOUT_S = 120.0


def profiler_problem() -> str | None:
    """None when one profiled device_stride call on CUDA (4096 tokens, page size 1: 16 KiB) agrees with the
    meter, in a child process as the sweep runs it; else what went wrong."""
    from kvpages.core.sweep import Point
    from kvpages.measure.crosscheck import CheckCase, CrosscheckError, run_crosscheck
    from kvpages.measure.targets import PointTarget

    case = CheckCase("device_stride", PointTarget(Point(4096, 1, device="cuda")))
    try:
        answer = run_crosscheck([case], "cuda", timeout_s=PROBE_TIMEOUT_S)[case.id]
    except CrosscheckError as exc:
        return str(exc)
    return None if answer.outcome == "agree" else f"{answer.outcome}: {answer.detail}"


if __name__ == "__main__":
    sys.exit(main())
