"""Whole requests and scheduler steps, as frozen data: the calls SGLang's PD disaggregation makes (no torch).

Facts from SGLang 0.5.23 (python/sglang/srt/disaggregation/):

- prefill, `_send_kv_chunk`: one conversion per chunk of a request, on
  `req_to_token[row, start_send_idx:end]` with `end = min(extend_end, len(origin_input_ids))`; for every
  chunk but the last, `end` is floored to a page boundary and the next chunk starts at `end`, so a
  partial page is sent again with the next chunk; the conversion runs even when the send is empty;
- decode, `pop_preallocated` then `_transfer_page_indices`: one conversion per request of
  `req_to_token[row][prefix_len:origin_input_len]`, followed by `.astype(np.int32)` (for ZMQ);
- every request is converted on its own: nothing gathers a step's requests into one D2H;
- a hybrid model's send carries more payloads than the main KV, each its own conversion (kvpages.core.payloads):
  `calls()` lists them after the main call of the send that carries them, each naming its payload and its send.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from kvpages.core.checks import check_choice, check_positive
from kvpages.core.payloads import DEFAULT_PAYLOADS, DEFAULT_SWA_WINDOW, MAIN, get_payloads
from kvpages.core.stats import exps
from kvpages.core.sweep import DTYPES, INDEX_MAX, ITEMSIZE, max_token_index, pool_pages

SIDES = ("prefill", "decode")


class Call(NamedTuple):
    """One conversion: `req_to_token[row, start:end]` turned into page indices, as payload `payload` of send `send`."""

    row: int
    start: int
    end: int
    payload: str = MAIN
    send: int = 0

    @property
    def tokens(self) -> int:
        return self.end - self.start


def prefill_chunks(prompt_len: int, chunk_size: int, page_size: int) -> list[tuple[int, int]]:
    """The (start, end) slices `_send_kv_chunk` converts for one request of `prompt_len` tokens."""
    slices, start, extend_end = [], 0, 0
    while extend_end < prompt_len:
        extend_end = min(extend_end + chunk_size, prompt_len)
        end = extend_end if extend_end == prompt_len else extend_end // page_size * page_size  # floored but the last
        slices.append((start, end))  # converted even when start == end (an empty send)
        start = end
    return slices


@dataclass(frozen=True, kw_only=True)
class ScenarioPool:
    """What a request and a step share: the pool's page size p, index dtype and page layout, and the device work."""

    page_size: int
    dtype: str = "int32"
    layout: str = "fragmented"
    busy_us: int = 0
    """Device work queued in each round as the next forward (CUDA only): a sleeping kernel of this many µs."""
    payloads: str = DEFAULT_PAYLOADS
    """The payloads each send carries (kvpages.core.payloads.PAYLOAD_PRESETS)."""
    swa_window: int = DEFAULT_SWA_WINDOW
    """The sliding window of an SWA payload, in tokens."""

    def __post_init__(self) -> None:
        check_positive("page_size", self.page_size)
        check_choice("dtype", self.dtype, DTYPES)
        get_payloads(self.payloads)
        check_positive("SWA window", self.swa_window)

    def send_calls(self, row: int, start: int, end: int, send: int, prompt_len: int, states: bool = True) -> tuple[Call, ...]:
        """One send's calls: its main slice, then (`states`) each state payload of the scenario's payloads."""
        carried = get_payloads(self.payloads).states if states else ()
        return (Call(row, start, end, MAIN, send), *(
            Call(row, *p.slice((start, end), prompt_len, self.page_size, self.swa_window), p.name, send) for p in carried))

    def suffix(self) -> str:
        """What the id adds for payloads beyond the main KV ('-hybrid-w4096', '-dsa') and a busy queue ('-busy500us')."""
        preset = get_payloads(self.payloads)
        payloads = "" if self.payloads == DEFAULT_PAYLOADS else f"-{self.payloads}"
        window = f"-w{self.swa_window}" if preset.windowed else ""
        return f"{payloads}{window}{f'-busy{self.busy_us}us' if self.busy_us else ''}"


@dataclass(frozen=True)
class RequestScenario(ScenarioPool):
    """One request: prompt length L, decode-side prefix P, chunk size C, page size p; one side of it."""

    prompt_len: int
    chunk_size: int
    side: str = "prefill"
    prefix: int = 0

    def __post_init__(self) -> None:
        check_positive("seq_len", self.prompt_len)
        super().__post_init__()
        check_positive("chunk size", self.chunk_size)
        if not 0 <= self.prefix < self.prompt_len:
            raise ValueError(f"prefix {self.prefix} must be >= 0 and < the prompt length {self.prompt_len}")
        check_choice("side", self.side, SIDES)
        _check_pool(self)

    kind = "request"
    requests = 1

    @property
    def lengths(self) -> tuple[int, ...]:
        return (self.prompt_len,)

    def calls(self) -> tuple[Call, ...]:
        if self.side == "decode":
            return self.send_calls(0, self.prefix, self.prompt_len, 0, self.prompt_len)
        chunks = prefill_chunks(self.prompt_len, self.chunk_size, self.page_size)
        return tuple(c for i, (s, e) in enumerate(chunks)  # the state payloads travel with the last chunk
                     for c in self.send_calls(0, s, e, i, self.prompt_len, states=i == len(chunks) - 1))

    @property
    def id(self) -> str:
        prefix = f"-P{self.prefix}" if self.prefix else ""
        return f"req-{self.side}-L{self.prompt_len}{prefix}-C{self.chunk_size}-p{self.page_size}-{self.dtype}{self.suffix()}"


LENGTHS = {
    "fixed": "fixed:L — every request has L tokens",
    "uniform": "uniform:LO,HI — integers drawn uniformly from [LO, HI]",
    "lognormal": "lognormal:MEDIAN,SIGMA,MAX — exp(N(log MEDIAN, SIGMA)), rounded, clipped to [1, MAX]",
}
"""The named length distributions of a step, drawn with the scenario's seed."""


def parse_lengths(text: str) -> tuple[str, tuple[float, ...]]:
    """'lognormal:4096,1.0,65536' -> ('lognormal', (4096, 1.0, 65536)); '512,2048' -> ('list', (512, 2048))."""
    if ":" not in text:
        try:
            values = tuple(int(v) for v in text.split(","))
        except ValueError:
            raise ValueError(f"lengths {text!r}: give comma-separated integers >= 1, or one of "
                             f"{'; '.join(LENGTHS.values())}") from None
        if not values or min(values) < 1:
            raise ValueError(f"lengths {text!r}: every length must be >= 1")
        return "list", tuple(float(v) for v in values)
    name, _, args = text.partition(":")
    check_choice("length distribution", name, LENGTHS)
    try:
        params = tuple(float(v) for v in args.split(","))
    except ValueError:
        raise ValueError(f"lengths {text!r}: {LENGTHS[name]}") from None
    arity = {"fixed": 1, "uniform": 2, "lognormal": 3}[name]
    if len(params) != arity or min(params) <= 0 or (name == "uniform" and params[0] > params[1]):
        raise ValueError(f"lengths {text!r}: {LENGTHS[name]}, all positive")
    return name, params


def draw_lengths(spec: str, count: int, seed: int) -> tuple[int, ...]:
    name, params = parse_lengths(spec)
    rng = np.random.default_rng(seed)
    if name in ("list", "fixed"):  # the given lengths, repeated
        return tuple(int(params[i % len(params)]) for i in range(count))
    if name == "uniform":
        return tuple(int(v) for v in rng.integers(int(params[0]), int(params[1]) + 1, count))
    median, sigma, cap = params
    drawn = exps(rng.normal(math.log(median), sigma, count))
    return tuple(int(v) for v in np.clip(np.rint(drawn), 1, cap))


@dataclass(frozen=True)
class StepScenario(ScenarioPool):
    """One decode-side scheduler step: B requests of given or drawn (`LENGTHS`) lengths, converted one by one or batched."""

    batch: int
    lengths_spec: str
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"a step needs B >= 1 requests, got {self.batch!r}")
        super().__post_init__()
        parse_lengths(self.lengths_spec)
        _check_pool(self)

    kind = "step"
    side = "decode"
    chunk_size = 0

    @property
    def requests(self) -> int:
        return self.batch

    @functools.cached_property
    def lengths(self) -> tuple[int, ...]:
        return draw_lengths(self.lengths_spec, self.batch, self.seed)

    def calls(self) -> tuple[Call, ...]:
        return tuple(c for i, length in enumerate(self.lengths) for c in self.send_calls(i, 0, length, i, length))

    @property
    def prompt_len(self) -> int:
        return sum(self.lengths)

    @property
    def id(self) -> str:
        lengths = self.lengths_spec.replace(":", "_").replace(",", "_")
        return f"step-B{self.batch}-{lengths}-p{self.page_size}-{self.dtype}{self.suffix()}"


Scenario = RequestScenario | StepScenario


def sends_of(scenario: Scenario) -> int:
    """The sends a scenario's calls travel in (a step: one per request; a prefill request: one per chunk)."""
    return len({(c.row, c.send) for c in scenario.calls()})


@dataclass(frozen=True)
class Upkeep:
    """Keeping a host-side page table up to date: before call `before_call`, one D2H of these (row, page) entries."""

    before_call: int
    pages: tuple[tuple[int, int], ...]


def mirror_upkeep(scenario: Scenario) -> tuple[Upkeep, ...]:
    """What keeping a host mirror of the page table costs in a request or step: one batched D2H per scheduler step
    of the page indices allocated in it. Decode side: at most one new page per request per step (its last page);
    prefill side: every chunk is a step that allocates its pages (an empty send allocates nothing)."""
    p, calls = scenario.page_size, scenario.calls()
    if scenario.side == "decode":
        return (Upkeep(0, tuple((c.row, (c.end - 1) // p) for c in calls if c.payload == MAIN)),)
    return tuple(Upkeep(i, tuple((c.row, page) for page in range(c.start // p, -(-c.end // p))))
                 for i, c in enumerate(calls) if c.end > c.start and c.payload == MAIN)


EXTRA_UPKEEP = {"host_pages": mirror_upkeep}
"""Per extra input of a variant (kvpages.measure.variants.EXTRA_INPUTS): its upkeep in a request or step."""

SCENARIO_ROTATION = 2
"""Timed rounds alternate between this many copies of a scenario's rows (different pages)."""


def _check_pool(scenario: Scenario) -> None:
    """Refuse a scenario whose pool (SCENARIO_ROTATION copies of its rows) has token indices beyond its dtype."""
    pages = SCENARIO_ROTATION * sum(math.ceil(n / scenario.page_size) for n in scenario.lengths)
    needed = max_token_index(pool_pages(pages), scenario.page_size)
    if needed > INDEX_MAX[scenario.dtype]:
        raise ValueError(f"scenario with {scenario.requests} request(s) of up to {max(scenario.lengths)} tokens at "
                         f"page_size {scenario.page_size} needs token indices up to {needed}, beyond {scenario.dtype}'s "
                         f"maximum {INDEX_MAX[scenario.dtype]}; use shorter or fewer requests")


def describe(scenario: Scenario) -> Iterator[str]:
    """Lines for `kvpages scenarios`: the calls a scenario expands into."""
    calls = scenario.calls()
    itemsize = ITEMSIZE[scenario.dtype]
    preset = get_payloads(scenario.payloads)
    sends = (f", {sends_of(scenario)} send(s) of payloads {preset.name}: {preset.carried(scenario.swa_window)}"
             if len(preset.payloads) > 1 else "")
    yield (f"{scenario.id}: {scenario.kind}, {scenario.requests} request(s), {len(calls)} call(s), "
           f"{sum(c.tokens for c in calls)} tokens{sends}")
    for i, c in enumerate(calls):
        pages = math.ceil(c.tokens / scenario.page_size)
        what = "" if c.payload == MAIN else f" {c.payload}"
        yield (f"  call {i}:{what} req_to_token[row {c.row}, {c.start}:{c.end}]  {c.tokens} tokens -> {pages} pages "
               f"({c.tokens * itemsize} B all tokens, {pages * itemsize} B pages)")


DEFAULT_CHUNK_SIZE = 8192
MIXED_LENGTHS = "lognormal:4096,1.0,65536"
"""The default step's request lengths: median 4096 tokens, heavy-tailed, at most 65536."""
BUSY_US = 500
"""The next forward of the busy scenario: a 500 µs kernel queued on the scheduler's stream in each round, after a
staged variant's indices and before every variant's readback (kvpages.measure.steps; CUDA only)."""


def scenarios_from(page_sizes: tuple[int, ...], dtypes: tuple[str, ...], request_lens: tuple[int, ...] = (),
                   chunk_size: int = DEFAULT_CHUNK_SIZE, prefix: int = 0, step_sizes: tuple[int, ...] = (),
                   step_lens: str = MIXED_LENGTHS, busy_us: int = 0) -> tuple[Scenario, ...]:
    """Per dtype, both sides of each request length, then a step of each size (behind a busy queue of `busy_us`), at
    every page size."""
    out: list[Scenario] = []
    for dtype in dtypes:
        out += [RequestScenario(L, chunk_size, side, prefix if side == "decode" else 0, page_size=p, dtype=dtype)
                for p in page_sizes for side in SIDES for L in request_lens]
        out += [StepScenario(b, step_lens, page_size=p, dtype=dtype, busy_us=busy_us) for p in page_sizes
                for b in step_sizes]
    return tuple(out)


def with_payloads(scenarios: tuple[Scenario, ...], payloads: tuple[str, ...] | None,
                  swa_window: int | None) -> tuple[Scenario, ...]:
    """Each scenario once per payload preset of `payloads` (None: its own), with `swa_window` (None: its own); a
    scenario made twice is kept once."""
    made = (dataclasses.replace(s, payloads=name, swa_window=swa_window or s.swa_window)
            for s in scenarios for name in (payloads or (s.payloads,)))
    return tuple({s.id: s for s in made}.values())
