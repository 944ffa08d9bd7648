"""The busy queue: device work (a sleeping kernel) queued in each round, as the next forward would be (a blocking
copy waits behind it, a non-blocking copy into pinned memory does not). CUDA only.
"""

from __future__ import annotations

import torch

SPIN_UP_MS = 30.0
"""Before calibrating, keep the GPU busy this long, so its clock has boosted (an idle H200 reads 345 MHz, 1980 MHz
under load)."""
PROBE_CYCLES = 1_000_000
PROBES = 5


def spin_up() -> float:
    """Keep the current CUDA device busy for SPIN_UP_MS, so its clock has boosted; return the microseconds it spun.
    Each process does this before its first timed block."""
    spun_us, cycles = 0.0, PROBE_CYCLES
    while spun_us < SPIN_UP_MS * 1e3:
        spun_us += _elapsed_us(cycles)
        cycles = min(cycles * 2, 50_000_000)
    return spun_us


def _sleep(cycles: int) -> tuple[torch.cuda.Event, torch.cuda.Event]:
    """Queue a sleeping kernel of `cycles` between two timing events, without waiting for it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    return start, end


def _elapsed_us(cycles: int) -> float:
    start, end = _sleep(cycles)
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def cycles_for(busy_us: float, probe_cycles: int, probe_elapsed_us: list[float]) -> int:
    """Sleep cycles that keep the device busy `busy_us` at the fastest clock the probes saw (their minimum time)."""
    return int(busy_us * probe_cycles / min(probe_elapsed_us))


class BusyQueue:
    """Queues `busy_us` of device work on the current stream, calibrated once after a spin-up from the fastest of
    several probes; `measured_us()` gives the busy time each round had (scenarios.csv records it)."""

    def __init__(self, busy_us: int) -> None:
        self.cycles = 0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        if busy_us:
            spin_up()  # the clock first
            self.cycles = cycles_for(busy_us, PROBE_CYCLES, [_elapsed_us(PROBE_CYCLES) for _ in range(PROBES)])

    def __call__(self) -> None:
        if self.cycles:
            self._events.append(_sleep(self.cycles))

    def reset(self) -> None:
        self._events.clear()

    def measured_us(self) -> list[float]:
        """The busy time each round since `reset()` actually had (waits for the device)."""
        if not self._events:
            return []
        self._events[-1][1].synchronize()
        return [start.elapsed_time(end) * 1e3 for start, end in self._events]
