"""`adaptive`, the recommendation "choose by length" as a variant (no torch): the merged PR's device stride from a
threshold length on, pre-PR's host stride below it and at page size 1 (where striding saves no byte). The one rule the
variant runs, its declared bytes and the link model read; `--kv-adaptive-threshold` sets the threshold of a sweep."""

from __future__ import annotations

ADAPTIVE = "adaptive"
DEFAULT_THRESHOLD = 32768
"""--kv-adaptive-threshold's default, in tokens per call: the first length the H200 judged faster on its default grid
(results/20261204T181656Z-cuda-nvidia-h200: the merged PR judged faster than pre-PR from L=32768 at p=16, 64 and 128,
slower at each shorter swept length but p=16, L=8192, which is unclear with its interval above 1; the crossing itself
lies in (8192, 32768], which that grid does not split), and the first the CPU reference (results/20261207T091135Z-cpu)
predicts on PCIe Gen5 pageable at p=16, 64 and 128."""

_threshold = [DEFAULT_THRESHOLD]  # this process's: the session sets it once from its options (`use_threshold`)


def use_threshold(tokens: int) -> None:
    """Set this process's threshold (the sweep's `--kv-adaptive-threshold`), before any call."""
    if tokens < 1:
        raise ValueError(f"--kv-adaptive-threshold: {tokens} is not >= 1; give a length in tokens, e.g. {DEFAULT_THRESHOLD}")
    _threshold[0] = tokens


def threshold() -> int:
    return _threshold[0]


def on_device(seq_len: int, page_size: int, at: int | None = None) -> bool:
    """Whether `adaptive` strides on the device for a slice of `seq_len` tokens: from the threshold on, above page size 1."""
    return page_size > 1 and seq_len >= (threshold() if at is None else at)
