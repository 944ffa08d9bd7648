"""Citations: the pair repro command of a ratio, and `kvpages cite RUN ID`'s one line (no torch)."""

from __future__ import annotations

import functools
import itertools
import math
import shlex

from kvpages.core.checks import UserError
from kvpages.core.options import BY_HAND, FLAG, OPTIONS, SCENARIO_FIELDS, BenchOptions
from kvpages.core.stats import Interval
from kvpages.schema.meta import Environment
from kvpages.schema.rows import RatioRow, ScenarioRatioRow

ANALYZE_FLAG = "--kv-analyze"
VARIANTS_FLAG, STEP_VARIANTS_FLAG, SCENARIOS_FLAG = FLAG["variants"], FLAG["step_variants"], FLAG["scenarios"]
_FLAGS = {o.flag for o in OPTIONS}
_SCENARIO_FLAGS = {FLAG[field] for field in SCENARIO_FIELDS}
_BY_HAND_FLAGS = {FLAG[field] for field in BY_HAND}


class CiteError(UserError):
    """An id that is not a row of the run; the message says how to list the valid ones."""


@functools.lru_cache(maxsize=4096)  # a scenario's row is cited for its blocked and its ready latency
def pair_repro(repro: str, variant: str, baseline: str) -> str:
    """The command that re-runs `variant` and `baseline` together, interleaved, where `repro` re-ran `variant` alone:
    parsed back through the options table, widened to the pair, with --kv-analyze; '' for no kvpages command."""
    words = shlex.split(repro) if "'" in repro or '"' in repro else repro.split()  # split() is 20x faster
    if not words:
        return ""
    first = next((i for i, w in enumerate(words) if w.startswith("--kv-")), len(words))
    given = {flag: value for flag, value in itertools.pairwise(words) if flag in _FLAGS}
    if given.get(SCENARIOS_FLAG) == "preset" and _BY_HAND_FLAGS & set(given):  # made before dc5886e refused the two
        del given[SCENARIOS_FLAG]  # together: the scenarios given by hand replaced the preset's, as they do without it
    steps = STEP_VARIANTS_FLAG in given and given.get(SCENARIOS_FLAG) != "none"  # a point's times none
    # the pair replaces the variants; a point's repro made before 2026-12-07 may name scenario options, left out too
    left_out = {VARIANTS_FLAG, STEP_VARIANTS_FLAG} | (set() if steps else _SCENARIO_FLAGS)
    options = _parsed(tuple(sorted((f, v) for f, v in given.items() if f not in left_out)))
    if options is None:
        return ""
    # a point: its pair alone, without the preset's whole requests and steps
    pair = (options.replace(step_variants=(variant, baseline)) if steps
            else options.without_scenarios(variants=(variant, baseline)))
    return shlex.join([*words[:first], *pair.to_args(), ANALYZE_FLAG])


@functools.lru_cache(maxsize=256)
def _parsed(given: tuple[tuple[str, str], ...]) -> BenchOptions | None:
    """A repro's options but its variants (the pair replaces them; names are not checked), parsed once per run's
    options and point: parsing builds and checks a whole sweep (None: they do not parse)."""
    try:
        return BenchOptions.parse(dict(given).get)
    except ValueError:
        return None


def sig(value: float, digits: int = 3) -> str:
    """A figure as every table, chart and finding prints it: `digits` significant figures, never an exponent, with
    thousands separators ('1,790', '142', '10.4', '0.951'); '-' for a missing one."""
    if not math.isfinite(value):
        return "-"
    if value == 0:
        return "0"
    places = digits - 1 - math.floor(math.log10(abs(value)))
    rounded = round(value, places)
    if rounded and digits - 1 - math.floor(math.log10(abs(rounded))) < places:  # 9.996 -> 10.0
        places -= 1
        rounded = round(value, places)
    return f"{rounded:,.{max(places, 0)}f}"


def percent(value: float) -> str:
    """A fraction as a percentage, its figure as `sig` prints it (0.101526 -> '10.2%'): the one way a minimum effect
    is printed."""
    return f"{sig(100 * value)}%"


def percent_up(value: float) -> str:
    """A fraction in percent rounded up to a tenth, so never under it: an upper bound ('at most', 'within'), or a
    share printed beside a lower bound it must reach (0.25628 -> '25.7%'); 'n/a' for no value."""
    return f"{math.ceil(round(1000 * value, 6)) / 10:.1f}%" if math.isfinite(value) else "n/a"


def percent_down(value: float) -> str:
    """A fraction in percent rounded down to a tenth, so never over it. A share held and the share it needs print as
    they compare when the one is rounded down and the other up (0.94964 against 0.95: '94.9%', '95.0%'); 'n/a' for no
    value."""
    return f"{math.floor(round(1000 * value, 6)) / 10:.1f}%" if math.isfinite(value) else "n/a"


def wholly_outside(low: float, high: float, lowest: float, highest: float) -> bool:
    """Whether the interval [low, high] lies wholly outside the range [lowest, highest] (a measured figure that a
    prediction's range at its terms' bounds misses)."""
    return high < lowest or low > highest


def commit_text(environment: Environment) -> str | None:
    """The run's commit as a citation gives it: its first 12 hex digits, '(dirty)' when the tree was; None without."""
    if not environment.git_commit:
        return None
    return f"{environment.git_commit[:12]}{' (dirty)' if environment.git_dirty else ''}"


def interval_text(i: Interval) -> str:
    """'1.23 [1.10, 1.30], 95% interval': the figure, its interval and the interval's exact coverage."""
    if not i.known:
        return f"{sig(i.ratio)} (no interval: {i.n} repetition{'s' if i.n != 1 else ''})"
    return f"{sig(i.ratio)} [{sig(i.ci_low)}, {sig(i.ci_high)}], {coverage_text(i.confidence)} interval"


def fraction(value: float) -> str:
    """A bytes ratio: '1/64' when it is the reciprocal of an integer, else 4 significant digits."""
    if 0 < value < 1 and abs(1 / value - round(1 / value)) < 1e-9:
        return f"1/{round(1 / value)}"
    return f"{value:.4g}"


def coverage_text(confidence: float) -> str:
    """An interval's exact coverage as a header says it, e.g. '95%' or '97.9%' (no trailing '.0')."""
    if confidence != confidence:
        return "n/a"
    return f"{confidence:.1%}".replace(".0%", "%")


def interval_of(row: RatioRow | ScenarioRatioRow) -> Interval:
    return Interval(row.ratio, row.ci_low, row.ci_high, row.repetitions, row.confidence)
