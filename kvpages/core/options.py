"""The `--kv-*` options: one table, `OPTIONS`, that the plugin registers, `BenchOptions.parse` reads and checks
before anything runs, and `BenchOptions.to_args` renders back (every row's repro command). No torch."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpages.core.adaptive import DEFAULT_THRESHOLD
from kvpages.core.affinity import CPU_CHOICES, parse_cpus
from kvpages.core.checks import check_choice, check_folder, parse_choices, parse_positive_ints, split_csv, with_table
from kvpages.core.names import BASELINE
from kvpages.core.payloads import DEFAULT_PAYLOADS, DEFAULT_SWA_WINDOW, PAYLOAD_PRESETS
from kvpages.core.presets import PRESETS, Preset, get_preset
from kvpages.core.scenarios import DEFAULT_CHUNK_SIZE, MIXED_LENGTHS, Scenario, parse_lengths, scenarios_from, with_payloads
from kvpages.core.sglang import SPEC_FORMS, parse_specs
from kvpages.core.stability import DEFAULT_FACTOR, DEFAULT_REMEASURE_BUDGET
from kvpages.core.sweep import DEVICES, DTYPES, LAYOUTS, Sweep

DEVICE_CHOICES = ("auto",) + DEVICES
CROSSCHECK_MODES = ("auto", "on", "off")
PROBE_MODES = ("auto", "on", "off")
SCENARIO_CHOICES = ("preset", "none")
BREAKDOWN_MODES = ("on", "off")
DEFAULT_RANK_TIMEOUT_S = 300.0


def _float_seconds(option: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not a number of seconds, e.g. 0.25") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{option}: {text!r} must be a positive number of seconds, e.g. 0.25")
    return value


def _fraction(low: float, high: float, low_open: bool, example: str) -> Callable[[str, str], float]:
    """A parser of a number in [low, high] ((low, high] when `low_open`) that names the range when refused."""
    valid = f"{'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(option: str, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (low < value <= high if low_open else low <= value <= high):
            raise ValueError(f"{option}: {text!r} is not a number in {valid}; give e.g. {example}")
        return value

    return parse


def _integer(minimum: int, what: str, example: str) -> Callable[[str, str], int]:
    def parse(option: str, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{option}: {text!r} is not an integer; give {what} >= {minimum}, e.g. {example}") from None
        if value < minimum:
            raise ValueError(f"{option}: {value} is not >= {minimum}; give {what} >= {minimum}, e.g. {example}")
        return value

    return parse


def _folder(flag: str, text: str) -> str:
    """A folder a run is written under (`check_folder`)."""
    check_folder(flag, Path(text))
    return text


def _ints(what: str, example: str, more: str = "") -> tuple[str, Callable[[str, str], tuple[int, ...]]]:
    """An option of comma-separated integers >= 1: its help, giving `example` (its own values), and its parser, whose
    error gives the same example."""
    return f"{what}, e.g. {example}{more}", functools.partial(parse_positive_ints, example=example)


def _flagged(check: Callable[[str], Any]) -> Callable[[str, str], Any]:
    """A parser that runs `check(text)` and names the flag in its ValueError."""
    def parse(option: str, text: str) -> Any:
        try:
            return check(text)
        except ValueError as exc:
            raise ValueError(f"{option}: {exc}") from None

    return parse


def _choice(choices: tuple[str, ...], what: str) -> Callable[[str, str], str]:
    return _flagged(functools.partial(check_choice, what, choices=choices))


def _lengths(text: str) -> str:
    parse_lengths(text)  # checked again, with the step sizes, when the scenarios are built
    return text


def _joined(value: Any) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, tuple) else str(value)


@dataclass(frozen=True)
class Option:
    """One `--kv-*` flag: the `BenchOptions` field it sets, how its text is parsed, and how it is rendered back."""

    flag: str
    field: str
    help: str
    parse: Callable[[str, str], Any]
    render: Callable[[Any], str] = _joined


OPTIONS: tuple[Option, ...] = (
    Option("--kv-preset", "preset", "named sweep: " + "; ".join(f"{p.name} ({p.purpose})" for p in PRESETS.values())
           + " (default: default)", _choice(tuple(PRESETS), "preset")),
    Option("--kv-seq-lens", "seq_lens", *_ints("comma-separated sequence lengths", "2048,8192", " (overrides the preset)")),
    Option("--kv-page-sizes", "page_sizes", *_ints("comma-separated page sizes", "1,64", " (overrides the preset)")),
    Option("--kv-dtypes", "dtypes", f"comma-separated index dtypes from {', '.join(DTYPES)} (overrides the preset)",
           lambda f, t: parse_choices(f, t, DTYPES)),
    Option("--kv-layouts", "layouts", f"comma-separated page layouts from {', '.join(LAYOUTS)} (overrides the preset)",
           lambda f, t: parse_choices(f, t, LAYOUTS)),
    Option("--kv-variants", "variants", "comma-separated variant names (default: all registered; see `kvpages list`)",
           lambda f, t: tuple(split_csv(f, t))),
    Option("--kv-device", "device", f"{', '.join(DEVICE_CHOICES)} (default: auto = cuda when available)",
           _choice(DEVICE_CHOICES, "device")),
    Option("--kv-seed", "seed", "seed of the generated inputs (default: the preset's, 0)", _integer(0, "an integer seed", "0")),
    Option("--kv-time-budget", "time_budget_s",
           "timed seconds per (variant, point), all repetitions together (default: the preset's)", _float_seconds, repr),
    Option("--kv-repetitions", "repetitions", "interleaved repetitions per (variant, point), a block each (default: the preset's)",
           _integer(1, "an integer", "10")),
    Option("--kv-passes", "passes", "sweeps over the points that each process's repetitions are dealt to "
           "(default: the preset's)", _integer(1, "an integer", "2")),
    Option("--kv-processes", "processes", "fresh processes the repetitions are dealt to, one after another; the "
           "intervals sample them (default: the preset's; 1 times in the pytest process)",
           _integer(1, "a number of processes", "5")),
    Option("--kv-crosscheck", "crosscheck", f"profiler cross-check of the meter, in its own process: "
           f"{', '.join(CROSSCHECK_MODES)} (default: auto = on for CUDA runs)", _choice(CROSSCHECK_MODES, "cross-check mode")),
    Option("--kv-scenarios", "scenarios", "whole requests and steps: preset (the preset's) or none (default: preset)",
           _choice(SCENARIO_CHOICES, "scenario choice")),
    Option("--kv-request-lens", "request_lens",
           *_ints("request scenarios by hand: comma-separated prompt lengths", "2048,32768", " (both sides of each)")),
    Option("--kv-chunk-size", "chunk_size", f"chunked-prefill size of the request scenarios (default {DEFAULT_CHUNK_SIZE})",
           _integer(1, "a number of tokens", str(DEFAULT_CHUNK_SIZE))),
    Option("--kv-prefix", "prefix", "decode-side prefix of the request scenarios, in tokens (default 0)",
           _integer(0, "a number of tokens", "0")),
    Option("--kv-step-sizes", "step_sizes", *_ints("step scenarios by hand: comma-separated requests per step (B)", "8,32")),
    Option("--kv-step-lens", "step_lens", "request lengths of a step: comma-separated integers, or fixed:L, "
           f"uniform:LO,HI, lognormal:MEDIAN,SIGMA,MAX (default {MIXED_LENGTHS})", _flagged(_lengths)),
    Option("--kv-busy-us", "busy_us", "the steps' busy queue: microseconds of device work queued as the next forward "
           "in each round, which a blocking copy waits behind (CUDA only; default 0: none)",
           _integer(0, "a number of microseconds", "500")),
    Option("--kv-payloads", "payloads", "the payloads each send of the scenarios carries, comma-separated payload "
           f"presets from {', '.join(PAYLOAD_PRESETS)}; each scenario is made once per preset (default: the sweep "
           f"preset's own; {DEFAULT_PAYLOADS}: the main KV alone; `kvpages scenarios`)",
           lambda f, t: parse_choices(f, t, tuple(PAYLOAD_PRESETS))),
    Option("--kv-swa-window", "swa_window", f"sliding window of the SWA payload, in tokens (default {DEFAULT_SWA_WINDOW})",
           _integer(1, "a number of tokens", str(DEFAULT_SWA_WINDOW))),
    Option("--kv-step-variants", "step_variants", "comma-separated step variant names (default: all; see `kvpages list`)",
           lambda f, t: tuple(split_csv(f, t))),
    Option("--kv-sglang", "sglang", f"SGLang's own kv_to_page_indices as variants sglang@<label>, comma-separated "
           f"SPECs: {SPEC_FORMS}", parse_specs),
    Option("--kv-baseline", "baseline", f"the variant every ratio, verdict, finding, chart and `kvpages compare` is "
           f"against, e.g. sglang@0.5.23 (default {BASELINE}; a registered variant, see `kvpages list`)",
           lambda f, t: t.strip()),  # checked against the registered variants by the plugin, after --kv-sglang
    Option("--kv-breakdown", "breakdown", "where the time goes: after the timing, a few profiled calls of each variant "
           "at three lengths per page size (on CUDA in a process of its own): on, off (default: on)",
           _choice(BREAKDOWN_MODES, "breakdown mode")),
    Option("--kv-bandwidth-probe", "bandwidth_probe", "after the timed blocks, copies of 4-64 MiB to pageable and "
           "pinned memory that fix a D2H bandwidth for `kvpages calibrate` (bandwidth.csv): "
           f"{', '.join(PROBE_MODES)} (default: auto = on for CUDA runs; on a CPU run it copies host to host)",
           _choice(PROBE_MODES, "bandwidth probe mode")),
    Option("--kv-rank-timeout", "rank_timeout_s", "under torchrun: seconds a rank waits for the others at a barrier "
           f"or gather before the run stops, naming them (default {DEFAULT_RANK_TIMEOUT_S:g})", _float_seconds, repr),
    Option("--kv-link-profile", "link_profiles", "link profile files (TOML, e.g. from `kvpages calibrate`), comma-separated, "
           "that the report's predictions add to the built-in ones; checked before the sweep, recorded in meta.json",
           lambda f, t: tuple(split_csv(f, t))),
    Option("--kv-disturb-factor", "disturb_factor", "a process whose paired ratio lies this factor or more from the "
           "other processes' (either way) is disturbed whatever the run's spread, and left out of that pair's centre "
           f"and re-measured (default {DEFAULT_FACTOR:g})", _fraction(1.0, 100.0, True, str(DEFAULT_FACTOR)), repr),
    Option("--kv-remeasure-budget", "remeasure_budget", "seconds the re-measurement of disturbed pairs may take, as a "
           f"fraction of the sweep's planned timed seconds; 0 turns it off (default {DEFAULT_REMEASURE_BUDGET:g})",
           _fraction(0.0, 10.0, False, str(DEFAULT_REMEASURE_BUDGET)), repr),
    Option("--kv-adaptive-threshold", "adaptive_threshold", "the length in tokens from which the `adaptive` variant "
           f"strides on the device (default {DEFAULT_THRESHOLD}: the first length the H200 judged faster on the default "
           "grid)",
           _integer(1, "a length in tokens", str(DEFAULT_THRESHOLD))),
    Option("--kv-threads", "threads", "torch intra-op threads in each timed process (default 1: the variants' ops "
           "are small, and more threads only add their wake-ups to the spread)", _integer(1, "a number of threads", "1")),
    Option("--kv-cpus", "cpus", f"the CPUs each timed process is pinned to while it times: {', '.join(CPU_CHOICES)} or "
           "a list such as 2,3 or 8-15 (default auto: the GPU's NUMA node on CUDA; on a CPU run one core that is not core "
           "0, where there are 3 CPUs or more)", _flagged(parse_cpus)),
    Option("--kv-results", "results_dir", "folder that receives the run folder (default: <rootdir>/results)", _folder),
)

FLAG = {o.field: o.flag for o in OPTIONS}
"""Each option's flag by its field ('busy_us': '--kv-busy-us')."""

OPTIONS_BEGIN = "<!-- options: written by `kvpages options --markdown docs/guide.md` from kvpages/core/options.py -->"
OPTIONS_END = "<!-- end of options -->"


def options_markdown() -> str:
    """The options as a markdown table, one row per option in `OPTIONS` order: what the docs hold."""
    rows = [f"| `{o.flag}` | {o.help.replace('|', '&#124;')} |" for o in OPTIONS]
    return "\n".join(["| option | meaning |", "|---|---|", *rows])


def with_options_table(text: str, where: str) -> str:
    """`text` (a docs page, `where` in errors) with the table between OPTIONS_BEGIN and OPTIONS_END rewritten."""
    return with_table(text, where, "options table", OPTIONS_BEGIN, OPTIONS_END, options_markdown())


BY_HAND = ("request_lens", "chunk_size", "prefix", "step_sizes", "step_lens", "busy_us")
"""The options that give scenarios by hand instead of the preset's (`scenarios_from`'s parameters)."""
SCENARIO_FIELDS = (*BY_HAND, "payloads", "swa_window", "step_variants")
"""The options that give, shape or select the scenarios: `--kv-scenarios none` leaves every one out, so it refuses them."""
SHAPES = {"chunk_size": "request_lens", "prefix": "request_lens", "step_lens": "step_sizes", "busy_us": "step_sizes"}
"""The by-hand options that shape the scenarios another one gives (a chunk size, the requests'), and that one: given
without it, they would shape none, so `BenchOptions.scenario_set` refuses them."""


@dataclass(frozen=True)
class BenchOptions:
    """The `--kv-*` options as given, one field per option (None: not given), and what follows from them."""

    preset: str | None = None
    seq_lens: tuple[int, ...] | None = None
    page_sizes: tuple[int, ...] | None = None
    dtypes: tuple[str, ...] | None = None
    layouts: tuple[str, ...] | None = None
    variants: tuple[str, ...] | None = None
    device: str | None = None
    seed: int | None = None
    time_budget_s: float | None = None
    repetitions: int | None = None
    passes: int | None = None
    processes: int | None = None
    crosscheck: str | None = None
    scenarios: str | None = None
    request_lens: tuple[int, ...] | None = None
    chunk_size: int | None = None
    prefix: int | None = None
    step_sizes: tuple[int, ...] | None = None
    step_lens: str | None = None
    busy_us: int | None = None
    payloads: tuple[str, ...] | None = None
    swa_window: int | None = None
    step_variants: tuple[str, ...] | None = None
    sglang: tuple[str, ...] | None = None
    baseline: str | None = None
    breakdown: str | None = None
    bandwidth_probe: str | None = None
    rank_timeout_s: float | None = None
    link_profiles: tuple[str, ...] | None = None
    disturb_factor: float | None = None
    remeasure_budget: float | None = None
    adaptive_threshold: int | None = None
    threads: int | None = None
    cpus: str | None = None
    results_dir: str | None = None

    @classmethod
    def parse(cls, get: Callable[[str], str | None]) -> BenchOptions:
        """Parse from `get(flag)`, which returns the given string or None; raises ValueError naming the flag."""
        values = {}
        for option in OPTIONS:
            text = get(option.flag)
            if text is not None:
                values[option.field] = option.parse(option.flag, str(text))
        options = cls(**values)
        options.sweep  # noqa: B018 (checked now, before anything runs)
        options.scenario_set  # noqa: B018
        return options

    def to_args(self, fields: Collection[str] | None = None) -> tuple[str, ...]:
        """The flags that parse back to these options (the inverse of `parse`), or to those of `fields`."""
        args: list[str] = []
        for option in OPTIONS:
            value = getattr(self, option.field)
            if value is not None and (fields is None or option.field in fields):
                args += [option.flag, option.render(value)]
        return tuple(args)

    def replace(self, **changes: Any) -> BenchOptions:
        return dataclasses.replace(self, **changes)

    def without_scenarios(self, **changes: Any) -> BenchOptions:
        """These options (with `changes`) timing no scenario: `--kv-scenarios none`, and none of SCENARIO_FIELDS (a
        point's repro)."""
        return self.replace(**{**dict.fromkeys(SCENARIO_FIELDS), "scenarios": "none", **changes})

    @functools.cached_property
    def selected_preset(self) -> Preset:
        return get_preset(self.preset or "default")

    @functools.cached_property
    def sweep(self) -> Sweep:
        """The preset's sweep with the options that name one of its fields replacing it (validated again)."""
        changes = {f.name: getattr(self, f.name) for f in dataclasses.fields(Sweep) if getattr(self, f.name, None) is not None}
        if self.repetitions is not None and self.processes is None:  # fewer repetitions: at most one process each
            changes["processes"] = min(self.selected_preset.sweep.processes, self.repetitions)
        try:
            return dataclasses.replace(self.selected_preset.sweep, **changes)
        except ValueError as exc:
            about = ("seq_lens", "page_sizes", "dtypes") + (("repetitions", "processes") if "processes" in str(exc) else ())
            given = " ".join(self.to_args(about))
            raise ValueError(f"{given or '--kv-preset ' + self.selected_preset.name}: {exc}") from None

    @functools.cached_property
    def scenario_set(self) -> tuple[Scenario, ...]:
        """The preset's scenarios, none, or those given by hand (at the sweep's page sizes and dtypes), each with the
        payloads and window given (`with_payloads`)."""
        if self.scenarios == "none":
            if shaped := " ".join(self.to_args(SCENARIO_FIELDS)):
                raise ValueError(f"--kv-scenarios none leaves out every scenario, which {shaped} would give or shape: "
                                 "give one or the other")
            return ()
        given = " ".join(self.to_args(BY_HAND))
        if not given:
            return with_payloads(self.selected_preset.scenarios, self.payloads, self.swa_window)
        missing = {name: needs for name, needs in SHAPES.items()
                   if getattr(self, name) is not None and getattr(self, needs) is None}
        if missing:  # every one, in one line
            said = "; ".join(f"{' '.join(self.to_args((name,)))}: it shapes the scenarios of {FLAG[needs]}, which is "
                             "not given" for name, needs in missing.items())
            raise ValueError(f"{said}; give {' and '.join(dict.fromkeys(FLAG[n] for n in missing.values()))} too")
        if self.scenarios == "preset":  # given as such, not the default
            raise ValueError(f"--kv-scenarios preset takes the preset's scenarios, which {given} would replace: give "
                             "one or the other")
        try:
            by_hand = {name: getattr(self, name) for name in BY_HAND if getattr(self, name) is not None}
            return with_payloads(scenarios_from(self.sweep.page_sizes, self.sweep.dtypes, **by_hand), self.payloads,
                                 self.swa_window)
        except ValueError as exc:
            raise ValueError(f"{given}: {exc}") from None

    @property
    def scenario_budget_s(self) -> float:
        return self.time_budget_s if self.time_budget_s is not None else self.selected_preset.scenario_budget_s

    @property
    def baseline_name(self) -> str:
        return self.baseline or BASELINE

    @property
    def disturb_factor_value(self) -> float:
        return DEFAULT_FACTOR if self.disturb_factor is None else self.disturb_factor

    @property
    def threads_value(self) -> int:
        return 1 if self.threads is None else self.threads

    @property
    def remeasure_fraction(self) -> float:
        return DEFAULT_REMEASURE_BUDGET if self.remeasure_budget is None else self.remeasure_budget

    @property
    def device_choice(self) -> str:
        return self.device or "auto"

    @property
    def crosscheck_mode(self) -> str:
        return self.crosscheck or "auto"

    def as_strings(self) -> dict[str, str]:
        """The options as given on the command line (for meta.json)."""
        args = self.to_args()
        return dict(zip(args[::2], args[1::2], strict=True))


def crosscheck_enabled(mode: str, device: str) -> bool:
    """Whether an auto/on/off choice (the cross-check, the bandwidth probe) is on for a run on `device`."""
    return mode == "on" or (mode == "auto" and device == "cuda")
