"""The runs beside a run folder, read from their files alone (no numpy, no pandas): the newest CUDA run of the same
preset and points, a CPU run's GPU answer (kvpages.analysis.gpu_answer), found before anything is analysed."""

from __future__ import annotations

import json
from pathlib import Path

from kvpages.schema.rows import META_JSON, RESULTS_CSV

MIN_SHARED = 0.5  # of the CPU run's per-call points: a CUDA run sharing fewer is not its answer


def _points(folder: Path) -> set[tuple[str, ...]]:
    """A run folder's (dtype, layout, seq_len, page_size) points, read from its results.csv's header and rows (none
    where it has no such header)."""
    lines = (folder / RESULTS_CSV).read_text().splitlines() or [""]
    header = lines[0].split(",")
    columns = ("dtype", "layout", "seq_len", "page_size")
    if not set(columns) <= set(header):
        return set()
    at = [header.index(c) for c in columns]
    return {tuple(line.split(",")[i] for i in at) for line in lines[1:] if line.count(",") >= max(at)}


def _meta(folder: Path) -> dict | None:
    """A run folder's meta.json, read; None where it has none, or one that is no JSON object (a folder beside a run
    is no answer to it; a run's own is judged by its report), or no results.csv (not a run folder)."""
    meta = folder / META_JSON
    if not meta.is_file() or not (folder / RESULTS_CSV).is_file():
        return None
    try:
        data = json.loads(meta.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _device(meta: dict) -> object:
    environment = meta.get("environment")
    return environment.get("device") if isinstance(environment, dict) else None


def gpu_run_beside(run: Path) -> Path | None:
    """The newest CUDA run beside the run folder `run` of its preset that shares at least MIN_SHARED of its points;
    None for a CUDA run or a folder without meta.json."""
    mine = _meta(run) if run.is_dir() else None
    if mine is None or _device(mine) == "cuda":
        return None
    points = _points(run)
    found = []
    for folder in sorted(run.parent.iterdir()):
        data = None if folder == run else _meta(folder)
        if data is None or _device(data) != "cuda" or data.get("preset") != mine.get("preset"):
            continue
        if len(points & _points(folder)) >= MIN_SHARED * len(points):
            found.append(folder)
    return found[-1] if found else None  # run ids begin with their UTC start: the newest sorts last
