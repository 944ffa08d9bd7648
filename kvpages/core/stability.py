"""When a point's repetitions agree: the rule the schedule re-measures by and the analysis trims by (no torch).

A process is *outlying* when its mean log level lies further from the median of the process means than
OUTLIER_SDS robust standard deviations (1.4826 x their MAD) and than the stable spread itself: a disturbed process,
not the box's usual spread. A variant is *settled* at a point when at least as many processes as the plan dealt
repetitions to are not outlying, and the block medians of those spread (log-sd, results.csv's `rep_spread`) by no
more than the stable spread. docs/method.md#re-measuring-unstable-points says why.
"""

from __future__ import annotations

import numpy as np

from kvpages.core.stats import Levels, log_spread

DEFAULT_STABLE_SPREAD = 0.10  # --kv-stable-spread: the block medians' log-sd (~ their CV) a settled point stays under
DEFAULT_REMEASURE_BUDGET = 0.25  # --kv-remeasure-budget: of the sweep's planned timed seconds (0: off)
OUTLIER_SDS = 3.0
MAD_TO_SD = 1.4826  # a normal sample's MAD times this estimates its standard deviation


def outlying(levels: Levels, stable_spread: float) -> frozenset[int]:
    """The processes whose mean level lies beyond the cut (module doc) from the median of the process means; none
    with fewer than 3 processes (no majority to tell a disturbed one from the rest)."""
    ids = np.unique(levels.processes)
    if ids.size < 3:
        return frozenset()
    means = np.array([group.mean() for group in levels.by_process()])  # in the order of `ids`
    centre = float(np.median(means))
    cut = max(OUTLIER_SDS * MAD_TO_SD * float(np.median(np.abs(means - centre))), stable_spread)
    return frozenset(int(p) for p, m in zip(ids, means, strict=True) if abs(m - centre) > cut)


def settled(levels: Levels, planned_processes: int, stable_spread: float) -> bool:
    """Whether one variant's log block medians at a point are settled (module doc)."""
    rest = levels.without(outlying(levels, stable_spread))
    return rest.process_count >= planned_processes and log_spread(rest.values) <= stable_spread
