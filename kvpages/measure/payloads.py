"""A hybrid model's conversions on the device: each send's payloads as slices of the full pool, and the SWA pool's
numbering they are translated to inside the timed call (kvpages.core.payloads has the facts).

The SWA pool hands out its own pages: the mapping sends every token slot of full page g to the same slot of SWA page
sigma(g), sigma a seeded shuffle of the pool's pages (page 0, SGLang's padding slot, to itself), as SGLang's
`full_to_swa_index_mapping` does for pages allocated together. It is an int64 tensor on the device, and
`translate` is SGLang's `translate_loc_from_full_to_swa`: a gather through it, cast to the pool's dtype. The reference
translates on the host from sigma, by arithmetic: it shares nothing with the gather but the shuffle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvpages.core.payloads import FULL_POOL, PAYLOADS
from kvpages.core.scenarios import Call

SWA_SEED = 0x5A
"""Mixed into a pool's seed for its SWA pages' shuffle."""


@dataclass(frozen=True)
class Conversions:
    """One input set of a scenario of several payloads: each call's slice of the full pool's `req_to_token` row, the
    mapping its indices go through when its payload is sent in the SWA pool's numbering (None: sent as they are),
    and the send that carries it (a send's calls are consecutive)."""

    slices: tuple[torch.Tensor, ...]
    mappings: tuple[torch.Tensor | None, ...]
    sends: tuple[int, ...]

    def indices(self) -> list[torch.Tensor]:
        """Each call's token indices in its payload's numbering: the device gathers run here, inside the call."""
        return [kv if mapping is None else translate(mapping, kv) for kv, mapping in zip(self.slices, self.mappings,
                                                                                         strict=True)]

    def moved(self, move: Callable[[torch.Tensor], torch.Tensor]) -> Conversions:
        """The same conversions with every slice moved (into a fresh copy of the pool, a clone); the mapping is shared."""
        return dataclasses.replace(self, slices=tuple(move(kv) for kv in self.slices))


def translate(mapping: torch.Tensor, kv_indices: torch.Tensor) -> torch.Tensor:
    """SGLang's `translate_loc_from_full_to_swa`, `mapping[kv_indices].to(torch.int32)`: a gather through the mapping,
    cast to the slice's dtype. The gather is `index_select`, one kernel on a GPU as `mapping[kv_indices]` is for a 1-D
    index; on a CPU advanced indexing's path takes about 6x its host time (180 against 31 µs for 4096 indices on the
    dev box), which no GPU box pays and which would otherwise dominate a CPU run's hybrid steps."""
    return torch.index_select(mapping, 0, kv_indices).to(kv_indices.dtype)


def shuffled_pages(pages: int, seed: int) -> np.ndarray:
    """sigma: the SWA page of each full page 0..pages, page 0 kept (the padding slot), the rest a seeded shuffle."""
    order = torch.randperm(pages, generator=torch.Generator().manual_seed(seed ^ SWA_SEED)) + 1
    return np.concatenate([[0], order.numpy()])


def swa_mapping(sigma: np.ndarray, page_size: int, device: str) -> torch.Tensor:
    """The int64 full slot -> SWA slot mapping of every token slot of the pool's pages, on `device`."""
    slots = (torch.from_numpy(sigma)[:, None] * page_size + torch.arange(page_size)).reshape(-1)
    return slots.to(torch.int64).to(device)


def host_translation(sigma: np.ndarray, kv_indices: torch.Tensor, page_size: int) -> torch.Tensor:
    """The reference: each token index's slot in its SWA page, by arithmetic on a host copy."""
    host = kv_indices.detach().cpu().numpy().astype(np.int64)
    return torch.from_numpy((sigma[host // page_size] * page_size + host % page_size).astype(host.dtype)).to(
        kv_indices.dtype)


def conversions(slices: tuple[torch.Tensor, ...], calls: tuple[Call, ...], mapping: torch.Tensor) -> Conversions:
    """An input set's conversions: the SWA payloads through `mapping`, the others as they are."""
    return Conversions(slices, tuple(None if PAYLOADS[c.payload].pool == FULL_POOL else mapping for c in calls),
                       tuple(c.send for c in calls))


def device_inputs(inputs: torch.Tensor | Conversions | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The device tensors of an input set (a point's slice, a request's or step's slices or conversions): what the
    meter takes as device side."""
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, Conversions):
        return inputs.slices
    return tuple(inputs)
