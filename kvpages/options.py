"""The sweep's command-line options, parsed and checked before anything runs (no torch import).

The pytest plugin registers these options from `OPTIONS`; each one overrides
one field of the chosen preset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvpages.checks import check_choice, parse_choices, parse_positive_ints, split_csv
from kvpages.crosscheck import MODES as CROSSCHECK_MODES
from kvpages.scenarios import (
    MIXED_LENGTHS,
    SCENARIO_BUDGET_S,
    SCENARIO_CHOICES,
    SCENARIO_PRESETS,
    Scenario,
    parse_lengths,
    scenarios_from,
)
from kvpages.sweep import DEVICES, DTYPES, LAYOUTS, PRESETS, Sweep, get_preset

DEVICE_CHOICES = ("auto",) + DEVICES


@dataclass(frozen=True)
class Option:
    flag: str
    help: str


OPTIONS: tuple[Option, ...] = (
    Option("--kv-preset", f"named sweep: {', '.join(PRESETS)} (default: default)"),
    Option("--kv-seq-lens", "comma-separated sequence lengths, e.g. 2048,8192 (overrides the preset)"),
    Option("--kv-page-sizes", "comma-separated page sizes, e.g. 1,64 (overrides the preset)"),
    Option("--kv-dtypes", f"comma-separated index dtypes from {', '.join(DTYPES)} (overrides the preset)"),
    Option("--kv-layouts", f"comma-separated page layouts from {', '.join(LAYOUTS)} (overrides the preset)"),
    Option("--kv-variants", "comma-separated variant names (default: all registered; see `kvpages list`)"),
    Option("--kv-device", f"{', '.join(DEVICE_CHOICES)} (default: auto = cuda when available)"),
    Option("--kv-seed", "seed of the generated inputs (default: the preset's, 0)"),
    Option("--kv-time-budget", "timed seconds per (variant, point), all repetitions together (default: the preset's)"),
    Option("--kv-repetitions", "interleaved repetitions (blocks) per (variant, point) (default: the preset's)"),
    Option("--kv-passes", "sweeps over the points that the repetitions are dealt to (default: the preset's)"),
    Option("--kv-crosscheck", f"profiler cross-check of the meter, in its own process: {', '.join(CROSSCHECK_MODES)} "
                              "(default: auto = on for CUDA runs)"),
    Option("--kv-scenarios", "whole requests and steps: preset (the preset's) or none (default: preset)"),
    Option("--kv-request-lens", "request scenarios by hand: comma-separated prompt lengths (both sides of each)"),
    Option("--kv-chunk-size", "chunked-prefill size of the request scenarios (default 8192)"),
    Option("--kv-prefix", "decode-side prefix of the request scenarios, in tokens (default 0)"),
    Option("--kv-step-sizes", "step scenarios by hand: comma-separated requests per step (B)"),
    Option("--kv-step-lens", "request lengths of a step: comma-separated integers, or fixed:L, uniform:LO,HI, "
                             "lognormal:MEDIAN,SIGMA,MAX (default lognormal:4096,1.0,65536)"),
    Option("--kv-step-variants", "comma-separated step variant names (default: all; see `kvpages list`)"),
    Option("--kv-results", "folder that receives the run folder (default: <rootdir>/results)"),
)


def _float_seconds(option: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not a number of seconds, e.g. 0.25") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{option}: {text!r} must be a positive number of seconds, e.g. 0.25")
    return value


def _integer(option: str, text: str, minimum: int, what: str, example: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not an integer; give {what} >= {minimum}, e.g. {example}") from None
    if value < minimum:
        raise ValueError(f"{option}: {value} is not >= {minimum}; give {what} >= {minimum}, e.g. {example}")
    return value


def _count(option: str, text: str) -> int:
    return _integer(option, text, 1, "an integer", "10")


def _seed(option: str, text: str) -> int:
    return _integer(option, text, 0, "an integer seed", "0")


def _scenarios(get: Callable[[str], str | None], preset_name: str, sweep: Sweep) -> tuple[Scenario, ...]:
    """The preset's scenarios, none, or those given by hand (at the sweep's page sizes and dtypes)."""
    choice = get("--kv-scenarios") or "preset"
    try:
        check_choice("scenario choice", choice, SCENARIO_CHOICES)
    except ValueError as exc:
        raise ValueError(f"--kv-scenarios: {exc}") from None
    by_hand = ("--kv-request-lens", "--kv-step-sizes", "--kv-chunk-size", "--kv-prefix", "--kv-step-lens")
    given = {flag: str(get(flag)) for flag in by_hand if get(flag) is not None}
    if choice == "none":
        return ()
    if not given:
        return SCENARIO_PRESETS[preset_name]
    request_lens = parse_positive_ints("--kv-request-lens", given["--kv-request-lens"]) if "--kv-request-lens" in given else ()
    step_sizes = parse_positive_ints("--kv-step-sizes", given["--kv-step-sizes"]) if "--kv-step-sizes" in given else ()
    chunk = parse_positive_ints("--kv-chunk-size", given.get("--kv-chunk-size", "8192"))[0]
    prefix = _integer("--kv-prefix", given.get("--kv-prefix", "0"), 0, "a number of tokens", "0")
    lengths = given.get("--kv-step-lens") or MIXED_LENGTHS
    try:
        parse_lengths(lengths)
        return scenarios_from(sweep.page_sizes, sweep.dtypes, request_lens, chunk, prefix, step_sizes, lengths)
    except ValueError as exc:
        raise ValueError(" ".join(f"{flag} {value}" for flag, value in given.items()) + f": {exc}") from None


@dataclass(frozen=True)
class BenchOptions:
    """The parsed options: a preset with its overrides, the variants, the device and the results folder."""

    preset: str
    sweep: Sweep
    variants: tuple[str, ...] | None
    device: str
    results_dir: str | None
    raw: tuple[tuple[str, str], ...]
    crosscheck: str = "auto"
    scenarios: tuple[Scenario, ...] = ()
    scenario_budget_s: float = 0.08
    step_variants: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, get: Callable[[str], str | None]) -> BenchOptions:
        """Parse from `get(flag)`, which returns the given string or None; raises ValueError on bad values."""
        preset_name = get("--kv-preset") or "default"
        try:
            sweep = get_preset(preset_name)
        except ValueError as exc:
            raise ValueError(f"--kv-preset: {exc}") from None
        parsers = {
            "--kv-seq-lens": ("seq_lens", lambda f, t: parse_positive_ints(f, t)),
            "--kv-page-sizes": ("page_sizes", lambda f, t: parse_positive_ints(f, t)),
            "--kv-dtypes": ("dtypes", lambda f, t: parse_choices(f, t, DTYPES)),
            "--kv-layouts": ("layouts", lambda f, t: parse_choices(f, t, LAYOUTS)),
            "--kv-seed": ("seed", _seed),
            "--kv-time-budget": ("time_budget_s", _float_seconds),
            "--kv-repetitions": ("repetitions", _count),
            "--kv-passes": ("passes", _count),
        }
        changes = {}
        for flag, (field_name, parse) in parsers.items():
            text = get(flag)
            if text is not None:
                changes[field_name] = parse(flag, text)
        if changes:
            try:
                sweep = sweep.replace(**changes)
            except ValueError as exc:
                sizes = ("--kv-seq-lens", "--kv-page-sizes", "--kv-dtypes")
                given = " ".join(f"{flag} {get(flag)}" for flag in sizes if get(flag) is not None)
                raise ValueError(f"{given or '--kv-preset ' + preset_name}: {exc}") from None
        variants_text = get("--kv-variants")
        variants = tuple(split_csv("--kv-variants", variants_text)) if variants_text is not None else None
        device = get("--kv-device") or "auto"
        try:
            check_choice("device", device, DEVICE_CHOICES)
        except ValueError as exc:
            raise ValueError(f"--kv-device: {exc}") from None
        crosscheck = get("--kv-crosscheck") or "auto"
        try:
            check_choice("cross-check mode", crosscheck, CROSSCHECK_MODES)
        except ValueError as exc:
            raise ValueError(f"--kv-crosscheck: {exc}") from None
        scenarios = _scenarios(get, preset_name, sweep)
        step_text = get("--kv-step-variants")
        step_variants = tuple(split_csv("--kv-step-variants", step_text)) if step_text is not None else None
        budget = changes.get("time_budget_s")
        scenario_budget_s = float(budget) if isinstance(budget, float) else SCENARIO_BUDGET_S[preset_name]
        raw = tuple((o.flag, str(get(o.flag))) for o in OPTIONS if get(o.flag) is not None)
        return cls(preset_name, sweep, variants, device, get("--kv-results"), raw, crosscheck, scenarios,
                   scenario_budget_s, step_variants)

    def as_strings(self) -> dict[str, str]:
        """The options as given on the command line (for meta.json)."""
        return dict(self.raw)
