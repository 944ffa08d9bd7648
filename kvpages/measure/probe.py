"""The bandwidth probe of a CUDA sweep (kvpages.schema.probe): after the timed blocks, in the session's process, copies
of 4-64 MiB from the device, into pageable memory as `.cpu()` does and into a pinned buffer, each round one blocking
copy and its synchronize, so `kvpages calibrate` can fix a bandwidth the sweep's few-MB copies cannot."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from kvpages.measure.timer import synchronizer
from kvpages.schema.probe import BANDWIDTH_CSV, PROBE_BLOCKS, PROBE_BYTES, PROBE_ROUNDS, ProbeRow, write_probe

WARMUP_ROUNDS = 2


def _copies(source: torch.Tensor, memory: str) -> Callable[[], object]:
    """One round's copy to the host, returning once the data is there."""
    if memory == "pageable":
        return source.cpu  # allocates pageable host memory and copies into it, as every `.cpu()` of the sweep does
    host = torch.empty(source.shape, dtype=source.dtype, pin_memory=source.device.type == "cuda")

    def pinned() -> torch.Tensor:
        host.copy_(source, non_blocking=True)
        if source.device.type == "cuda":
            torch.cuda.current_stream(source.device).synchronize()
        return host

    return pinned


def bandwidth_probe(device: str, sizes: Sequence[int] = PROBE_BYTES, blocks: int = PROBE_BLOCKS,
                    rounds: int = PROBE_ROUNDS) -> list[ProbeRow]:
    """Per memory and size, `blocks` blocks of `rounds` timed copies (after WARMUP_ROUNDS untimed ones), the device
    synchronized before each. On a CPU device the same code copies host to host (a rehearsal: no link is crossed)."""
    sync = synchronizer(device)
    rows = []
    for size in sizes:
        source = torch.randint(0, 1 << 30, (size // 4,), dtype=torch.int32, device=device)
        for memory in ("pageable", "pinned"):
            copy = _copies(source, memory)
            for block in range(blocks):
                times = []
                for round_ in range(WARMUP_ROUNDS + rounds):
                    sync()
                    start = time.perf_counter()
                    copy()
                    if round_ >= WARMUP_ROUNDS:
                        times.append((time.perf_counter() - start) * 1e6)
                data = np.array(times)
                rows.append(ProbeRow(memory, size, block, rounds, float(np.median(data)), float(data.min()),
                                     float(data.max())))
        del source
    return rows


def probe_into(folder: Path, device: str) -> str:
    """bandwidth.csv in a finished run folder; meta.json's `bandwidth_probe`: what it holds and what it took."""
    start = time.perf_counter()
    rows = bandwidth_probe(device)
    write_probe(folder, rows)
    sizes = sorted({r.bytes >> 20 for r in rows})
    return (f"{BANDWIDTH_CSV}: {len(rows)} blocks of {rows[0].rounds} copies, pageable and pinned, of "
            f"{', '.join(map(str, sizes))} MiB, {time.perf_counter() - start:.1f} s")
