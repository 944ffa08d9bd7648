"""A send's payloads and the strategies that convert them, as data: what a hybrid model's request pays (no torch).

Facts from SGLang main (python/sglang/srt/disaggregation/, as of 2026-09: prefill.py `send_kv_chunk`, decode.py
`pop_preallocated`) and its memory pools:

- a send carries the main KV's page indices and, for each state type of the model (`kv_args.state_types`), one more
  payload in that order; each is its own `kv_to_page_indices` call (0.5.16 on: a strided divide on the device, then
  `.cpu()`), so its own D2H and host sync, on the scheduler thread;
- SWA (`_swa_payload`): the window's slice of the request's row, `req_to_token[row, window_start:seq_len]` with
  `window_start = max(0, seq_len - sliding_window_size)` floored to a page (`page_align_floor`), translated from the
  full pool's numbering to the SWA pool's by `translate_loc_from_full_to_swa`, which is
  `full_to_swa_index_mapping[kv_indices].to(torch.int32)`: a gather through an int64 mapping tensor on the device,
  then a cast (the allocator hands out a full page and an SWA page together, so a full page maps to a whole SWA page);
- DSA/NSA indexer state (`_dsa_payload`; `_nsa_payload` before): the whole row, `req_to_token[row, :seq_len]`, the
  decode side at the device pool's page size, the prefill side at the allocator's (#37770, open, would make both the
  device pool's: they can differ); kvpages converts every payload at the pool's page size p. MiniMax's index K
  (`StateType.MINIMAX_INDEX_K`) sends the same page ids again ("Index rows live at the same loc as main KV on the same
  page_size");
- prefill: only the last chunk's send carries the state payloads (`if last_chunk:`), with `seq_len` the prompt's
  length; decode: every request's pre-allocation does, with `seq_len = origin_input_len` (a decode-side prefix
  shortens the main payload only);
- SGLang #35710 (open) says `pop_preallocated()` "read the destination page/state indices back with `.cpu()`" on the
  scheduler's stream, which is WAR-fenced, so "each sync costs a whole in-flight forward"; #35132 (open) passes the
  producer's `copy_done` event to the Mooncake, NIXL and Mori workers "so they wait off the scheduler thread"; the
  issue this module answers (kvpages issue 39) cites #34515, which stages the prefill and cached-prefix transfer
  indices asynchronously, and #34338, which measured that a step's cost is its syncs.

`PAYLOAD_PRESETS` name the payloads a send carries (`--kv-payloads`; not the sweep presets of kvpages.core.presets);
`STRATEGIES` the step variants timed on a scenario of several payloads, and what each declares.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpages.core.checks import check_choice
from kvpages.core.names import STEP_BASELINE, STEP_CANDIDATE

MAIN, SWA, INDEXER = "main", "swa", "indexer"
CALL, WINDOW, ROW = "call", "window", "row"
"""A payload's span: the call's own slice (a prefill chunk, the decode side's [P:L]), the window's slice of the row, the
whole row [0:L]."""
FULL_POOL, SWA_POOL = "full", "swa"


@dataclass(frozen=True)
class Payload:
    """One payload of a send: its span of the request's row, and the pool whose numbering its indices are sent in (the
    full pool's: as `req_to_token` holds them; the SWA pool's: translated on the device, inside the timed call)."""

    name: str
    span: str
    pool: str
    sglang: str

    def slice(self, call: tuple[int, int], prompt_len: int, page_size: int, window: int) -> tuple[int, int]:
        """The (start, end) of this payload's slice of the row, for a send whose main slice is `call`."""
        if self.span == CALL:
            return call
        if self.span == ROW:
            return 0, prompt_len
        return window_start(prompt_len, window, page_size), prompt_len


def window_start(prompt_len: int, window: int, page_size: int) -> int:
    """Where the SWA window's slice starts: `max(0, L - window)` floored to a page (SGLang's `page_align_floor`)."""
    return max(0, prompt_len - window) // page_size * page_size


PAYLOADS = {p.name: p for p in (
    Payload(MAIN, CALL, FULL_POOL, "the main KV: `kv_to_page_indices(kv_indices, page_size)`"),
    Payload(SWA, WINDOW, SWA_POOL, "`StateType.SWA`: the window, through `translate_loc_from_full_to_swa`"),
    Payload(INDEXER, ROW, FULL_POOL, "`StateType.DSA` (NSA): the indexer's state, the whole row"),
)}


@dataclass(frozen=True)
class PayloadPreset:
    """A named list of the payloads each send carries (`--kv-payloads`), main first, then the state payloads."""

    name: str
    payloads: tuple[str, ...]
    model: str

    def __post_init__(self) -> None:
        if self.payloads[:1] != (MAIN,):
            raise ValueError(f"payload preset {self.name!r}: the main KV comes first, got {self.payloads}")
        for name in self.payloads:
            check_choice("payload", name, PAYLOADS)

    @property
    def states(self) -> tuple[Payload, ...]:
        """The state payloads: what a send carries besides the main KV (the last prefill chunk's, every decode send's)."""
        return tuple(PAYLOADS[name] for name in self.payloads[1:])

    @property
    def windowed(self) -> bool:
        return any(p.span == WINDOW for p in self.states)

    @property
    def translated(self) -> int:
        """Payloads per state-carrying send sent in another pool's numbering (a device gather each)."""
        return sum(p.pool != FULL_POOL for p in self.states)

    def carried(self, window: int) -> str:
        """'main + swa (window 4096, translated to the SWA pool) + indexer'."""
        return " + ".join(f"{p}{f' (window {window}, translated to the SWA pool)' if PAYLOADS[p].span == WINDOW else ''}"
                          for p in self.payloads)


DEFAULT_PAYLOADS = "full"
DEFAULT_SWA_WINDOW = 4096
"""The sliding window of the SWA payload (`--kv-swa-window`), in tokens (gpt-oss's is 128, Gemma 3's 1024, Mistral 7B's
4096; SGLang reads `sliding_window_size` from the model's config)."""
PAYLOAD_PRESETS = {p.name: p for p in (
    PayloadPreset(DEFAULT_PAYLOADS, (MAIN,), "one payload per send, as kvpages measured before issue 39"),
    PayloadPreset("swa", (MAIN, SWA), "a hybrid SWA model: main KV + the sliding window's pages in the SWA pool"),
    PayloadPreset("dsa", (MAIN, INDEXER), "a DSA/NSA model: main KV + the indexer's state"),
    PayloadPreset("hybrid", (MAIN, SWA, INDEXER), "main KV + SWA + indexer, as the last prefill chunk of a hybrid "
                  "DSA model sends them"),
)}


def get_payloads(name: str) -> PayloadPreset:
    check_choice("payload preset", name, PAYLOAD_PRESETS)
    return PAYLOAD_PRESETS[name]


def send_runs(sends: tuple[int, ...]) -> list[tuple[int, int]]:
    """The [first, last) ranges of consecutive calls that travel in one send (a send's calls are consecutive)."""
    edges = [i for i in range(1, len(sends)) if sends[i] != sends[i - 1]]
    return list(zip([0, *edges], [*edges, len(sends)], strict=True))


def translation_ops(dtype: str) -> int:
    """Device ops of one translation: the gather through the int64 mapping, and its cast to the pool's dtype (int32 as
    SGLang's `.to(torch.int32)`; none for an int64 pool)."""
    return 1 if dtype == "int64" else 2


GATHERED = "gathered_device_stride"
BATCHED = "batched_device_stride"
STAGED = "staged_device_stride"
PER_CALL, PER_SEND, PER_STEP = "call", "send", "step"


@dataclass(frozen=True)
class Strategy:
    """A step variant timed on a scenario of several payloads, and what it declares there: one D2H per payload
    conversion, per send or per step; whether its stride is on the device; whether it is staged off the scheduler's
    path (no host sync on that thread; the transfer worker waits)."""

    name: str
    said: str  # how a finding names it
    copies: str
    on_device: bool
    staged: bool = False

    def device_ops(self, calls: int, sends: int, translations: int, dtype: str) -> int:
        """The device ops the meter must count: a strided divide per call (on the device), a gather per D2H of several
        payloads (per send, or one per step), and each translation's (`translation_ops`)."""
        gathers = {PER_CALL: 0, PER_SEND: sends, PER_STEP: 1}[self.copies]
        return (calls if self.on_device else 0) + gathers + translations * translation_ops(dtype)


STRATEGIES = {s.name: s for s in (
    Strategy(STEP_BASELINE, "pre-PR per payload", PER_CALL, False),  # every token index of each payload to the host
    Strategy(STEP_CANDIDATE, "per payload", PER_CALL, True),  # a conversion, D2H and host sync per payload (SGLang today)
    Strategy(GATHERED, "per request", PER_SEND, True),  # a send's payloads gathered into one device buffer
    Strategy(BATCHED, "batched", PER_STEP, True),  # every payload of every request in one D2H
    Strategy(STAGED, "staged", PER_STEP, True, staged=True),  # on a side stream, read by the transfer worker
)}
PAYLOADS_ONLY = (GATHERED, STAGED)
"""The strategies timed on a scenario of several payloads only (on one payload each is another's twin)."""


def runs_on(step_variant: str, payloads: str, also: tuple[str, ...] = ()) -> bool:
    """Whether `step_variant` is timed on a scenario of `payloads`: on one payload every step variant but
    PAYLOADS_ONLY, on several the STRATEGIES (and `also`: the run's per_request[baseline])."""
    if len(get_payloads(payloads).payloads) == 1:
        return step_variant not in PAYLOADS_ONLY
    return step_variant in STRATEGIES or step_variant in also
