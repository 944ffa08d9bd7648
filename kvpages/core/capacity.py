"""Will a sweep's points fit in memory? Estimated (`PoolGeometry.memory_bytes`) before anything is built."""

from __future__ import annotations

from kvpages.core.sweep import Sweep

HEADROOM = 0.9
"""A point may use at most this fraction of the memory that is free when the run starts."""


def host_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), None)
    except OSError:
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_fits(sweep: Sweep, device: str, free: dict[str, int | None]) -> None:
    """Raise ValueError when a point's estimated peak, or the inputs a multi-pass sweep keeps for all its points plus
    the largest peak, exceed HEADROOM x the `free` bytes of 'host' and, on CUDA runs, 'cuda' (None: not checked)."""
    points = list(sweep.points(device))
    for point in points:
        for where, needed in point.geometry().memory_bytes(device).items():
            available = free.get(where)
            if available is not None and needed > HEADROOM * available:
                raise ValueError(f"seq_len {point.seq_len} at page_size {point.page_size} ({point.dtype}) needs about "
                                 f"{_gib(needed)} of {where} memory to build and check its {point.rotation} request "
                                 f"rows, but only {_gib(available)} is free (at most {HEADROOM:.0%} of it may be used); "
                                 "choose shorter --kv-seq-lens")
    where = "host" if device == "cpu" else "cuda"  # where the kept inputs live
    available = free.get(where)
    if min(sweep.passes, sweep.repetitions) > 1 and available is not None:
        total = sum(p.geometry().pool_bytes for p in points)
        peak = max(p.geometry().memory_bytes(device)[where] for p in points)
        if total + peak > HEADROOM * available:
            raise ValueError(f"the sweep keeps every point's inputs for its {sweep.passes} passes: about {_gib(total)} "
                             f"of {where} memory, plus {_gib(peak)} for the largest point, but only {_gib(available)} "
                             f"is free (at most {HEADROOM:.0%} of it may be used); give fewer --kv-passes or shorter "
                             "--kv-seq-lens")
