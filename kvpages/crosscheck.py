"""The profiler cross-check of the D2H meter, in a process of its own.

Kineto keeps CUPTI attached after a profile ends (unless TEARDOWN_CUPTI=1; pytorch#144455
reports a 10-20% slowdown after profiling), and variants that make different numbers of
CUDA API calls would be slowed differently. So the timing process never profiles:
`run_crosscheck` starts `python -m kvpages.crosscheck` once per session, before anything
is timed, which profiles one call of every planned (variant, point) and answers, per case,
None (the meter and the profiler agree) or what is wrong.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from kvpages.sweep import Point

MODES = ("auto", "on", "off")
"""auto: on for CUDA runs, off for CPU runs (there is no link to cross-check)."""


@dataclass(frozen=True)
class CheckCase:
    variant: str
    point: Point

    @property
    def id(self) -> str:
        return f"{self.variant}-{self.point.id}"


class CrosscheckError(RuntimeError):
    """The cross-check process itself failed (not a disagreement: that is a case's answer)."""


def enabled(mode: str, device: str) -> bool:
    return mode == "on" or (mode == "auto" and device == "cuda")


def run_crosscheck(cases: Sequence[CheckCase], timeout_s: float = 600) -> dict[str, str | None]:
    """Cross-check `cases` in a fresh interpreter; return {case id: None or the disagreement}."""
    from kvpages.variants import get_variant

    # Variants registered outside kvpages (a conftest, a plugin) are imported by the check process too.
    modules = sorted({get_variant(c.variant).fn.__module__ for c in cases} - {"kvpages.variants"})
    request = json.dumps({"modules": modules,
                          "cases": [{"variant": c.variant, "point": asdict(c.point)} for c in cases]})
    done = subprocess.run([sys.executable, "-m", "kvpages.crosscheck"], input=request, capture_output=True,
                          text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CrosscheckError(f"the profiler cross-check process exited {done.returncode}: {tail}")
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    return {c.id: answers[c.id] for c in cases}


def check_one(variant_name: str, point: Point) -> str | None:
    """Meter one call, profile another, and compare (in this process: the child's side)."""
    from kvpages.inputs import make_workload
    from kvpages.meter import MeterMismatchError, crosscheck, measure_d2h, profiler_d2h
    from kvpages.variants import get_variant

    fn = get_variant(variant_name).fn
    kv = make_workload(point, rotation=1).kv_indices[0]
    fn(kv, point.page_size)  # lazy initialisation (CUDA context, kernels, the pinned pool) outside the profile
    measured = measure_d2h(fn, kv, point.page_size)
    try:
        crosscheck(measured, profiler_d2h(fn, kv, point.page_size), f"{variant_name}-{point.id}")
    except MeterMismatchError as exc:
        return str(exc)
    return None


def main() -> int:
    import importlib

    request = json.loads(sys.stdin.read())
    for module in request["modules"]:
        importlib.import_module(module)
    answers = {}
    for item in request["cases"]:
        point = Point(**item["point"])
        answers[f"{item['variant']}-{point.id}"] = check_one(item["variant"], point)
    print(json.dumps(answers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
