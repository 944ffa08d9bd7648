"""Does the suite's device_stride/host_stride ratio agree with torch.utils.benchmark on the same inputs?

    python bench/agreement.py results/<run-id> [--pairs 10] [--variant device_stride]

For every point of the run where both variants were timed, it rebuilds the run's inputs
(same seed, same rotation), then alternates the two variants under
`torch.utils.benchmark.Timer` (`pairs` times each, about 5 ms per measurement), takes the
median of the paired ratios, and prints it beside the run's ratio from `ratios.csv`
(written by `kvpages report` or `--kv-analyze`), and how many points agree within +-20%.
It is a one-off measurement, not a test: run it right after the run, on the same machine.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.utils.benchmark import Timer

from kvpages.core.sweep import Point
from kvpages.measure.inputs import make_workload
from kvpages.measure.variants import get_variant

TOLERANCE = 0.20
TARGET_S = 0.005


def per_call_s(fn, rows, page_size: int, number: int) -> float:
    cycle = itertools.cycle(rows)
    timer = Timer("fn(next(cycle), page_size)", globals={"fn": fn, "cycle": cycle, "page_size": page_size})
    return timer.timeit(number).median  # per call: timeit(number) runs `number` calls in one measurement


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--variant", default="device_stride")
    parser.add_argument("--baseline", default="host_stride")
    parser.add_argument("--pairs", type=int, default=10)
    args = parser.parse_args(argv)
    ratios_csv = args.run / "ratios.csv"
    if not ratios_csv.exists():
        print(f"agreement: {ratios_csv}: no such file; run `kvpages report {args.run}` first", file=sys.stderr)
        return 2
    ratios = pd.read_csv(ratios_csv)
    ratios = ratios[(ratios["variant"] == args.variant) & (ratios["baseline"] == args.baseline)]
    device = pd.read_csv(args.run / "results.csv")["device"].iloc[0]
    fn, base = get_variant(args.variant).fn, get_variant(args.baseline).fn
    agree = 0
    print(f"{'page':>5} {'seq_len':>8} {'suite':>8} {'[95% CI]':>18} {'t.u.b':>8} {'t.u.b/suite':>11}")
    for r in ratios.itertuples():
        point = Point(int(r.seq_len), int(r.page_size), r.dtype, device, r.layout)
        rows = make_workload(point).inputs
        for f in (fn, base):  # warm up
            for kv in rows:
                f(kv, point.page_size)
        number = max(1, int(TARGET_S / max(per_call_s(base, rows, point.page_size, 1), 1e-7)))
        pair_ratios = []
        for _ in range(args.pairs):
            b = per_call_s(base, rows, point.page_size, number)
            v = per_call_s(fn, rows, point.page_size, number)
            pair_ratios.append(v / b)
        tub = float(np.median(pair_ratios))
        ok = abs(tub / r.ratio - 1) <= TOLERANCE
        agree += ok
        print(f"{r.page_size:>5} {r.seq_len:>8} {r.ratio:>8.3f} [{r.ci_low:>7.3f}, {r.ci_high:>7.3f}] {tub:>8.3f} "
              f"{tub / r.ratio:>11.3f}{'' if ok else '  (outside +-20%)'}")
    print(f"{args.variant}/{args.baseline}: torch.utils.benchmark agrees with the suite within +-{TOLERANCE:.0%} "
          f"at {agree}/{len(ratios)} points ({agree / max(len(ratios), 1):.0%}); torch {torch.__version__}, {device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
