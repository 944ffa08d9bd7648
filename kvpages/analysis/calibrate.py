"""`kvpages calibrate RUN`: the link model's terms fitted from a CUDA run's own measured rows (no torch).

Each timed per-call row of a variant whose time is all device and link work on a GPU box (no host stride: see
kvpages.core.links.carries_host_work) is one equation, its time (the run's estimator: the geometric mean of its block
medians) against what the meter saw it do:

    time_us = ops x (launch + kernel) + copies x fixed cost + host syncs x sync + bytes / bandwidth

with a fixed cost and a bandwidth per kind of memory the copies land in (pageable, pinned) and the device terms shared.
Least squares gives the terms; the same fit over resampled rows (each row's processes drawn with replacement, its
repetitions where it ran in one process, independently per row) gives each term its interval. A term the run's rows
cannot tell apart from the others (every row syncs once per copy, say) keeps the prior profile's value, subtracted
before the fit, and says so; launch and kernel enter every row only as their sum, so the kernel is read from
breakdown.csv's profiled device time per op of the declared variants where the run has it, else it keeps the prior.
An undeclared variant (sglang@<label>) is priced at one device op per call, as the model prices it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvpages.analysis.intervals import levels
from kvpages.analysis.ratios import Analysis
from kvpages.core.links import KERNELS_PER_CALL, MEMORIES, SHORT, LinkProfile, Term, carries_host_work, device_ops
from kvpages.core.names import case_id, point_id
from kvpages.core.stats import BOOTSTRAP_SEED, CONFIDENCE
from kvpages.schema.reader import RunError, row_key

RESAMPLES = 400
LINKS = {"pcie pageable": "pageable", "pcie pinned": "pinned"}  # results.csv `link` -> the memory its copies land in


@dataclass(frozen=True)
class Residual:
    """One row of the fit: its measured time, the fitted model's, and what the model misses."""

    id: str
    memory: str
    measured_us: float
    modeled_us: float
    residual_us: float  # measured - modeled


@dataclass(frozen=True)
class Calibration:
    """The fitted profiles (one per kind of memory the run's copies landed in), the rows behind them, and what the run
    could not separate."""

    run_id: str
    profiles: tuple[LinkProfile, ...]
    residuals: tuple[Residual, ...]
    notes: tuple[str, ...]
    repetitions: int


@dataclass(frozen=True)
class _Design:
    names: tuple[str, ...]  # a coefficient per column: per_op, sync, copy_<memory>, per_byte_<memory>
    matrix: np.ndarray  # rows x columns
    times: np.ndarray  # each row's time: the geometric mean of its block medians (the run's estimator)
    units: tuple[np.ndarray, ...]  # each row's log level per process (per repetition where it ran in one process)
    ids: tuple[str, ...]
    memories: tuple[str, ...]
    repetitions: int  # the most any row has (a re-measured row has more than the plan's)

    def resampled(self, rng: np.random.Generator) -> np.ndarray:
        """RESAMPLES x rows: each row's time over its own units drawn with replacement (independently per row)."""
        out = np.empty((RESAMPLES, len(self.units)))
        for i, units in enumerate(self.units):
            out[:, i] = np.exp(units[rng.integers(0, units.size, (RESAMPLES, units.size))].mean(axis=1))
        return out


def _units(values: np.ndarray, processes: np.ndarray) -> np.ndarray:
    ids = np.unique(processes)
    return values if ids.size < 2 else np.array([values[processes == p].mean() for p in ids])


def _design(analysis: Analysis) -> _Design:
    run = analysis.run
    rows = []
    for r in run.ok_rows().to_dict("records"):
        variant, memory = str(r["variant"]), LINKS.get(str(r["link"]))
        found = levels(run, row_key(r))
        if memory is not None and found is not None and not carries_host_work(variant, analysis.host_side(variant)):
            rows.append((r, variant, memory, found))
    if not rows:
        raise RunError(f"{run.path}: no timed row of a device variant crossed a PCIe link, so there is nothing to fit")
    memories = tuple(m for m in MEMORIES if m in {memory for _, _, memory, _ in rows})
    names = ("per_op", "sync") + tuple(f"{kind}_{m}" for m in memories for kind in ("copy", "per_byte"))
    matrix = []
    for r, variant, memory, _ in rows:
        syncs = r["d2h_transfers"] if pd.isna(r["host_syncs"]) else r["host_syncs"]  # not metered: one per copy
        column = {"per_op": device_ops(variant, int(r["page_size"]), 1, False), "sync": float(syncs),
                  f"copy_{memory}": float(r["d2h_transfers"]), f"per_byte_{memory}": float(r["d2h_bytes"])}
        matrix.append([column.get(n, 0.0) for n in names])
    return _Design(names, np.array(matrix, dtype=float), np.array([np.exp(f.values.mean()) for *_, f in rows]),
                   tuple(_units(f.values, f.processes) for *_, f in rows),
                   tuple(case_id(v, point_id(r["seq_len"], r["page_size"], r["dtype"], r["layout"])) for r, v, _, _ in rows),
                   memories, max(f.values.size for *_, f in rows))


def _prior_coefficients(prior: dict[str, LinkProfile], name: str) -> float:
    memory = name.rpartition("_")[2]
    if name == "per_op":
        return prior["pageable"].us("launch_us") + prior["pageable"].us("kernel_us")
    if name == "sync":
        return prior["pageable"].us("sync_us")
    if name.startswith("copy_"):
        return prior[memory].us("copy_us")
    return 1 / (prior[memory].us("bandwidth_gb_s") * 1e3)


def _separable(matrix: np.ndarray, names: tuple[str, ...]) -> tuple[list[int], list[str]]:
    """The columns a fit can tell apart, in the order bytes, copies, ops, syncs; and why each other one cannot."""
    order = sorted(range(len(names)), key=lambda i: ("per_byte" not in names[i], "copy" not in names[i],
                                                     names[i] != "per_op"))
    kept: list[int] = []
    held: list[str] = []
    for i in order:
        if not matrix[:, i].any():
            held.append(f"{names[i]}: no row has any")
        elif np.linalg.matrix_rank(matrix[:, kept + [i]]) > len(kept):
            kept.append(i)
        else:
            held.append(f"{names[i]}: every row's count of it follows from the others'")
    return sorted(kept), held


def _fit(matrix: np.ndarray, times: np.ndarray, free: list[int], fixed: dict[int, float]) -> np.ndarray:
    coefficients = np.zeros(matrix.shape[1])
    for i, value in fixed.items():
        coefficients[i] = value
    rest = times - matrix @ coefficients
    coefficients[free] = np.linalg.lstsq(matrix[:, free], rest, rcond=None)[0]
    return coefficients


def _kernel_us(analysis: Analysis) -> list[float]:
    """breakdown.csv's profiled device time per op of each device-op row (a CUDA run's; [] without one)."""
    out = []
    for b in analysis.breakdown:  # declared variants only: an undeclared one's kernels are not known to be one op
        ops = device_ops(b.variant, b.page_size, 1) if b.variant in KERNELS_PER_CALL else 0
        if b.kernel_us is not None and ops:
            out.append(b.kernel_us / ops)
    return out


def calibrate(analysis: Analysis, prior: dict[str, LinkProfile], name: str | None = None) -> Calibration:
    """Fit the run's rows (module doc); `prior`: per memory kind, the profile whose terms a term the run cannot
    separate keeps (the built-in profile of the run's link); `name`: the profiles' names are `<name>_<memory>`
    (default `fit_<run id>`)."""
    run = analysis.run
    if not run.link_crossed:
        raise RunError(f"{run.path}: a CPU run crossed no link, so it has no transfer to fit; calibrate a CUDA run "
                       "(make gpu-check)")
    design = _design(analysis)
    free, held = _separable(design.matrix, design.names)
    fixed = {i: _prior_coefficients(prior, design.names[i]) for i in range(len(design.names)) if i not in free}
    notes = [f"{line}: kept the prior's {_prior_coefficients(prior, line.split(':')[0]):.4g}" for line in held]
    times = design.times
    center = _fit(design.matrix, times, free, fixed)
    for i in list(free):  # a fitted term <= 0: the rows cannot support it; it keeps the prior and the rest refit
        if center[i] <= 0:
            free.remove(i)
            fixed[i] = _prior_coefficients(prior, design.names[i])
            notes.append(f"{design.names[i]}: fitted {center[i]:.4g} <= 0, which no link has; kept the prior's {fixed[i]:.4g}")
            center = _fit(design.matrix, times, free, fixed)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    resampled = np.array([_fit(design.matrix, t, free, fixed) for t in design.resampled(rng)])
    kernels = _kernel_us(analysis)
    if kernels:
        kernel = float(np.median(kernels))
        kernel_draws = np.array([np.median(rng.choice(kernels, len(kernels))) for _ in range(RESAMPLES)])
    else:
        kernel, kernel_draws = prior["pageable"].us("kernel_us"), None
        notes.append(f"kernel: no profiled device time per op in breakdown.csv; kept the prior's {kernel:g} µs "
                     "(launch is the fitted per-op cost less it)")
    coefficients = dict(zip(design.names, center, strict=True))
    draws_of = {n: resampled[:, i] for i, n in enumerate(design.names)}
    fitted = {n: i in free for i, n in enumerate(design.names)}
    where = (f"fitted from run {run.run_id} ({analysis.run.device_name}): least squares over {len(design.ids)} rows, "
             f"{CONFIDENCE:.0%} interval over {RESAMPLES} resamples of each row's processes")

    def term(key: str, value: float, samples: np.ndarray | None, prior_term: Term, where: str = where) -> Term:
        value = float(value)
        if samples is None:
            return Term(key, value, f"prior, not separable in run {run.run_id}: {prior_term.source}")
        low, high = (float(x) for x in np.percentile(samples, [50 * (1 - CONFIDENCE), 50 * (1 + CONFIDENCE)]))
        if key == "bandwidth_gb_s":  # samples are seconds per byte: the interval of their inverse, in GB/s
            low, high = 1 / (high * 1e3), (1 / (low * 1e3) if low > 0 else math.inf)
        low, high = min(low, value), max(high, value)
        if not (low > 0 and math.isfinite(high)):
            bound = "is unbounded above (too few bytes to bound it)" if key == "bandwidth_gb_s" else "reaches 0"
            return Term(key, value, f"{where}; its interval {bound}, so it is bounded as an assumption")
        return Term(key, value, where, low, high)

    slug = name or "fit_" + "".join(c if c.isalnum() else "_" for c in run.run_id.lower())
    profiles = []
    for memory in design.memories:
        base = prior[memory]
        per_op = draws_of["per_op"] if fitted["per_op"] else None
        launch = coefficients["per_op"] - kernel
        launch_draws = None if per_op is None else per_op - (kernel if kernel_draws is None else kernel_draws)
        launch_source = base.term("launch_us")
        if launch <= 0:  # the kernel overlaps the next launch: the per-op wall is below the kernel's device time
            notes.append(f"launch: the fitted per-op cost {coefficients['per_op']:.3g} µs is not above the profiled "
                         f"kernel {kernel:.3g} µs; kept the prior's {base.us('launch_us'):g} µs")
            launch, launch_draws = base.us("launch_us"), None
        elif per_op is None:
            launch_source = dataclasses.replace(launch_source, source=f"the prior's launch + kernel less the kernel here "
                                                                      f"({launch_source.source})")
        inv, inv_draws = coefficients[f"per_byte_{memory}"], draws_of[f"per_byte_{memory}"]
        terms = (term("launch_us", launch, launch_draws, launch_source),
                 term("kernel_us", kernel, kernel_draws, base.term("kernel_us"),
                      f"profiled device time per op in breakdown.csv of run {run.run_id}: the median of {len(kernels)} "
                      f"rows, {CONFIDENCE:.0%} interval over {RESAMPLES} resamples of them"),
                 term("sync_us", coefficients["sync"], draws_of["sync"] if fitted["sync"] else None, base.term("sync_us")),
                 term("copy_us", coefficients[f"copy_{memory}"],
                      draws_of[f"copy_{memory}"] if fitted[f"copy_{memory}"] else None, base.term("copy_us")),
                 term("bandwidth_gb_s", 1 / (inv * 1e3), inv_draws if fitted[f"per_byte_{memory}"] else None,
                      base.term("bandwidth_gb_s")))
        if any(t.value <= 0 for t in terms):
            bad = next(t for t in terms if t.value <= 0)
            raise RunError(f"{run.path}: the fit puts {SHORT[bad.key]} at {bad.value:.3g} {bad.unit} (<= 0): this run's "
                           f"rows cannot support a {memory} profile; see `kvpages calibrate` --help")
        profiles.append(LinkProfile(f"{slug}_{memory}", f"{run.device_name}, {memory} (fitted)", memory, terms))
    modeled = design.matrix @ center
    residuals = tuple(Residual(i, m, float(t), float(f), float(t - f)) for i, m, t, f in
                      zip(design.ids, _row_memories(design), times, modeled, strict=True))
    return Calibration(run.run_id, tuple(profiles), residuals, tuple(dict.fromkeys(notes)), design.repetitions)


def _row_memories(design: _Design) -> list[str]:
    copies = [design.names.index(f"copy_{m}") for m in design.memories]
    return [next((m for m, c in zip(design.memories, copies, strict=True) if row[c]), "-") for row in design.matrix]
