"""The session's SIGINT and SIGTERM: a KeyboardInterrupt, held back while a block's outcome is being recorded so that
what was read is written whole (kvpages.measure.recorder, kvpages.measure.workers). No torch: the session's workers
are started before it imports torch (kvpages.measure.workers)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class _Held:
    depth: int = 0
    pending: str | None = None  # an interruption that arrived while held, delivered when the outermost hold ends


_HELD = _Held()


def interrupt(signum: int, frame: object) -> None:
    """The session's SIGINT and SIGTERM handler: a KeyboardInterrupt, or, while a block is being recorded
    (`deferred_interruption`), one held until it is. Blocking the signals alone would not do: one the C handler
    caught just before is still run by Python at the next bytecode, inside the held region."""
    message = f"signal {signal.Signals(signum).name}"
    if _HELD.depth:
        _HELD.pending = message
        return
    raise KeyboardInterrupt(message)


@contextmanager
def deferred_interruption() -> Iterator[None]:
    """SIGINT and SIGTERM held back meanwhile (in the main thread, where Python runs its signal handlers): one that
    arrives is delivered at the end, as a KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _HELD.depth += 1
    try:
        yield
    finally:
        _HELD.depth -= 1
    if _HELD.depth == 0 and _HELD.pending is not None:
        message, _HELD.pending = _HELD.pending, None
        raise KeyboardInterrupt(message)
