"""The samples' series read back bit for bit as `float()` reads each number, and a cell that is not one refused."""

from __future__ import annotations

import gzip
import random

import numpy as np
import pytest
from conftest import synthetic_run

from kvpages.schema.decimals import read_cell, read_series
from kvpages.schema.reader import RunError, load_run, sample_file
from kvpages.schema.rows import SAMPLES_CSV

ODD = ["nan", "inf", "-1.5", "+2", "1e5", "2.5E-3", "1_0", ".5", "5.", "0", "00.000", "999999999", "9999999999",
       "0.000000001", "123456789.0", "1234567.891", "0.30000000000000004", "4503599627370497"]
"""Tokens on either side of the fast path's limits (9 digits, one '.', nothing else) and beyond it."""


def token(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.4:  # as the writer writes a time: repr of a float
        return repr(rng.uniform(0, 10 ** rng.randint(-4, 7)))
    if pick < 0.8:  # a time to a few decimals, the most common
        return repr(round(rng.uniform(0, 10 ** rng.randint(0, 6)), rng.randint(0, 4)))
    if pick < 0.9:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12)))
        return digits + rng.choice(["", ".", "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 6)))])
    return rng.choice(ODD)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype == np.float64 and a.shape == b.shape and np.array_equal(a.view(np.int64), b.view(np.int64))


def test_every_cell_reads_as_float_reads_each_number():
    rng = random.Random(7)
    for _ in range(300):
        cells = [" ".join(token(rng) for _ in range(rng.randint(0, 40))) for _ in range(rng.randint(1, 12))]
        cells += ["", "  1.5   2 ", "3\t4"]  # empty, runs of spaces, another whitespace: as str.split() takes them
        for cell, got in zip(cells, read_series(cells), strict=True):
            assert same_bits(got, np.array([float(t) for t in cell.split()], dtype=np.float64)), cell
    arabic = "\u0661\u0662 1.5"  # not ASCII: float() reads these digits too, and so does every cell beside it
    assert [list(a) for a in read_series([arabic, "2.5"])] == [[12.0, 1.5], [2.5]] == [list(read_cell(arabic)), [2.5]]


@pytest.mark.parametrize("cells", [["1.0 x"], ["1..0"], ["."], ["2.0", "1.0 -"], ["1,0"], ["1.0", "1.0 µs"]])
def test_a_token_float_refuses_raises_its_error(cells):
    with pytest.raises(ValueError, match="could not convert string to float"):
        read_series(cells)


def test_a_sample_that_is_not_a_number_is_one_line_naming_the_first_such_line(tmp_path):
    folder = synthetic_run(tmp_path / "run", {("host_stride", 512, 64): 2.0, ("device_stride", 512, 64): 3.0},
                           repetitions=3, rounds=5)
    path = sample_file(folder, SAMPLES_CSV)
    lines = gzip.decompress(path.read_bytes()).decode().splitlines(keepends=True)
    lines[4] = lines[4].rstrip("\n") + " 1.0x\n"  # line 5: a series with a token float() refuses
    lines[6] = lines[6].replace(",0,", ",zero,", 1)  # line 7: a repetition that is not a number
    path.write_bytes(gzip.compress("".join(lines).encode()))
    with pytest.raises(RunError, match=r"samples\.csv\.gz: line 5: a repetition, process, rank or sample is not a number"):
        load_run(folder)
