"""One estimator everywhere: every printed ratio is the ratio of its two printed times, every chart marker lies in
its own band, and the interval of that statistic is calibrated (kvpages.core.estimator.paired_ratio; real files)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from conftest import Reported

from kvpages.analysis.cite import sig
from kvpages.core.estimator import paired_ratio, t_quantile
from kvpages.core.names import CANDIDATE
from kvpages.core.stats import Levels, block_medians


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _half_ulp(text: str) -> float:
    """Half the last printed digit of a figure: the most its rounding moved it."""
    digits = text.replace(",", "")
    if "." in digits:
        return 0.5 * 10 ** -len(digits.split(".")[1])
    return 0.5 * 10 ** max(len(digits.lstrip("-")) - 3, 0)  # three significant figures: '1,080' is 1075-1085


def agrees(a: str, b: str, ratio: str) -> bool:
    """Whether the printed `ratio` can be the ratio of the printed times `a` / `b`, within the rounding of all three."""
    low = (_number(a) - _half_ulp(a)) / (_number(b) + _half_ulp(b))
    high = (_number(a) + _half_ulp(a)) / (_number(b) - _half_ulp(b))
    return low - _half_ulp(ratio) <= _number(ratio) <= high + _half_ulp(ratio)


@pytest.fixture(scope="module")
def reference(reported_reference: Reported):
    return reported_reference.path, reported_reference.analysis  # re-analysed from its samples with this code


def test_every_ratio_of_the_reference_run_is_the_ratio_of_its_printed_times(reference):
    _, analysis = reference
    assert analysis.ratios and analysis.scenario_ratios
    for r in analysis.ratios:
        assert r.ratio == pytest.approx(r.variant_median_us / r.baseline_median_us, rel=1e-12), r.id
        assert agrees(sig(r.variant_median_us), sig(r.baseline_median_us), sig(r.ratio)), r.id
        assert r.ci_low <= r.ratio <= r.ci_high, r.id
        main = analysis.ratio_at(CANDIDATE, r.dtype, r.layout, r.page_size, r.seq_len)  # the baseline's marker: its pair's
        for variant, time in ((r.variant, r.variant_median_us), (r.baseline, (main or r).baseline_median_us)):
            band = analysis.time_band(variant, r.dtype, r.layout, r.page_size, r.seq_len)
            assert band is not None and band.ratio == pytest.approx(time, rel=1e-12)  # the marker is the table's time
            assert band.ci_low <= band.ratio <= band.ci_high, (r.id, variant)  # ... inside its own band
    for s in analysis.scenario_ratios:
        assert s.interval.ratio == pytest.approx(s.variant_us / s.baseline_us, rel=1e-12), s.id
        assert agrees(sig(s.variant_us), sig(s.baseline_us), sig(s.interval.ratio)), s.id
        band = analysis.scenario_band(s.scenario, s.variant, s.latency)
        assert band is not None and band.ratio == pytest.approx(s.variant_us, rel=1e-12)
        assert band.ci_low <= band.ratio <= band.ci_high, s.id


def test_every_table_row_of_the_report_and_appendix_agrees_with_itself(reference):
    """In every table that prints two times and their ratio, the printed ratio is theirs within the rounding."""
    run, _ = reference
    checked = 0
    text = (run / "REPORT.md").read_text() + (run / "APPENDIX.md").read_text()
    for line in text.splitlines():
        # '| baseline µs | variant µs | ratio [lo, hi] verdict |', '| ... | ratio | [lo, hi] |', 'a → b | ratio [...';
        # a row that starts with its id prints one time, the baseline's is its own row (checked above)
        found = re.search(r"\| ([\d.,]+) (?:\||→) ([\d.,]+) \| ([\d.,]+) (?:\| )?\[[\d.,]+, [\d.,]+\]", line)
        if found and not line.startswith("| `"):
            base, variant, ratio = found.groups()
            assert agrees(variant, base, ratio), line
            checked += 1
    assert checked >= 40


def _two_level(rng: np.random.Generator, processes: int, per_process: int, between: float, within: float,
               outliers: float) -> tuple[np.ndarray, np.ndarray]:
    owners = np.repeat(np.arange(processes), per_process)
    n = processes * per_process
    noise = np.where(rng.random(n) < outliers, rng.normal(0.0, 0.4, n), rng.normal(0.0, within, n))
    return rng.normal(0.0, between, processes)[owners] + noise, owners


@pytest.mark.parametrize("processes, per_process, between, within, outliers",
                         [(6, 2, 0.2, 0.03, 0.0), (6, 2, 0.05, 0.03, 0.15), (6, 2, 0.0, 0.1, 0.0), (1, 12, 0.0, 0.1, 0.0),
                          (6, 1, 0.05, 0.03, 0.0), (6, 1, 0.0, 0.1, 0.15)])
def test_the_paired_ratio_is_calibrated_and_drift_shared_by_a_repetition_cancels(processes, per_process, between,
                                                                                 within, outliers):
    """A/A: true ratio 1, a strong drift shared by both variants in each repetition, and the ratio's own process
    effect, block outliers, or neither: the interval holds 1 about 95% of the time."""
    rng = np.random.default_rng(11)
    trials, hits = 300, 0
    for _ in range(trials):
        shift, owners = _two_level(rng, processes, per_process, between, within, outliers)
        drift = rng.normal(0.0, 0.3, owners.size)
        found = paired_ratio(Levels(drift, owners), Levels(drift + shift, owners)).interval
        hits += found.ci_low <= 1.0 <= found.ci_high
    assert 0.90 <= hits / trials <= 0.995


def test_a_real_difference_is_found_and_the_p_value_comes_from_the_same_resamples():
    owners = np.repeat(np.arange(6), 2)
    rng = np.random.default_rng(5)
    drift = rng.normal(0.0, 0.3, 12)
    found = paired_ratio(Levels(drift, owners), Levels(drift + math.log(1.5) + rng.normal(0, 0.03, 12), owners))
    assert found.interval.ci_low <= 1.5 <= found.interval.ci_high and found.interval.ci_low > 1 and found.p_value < 0.01
    assert found.interval.unit == "process" and found.interval.n == 6 and found.repetitions == 12
    with pytest.raises(ValueError, match="different processes"):
        paired_ratio(Levels(drift, owners), Levels(drift, np.zeros(12, dtype=int)))


@pytest.mark.parametrize("df, exact", [(3, 3.182446), (5, 2.570582), (11, 2.200985), (30, 2.042272)])
def test_t_quantile_is_student_t(df, exact):
    assert t_quantile(0.975, df) == pytest.approx(exact, rel=3e-3)


def test_block_medians_are_np_median_bit_for_bit():
    rng = np.random.default_rng(5)
    blocks = [rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4) for n in rng.integers(1, 60, 400)]
    blocks += [np.array([3.0, 1.0]), np.array([1.0, np.nan, 2.0]), np.array([np.inf, 1.0]), np.array([5e-324, 5e-324]),
               np.array([7.0]), np.array([2.0, 2.0, 1.0, 1.0])]
    with np.errstate(all="ignore"):
        expected = np.array([np.median(b) for b in blocks])
        found = block_medians(blocks)
    assert found.dtype == np.float64 and np.array_equal(found.view(np.int64), expected.view(np.int64))


def test_levels_of_the_same_processes_share_their_owners_which_are_np_uniques_and_read_only():
    processes = np.array([3, 1, 3, 0, 1, 3])
    a, b = Levels(np.arange(6.0), processes), Levels(np.ones(6), processes.copy())
    ids, owner = np.unique(processes, return_inverse=True)
    for levels in (a, b):
        assert [x.tolist() for x in levels._owners] == [ids.tolist(), owner.tolist(), [1, 2, 3]]
        assert not any(x.flags.writeable for x in levels._owners)
    assert all(x is y for x, y in zip(a._owners, b._owners, strict=True))  # computed once
    assert a.process_means()[1].tolist() == [3.0, 2.5, 7 / 3]  # processes 0, 1 and 3: values 3; 1, 4; 0, 2, 5
    assert Levels(a.values, processes.astype(np.int32))._owners[0].dtype == np.int32  # another dtype, another entry
