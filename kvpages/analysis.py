"""Load run folders and analyse them once: what the charts, the report, the notebook and `compare` show.

`analyze(run)` computes one typed `Analysis` of a run (every variant against the baseline
with repetition-level confidence intervals, the crossovers, the fastest variants per point,
the noise floor); the renderers only format it. Every figure comes from a run's
results.csv and samples.csv. No torch import.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvpages.links import LINK_PROFILES
from kvpages.results import (
    COLUMNS,
    FLOAT_COLUMNS,
    INT_COLUMNS,
    KEY_COLUMNS,
    META_JSON,
    OPTIONAL_COLUMNS,
    READABLE_SCHEMAS,
    RESULTS_CSV,
    SAMPLES_CSV,
    SCENARIO_COLUMNS,
    SCENARIO_FLOAT_COLUMNS,
    SCENARIO_INT_COLUMNS,
    SCENARIO_OPTIONAL_COLUMNS,
    SCENARIO_SAMPLE_COLUMNS,
    SCENARIO_SAMPLES_CSV,
    SCENARIOS_CSV,
    Environment,
    RatioRow,
    RunMeta,
)
from kvpages.stats import (
    CONFIDENCE,
    Interval,
    block_medians,
    median_interval,
    paired_log_ratios,
    shift_interval,
    unknown,
)

BASELINE = "host_stride"
CANDIDATE = "device_stride"
NOISY_SPREAD = 0.10
"""A row whose block medians vary by at least this much (log-sd, ~ the CV) is flagged as noisy."""
MEDIAN_RTOL = 1e-9
"""load_run recomputes each ok row's median from samples.csv; beyond this relative difference it refuses the folder."""


class RunError(ValueError):
    """A run folder or file that cannot be read; the message names the file and what is wrong."""


@dataclass(frozen=True, eq=False)
class Run:
    """A loaded run: its rows, its raw samples by row key, and its meta (None for a bare CSV)."""

    path: Path
    rows: pd.DataFrame
    samples: dict[tuple, list[np.ndarray]]
    """Per row key, the per-round times of each repetition (block), in repetition order."""
    meta: RunMeta | None
    scenarios: pd.DataFrame | None = None
    """scenarios.csv (whole requests and steps), or None for a run without them."""
    scenario_samples: dict[tuple, dict[str, list[np.ndarray]]] | None = None
    """Per (scenario, variant): {'blocked': blocks, 'ready': blocks}, in repetition order."""

    @property
    def run_id(self) -> str:
        return self.meta.run_id if self.meta else self.path.name

    @property
    def device_name(self) -> str:
        names = self.rows["device_name"].dropna().unique()
        return ", ".join(str(n) for n in names) if len(names) else "unknown device"

    @property
    def link_crossed(self) -> bool:
        return bool((self.rows["link"].fillna("").str.startswith("pcie")).any())

    def ok_rows(self) -> pd.DataFrame:
        return self.rows[self.rows["status"] == "ok"]

    def blocks(self, key: tuple) -> list[np.ndarray] | None:
        return self.samples.get(key)


def row_key(row: pd.Series | dict) -> tuple:
    return tuple(int(row[c]) if c in ("seq_len", "page_size") else str(row[c]) for c in KEY_COLUMNS)


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise RunError(f"{path}: no such file")
    data = path.read_bytes()
    if not data.strip():
        raise RunError(f"{path}: empty file")
    if b"\0" in data[:4096]:
        raise RunError(f"{path}: binary file, expected kvpages text (CSV or JSON)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise RunError(f"{path}: not UTF-8 text, expected kvpages text (CSV or JSON)") from None


def _read_csv(path: Path, required: tuple[str, ...]) -> pd.DataFrame:
    text = _read_text(path)
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise RunError(f"{path}: not a parseable CSV ({str(exc).splitlines()[0]})") from None
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise RunError(f"{path}: missing required columns: {', '.join(missing)}")
    return frame


def _typed_rows(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    frame = frame.copy()
    for column in OPTIONAL_COLUMNS:
        if column not in frame.columns:
            frame[column] = ""
    return _typed(frame[list(COLUMNS)].copy(), INT_COLUMNS, FLOAT_COLUMNS, path)


def _typed(frame: pd.DataFrame, ints: tuple[str, ...], floats: tuple[str, ...], path: Path) -> pd.DataFrame:
    """`frame` (all strings) with its integer and float columns parsed; empty cells become missing."""
    column = ""
    try:
        for column in ints:
            frame[column] = pd.to_numeric(frame[column].replace("", None)).astype("Int64")
        for column in floats:
            frame[column] = pd.to_numeric(frame[column].replace("", None)).astype("float64")
    except (ValueError, TypeError) as exc:
        raise RunError(f"{path}: column {column!r} holds a non-number ({exc})") from None
    return frame


def _read_meta(path: Path) -> RunMeta:
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise RunError(f"{path}: expected a JSON object")
    version = data.get("schema_version")
    if version not in READABLE_SCHEMAS:
        readable = ", ".join(str(v) for v in READABLE_SCHEMAS)
        raise RunError(f"{path}: schema version {version!r}; this kvpages reads schema versions {readable}")
    try:
        env = Environment(**data.pop("environment"))
        return RunMeta(environment=env, **data)
    except (TypeError, KeyError) as exc:
        raise RunError(f"{path}: fields do not match schema version {version} ({exc})") from None


def load_run(path: str | Path) -> Run:
    """Load a run folder, or a results CSV (its folder's meta.json and samples.csv are used when present)."""
    path = Path(path)
    if not path.exists():
        raise RunError(f"{path}: no such file or folder")
    if path.is_dir():
        folder, csv_path = path, path / RESULTS_CSV
        if not csv_path.exists():
            raise RunError(f"{path}: no {RESULTS_CSV} here; not a kvpages run folder")
        meta: RunMeta | None = _read_meta(folder / META_JSON)
    else:
        folder, csv_path = path.parent, path
        meta = _read_meta(folder / META_JSON) if (folder / META_JSON).exists() else None
    required = tuple(c for c in COLUMNS if c not in OPTIONAL_COLUMNS)
    rows = _typed_rows(_read_csv(csv_path, required), csv_path)
    samples_path = folder / SAMPLES_CSV
    samples = _read_samples(samples_path) if samples_path.exists() else {}
    _check_medians(rows, samples, csv_path)
    scenarios, scenario_samples = _read_scenarios(folder)
    return Run(folder, rows, samples, meta, scenarios, scenario_samples)


def _read_scenarios(folder: Path) -> tuple[pd.DataFrame | None, dict[tuple, dict[str, list[np.ndarray]]] | None]:
    path = folder / SCENARIOS_CSV
    if not path.exists():
        return None, None
    frame = _read_csv(path, tuple(c for c in SCENARIO_COLUMNS if c not in SCENARIO_OPTIONAL_COLUMNS))
    for column in SCENARIO_OPTIONAL_COLUMNS:
        if column not in frame.columns:
            frame[column] = ""
    frame = _typed(frame[list(SCENARIO_COLUMNS)].copy(), SCENARIO_INT_COLUMNS, SCENARIO_FLOAT_COLUMNS, path)
    samples: dict[tuple, dict[str, list[np.ndarray]]] = {}
    samples_path = folder / SCENARIO_SAMPLES_CSV
    if samples_path.exists():
        records = _read_csv(samples_path, SCENARIO_SAMPLE_COLUMNS[:-1]).to_dict("records")  # busy_us: optional
        try:
            records.sort(key=lambda r: int(r["repetition"]))
            for r in records:
                entry = samples.setdefault((r["scenario"], r["variant"]), {"blocked": [], "ready": []})
                for what in ("blocked", "ready"):
                    entry[what].append(np.array(r[f"{what}_us"].split(), dtype=np.float64))
        except ValueError:
            raise RunError(f"{samples_path}: a repetition or sample is not a number") from None
    for _, row in frame[frame["status"] == "ok"].iterrows():
        blocks = samples.get((row["scenario"], row["variant"]))
        if blocks is None:
            raise RunError(f"{path}: row {row['scenario']} {row['variant']} has no samples in {SCENARIO_SAMPLES_CSV}")
        median = float(np.median(np.concatenate(blocks["blocked"])))
        if not math.isclose(median, float(row["blocked_median_us"]), rel_tol=MEDIAN_RTOL, abs_tol=1e-12):
            raise RunError(f"{path}: row {row['scenario']} {row['variant']} says blocked_median_us "
                           f"{row['blocked_median_us']!r}, but its samples give {median!r}; the folder was edited or mixed up")
    return frame, samples


def _read_samples(path: Path) -> dict[tuple, list[np.ndarray]]:
    """samples.csv by row key; version 1 files (no `repetition` column) hold one block per row."""
    frame = _read_csv(path, KEY_COLUMNS + ("rounds", "samples_us"))
    by_key: dict[tuple, list[tuple[int, np.ndarray]]] = {}
    for i, record in enumerate(frame.to_dict("records")):
        try:
            values = np.array(record["samples_us"].split(), dtype=np.float64)
            repetition = int(record.get("repetition") or 0)
        except ValueError:
            raise RunError(f"{path}: line {i + 2}: samples_us or repetition holds a non-number") from None
        by_key.setdefault(row_key(record), []).append((repetition, values))
    return {key: [v for _, v in sorted(blocks, key=lambda b: b[0])] for key, blocks in by_key.items()}


def _check_medians(rows: pd.DataFrame, samples: dict[tuple, list[np.ndarray]], path: Path) -> None:
    """Refuse a results.csv whose ok rows' medians are not those of their samples (a hand edit, a mix-up)."""
    if not samples:
        return
    for _, row in rows[rows["status"] == "ok"].iterrows():
        key = row_key(row)
        blocks = samples.get(key)
        if blocks is None:
            raise RunError(f"{path}: row {' '.join(map(str, key))} has no samples in {SAMPLES_CSV}")
        median = float(np.median(np.concatenate(blocks)))
        if not math.isclose(median, float(row["median_us"]), rel_tol=MEDIAN_RTOL, abs_tol=1e-12):
            raise RunError(f"{path}: row {' '.join(map(str, key))} says median_us {row['median_us']!r}, but its "
                           f"samples in {SAMPLES_CSV} give {median!r}; the folder was edited or mixed up")


# ----------------------------------------------------------------------------- analysis


def with_link_model(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` plus one `modeled_<link>_us` column per link profile (a model, see kvpages.links)."""
    out = rows.copy()
    for profile in LINK_PROFILES:
        out[profile.column] = [
            profile.modeled_us(float(b), float(t)) if pd.notna(b) and pd.notna(t) else np.nan
            for b, t in zip(rows["d2h_bytes"], rows["d2h_transfers"], strict=True)
        ]
    return out


POINT_COLUMNS = ("dtype", "layout", "page_size", "seq_len")


def verdict(interval: Interval) -> str:
    if interval.ci_high < 1:
        return "faster"
    if interval.ci_low > 1:
        return "slower"
    return "within noise"


def _log_block_medians(run: Run, key: tuple) -> np.ndarray | None:
    blocks = run.blocks(key)
    return None if blocks is None else np.log(block_medians(blocks))


def paired_logs(run: Run, baseline_key: tuple, variant_key: tuple) -> np.ndarray | None:
    """Per repetition, log(variant / baseline) of the block medians; None without samples for both."""
    base, other = run.blocks(baseline_key), run.blocks(variant_key)
    if base is None or other is None or len(base) != len(other):
        return None
    return paired_log_ratios(block_medians(base), block_medians(other))


def _ratio(run: Run, variant: pd.Series, baseline: pd.Series) -> RatioRow:
    logs = paired_logs(run, row_key(baseline), row_key(variant))
    # A bare CSV has no repetitions to judge from.
    interval = unknown(float(variant["median_us"] / baseline["median_us"]), 0) if logs is None else median_interval(logs)
    return RatioRow(
        variant=str(variant["variant"]), baseline=str(baseline["variant"]), dtype=str(variant["dtype"]),
        layout=str(variant["layout"]), seq_len=int(variant["seq_len"]), page_size=int(variant["page_size"]),
        ratio=interval.ratio, ci_low=interval.ci_low, ci_high=interval.ci_high, confidence=interval.confidence,
        repetitions=interval.n,
        bytes_ratio=float(variant["d2h_bytes"] / baseline["d2h_bytes"]),
        variant_median_us=float(variant["median_us"]), baseline_median_us=float(baseline["median_us"]),
        variant_d2h_bytes=int(variant["d2h_bytes"]), baseline_d2h_bytes=int(baseline["d2h_bytes"]),
        verdict=verdict(interval),
    )


@dataclass(frozen=True)
class Crossover:
    dtype: str
    layout: str
    page_size: int
    seq_len: int | None  # None: not within the swept range
    swept: tuple[int, ...]

    def describe(self) -> str:
        if self.seq_len is None:
            return f"not within the swept range ({min(self.swept)}..{max(self.swept)})"
        return f"seq_len {self.seq_len}"


def crossovers(ratios: tuple[RatioRow, ...], variant: str = CANDIDATE) -> list[Crossover]:
    """Per (dtype, layout, page size): the smallest seq_len at which `variant` beats the baseline,
    i.e. the upper end of the confidence interval of variant/baseline is below 1."""
    groups: dict[tuple, list[RatioRow]] = {}
    for r in ratios:
        if r.variant == variant:
            groups.setdefault((r.dtype, r.layout, r.page_size), []).append(r)
    out = []
    for (dtype, layout, page_size), group in sorted(groups.items()):
        group.sort(key=lambda r: r.seq_len)
        wins = [r.seq_len for r in group if r.ci_high < 1]
        out.append(Crossover(dtype, layout, page_size, wins[0] if wins else None, tuple(r.seq_len for r in group)))
    return out


def fastest(run: Run, rows: pd.DataFrame) -> tuple[str, ...]:
    """At one point: the variant with the lowest median, then every variant tied with it, i.e. whose
    paired ratio to it has a confidence interval that reaches 1 (no repetitions: equal medians only)."""
    ordered = rows.sort_values("median_us")
    best = ordered.iloc[0]
    tied = []
    for _, r in ordered.iterrows():
        logs = paired_logs(run, row_key(best), row_key(r))
        tie = r["median_us"] == best["median_us"] if logs is None else median_interval(logs).ci_low <= 1
        if tie:
            tied.append(str(r["variant"]))
    return tuple(tied)


@dataclass(frozen=True)
class NoiseFloor:
    """The spread between this run's repetitions: log-sd of each ok row's block medians (~ its CV)."""

    repetitions: int
    median_spread: float
    max_spread: float
    median_ci_half_width: float
    """The median, over ratios, of the relative half-width of the ratio's confidence interval."""


@dataclass(frozen=True)
class ScenarioRatio:
    """A step variant against the baseline step variant on one scenario, for one latency (blocked or ready)."""

    scenario: str
    variant: str
    baseline: str
    latency: str  # blocked | ready
    interval: Interval
    verdict: str


def scenario_ratios(run: Run, baseline: str) -> tuple[ScenarioRatio, ...]:
    """Paired per-repetition ratios of block medians, every ok step variant against `baseline`, per scenario."""
    if run.scenarios is None or run.scenario_samples is None:
        return ()
    ok = run.scenarios[run.scenarios["status"] == "ok"]
    out = []
    for scenario, rows in ok.groupby("scenario", sort=False):
        base = run.scenario_samples.get((scenario, baseline))
        if base is None:
            continue
        for variant in rows["variant"]:
            other = run.scenario_samples[(scenario, variant)]
            if variant == baseline or len(other["blocked"]) != len(base["blocked"]):
                continue
            for latency in ("blocked", "ready"):
                logs = paired_log_ratios(block_medians(base[latency]), block_medians(other[latency]))
                interval = median_interval(logs)
                out.append(ScenarioRatio(str(scenario), str(variant), baseline, latency, interval, verdict(interval)))
    return tuple(out)


@dataclass(frozen=True)
class Analysis:
    """Everything the report, the charts, the notebook and `compare` show of one run, computed once."""

    run: Run
    baseline: str
    ratios: tuple[RatioRow, ...]
    crossovers: tuple[Crossover, ...]
    fastest: dict[tuple, tuple[str, ...]]
    """Per point (dtype, layout, page_size, seq_len): the fastest variants, tied within noise."""
    noise: NoiseFloor
    scenario_ratios: tuple[ScenarioRatio, ...] = ()
    scenario_baseline: str = "per_request[host_stride]"

    def scenario_ratio(self, scenario: str, variant: str, latency: str) -> ScenarioRatio | None:
        return next((r for r in self.scenario_ratios
                     if (r.scenario, r.variant, r.latency) == (scenario, variant, latency)), None)

    def ratios_of(self, variant: str) -> tuple[RatioRow, ...]:
        return tuple(r for r in self.ratios if r.variant == variant)

    def ratio_at(self, variant: str, dtype: str, layout: str, page_size: int, seq_len: int) -> RatioRow | None:
        return next((r for r in self.ratios if (r.variant, r.dtype, r.layout, r.page_size, r.seq_len)
                     == (variant, dtype, layout, page_size, seq_len)), None)

    def ratios_frame(self) -> pd.DataFrame:
        return pd.DataFrame([r.__dict__ for r in self.ratios])


def analyze(run: Run, baseline: str = BASELINE) -> Analysis:
    """Analyse `run` once: every timed variant against `baseline` at every point where both were timed."""
    ok = run.ok_rows()
    ratios: list[RatioRow] = []
    best: dict[tuple, tuple[str, ...]] = {}
    for key, at in ok.groupby(list(POINT_COLUMNS), sort=True):
        point = tuple(key)
        best[point] = fastest(run, at)
        base = at[at["variant"] == baseline]
        if base.empty:
            continue
        for _, row in at.sort_values("variant", key=variant_order).iterrows():
            if row["variant"] != baseline:
                ratios.append(_ratio(run, row, base.iloc[0]))
    found = tuple(crossovers(tuple(ratios)))
    spreads = ok["rep_spread"].dropna()
    finite = [(r.ci_high - r.ci_low) / 2 / r.ratio for r in ratios if math.isfinite(r.ci_high)]
    repetitions = int(ok["repetitions"].dropna().max()) if ok["repetitions"].notna().any() else 1
    noise = NoiseFloor(
        repetitions=repetitions,
        median_spread=float(spreads.median()) if len(spreads) else math.nan,
        max_spread=float(spreads.max()) if len(spreads) else math.nan,
        median_ci_half_width=float(np.median(finite)) if finite else math.nan,
    )
    step_baseline = f"per_request[{baseline}]"
    return Analysis(run, baseline, tuple(ratios), found, best, noise, scenario_ratios(run, step_baseline), step_baseline)


def summary_seq_lens(seq_lens: list[int]) -> list[int]:
    """A few sequence lengths for short tables: the shortest, 8192 (or the middle one) and the longest."""
    ordered = sorted(set(seq_lens))
    middle = 8192 if 8192 in ordered else ordered[len(ordered) // 2]
    return sorted({ordered[0], middle, ordered[-1]})


SUMMARY_STEP_VARIANTS = ("per_request[host_stride]", "per_request[device_stride]", "batched_device_stride",
                         "batched_device_stride_pinned")


def scenario_summary(analysis: Analysis) -> list[str]:
    """Lines for the whole requests and steps: bytes, transfers, blocked and ready, and blocked vs the baseline."""
    frame = analysis.run.scenarios
    if frame is None:
        return []
    ok = frame[(frame["status"] == "ok") & frame["variant"].isin(SUMMARY_STEP_VARIANTS)]
    if ok.empty:
        return []
    table = ok[["scenario", "variant", "d2h_transfers", "d2h_bytes", "blocked_median_us", "ready_median_us"]].copy()
    cells = []
    for scenario, variant in zip(table["scenario"], table["variant"], strict=True):
        r = analysis.scenario_ratio(scenario, variant, "blocked")
        cells.append("1" if variant == analysis.scenario_baseline else
                     (f"{r.interval.ratio:.3f} [{r.interval.ci_low:.3f}, {r.interval.ci_high:.3f}]" if r else ""))
    table[f"blocked vs baseline [{CONFIDENCE:.0%} CI]"] = cells
    return ["", "whole requests and steps (per request or per step; blocked = ready on a CPU run):",
            table.to_string(index=False, float_format=lambda v: f"{v:.2f}")]


def summary_text(analysis: Analysis) -> str:
    """Per page size: D2H bytes, median latency and the ratio to the baseline (with its CI) at a few lengths;
    then the whole requests and steps."""
    run = analysis.run
    ok = run.ok_rows()
    if ok.empty:
        return "\n".join(scenario_summary(analysis)) or "no timed rows"
    lines = []
    if not run.link_crossed:
        lines.append("CPU run: no PCIe link was crossed; bytes are those handed to the host boundary.")
    lines.append(f"{analysis.noise.repetitions} interleaved repetitions per (variant, point); "
                 f"ratios are paired per repetition, with {CONFIDENCE:.0%} CIs.")
    for key, group in ok.groupby(["dtype", "layout", "page_size"], sort=True):
        dtype, layout, page_size = str(key[0]), str(key[1]), int(key[2])  # type: ignore[call-overload]
        chosen = group[group["seq_len"].isin(summary_seq_lens(group["seq_len"].tolist()))]
        table = chosen[["seq_len", "variant", "d2h_bytes", "median_us"]].copy()
        cells = []
        for s, v in zip(table["seq_len"], table["variant"], strict=True):
            r = analysis.ratio_at(v, dtype, layout, page_size, s)
            cells.append("1" if v == analysis.baseline else (f"{r.ratio:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]"
                                                            if r else ""))
        table[f"vs_{analysis.baseline} [{CONFIDENCE:.0%} CI]"] = cells
        table = table.sort_values(["seq_len", "variant"], key=variant_order)
        lines.append(f"\npage_size={page_size} ({dtype}, {layout})")
        lines.append(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return "\n".join(lines + scenario_summary(analysis))


def variant_sort_key(name: str) -> tuple:
    """The baseline first, then the candidate, then the rest by name; step variants likewise
    (per_request[host_stride], per_request[device_stride], the other per-request ones, the batched ones)."""
    inner = name[len("per_request["):-1] if name.startswith("per_request[") else name
    return (inner != BASELINE, inner != CANDIDATE, inner != name, name)


def variant_order(column: pd.Series) -> pd.Series:
    """A `sort_values(key=...)` that orders the variant column by `variant_sort_key`."""
    return column.map(variant_sort_key) if column.name == "variant" else column


# ----------------------------------------------------------------------------- compare


@dataclass(frozen=True)
class PointComparison:
    """One key in both runs: B against A, with the confidence interval of B/A and its verdict."""

    key: tuple
    a_value: float
    b_value: float
    interval: Interval
    verdict: str  # "faster", "slower", "same within noise"


@dataclass(frozen=True)
class RunComparison:
    relative: list[PointComparison]
    """Per (variant, point): B's variant/baseline ratio over A's (gated: robust to machine and process)."""
    absolute: list[PointComparison]
    """Per (variant, point): B's median over A's (informational: absolute times move between processes)."""
    only_a: list[tuple]
    only_b: list[tuple]
    baseline: str

    def regressions(self, fail_above_pct: float) -> list[PointComparison]:
        """Relative points whose whole CI of B/A lies above 1 + fail_above_pct / 100."""
        return [p for p in self.relative if p.interval.ci_low > 1 + fail_above_pct / 100]


def _compare_verdict(interval: Interval) -> str:
    v = verdict(interval)
    return "same within noise" if v == "within noise" else v


def compare_runs(a: Run, b: Run, baseline: str = BASELINE) -> RunComparison:
    """Align two runs on (variant, dtype, layout, seq_len, page_size) and judge B against A.

    Relative: each run's paired per-repetition log-ratios variant/baseline, compared by their
    Hodges-Lehmann shift and its Mann-Whitney interval, so what drifts with the machine or the
    process cancels within each run.
    Absolute: each run's log block medians, compared the same way. Without repetitions
    (1 each), no interval can be formed and the verdict is 'same within noise'.
    """
    a_rows = {row_key(r): r for _, r in a.ok_rows().iterrows()}
    b_rows = {row_key(r): r for _, r in b.ok_rows().iterrows()}
    common = sorted(set(a_rows) & set(b_rows))
    if not common:
        raise RunError(f"{a.path} and {b.path}: no timed (variant, point) in common; nothing to compare")
    absolute, relative = [], []
    for key in common:
        ra, rb = a_rows[key], b_rows[key]
        la, lb = _log_block_medians(a, key), _log_block_medians(b, key)
        interval = _between(la, lb, float(rb["median_us"] / ra["median_us"]))
        absolute.append(PointComparison(key, float(ra["median_us"]), float(rb["median_us"]), interval,
                                        _compare_verdict(interval)))
        base_key = (baseline,) + key[1:]
        if key[0] == baseline or base_key not in a_rows or base_key not in b_rows:
            continue
        pa, pb = paired_logs(a, base_key, key), paired_logs(b, base_key, key)
        ratio_a = float(ra["median_us"] / a_rows[base_key]["median_us"])
        ratio_b = float(rb["median_us"] / b_rows[base_key]["median_us"])
        interval = _between(pa, pb, ratio_b / ratio_a)
        a_value = math.exp(float(np.median(pa))) if pa is not None else ratio_a
        b_value = math.exp(float(np.median(pb))) if pb is not None else ratio_b
        relative.append(PointComparison(key, a_value, b_value, interval, _compare_verdict(interval)))
    return RunComparison(relative, absolute, sorted(set(a_rows) - set(b_rows)), sorted(set(b_rows) - set(a_rows)),
                         baseline)


def _between(a_logs: np.ndarray | None, b_logs: np.ndarray | None, fallback: float) -> Interval:
    if a_logs is None or b_logs is None or a_logs.size < 2 or b_logs.size < 2:
        return unknown(fallback, 0)
    return shift_interval(a_logs, b_logs)
