"""`python -m kvpages.preflight [--cuda]`: can this Python run the sweep? Checked before anything runs.

bench/gpu_check.sh runs it first: stock PyTorch CUDA images ship neither pandas, matplotlib,
pytest nor pytest-benchmark, and a GPU lease must not be spent finding that out one
traceback at a time. It prints one line naming everything missing and how to get it,
online or offline, and exits 2; with --cuda it also needs torch to see a CUDA device.
Standard library only, so it runs on any Python.
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
)
"""What a sweep with --kv-analyze needs; the CUDA-marked tests need only the first four."""


def missing(needs: tuple[Need, ...] = NEEDS) -> list[Need]:
    """The needs whose module does not import (an ImportError of another module propagates)."""
    out = []
    for need in needs:
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
            return 2
        print(f"gpu-check on {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
