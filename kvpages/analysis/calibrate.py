"""`kvpages calibrate RUN [RUN ...]`: the link model's terms fitted from CUDA runs' own measured rows (no torch).

The rows are kvpages.analysis.design's: each timed per-call row of a device variant (no host stride: see
kvpages.core.links.carries_host_work) and each block of a bandwidth probe, one equation each. Least squares gives the
terms; the same fit over resampled rows (several runs: the runs drawn with replacement, then each row's own processes)
gives each its interval, which so covers machine to machine when the runs come from fresh machines of one kind. A term
the rows cannot tell apart from the others (every row syncs once per copy, say) keeps the prior profile's value,
subtracted before the fit, and says so; launch and kernel enter every row only as their sum, so the kernel is read from
breakdown.csv's profiled device time per op of the declared variants where a run has it, else it keeps the prior.

Two checks keep a term what a link can be:
- *identified*: a bandwidth is fitted only where the largest copy of its memory moves its bytes in at least
  IDENTIFY_FACTOR times the copy's fixed cost with its sync; smaller copies cannot tell bandwidth from fixed cost (the
  bandwidth probe's 4-64 MiB can), so the prior stays and the note says so;
- *physical*: a fitted bandwidth beyond the per-direction limit of the runs' link (kvpages.core.links.LINK_LIMITS) is
  refused in one line naming the term, the limit and its source, and the prior stays.
An undeclared variant (sglang@<label>) is priced at one device op per call, as the model prices it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvpages.analysis.design import RESAMPLES, Design, design
from kvpages.analysis.ratios import Analysis
from kvpages.core.links import KERNELS_PER_CALL, SHORT, LinkProfile, Term, device_ops, link_limit
from kvpages.core.stats import BOOTSTRAP_SEED, CONFIDENCE
from kvpages.schema.reader import RunError

IDENTIFY_FACTOR = 2.0


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
    """The fitted profiles (one per kind of memory the runs' copies landed in), the rows behind them, and what the runs
    could not separate or a link cannot do."""

    run_ids: tuple[str, ...]
    profiles: tuple[LinkProfile, ...]
    residuals: tuple[Residual, ...]
    notes: tuple[str, ...]
    repetitions: int
    refused: tuple[str, ...] = ()  # one line per fitted term beyond a physical limit, each kept at the prior

    @property
    def run_id(self) -> str:
        return " + ".join(self.run_ids)


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


def _kernel_us(analyses: Sequence[Analysis]) -> list[float]:
    """breakdown.csv's profiled device time per op of each device-op row (CUDA runs'; [] without one)."""
    out = []
    for b in (b for a in analyses for b in a.breakdown):  # declared variants only: an undeclared one's may be several
        ops = device_ops(b.variant, b.page_size, 1) if b.variant in KERNELS_PER_CALL else 0
        if b.kernel_us is not None and ops:
            out.append(b.kernel_us / ops)
    return out


def _one_kind(analyses: Sequence[Analysis]) -> str:
    """The device every run measured on, or RunError: one profile is fitted from one kind of machine."""
    for a in analyses:
        if not a.run.link_crossed:
            raise RunError(f"{a.run.path}: a CPU run crossed no link, so it has no transfer to fit; calibrate a CUDA "
                           "run (make gpu-check)")
    kinds = {a.run.device_name for a in analyses}
    if len(kinds) > 1:
        raise RunError(f"runs of {len(kinds)} kinds of machine ({', '.join(sorted(kinds))}): one profile is fitted "
                       "from runs of one kind; calibrate each kind apart")
    return kinds.pop()


class _Fit:
    """The least-squares fit of a design, with the terms held at the prior and the notes that say why."""

    def __init__(self, d: Design, prior: dict[str, LinkProfile]) -> None:
        self.design, self.prior = d, prior
        self.matrix, self.times = d.matrix, d.times
        self.free, held = _separable(self.matrix, d.names)
        self.fixed = {i: _prior_coefficients(prior, d.names[i]) for i in range(len(d.names)) if i not in self.free}
        self.notes = [f"{line}: kept the prior's {_prior_coefficients(prior, line.split(':')[0]):.3g}" for line in held]
        self.center = self.refit()

    def refit(self) -> np.ndarray:
        self.center = _fit(self.matrix, self.times, self.free, self.fixed)
        return self.center

    def hold(self, name: str, why: str) -> None:
        """Keep `name` at the prior (it says `why`) and fit the rest again."""
        i = self.design.names.index(name)
        if i in self.free:
            self.free.remove(i)
        self.fixed[i] = _prior_coefficients(self.prior, name)
        self.notes.append(why)
        self.refit()

    def coefficient(self, name: str) -> float:
        return float(self.center[self.design.names.index(name)])


def _checked_bandwidths(fit: _Fit, limit: tuple[float, str] | None) -> list[str]:
    """Hold each bandwidth its rows cannot identify or a link cannot reach at the prior; the refusals' lines."""
    refused = []
    for memory in fit.design.memories:
        name = f"per_byte_{memory}"
        if fit.design.names.index(name) not in fit.free:
            continue
        largest = max(e.bytes for e in fit.design.equations if e.memory == memory)
        fixed = fit.coefficient(f"copy_{memory}") + fit.coefficient("sync")
        per_byte = fit.coefficient(name)
        gb_s = 1 / (per_byte * 1e3) if per_byte > 0 else math.inf
        prior = fit.prior[memory].us("bandwidth_gb_s")
        if largest * per_byte < IDENTIFY_FACTOR * fixed:  # a fit at or below 0 too: nothing bounds it
            fitted = f"{largest * per_byte:.3g} µs at the fitted {gb_s:.3g} GB/s" if per_byte > 0 else \
                f"no time at all at the fitted {per_byte:.3g} µs per byte"
            fit.hold(name, f"{memory} bandwidth: not identified: the largest {memory} copy here, {largest / 1e6:.3g} MB, "
                           f"takes {fitted}, under {IDENTIFY_FACTOR:g}x the copy's fixed cost with its sync "
                           f"({fixed:.3g} µs), so bandwidth and fixed cost cannot be told apart; kept the prior's "
                           f"{prior:.3g} GB/s (a CUDA sweep's bandwidth probe fixes it)")
        elif limit is not None and gb_s > limit[0]:
            line = (f"{memory} D2H bandwidth: fitted {gb_s:.3g} GB/s is beyond {limit[1]} ({limit[0]:g} GB/s per "
                    f"direction); refused, kept the prior's {prior:.3g} GB/s")
            refused.append(line)
            fit.hold(name, line)
    return refused


def _solve(d: Design, prior: dict[str, LinkProfile], limit: tuple[float, str] | None) -> tuple[_Fit, list[str]]:
    """The fit of `d`: every term its rows separate, none at or below 0, every bandwidth identified and within the
    link (`_checked_bandwidths`'s refusals returned)."""
    fit = _Fit(d, prior)
    refused = _checked_bandwidths(fit, limit)
    for i in list(fit.free):  # a fitted term <= 0: the rows cannot support it; it keeps the prior and the rest refit
        if fit.center[i] <= 0:
            fit.hold(d.names[i], f"{d.names[i]}: fitted {fit.center[i]:.3g} <= 0, which no link has; kept the prior's "
                                 f"{_prior_coefficients(prior, d.names[i]):.3g}")
    return fit, refused


def _per_run(fit: _Fit, analyses: Sequence[Analysis], limit: tuple[float, str] | None) -> dict[int, dict[str, float]]:
    """Each run's own fit, as `calibrate` of that run alone makes it: the terms it fits (not held at the prior), and
    its launch (its per-op cost less its own profiled kernel)."""
    out = {}
    for k, analysis in enumerate(analyses):
        own, _ = _solve(fit.design.of_run(k), fit.prior, limit)
        found = {own.design.names[i]: float(own.center[i]) for i in own.free}
        kernels = _kernel_us([analysis])
        if "per_op" in found:
            launch = found["per_op"] - (float(np.median(kernels)) if kernels else fit.prior["pageable"].us("kernel_us"))
            found |= {"launch": launch} if launch > 0 else {}
        out[k] = found
    return out


def calibrate(analyses: Analysis | Sequence[Analysis], prior: dict[str, LinkProfile], name: str | None = None
              ) -> Calibration:
    """Fit the runs' rows (module doc); `prior`: per memory kind, the profile whose terms a term the runs cannot
    separate keeps (the built-in profile of their link); `name`: the profiles' names are `<name>_<memory>` (default
    `fit_<first run id>`)."""
    analyses = (analyses,) if isinstance(analyses, Analysis) else tuple(analyses)
    device = _one_kind(analyses)
    runs = tuple(a.run.run_id for a in analyses)
    pcie = {a.run.meta.environment.pcie_link for a in analyses if a.run.meta is not None}
    limit = link_limit(pcie.pop() if len(pcie) == 1 else None)
    fit, refused = _solve(design(analyses), prior, limit)
    d = fit.design
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    resampled = np.array([_fit(fit.matrix, t, fit.free, fit.fixed) for t in d.resampled(rng)])
    machines = _per_run(fit, analyses, limit) if len(runs) > 1 else {}
    kernels = _kernel_us(analyses)
    notes = fit.notes
    if kernels:
        kernel = float(np.median(kernels))
        kernel_draws = np.array([np.median(rng.choice(kernels, len(kernels))) for _ in range(RESAMPLES)])
    else:
        kernel, kernel_draws = prior["pageable"].us("kernel_us"), None
        notes.append(f"kernel: no profiled device time per op in breakdown.csv; kept the prior's {kernel:g} µs "
                     "(launch is the fitted per-op cost less it)")
    coefficients = dict(zip(d.names, fit.center, strict=True))
    draws_of = {n: resampled[:, i] for i, n in enumerate(d.names)}
    fitted = {n: i in fit.free for i, n in enumerate(d.names)}
    probes = sum(e.probe for e in d.equations)
    rows = f"{len(d.equations) - probes} rows" + (f" and {probes} probe copies" if probes else "")
    over = (", widened to hold each run's own fit (machine to machine)" if len(runs) > 1 else "")
    where = (f"fitted from run{'s' if len(runs) > 1 else ''} {', '.join(runs)} ({device}): least squares over {rows}, "
             f"{CONFIDENCE:.0%} interval over {RESAMPLES} resamples of each row's processes{over}")

    def term(key: str, value: float, samples: np.ndarray | None, prior_term: Term, where: str = where,
             each: tuple[float, ...] = ()) -> Term:
        value = float(value)
        if samples is None:
            return Term(key, value, f"prior, not fitted from {', '.join(runs)}: {prior_term.source}")
        low, high = (float(x) for x in np.percentile(samples, [50 * (1 - CONFIDENCE), 50 * (1 + CONFIDENCE)]))
        if key == "bandwidth_gb_s":  # samples are seconds per byte: the interval of their inverse, in GB/s
            low, high = 1 / (high * 1e3), (1 / (low * 1e3) if low > 0 else math.inf)
        low, high = min(low, value, *each), max(high, value, *each)
        if not (low > 0 and math.isfinite(high)):
            bound = "is unbounded above (too few bytes to bound it)" if key == "bandwidth_gb_s" else "reaches 0"
            return Term(key, value, f"{where}; its interval {bound}, so it is bounded as an assumption")
        return Term(key, value, where, low, high)

    slug = name or "fit_" + "".join(c if c.isalnum() else "_" for c in runs[0].lower())
    profiles = []
    for memory in d.memories:
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
        per_run = {key: tuple(m[key] for m in machines.values() if key in m) for key in
                   ("launch", "sync", f"copy_{memory}", f"per_byte_{memory}")}
        terms = (term("launch_us", launch, launch_draws, launch_source, each=per_run["launch"]),
                 term("kernel_us", kernel, kernel_draws, base.term("kernel_us"),
                      f"profiled device time per op in breakdown.csv of {', '.join(runs)}: the median of {len(kernels)} "
                      f"rows, {CONFIDENCE:.0%} interval over {RESAMPLES} resamples of them"),
                 term("sync_us", coefficients["sync"], draws_of["sync"] if fitted["sync"] else None, base.term("sync_us")),
                 term("copy_us", coefficients[f"copy_{memory}"],
                      draws_of[f"copy_{memory}"] if fitted[f"copy_{memory}"] else None, base.term("copy_us"),
                      each=per_run[f"copy_{memory}"]),
                 term("bandwidth_gb_s", 1 / (inv * 1e3) if fitted[f"per_byte_{memory}"] else base.us("bandwidth_gb_s"),
                      inv_draws if fitted[f"per_byte_{memory}"] else None,
                      base.term("bandwidth_gb_s"), each=tuple(1 / (v * 1e3) for v in per_run[f"per_byte_{memory}"])))
        if any(t.value <= 0 for t in terms):
            bad = next(t for t in terms if t.value <= 0)
            raise RunError(f"{', '.join(runs)}: the fit puts {SHORT[bad.key]} at {bad.value:.3g} {bad.unit} (<= 0): "
                           f"these rows cannot support a {memory} profile; see `kvpages calibrate` --help")
        profiles.append(LinkProfile(f"{slug}_{memory}", f"{device}, {memory} (fitted)", memory, terms, fitted_from=runs))
    modeled = fit.matrix @ fit.center
    residuals = tuple(Residual(e.id, e.memory, float(t), float(f), float(t - f)) for e, t, f in
                      zip(d.equations, fit.times, modeled, strict=True))
    return Calibration(runs, tuple(profiles), residuals, tuple(dict.fromkeys(notes)), d.repetitions, tuple(refused))
