"""The committed H200 default run, re-analysed from its own samples (real CUDA data, no GPU needed): the verdicts a
reviewer of the merged PR needs come out of it with the defaults a CPU run uses (issue 37's acceptance)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import REPO

from kvpages.analysis.ratios import analyze
from kvpages.analysis.verdicts import FASTER, SLOWER
from kvpages.core.names import BASELINE, CANDIDATE
from kvpages.render.report import render, render_appendix
from kvpages.schema.reader import load_run

H200_DEFAULT = REPO / "results" / "20261204T181656Z-cuda-nvidia-h200"


@pytest.fixture(scope="module")
def h200():
    if not (H200_DEFAULT / "meta.json").is_file():
        pytest.skip(f"{H200_DEFAULT.name} is not committed here")
    return analyze(load_run(H200_DEFAULT))


def test_page_size_1_is_slower_wherever_the_interval_excludes_1_and_the_effect_passes_the_minimum(h200):
    rows = [r for r in h200.ratios_of(CANDIDATE) if r.page_size == 1]
    assert len(rows) == 7
    clear = [r for r in rows if r.ci_low > 1 and math.log(r.ratio) >= math.log1p(h200.noise.min_effect)]
    assert clear and all(r.verdict == SLOWER for r in clear), [(r.seq_len, r.ratio, r.verdict) for r in rows]


def test_a_measured_crossover_is_named_at_page_sizes_16_64_and_128(h200):
    found = {c.page_size: c.seq_len for c in h200.crossovers}
    assert all(found[p] is not None for p in (16, 64, 128)), found
    for p in (16, 64, 128):
        at = h200.ratio_at(CANDIDATE, "int32", "fragmented", p, found[p])
        assert at is not None and at.verdict == FASTER and at.ci_high < 1


def test_every_printed_time_is_every_process_mean_or_the_report_names_the_process_left_out(h200):
    run, text = h200.run, render(h200) + render_appendix(h200)
    for r in h200.ratios_of(CANDIDATE):
        for variant, printed in ((CANDIDATE, r.variant_median_us), (BASELINE, r.baseline_median_us)):
            blocks = run.samples[(variant, r.dtype, r.layout, r.seq_len, r.page_size)]
            every = math.exp(np.mean(np.log([np.median(b) for b in blocks])))
            if abs(printed / every - 1) > 0.05:
                assert r.left_out and f"`{r.id}`" in text and r.left_out in text, (r.id, printed, every)
