"""Load run folders and compute what the charts, the report and `compare` show (no torch import).

Every figure comes from a run's results.csv and samples.csv.
"""

from __future__ import annotations

import functools
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvpages.links import LINK_PROFILES
from kvpages.results import (
    COLUMNS, FLOAT_COLUMNS, INT_COLUMNS, KEY_COLUMNS, META_JSON, RESULTS_CSV, SAMPLE_COLUMNS,
    SAMPLES_CSV, SCHEMA_VERSION, Environment, RunMeta,
)

BASELINE = "host_stride"
CANDIDATE = "device_stride"
NOISY_IQR_FRACTION = 0.10
"""A row whose IQR is at least this fraction of its median is flagged as noisy."""
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


class RunError(ValueError):
    """A run folder or file that cannot be read; the message names the file and what is wrong."""


@dataclass(frozen=True, eq=False)
class Run:
    """A loaded run: its rows, its raw samples by row key, and its meta (None for a bare CSV)."""

    path: Path
    rows: pd.DataFrame
    samples: dict[tuple, np.ndarray]
    meta: RunMeta | None

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
    rows = frame[list(COLUMNS)].copy()
    try:
        for column in INT_COLUMNS:
            rows[column] = pd.to_numeric(rows[column].replace("", None)).astype("Int64")
        for column in FLOAT_COLUMNS:
            rows[column] = pd.to_numeric(rows[column].replace("", None)).astype("float64")
    except (ValueError, TypeError) as exc:
        raise RunError(f"{path}: column {column!r} holds a non-number ({exc})") from None
    return rows


def _read_meta(path: Path) -> RunMeta:
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise RunError(f"{path}: expected a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RunError(f"{path}: schema version {version!r}; this kvpages reads schema version {SCHEMA_VERSION}")
    try:
        env = Environment(**data.pop("environment"))
        return RunMeta(environment=env, **data)
    except (TypeError, KeyError) as exc:
        raise RunError(f"{path}: fields do not match schema version {SCHEMA_VERSION} ({exc})") from None


def load_run(path: str | Path) -> Run:
    """Load a run folder, or a results CSV (its folder's meta.json and samples.csv are used when present)."""
    path = Path(path)
    if not path.exists():
        raise RunError(f"{path}: no such file or folder")
    if path.is_dir():
        folder, csv_path = path, path / RESULTS_CSV
        if not csv_path.exists():
            raise RunError(f"{path}: no {RESULTS_CSV} here; not a kvpages run folder")
        meta = _read_meta(folder / META_JSON)
    else:
        folder, csv_path = path.parent, path
        meta = _read_meta(folder / META_JSON) if (folder / META_JSON).exists() else None
    rows = _typed_rows(_read_csv(csv_path, COLUMNS), csv_path)
    samples: dict[tuple, np.ndarray] = {}
    samples_path = folder / SAMPLES_CSV
    if samples_path.exists():
        frame = _read_csv(samples_path, SAMPLE_COLUMNS)
        for record in frame.to_dict("records"):
            try:
                values = np.array([float(x) for x in record["samples_us"].split()])
            except ValueError:
                raise RunError(f"{samples_path}: samples_us holds a non-number") from None
            samples[row_key(record)] = values
    return Run(folder, rows, samples, meta)


# ----------------------------------------------------------------------------- statistics


def bootstrap_ratio(base: np.ndarray, other: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """Ratio of medians other/base and its bootstrap confidence interval (percentile method)."""
    rng = np.random.default_rng(seed)
    ratio = float(np.median(other) / np.median(base))
    base_medians = _resampled_medians(base, rng)
    other_medians = _resampled_medians(other, rng)
    tail = (1 - CONFIDENCE) / 2 * 100
    lo, hi = np.percentile(other_medians / base_medians, [tail, 100 - tail])
    return ratio, float(lo), float(hi)


def _resampled_medians(data: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Medians of BOOTSTRAP_RESAMPLES resamples (with replacement) of `data`, as np.median defines them.

    Resampling positions of the sorted data is resampling the data; sorting the small
    integer positions (a radix sort) then gives each resample's middle order statistics.
    """
    ordered = np.sort(data)
    n = ordered.size
    dtype = np.uint16 if n <= np.iinfo(np.uint16).max else np.int64
    positions = np.sort(rng.integers(0, n, (BOOTSTRAP_RESAMPLES, n), dtype=dtype), axis=1, kind="stable")
    middle = [n // 2] if n % 2 else [n // 2 - 1, n // 2]
    return ordered[positions[:, middle]].mean(axis=1)


def with_link_model(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` plus one `modeled_<link>_us` column per link profile (a model, see kvpages.links)."""
    out = rows.copy()
    for profile in LINK_PROFILES:
        out[profile.column] = [
            profile.modeled_us(float(b), float(t)) if pd.notna(b) and pd.notna(t) else np.nan
            for b, t in zip(rows["d2h_bytes"], rows["d2h_transfers"])
        ]
    return out


@dataclass(frozen=True)
class RatioPoint:
    """`candidate` vs `baseline` at one point: medians, ratio candidate/baseline and its CI."""

    dtype: str
    layout: str
    page_size: int
    seq_len: int
    baseline_us: float
    candidate_us: float
    ratio: float
    ci_low: float
    ci_high: float
    baseline_bytes: int
    candidate_bytes: int

    @property
    def bytes_ratio(self) -> float:
        return self.candidate_bytes / self.baseline_bytes

    @property
    def candidate_wins(self) -> bool:
        return self.ci_high < 1.0


@functools.lru_cache(maxsize=64)
def ratio_points(run: Run, baseline: str = BASELINE, candidate: str = CANDIDATE) -> tuple[RatioPoint, ...]:
    """Every point where both variants were timed, with the bootstrap CI of the latency ratio (cached per run)."""
    ok = run.ok_rows()
    base = ok[ok["variant"] == baseline].set_index(["dtype", "layout", "page_size", "seq_len"])
    cand = ok[ok["variant"] == candidate].set_index(["dtype", "layout", "page_size", "seq_len"])
    points = []
    for key in sorted(set(base.index) & set(cand.index)):
        b, c = base.loc[key], cand.loc[key]
        dtype, layout, page_size, seq_len = key
        b_samples = run.samples.get((baseline, dtype, layout, int(seq_len), int(page_size)))
        c_samples = run.samples.get((candidate, dtype, layout, int(seq_len), int(page_size)))
        if b_samples is not None and c_samples is not None:
            ratio, lo, hi = bootstrap_ratio(b_samples, c_samples)
        else:
            ratio = lo = hi = float(c["median_us"] / b["median_us"])
        points.append(RatioPoint(dtype, layout, int(page_size), int(seq_len), float(b["median_us"]),
                                 float(c["median_us"]), ratio, lo, hi, int(b["d2h_bytes"]), int(c["d2h_bytes"])))
    return tuple(points)


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


def crossovers(points: tuple[RatioPoint, ...]) -> list[Crossover]:
    """Per (dtype, layout, page size): the smallest seq_len at which the candidate beats the baseline,
    i.e. the upper end of the 95% CI of candidate/baseline is below 1."""
    groups: dict[tuple, list[RatioPoint]] = {}
    for p in points:
        groups.setdefault((p.dtype, p.layout, p.page_size), []).append(p)
    out = []
    for (dtype, layout, page_size), group in sorted(groups.items()):
        group.sort(key=lambda p: p.seq_len)
        wins = [p.seq_len for p in group if p.candidate_wins]
        out.append(Crossover(dtype, layout, page_size, wins[0] if wins else None, tuple(p.seq_len for p in group)))
    return out


def summary_seq_lens(seq_lens: list[int]) -> list[int]:
    """A few sequence lengths for short tables: the shortest, 8192 (or the middle one) and the longest."""
    ordered = sorted(set(seq_lens))
    middle = 8192 if 8192 in ordered else ordered[len(ordered) // 2]
    return sorted({ordered[0], middle, ordered[-1]})


def summary_text(run: Run) -> str:
    """Per page size: D2H bytes and median latency of each variant at a few sequence lengths."""
    ok = run.ok_rows()
    if ok.empty:
        return "no timed rows"
    lines = []
    if not run.link_crossed:
        lines.append("CPU run: no PCIe link was crossed; bytes are those handed to the host boundary.")
    for (dtype, layout, page_size), group in ok.groupby(["dtype", "layout", "page_size"], sort=True):
        chosen = group[group["seq_len"].isin(summary_seq_lens(group["seq_len"].tolist()))]
        base = chosen[chosen["variant"] == BASELINE].set_index("seq_len")["median_us"]
        table = chosen[["seq_len", "variant", "d2h_bytes", "median_us"]].copy()
        table[f"vs_{BASELINE}"] = [m / base.get(s, np.nan) for s, m in zip(table["seq_len"], table["median_us"])]
        table = table.sort_values(["seq_len", "variant"], key=variant_order)
        lines.append(f"\npage_size={page_size} ({dtype}, {layout})")
        lines.append(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return "\n".join(lines)


def variant_sort_key(name: str) -> tuple:
    """The baseline first, then the candidate, then the rest by name."""
    return (name != BASELINE, name != CANDIDATE, name)


def variant_order(column: pd.Series) -> pd.Series:
    """A `sort_values(key=...)` that orders the variant column by `variant_sort_key`."""
    return column.map(variant_sort_key) if column.name == "variant" else column


def relative_noise(a: pd.Series, b: pd.Series) -> float:
    """The spread two rows' medians are compared against: half the larger IQR/median of the two."""
    return 0.5 * max(a["iqr_us"] / a["median_us"], b["iqr_us"] / b["median_us"])


def fastest(rows: pd.DataFrame) -> tuple[str, ...]:
    """The variant with the lowest median among `rows` (one point), then any variant whose median
    is within the noise (see `relative_noise`) of it."""
    ordered = rows.sort_values("median_us")
    best = ordered.iloc[0]
    return tuple(r["variant"] for _, r in ordered.iterrows()
                 if r["median_us"] <= best["median_us"] * (1 + relative_noise(best, r)))


# ----------------------------------------------------------------------------- compare


@dataclass(frozen=True)
class PointComparison:
    key: tuple
    a_median_us: float
    b_median_us: float
    ratio: float
    ci_low: float
    ci_high: float
    noise: float  # half the larger relative IQR of the two rows
    verdict: str  # "faster", "slower", "same within noise"


@dataclass(frozen=True)
class RunComparison:
    points: list[PointComparison]
    only_a: list[tuple]
    only_b: list[tuple]

    def regressions(self, fail_above_pct: float) -> list[PointComparison]:
        """Points where B is slower than A by more than `fail_above_pct` percent beyond noise."""
        return [p for p in self.points if p.verdict == "slower" and p.ci_low > 1 + fail_above_pct / 100]


def compare_runs(a: Run, b: Run) -> RunComparison:
    """Align two runs on (variant, dtype, layout, seq_len, page_size); B/A ratios with bootstrap CIs.

    A point is slower (faster) when the whole CI of B/A lies above (below) 1 and the
    ratio is further from 1 than the runs' spread: half the larger IQR/median of
    the two rows. Without samples for both rows, the CI falls back to the IQRs:
    the ratio range q1_B/q3_A .. q3_B/q1_A.
    """
    a_rows = {row_key(r): r for _, r in a.ok_rows().iterrows()}
    b_rows = {row_key(r): r for _, r in b.ok_rows().iterrows()}
    common = sorted(set(a_rows) & set(b_rows))
    if not common:
        raise RunError(f"{a.path} and {b.path}: no timed (variant, point) in common; nothing to compare")
    points = []
    for key in common:
        ra, rb = a_rows[key], b_rows[key]
        sa, sb = a.samples.get(key), b.samples.get(key)
        if sa is not None and sb is not None:
            ratio, lo, hi = bootstrap_ratio(sa, sb)
        else:
            ratio = rb["median_us"] / ra["median_us"]
            lo, hi = rb["q1_us"] / ra["q3_us"], rb["q3_us"] / ra["q1_us"]
        noise = relative_noise(ra, rb)
        if lo > 1 and ratio > 1 + noise:
            verdict = "slower"
        elif hi < 1 and ratio < 1 - noise:
            verdict = "faster"
        else:
            verdict = "same within noise"
        points.append(PointComparison(key, float(ra["median_us"]), float(rb["median_us"]), float(ratio),
                                      float(lo), float(hi), float(noise), verdict))
    return RunComparison(points, sorted(set(a_rows) - set(b_rows)), sorted(set(b_rows) - set(a_rows)))
