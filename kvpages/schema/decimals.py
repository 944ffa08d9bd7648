"""Reads the per-round series of a samples file (space-separated decimals, as `repr(float)` writes them) into float64
arrays, the numbers `float()` reads from each, a column of characters at a time instead of a `float()` per number.

A number of at most 9 digits with at most one '.' and nothing else (1.041, 19.28, 0.5) is its digits as an integer m
over 10**d, d the digits after the '.': m < 2**53 and 10**d are exact doubles, so the one IEEE division m / 10**d
rounds the exact decimal correctly, as `float()` does (Clinger's fast path). A cell with any other token (an exponent,
a sign, nan, 10 digits or more, runs of spaces, a non-number) is read by `float()`, token by token, as before; a token
`float()` refuses raises its ValueError. No torch."""

from __future__ import annotations

import numpy as np

MAX_DIGITS = 9  # the integer of its digits fits an int32
_POWERS = np.array([float(f"1e{d}") for d in range(MAX_DIGITS + 1)])  # exact
_SPACE, _DOT, _ZERO = 32, 46, 48


def read_cell(cell: str) -> np.ndarray:
    """One cell as `float()` reads each of its whitespace-separated tokens ('' is no number)."""
    return np.array([float(token) for token in cell.split()], dtype=np.float64)


def read_series(cells: list[str]) -> list[np.ndarray]:
    """Each cell's numbers as a float64 array (an empty cell: an empty one), bit for bit `read_cell`'s."""
    filled = [i for i, cell in enumerate(cells) if cell]
    found = [np.empty(0, dtype=np.float64) for _ in cells]
    try:
        text = " ".join(cells[i] for i in filled).encode("ascii")
    except UnicodeEncodeError:
        return [read_cell(cell) for cell in cells]
    if not text:
        return found
    values, fast = _fast_path(np.frombuffer(text, dtype=np.uint8))
    counts = np.array([cells[i].count(" ") + 1 for i in filled])
    slow = set(np.repeat(np.arange(len(filled)), counts)[~fast].tolist())
    for k, part in enumerate(np.split(values, np.cumsum(counts)[:-1])):
        found[filled[k]] = read_cell(cells[filled[k]]) if k in slow else part
    return found


def _fast_path(chars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per token of `chars` (split at each space): its value by the fast path, and whether the path applies to it;
    the k-th characters of every token at once, for k up to the longest token the path takes."""
    space = np.flatnonzero(chars == _SPACE)
    starts = np.concatenate(([0], space + 1))
    lengths = np.concatenate((space, [chars.size])) - starts
    width = min(int(lengths.max()), MAX_DIGITS + 1)
    padded = np.concatenate((chars, np.full(width, _SPACE, dtype=np.uint8)))
    mantissa = np.zeros(starts.size, dtype=np.int32)
    decimals, digits, dots = (np.zeros(starts.size, dtype=np.int8) for _ in range(3))
    other = lengths > MAX_DIGITS + 1
    for k in range(width):
        char = padded[starts + k]
        inside = lengths > k
        value = char - np.uint8(_ZERO)
        digit = (value < 10) & inside
        dot = (char == _DOT) & inside
        other |= inside & ~(digit | dot)
        np.copyto(mantissa, mantissa * 10 + value, where=digit)  # wraps past 9 digits: such a token is not fast
        decimals += digit & (dots > 0)
        digits += digit
        dots += dot
    fast = ~other & (dots <= 1) & (digits >= 1) & (digits <= MAX_DIGITS)
    return mantissa / _POWERS[np.minimum(decimals, MAX_DIGITS)], fast
