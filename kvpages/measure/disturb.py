"""A test-only disturbance: makes one variant's timed calls slower in one process, as a busy neighbour would.

Inert unless the environment names it: KVPAGES_TEST_DISTURB="<process>:<variant>:<factor>" makes every timed call
of `variant` in process `process` take `factor` times as long (the call, then a busy wait for the rest), so that
process's blocks of that variant are `factor` times slower. tests/test_remeasure.py sets it to check that a
disturbed point is re-measured; a sweep never does. No torch import.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

ENV = "KVPAGES_TEST_DISTURB"


def disturbed(fn: Callable[..., Any], process: int, variant: str) -> Callable[..., Any]:
    """`fn`, or, where KVPAGES_TEST_DISTURB names this process and variant, `fn` slowed down by its factor."""
    given = os.environ.get(ENV)
    if not given:
        return fn
    where, name, factor = given.split(":")
    if int(where) != process or name != variant:
        return fn

    def slowed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        until = start + (time.perf_counter() - start) * float(factor)
        while time.perf_counter() < until:
            pass
        return out

    return slowed
