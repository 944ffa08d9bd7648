"""Link profiles as files: the built-in ones, a user's own changing the predictions and recorded with the run, and a bad
file refused in one line naming the file and the key, before any work (`kvpages report`, `plot`, a sweep)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from conftest import FAST, REPO, kvpages_here, synthetic_run

from kvpages.analysis.findings import findings
from kvpages.analysis.predict import crossover, point_calls, point_predictions, predict
from kvpages.analysis.ratios import analyze
from kvpages.cli import main
from kvpages.core.links import PREDICTION_PROFILES, TERM_KEYS, variations
from kvpages.core.names import CANDIDATE
from kvpages.schema.profiles import BUILT_IN, ProfileError, built_in_profiles, parse_profile, profile_text, read_profile
from kvpages.schema.reader import load_run

GOOD = (BUILT_IN / "pcie5_pageable.toml").read_text()


def cpu_run(folder: Path) -> Path:
    """Pre-PR's host work (its time at p=64 less its time at p=1, the same copy) 2, 7.5 and 80 µs at 512, 8192 and
    131072 tokens."""
    times = {(v, s, p): m for p in (1, 64) for s, m in ((512, 3.0), (8192, 9.0), (131072, 110.0))
             for v in ("host_stride", CANDIDATE)}
    times |= {("host_stride", s, 1): m for s, m in ((512, 1.0), (8192, 1.5), (131072, 30.0))}
    return synthetic_run(folder, times)


def kvpages(*args: object) -> subprocess.CompletedProcess:
    return kvpages_here(*args)


def test_the_built_in_profiles_are_files_with_a_source_for_every_term_and_read_back_the_same():
    profiles = built_in_profiles()
    assert tuple(p.name for p in profiles[:len(PREDICTION_PROFILES)]) == PREDICTION_PROFILES
    assert len(profiles) == len(list(BUILT_IN.glob("*.toml")))
    for p in profiles:
        assert [t.key for t in p.terms] == list(TERM_KEYS) and all(t.source and t.value > 0 for t in p.terms)
        assert parse_profile(Path("again.toml"), profile_text(p)).terms == p.terms
        # the bounds: each assumed term alone at 0.5x and 2x (a fitted one at its interval's ends), then all together
        said = [v.said for v in variations(p)]
        if p.term("launch_us").low is None:
            assert said[:2] == ["launch 0.5x", "launch 2x"] and said[-2:] == ["all 0.5x", "all 2x"] and len(said) == 10
        else:  # h200_measured_pageable/_pinned, fitted from a committed CUDA run
            low, high = (float(x.split()[1]) for x in said[:2])
            assert low == pytest.approx(p.term("launch_us").low, rel=0.01) and said[0].endswith(" µs")
            assert high == pytest.approx(p.term("launch_us").high, rel=0.01)
            assert said[-2:] == ["all low", "all high"]
            assert len(said) == 10 + 2 * p.term("bandwidth_gb_s").fitted  # a fitted bandwidth moves within its interval


BAD = [
    ("missing term", GOOD.split("[sync_us]")[0] + "[copy_us]" + GOOD.split("[copy_us]")[1], "missing key 'sync_us'"),
    ("negative bandwidth", GOOD.replace("value = 26.5", "value = -26.5"), "[bandwidth_gb_s] value: -26.5 must be > 0"),
    ("zero bandwidth", GOOD.replace("value = 26.5", "value = 0"), "[bandwidth_gb_s] value: 0 must be > 0"),
    ("not TOML", GOOD.replace('name = "pcie5_pageable"', "name = pcie5_pageable"), "not valid TOML"),
    ("unknown key", GOOD + "\nlatency_us = 3\n", "unknown key 'latency_us'"),
    ("a term not a table", GOOD.replace("[launch_us]\nvalue = 5.0", "launch_us = 5.0\n[launch_old]\nvalue = 5.0"),
     "unknown key 'launch_old'"),
    ("no source", GOOD.replace("[kernel_us]\nvalue = 2.0\nsource", "[kernel_us]\nvalue = 2.0\nsourced"),
     "[kernel_us]: unknown key 'sourced'"),
    ("text for a number", GOOD.replace("value = 8.0", 'value = "8"'), "[copy_us] value: '8' is not a finite number"),
    ("half an interval", GOOD.replace("value = 3.0", "value = 3.0\nlow = 2.0"), "[sync_us]: give both low and high"),
    ("value outside its interval", GOOD.replace("value = 3.0", "value = 3.0\nlow = 4.0\nhigh = 5.0"),
     "low 4 <= value 3 <= high 5 must hold"),
    ("memory", GOOD.replace('memory = "pageable"', 'memory = "unified"'), "key 'memory' 'unified'; valid: pageable, pinned"),
]


@pytest.mark.parametrize(("text", "words"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_profile_file_is_one_line_naming_the_file_and_the_key_before_any_work(tmp_path, capsys, text, words):
    folder = cpu_run(tmp_path / "run")
    bad = tmp_path / "mine.toml"
    bad.write_text(text)
    with pytest.raises(ProfileError, match=r"mine\.toml"):
        read_profile(bad)
    for command in ("report", "plot"):  # the command's own main, in this process (one real process: the test below)
        assert main([command, str(folder), "--link-profile", str(bad)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and str(bad) in err and words in err, err
    assert not (folder / "REPORT.md").exists() and not list(folder.glob("*.png"))  # refused before any work
    assert not json.loads((folder / "meta.json").read_text()).get("link_profiles")


def test_a_bad_profile_file_through_the_command_is_one_line_without_a_traceback(tmp_path):
    folder = cpu_run(tmp_path / "run")
    bad = tmp_path / "mine.toml"
    bad.write_text(BAD[1][1])
    done = kvpages("report", folder, "--link-profile", bad)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr == f"kvpages: error: {bad}: [bandwidth_gb_s] value: -26.5 must be > 0\n"


def test_a_users_profile_changes_the_predictions_and_the_run_records_it(tmp_path):
    folder = cpu_run(tmp_path / "run")
    before = analyze(load_run(folder))
    mine = tmp_path / "mine.toml"
    mine.write_text(GOOD.replace('name = "pcie5_pageable"', 'name = "slow_sync"').replace(
        'label = "PCIe Gen5 x16, pageable"', 'label = "Slow sync box"').replace("value = 3.0", "value = 30.0"))
    done = kvpages("report", folder, "--link-profile", mine)
    assert done.returncode == 0, done.stderr
    report = (folder / "REPORT.md").read_text()
    assert "Slow sync box (your profile slow_sync)" in report and str(mine) in report
    recorded = json.loads((folder / "meta.json").read_text())["link_profiles"]
    assert [(r["name"], r["origin"], r["sha256"]) for r in recorded] == [
        ("slow_sync", str(mine), hashlib.sha256(mine.read_bytes()).hexdigest())]
    assert {t["key"]: t["value"] for t in recorded[0]["terms"]}["sync_us"] == 30.0
    # the recorded profile prices the run again without its file, with its own figures
    mine.unlink()
    after = analyze(load_run(folder))
    assert [p.name for p in after.predicting] == [*PREDICTION_PROFILES, "slow_sync"]
    r = next(r for r in after.ratios_of(CANDIDATE) if r.page_size == 64 and r.seq_len == 131072)
    own = point_predictions(after, r)
    mine_at = len(PREDICTION_PROFILES)
    assert [p.ratio for p in own[:mine_at]] == [p.ratio for p in point_predictions(before, r)]
    assert own[mine_at].ratio != own[0].ratio and own[mine_at].profile.us("sync_us") == 30.0
    found = next(f for f in findings(after) if f.question == "Crossover")
    assert "slow_sync" in found.figure
    assert kvpages("report", folder).returncode == 0 and "slow_sync" in (folder / "REPORT.md").read_text()


def test_the_sweep_checks_its_link_profile_before_any_work_and_records_it(pytester, tmp_path):
    pytester.makepyfile(test_kv_sweep=(REPO / "bench" / "test_d2h.py").read_text())
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.replace("value = 26.5", "value = 0"))
    tiny = ("--kv-device", "cpu", "--kv-seq-lens", "64", "--kv-page-sizes", "16", "--kv-variants", "device_shift",
            "--kv-scenarios", "none", "--kv-breakdown", "off", "--kv-results", str(tmp_path / "out"))
    refused = pytester.runpytest(*FAST, *tiny, "--kv-link-profile", str(bad))
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    assert f"--kv-link-profile: {bad}: [bandwidth_gb_s] value: 0 must be > 0" in refused.stderr.str()
    assert not (tmp_path / "out").exists()
    good = tmp_path / "good.toml"
    good.write_text(GOOD.replace('name = "pcie5_pageable"', 'name = "mine"'))
    assert pytester.runpytest(*FAST, *tiny, "--kv-link-profile", str(good)).ret == pytest.ExitCode.OK
    (run,) = (tmp_path / "out").iterdir()
    recorded = json.loads((run / "meta.json").read_text())["link_profiles"]
    assert [(r["name"], r["origin"]) for r in recorded] == [("mine", str(good))]
    assert [p.name for p in analyze(load_run(run)).predicting][-1] == "mine"


def test_every_model_finding_of_the_reference_run_carries_its_range_and_the_crossover_what_moves_it(reported_reference):
    analysis = reported_reference.analysis
    if analysis.run.link_crossed:
        pytest.skip("the newest reference run crossed a link: its findings are measured, not predicted")
    made = [f for f in findings(analysis) if f.status.startswith("model")]
    assert len(made) >= 5
    appendix = (reported_reference.path / "APPENDIX.md").read_text()
    for f in made:  # each profile's ratio and its range in the finding; the variation behind each end in the appendix
        assert f.figure.count("[") == len(analysis.predicting), f.figure
        lines = [line for line in appendix.splitlines() if line.startswith(f"| {f.question} | `{f.id}` |")]
        assert len(lines) == len(analysis.predicting) and all(line.count(" if ") == 2 for line in lines), f.question
    crossover_finding = next(f for f in made if f.question == "Crossover")
    for r in {r.page_size: r for r in analysis.ratios_of(CANDIDATE) if r.page_size > 1}.values():
        rows = [x for x in analysis.ratios_of(CANDIDATE) if x.page_size == r.page_size]
        found = [crossover(analysis, rows, p).seq_len for p in analysis.predicting if not p.pinned]
        lengths = sorted({n for n in found if n})
        assert f"p={r.page_size}: L={lengths[0]}" in crossover_finding.answer
        for profile in analysis.predicting:
            for variation, moved_to in crossover(analysis, rows, profile).moved:  # a named variation moves it there
                assert crossover(analysis, rows, next(v.profile for v in variations(profile) if v.said == variation)
                                 ).seq_len == moved_to
    report = (reported_reference.path / "REPORT.md").read_text()
    assert "one at a time and all together" in report and "bounds 2.5-10 (0.5-2x)" in report


def test_a_fitted_profile_bounds_each_term_by_its_interval_so_its_ranges_shrink(tmp_path):
    analysis = analyze(load_run(cpu_run(tmp_path / "run")))
    assumed = built_in_profiles()[0]
    fitted = dataclasses.replace(assumed, origin=str(tmp_path / "fit.toml"), terms=tuple(
        dataclasses.replace(t, low=t.value * 0.95, high=t.value * 1.05) for t in assumed.terms))
    r = next(r for r in analysis.ratios_of(CANDIDATE) if r.page_size == 64 and r.seq_len == 8192)
    wide, narrow = (predict(p, point_calls(analysis, r)) for p in (assumed, fitted))
    assert narrow.ratio == wide.ratio and wide.low < narrow.low <= narrow.ratio <= narrow.high < wide.high
    assert variations(fitted)[0].said == "launch 4.75 µs" and variations(fitted)[-1].said == "all high"
    rows = [x for x in analysis.ratios_of(CANDIDATE) if x.page_size == 64]
    wide_crossover, narrow_crossover = crossover(analysis, rows, assumed), crossover(analysis, rows, fitted)
    assert wide_crossover.seq_len == narrow_crossover.seq_len == 8192
    assert wide_crossover.moved == (("launch 2x", 131072), ("kernel 2x", 131072), ("all 2x", 131072))
    assert wide_crossover.span == "L=8192 to L=131072"
    assert narrow_crossover.moved == ()  # every term within its fitted interval: it stays at L=8192
