"""The report's findings, verdicts with an effect, stable row ids, pair repro commands and `kvpages cite`, on real files."""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import Reported, reference_runs, synthetic_run
from test_analysis import cli_each

from kvpages.analysis.cite import coverage_text, pair_repro, sig
from kvpages.analysis.findings import findings
from kvpages.analysis.ratios import Analysis, analyze
from kvpages.analysis.verdicts import FASTER, SAME, SLOWER, UNCLEAR, bh_adjusted, holm_sentence, judge
from kvpages.analysis.wording import CELL_CHARS, MEASURED, MODEL, NEEDS_GPU
from kvpages.analysis.wording import figure as figure_of
from kvpages.core.names import LABELS, label
from kvpages.core.options import OPTIONS, BenchOptions
from kvpages.core.stats import Interval
from kvpages.schema.beside import gpu_run_beside
from kvpages.schema.reader import load_run
from kvpages.schema.rows import ratio_id, scenario_row_id

needs_reference = pytest.mark.skipif(not reference_runs(), reason="no run committed under results/")


@pytest.fixture(scope="module")
def reference(reported_reference: Reported) -> Path:
    """A copy of the newest committed run, reported (REPORT.md, ratios.csv, scenario_ratios.csv, noisy.csv)."""
    return reported_reference.path


def findings_rows(report: str) -> list[list[str]]:
    """The findings table's cells: question, answer, figure, row id, status."""
    section = report.split("## Findings", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| question")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


def test_judge_needs_an_interval_that_excludes_1_and_an_effect_beyond_the_minimum():
    assert judge(Interval(0.987, 0.975, 0.999, 10, 0.979), 0.08) == SAME  # the shortcut at p=1, s2048: excludes 1
    assert judge(Interval(2.0, 1.8, 2.2, 10, 0.979), 0.08) == SLOWER
    assert judge(Interval(0.5, 0.4, 0.6, 10, 0.979), 0.08) == FASTER
    assert judge(Interval(0.5, 0.4, 0.6, 10, 0.979), 0.08, discovered=False) == UNCLEAR  # dropped by the family
    assert judge(Interval(1.6, 0.8, 2.1, 10, 0.979), 0.08) == UNCLEAR  # beyond the minimum, interval reaches 1
    assert judge(Interval(1.6, 0.0, math.inf, 1, math.nan), 0.08) == UNCLEAR
    assert judge(Interval(1.0, 0.0, math.inf, 1, math.nan), 0.08) == UNCLEAR  # no interval: no sameness shown either
    assert judge(Interval(1.03, 0.9, 1.15, 10, 0.979), 0.08) == UNCLEAR  # reaches 1, and past 8% either side
    assert judge(Interval(1.03, 0.96, 1.07, 10, 0.979), 0.08) == SAME  # the whole interval within 8%


def test_a_difference_resolved_whose_interval_reaches_beyond_the_minimum_effect_is_unclear_not_same():
    """The committed H200 runs' cases: *same* needs the whole interval within the minimum effect; an estimate within
    it whose interval excludes 1 and reaches past it is a difference the run resolved but cannot size, and one whose
    interval reaches 1 and past it shows nothing either way."""
    assert judge(Interval(2.227, 1.386, 3.679, 2, 0.001), 1.339) == UNCLEAR  # 2 processes: a 134% minimum effect
    assert judge(Interval(1.068, 1.009, 1.146, 6, 0.01), 0.102) == UNCLEAR  # the merged PR at p=16, L=8192
    assert judge(Interval(1.012, 1.008, 1.016, 6, 0.001), 0.02) == SAME  # excludes 1, but wholly within 2%
    assert judge(Interval(0.93, 0.899, 0.97, 6, 0.001), 0.102) == UNCLEAR  # below 1, reaching past -10.2% at 0.899
    assert judge(Interval(1.41, 0.738, 7.24, 2, 0.5), 1.339) == UNCLEAR  # reaches 1, and far past 134%
    assert judge(Interval(1.0, math.nan, 1.05, 6, 0.5), 0.102) == UNCLEAR  # no lower bound: nothing shown


@pytest.mark.parametrize("family, said", [
    (140, "0.05/140 = 0.00036 for its first call; the bootstrap's smallest p-value is 1/2000 = 0.0005, so it could "
          "call nothing"),
    (100, "0.05/100 = 0.0005 for its first call; the bootstrap's smallest p-value is 1/2000 = 0.0005, which a ratio "
          "reaches only where none of the resamples cross 1"),
    (20, "0.05/20 = 0.0025 for its first call; the bootstrap's smallest p-value is 1/2000 = 0.0005, which a ratio "
         "reaches only where at most 2 of the resamples cross 1"),
    (40, "at most 1 of the resamples cross 1"),  # p = 2/2000 = 0.001 <= 0.05/40 = 0.00125; 4/2000 is not
])
def test_the_method_says_whether_holm_could_call_anything_from_the_bootstraps_smallest_p_value(family, said):
    assert said in holm_sentence(family)


def test_benjamini_hochberg():
    assert bh_adjusted([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.5])


@needs_reference
def test_the_shortcut_at_page_size_1_is_same_as_pre_pr(reported_reference):
    shortcut = [r for r in reported_reference.analysis.ratios  # re-analysed from its samples with this code
                if r.variant == "device_stride_shortcut" and r.page_size == 1]
    assert shortcut and {r.verdict for r in shortcut} == {SAME}


@needs_reference
def test_every_figure_in_the_findings_table_is_a_row_of_the_csvs(reported_reference):
    reference = reported_reference.path
    report = (reference / "REPORT.md").read_text()
    ratios = pd.read_csv(reference / "ratios.csv").set_index("id")
    scenarios = reported_reference.analysis.run.scenarios.set_index("id")  # a run from before the column: ids on reading
    recommended = pd.read_csv(reference / "recommendations.csv").set_index("id")  # the hybrid finding's (staging)
    rows = findings_rows(report)
    assert [r[0] for r in rows][:3] == ["Bytes per call", "Page size 1: per call and per step", "Crossover"]
    cited = 0
    for question, answer, figure, row_id, status in rows:
        assert status in (MEASURED, MODEL, NEEDS_GPU)
        assert max(len(answer), len(figure), len(status)) <= CELL_CHARS, question  # the detail is in the appendix
        if figure == "-":
            assert status == NEEDS_GPU
            continue
        key = row_id.strip("`")
        assert key in ratios.index or key in scenarios.index or key in recommended.index
        if question == "Bytes per call":
            r = ratios.loc[key]
            assert f"{r['variant_d2h_bytes']:,} / {r['baseline_d2h_bytes']:,} bytes" in figure and status == MEASURED
        else:  # a CPU run: a time finding is a prediction per link profile, never a measured 'slower' or 'faster'
            assert status == MODEL and "`make gpu-check`" in status and figure.startswith("model: ")
            for profile in ("pcie5_pageable", "nvlink_c2c", "pcie5_pinned (what-if)", "h200_measured_pageable"):
                assert profile in figure
            for word in ("slower", "faster", "regression"):
                assert word not in answer
            assert "predicted" in answer.lower()
        cited += 1
    assert cited >= 5


@needs_reference
def test_cite_reproduces_a_finding_in_one_line_and_refuses_a_bad_id(reference):
    report = (reference / "REPORT.md").read_text()
    quoted = findings_rows(report)[1:4]  # page size 1, the crossover, a prefill request: each a model figure here
    row_ids = [row_id for _, _, _, row_id, _ in quoted]
    committed = reference_runs()[-1]  # beside the CUDA run its report quotes (the copy is alone in its folder)
    on_gpu = next(row_id.strip("`") for _, _, _, row_id, status in findings_rows((committed / "REPORT.md").read_text())
                  if status.startswith("needs a GPU run; measured on"))  # the busy queue's: the GPU run's row, by its id
    *cited, unknown, listed, bad, elsewhere = cli_each(
        *(["cite", str(reference), row_id.strip("`")] for row_id in row_ids),
        ["cite", str(reference), "r-device_stride-s999-p64-int32-fragmented"], ["cite", str(reference), "--list"],
        ["cite", str(reference.parent / "nope"), "r-x"], ["cite", str(committed), on_gpu])
    for row_id, done in zip(row_ids, cited, strict=True):
        assert done.returncode == 0, done.stderr
        r = pd.read_csv(reference / "ratios.csv").set_index("id").loc[row_id.strip("`")] if row_id.startswith("`r-") \
            else None
        assert done.stdout.count("\n") == 1 and (r is None or f"{sig(r['ratio'])} [" in done.stdout)
        assert "commit " in done.stdout and "CPU run: no link crossed" in done.stdout
        assert "repro: pytest bench/" in done.stdout and "--kv-analyze" in done.stdout
    for (_, _, figure, _, _), done in zip(quoted, cited, strict=True):  # the figure the report puts beside the id
        assert figure.startswith("model: ") and f"; on a GPU box, {figure}; " in done.stdout, (figure, done.stdout)
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1
    assert "did you mean r-device_stride-s" in unknown.stderr and "--list" in unknown.stderr
    assert listed.returncode == 0 and "r-device_stride-s8192-p64-int32-fragmented" in listed.stdout.split()
    assert bad.returncode == 2 and "no such file or folder" in bad.stderr
    gpu_run = gpu_run_beside(committed)  # the run its report quotes: where to cite that row
    assert gpu_run is not None
    assert elsewhere.returncode == 2 and elsewhere.stderr.count("\n") == 1, elsewhere.stderr
    assert f"it is a row of {gpu_run.name}" in elsewhere.stderr and f"`kvpages cite {gpu_run} {on_gpu}`" in elsewhere.stderr


@needs_reference
def test_the_report_answers_first_with_exact_coverage_and_honest_names(reference):
    report = (reference / "REPORT.md").read_text()
    lines = report.splitlines()
    assert len(lines) <= 200
    text = "\n".join(lines[:60])  # the findings and every chart, captioned, come first
    assert lines[0].startswith("# kvpages report") and "## Findings" in text and "## Charts" in text
    assert text.count("![") == len(list(reference.glob("*.png"))) and "*breakdown_int32_fragmented.*" not in text
    order = [report.index(s) for s in ("## Findings", "## Charts", "## Evidence", "## Method and caveats")]
    assert order == sorted(order)
    exact = {coverage_text(c) for c in pd.read_csv(reference / "ratios.csv")["confidence"]}
    assert "95% CI" not in report and "95.0%" not in report and exact and all(f"{c} interval" in report for c in exact)
    assert LABELS["host_stride"] in text and LABELS["device_stride"] in text
    assert "what SGLang does today" not in report and "e+0" not in report
    assert "host-side µs (no transfer)" in report  # measured CPU times are named what they are
    assert f"over its family ({len(pd.read_csv(reference / 'ratios.csv'))} ratios per call" in report  # computed
    noisy = pd.read_csv(reference / "noisy.csv")
    assert f"{len(noisy)} of " in report and "noisy.csv" in report and "s512 p1 (" not in report
    appendix = (reference / "APPENDIX.md").read_text()
    assert "[APPENDIX.md](APPENDIX.md)" in report and "## Where the time goes" in appendix
    assert "blocked = ready µs" in appendix  # merged on a CPU run, with the reason
    section = report.split("### Where the time goes", 1)[1].split("\n### ", 1)[0].strip()
    assert 0 < len(section.splitlines()) <= 8


def test_ids_are_stable_across_analyses_and_runs(tmp_path):
    points = {("host_stride", 512, 16): 10.0, ("device_stride", 512, 16): 5.0, ("host_stride", 8192, 16): 10.0,
              ("device_stride", 8192, 16): 9.0}
    a = analyze(load_run(synthetic_run(tmp_path / "a", points, seed=1)))
    b = analyze(load_run(synthetic_run(tmp_path / "b", points, seed=2)))
    assert [r.id for r in a.ratios] == [r.id for r in b.ratios] == [r.id for r in analyze(a.run).ratios]
    assert a.ratios[0].id == "r-device_stride-s512-p16-int32-fragmented"
    assert ratio_id("x", "y", "int64", "contiguous", 1, 2) == "r-x-s1-p2-int64-contiguous-vs-y"
    assert scenario_row_id("step-B8-p64-int32", "per_request[host_stride]") == "step-B8-p64-int32:per_request-host_stride"
    assert label("per_request[host_stride]") == f"per_request[host_stride], {LABELS['host_stride']}"


def test_a_ratio_repro_reruns_the_pair_at_its_point_with_the_runs_options():
    alone = ("pytest bench/ --benchmark-only --kv-device cpu --kv-variants device_stride --kv-seq-lens 2048 "
             "--kv-page-sizes 64 --kv-dtypes int32 --kv-layouts fragmented --kv-seed 0 --kv-time-budget 0.25 "
             "--kv-repetitions 10 --kv-passes 10")
    words = shlex.split(pair_repro(alone, "device_stride", "host_stride"))
    assert words[:3] == ["pytest", "bench/", "--benchmark-only"] and words[-1] == "--kv-analyze"
    given = dict(zip(words[3:-1:2], words[4:-1:2], strict=True))
    assert set(given) <= {o.flag for o in OPTIONS}
    options = BenchOptions.parse(given.get)
    assert options.variants == ("device_stride", "host_stride")
    assert (options.seq_lens, options.page_sizes, options.repetitions, options.passes) == ((2048,), (64,), 10, 10)
    assert options.scenarios == "none"  # the point's pair alone
    step = pair_repro("pytest bench/test_steps.py --benchmark-only --kv-step-variants 'per_request[device_stride]' "
                      "--kv-step-sizes 8", "per_request[device_stride]", "per_request[host_stride]")
    assert "--kv-step-variants 'per_request[device_stride],per_request[host_stride]'" in step
    assert pair_repro("", "a", "b") == ""


def test_a_points_repro_made_before_it_left_out_the_scenario_options_still_gives_its_pair():
    """A point's repro of a run given scenario options, as PointTarget.narrowed made it before 2026-12-07 (beside
    `--kv-scenarios none`, which now refuses them): its pair is that point's alone, not a step's, and parses."""
    old = ("pytest bench/ --benchmark-only --kv-device cpu --kv-variants device_stride --kv-seq-lens 2048 "
           "--kv-page-sizes 64 --kv-scenarios none --kv-request-lens 1000 --kv-payloads hybrid "
           "--kv-step-variants batched_device_stride")
    words = shlex.split(pair_repro(old, "device_stride", "host_stride"))
    given = dict(zip(words[3:-1:2], words[4:-1:2], strict=True))
    assert not {"--kv-request-lens", "--kv-payloads", "--kv-step-variants"} & set(given), words
    options = BenchOptions.parse(given.get)
    assert options.variants == ("device_stride", "host_stride") and options.scenario_set == ()


def test_a_steps_repro_made_before_preset_and_by_hand_scenarios_were_refused_together_still_gives_its_pair():
    """A step's repro of a run given `--kv-scenarios preset` beside scenarios by hand, as ScenarioTarget.narrowed made it
    before dc5886e (which now refuses the two together): its pair times the scenarios given by hand, as that run did."""
    old = ("pytest bench/test_steps.py --benchmark-only --kv-device cpu --kv-step-variants 'per_request[device_stride]' "
           "--kv-scenarios preset --kv-step-sizes 8")
    words = shlex.split(pair_repro(old, "per_request[device_stride]", "per_request[host_stride]"))
    assert words[:3] == ["pytest", "bench/test_steps.py", "--benchmark-only"] and words[-1] == "--kv-analyze", words
    given = dict(zip(words[3:-1:2], words[4:-1:2], strict=True))
    assert "--kv-scenarios" not in given
    options = BenchOptions.parse(given.get)
    assert options.step_variants == ("per_request[device_stride]", "per_request[host_stride]")
    assert options.step_sizes == (8,) and {s.kind for s in options.scenario_set} == {"step"}


def cuda_labelled(folder: Path) -> Path:
    """A synthetic run folder relabelled as a CUDA run whose rows crossed PCIe Gen5 x16 into pageable memory."""
    import json

    (folder / "results.csv").write_text((folder / "results.csv").read_text().replace("none (cpu)", "pcie pageable"))
    meta = json.loads((folder / "meta.json").read_text())
    meta["environment"].update(device="cuda", pcie_link="Gen5 x16", link_crossed=True, link_note="CUDA run.")
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def crossover_answer(run: Path | Analysis) -> str:
    """The Crossover finding's answer of `run` (a synthetic run folder, labelled CUDA first, or its analysis)."""
    analysis = run if isinstance(run, Analysis) else analyze(load_run(cuda_labelled(run)))
    return {f.question: f.answer for f in findings(analysis)}["Crossover"]


def test_a_findings_figure_names_the_processes_its_centre_leaves_out(tmp_path):
    """The H200 page-size-1 headline, 2.31, leaves out process 5 (2.21 with all 6): the finding says so beside it,
    not only the Method section."""
    folder = synthetic_run(tmp_path / "r", {("host_stride", 512, 1): 10.0, ("device_stride", 512, 1): 20.0},
                           processes=6, repetitions=6, own_shifts={"device_stride": (1, 1, 1, 1, 1, 1.6)})
    [row] = analyze(load_run(folder)).ratios
    level = row.left_out.removeprefix("5 (").removesuffix(")")
    assert row.left_out.startswith("5 (") and figure_of(row).endswith(f"; centre without process 5 (at {level} the others)")
    made = {f.question: f for f in findings(analyze(load_run(cuda_labelled(folder))))}  # a CUDA run: measured
    assert made["Page size 1: per call and per step"].figure == figure_of(row)


def test_the_crossover_names_each_shorter_point_that_is_not_slower(tmp_path):
    """'slower at every shorter swept length' only where each is judged slower: the H200 run's p=16, L=8192 was not.
    The crossing of 1 lies above the longest shorter length whose interval lies above 1: not L=2048, at 1.0."""
    points = {("host_stride", 512, 64): 10.0, ("device_stride", 512, 64): 20.0,
              ("host_stride", 2048, 64): 10.0, ("device_stride", 2048, 64): 10.0,
              ("host_stride", 8192, 64): 10.0, ("device_stride", 8192, 64): 5.0}
    answer = crossover_answer(synthetic_run(tmp_path / "cuda", points))
    said = "faster than pre-PR from L=8192 at p=64, crossing in (512, 8192]; slower at 1 of the 2 shorter swept points"
    assert f"{said}; same at p=64, L=2048" in answer, answer
    points["device_stride", 2048, 64] = 20.0
    answer = crossover_answer(synthetic_run(tmp_path / "again", points))
    said = "from L=8192 at p=64, crossing in (2048, 8192]; slower at every shorter swept length"
    assert f"{said} (1 of 1 page sizes above 1 cross)" in answer, answer
    for length in (512, 8192):  # SGLang's default page size, swept and never crossing: the count says so
        points["host_stride", length, 1], points["device_stride", length, 1] = 10.0, 20.0
    answer = crossover_answer(synthetic_run(tmp_path / "with-p1", points))
    assert f"{said} (1 of 1 page sizes above 1 cross; p=1 does not)" in answer, answer
    for length in (512, 1024, 2048):  # three not slower: two named, the rest counted (a finding's cell stays short)
        points["host_stride", length, 64] = points["device_stride", length, 64] = 10.0
    answer = crossover_answer(synthetic_run(tmp_path / "three", points))
    assert "slower at 0 of the 3 shorter swept points; " in answer and answer.count(" at p=64, L=") == 2, answer
    assert "and 1 more (APPENDIX.md) (1 of 1 page sizes above 1 cross; p=1 does not)" in answer, answer


def test_crossings_at_several_lengths_stay_one_short_cell(tmp_path):
    """Four page sizes first judged faster at four lengths, each above a different shorter length: the finding names
    each length once with its page sizes, leaves their differing intervals to the appendix's table, and stays
    within a finding's cell; one page size's crossing at the shortest swept length is 'at or below' it."""
    lengths = (512, 2048, 8192, 32768, 131072)
    first = {16: 2048, 32: 8192, 64: 32768, 128: 131072}
    points = {}
    for p, cross in first.items():
        for length in lengths:
            points["host_stride", length, p] = 10.0
            points["device_stride", length, p] = 5.0 if length >= cross else 20.0
    points["device_stride", 512, 32] = 10.0  # a shorter point not slower: named; p=32 still crosses above 2048
    analysis = analyze(load_run(cuda_labelled(synthetic_run(tmp_path / "cuda", points))))
    assert {c.page_size: c.describe() for c in analysis.crossovers} == {
        16: "seq_len 2048 (crossing in (512, 2048])", 32: "seq_len 8192 (crossing in (2048, 8192])",
        64: "seq_len 32768 (crossing in (8192, 32768])", 128: "seq_len 131072 (crossing in (32768, 131072])"}
    answer = crossover_answer(analysis)
    assert answer.startswith("The merged PR is judged faster than pre-PR from L=2048 at p=16; L=8192 at p=32; "
                             "L=32768 at p=64; L=131072 at p=128, each crossing 1 where APPENDIX.md's crossover "
                             "table places it; slower at 9 of the 10 shorter swept points; same at p=32, L=512 "), answer
    assert len(answer) <= CELL_CHARS, len(answer)
    points["device_stride", 2048, 16] = 5.0
    points["device_stride", 512, 16] = 5.0  # p=16 now faster from the shortest swept length
    again = analyze(load_run(cuda_labelled(synthetic_run(tmp_path / "again", points))))
    assert next(c for c in again.crossovers if c.page_size == 16).describe() == "seq_len 512 (crossing at or below L=512)"
    answer = crossover_answer(again)
    assert answer.startswith("The merged PR is judged faster than pre-PR from L=512 at p=16; L=8192 at p=32; "), answer
    assert "each crossing 1 where APPENDIX.md's crossover table places it" in answer and len(answer) <= CELL_CHARS


def test_a_cuda_run_states_its_latency_findings_as_measured(tmp_path):
    points = {("host_stride", 512, 1): 10.0, ("device_stride", 512, 1): 20.0, ("host_stride", 512, 64): 10.0,
              ("device_stride", 512, 64): 5.0}
    folder = cuda_labelled(synthetic_run(tmp_path / "cuda", points))
    made = {f.question: f for f in findings(analyze(load_run(folder)))}
    assert made["Bytes per call"].status == MEASURED and "1/64" in made["Bytes per call"].figure
    page1 = made["Page size 1: per call and per step"]
    assert page1.status == MEASURED and "slower than pre-PR at 1 of 1 lengths" in page1.answer
    crossing = "faster than pre-PR from L=512 at p=64, crossing at or below L=512; no shorter length was swept (1 of 1"
    assert made["Crossover"].status == MEASURED and crossing in made["Crossover"].answer
    assert not any(q.startswith("Scheduler thread blocked") for q in made)  # no scenarios: nothing asked of them
    # the model set against the measurement at the same points, on the profile of the link the run crossed
    check = made["Model vs measurement"]
    assert check.status == MEASURED and check.answer.startswith("PCIe Gen5 x16, pageable model / measured time")
    from kvpages.core.links import profile_for
    from kvpages.schema.profiles import built_in_profiles

    profile = profile_for("Gen5 x16", "pcie pageable", built_in_profiles())
    assert profile is not None
    ratios = [r for r in analyze(load_run(folder)).ratios if r.variant == "device_stride"]
    shares = [profile.predicted_us("device_stride", r.page_size, 1, r.variant_d2h_bytes, 1, 0.0) / r.variant_median_us
              for r in ratios]
    assert f"{sig(min(shares))}-{sig(max(shares))} over 2 points" in check.answer


@needs_reference
def test_a_predicted_recommendation_gives_its_verdict_at_the_other_sizes_where_one_differs(reported_reference):
    """On a CPU run, `along` gives each other size of the cited setting's kind and page size once, below (on every
    pageable profile) or not below (on some), and REPORT.md's row shows it; `adaptive` is the merged PR from its
    threshold on (a predicted ratio of exactly 1), so choosing by length is not below at every length from there."""
    from kvpages.analysis.recommend import PREDICTED_VERDICTS, recommendations
    from kvpages.core.adaptive import DEFAULT_THRESHOLD

    analysis = reported_reference.analysis
    steps = analysis.run.scenarios
    report = (reported_reference.path / "REPORT.md").read_text()
    said = [r for r in recommendations(analysis) if r.along]
    assert said, "the reference run's candidates agree at every size: nothing to check"
    for r in said:
        assert f"| {r.where} |" in report and r.where.startswith(f"{r.setting} (other sizes: {r.along}")
        named = []
        for part in r.along.split("; "):
            verdict, sizes = part.split(" at ")
            assert verdict in ("below", "not below"), r.along
            named += [int(x) for x in sizes[2:].split(", ")]
        assert len(named) == len(set(named)), r.along  # each size once
        if (step := re.fullmatch(r"a B=(\d+) step at p=(\d+)", r.setting)) is not None:  # the other step sizes there
            there = steps[(steps["kind"] == "step") & (steps["page_size"] == int(step[2]))]
            assert set(named) <= set(there["requests"]) - {int(step[1])}, r
        rows = {r2.id[len(r.id) + 2:]: r2.verdict for r2 in recommendations(analysis) if r2.of == r.id}  # -L2048
        assert {str(x) for x in named} <= set(rows), r  # each size's verdict a row of its own (its `of` this row)
        assert all(PREDICTED_VERDICTS[v] == rows[x] for part in r.along.split("; ") for v, sizes in
                   [part.split(" at ")] for x in sizes[2:].split(", ")), (r.along, rows)
    crossed = [r for r in recommendations(analysis) if r.across]  # the other kind at that page size: each a row too
    assert {r.id for r in crossed} >= {"rec-shortcut", "rec-host-page-table"}, [r.id for r in crossed]
    for r in crossed:
        assert f"| {r.where} |" in report and r.where.endswith(f"{r.across})")
        kind, _, verdicts = r.across.partition(": ")
        prefix = {"per step": "B", "per call": "L"}[kind]
        rows = {r2.id[len(r.id) + 1:]: r2.verdict for r2 in recommendations(analysis) if r2.of == r.id}  # B128, L512
        for part in verdicts.split("; "):
            verdict, sizes = part.split(" at ")
            assert all(rows[f"{prefix}{x}"] == PREDICTED_VERDICTS[verdict] for x in sizes[2:].split(", ")), (r.id, rows)
    for r in recommendations(analysis):  # a predicted gain's range is written as every model figure's: [low-high]
        assert r.gain == f"{sig(r.ratio)} [{sig(r.ci_low)}-{sig(r.ci_high)}]" and (r.of or f"| {r.gain} |" in report)
    by_length = next(r for r in said if r.id == "rec-by-length")
    lengths = {int(x): verdict for part in by_length.along.split("; ") for verdict, sizes in [part.split(" at ")]
               for x in sizes[2:].split(", ")}
    assert lengths and all(v == "not below" for L, v in lengths.items() if L >= DEFAULT_THRESHOLD), by_length.along


def test_the_appendix_lists_the_predictions_each_finding_quotes_and_no_others(reported_reference):
    """APPENDIX.md's "Predictions behind the findings" holds, per finding, the predictions its figure quotes, against
    what the finding sets it (the hybrid step's staged strategy against per payload, not pre-PR), and none for a
    finding that quotes none (the metered bytes)."""
    from kvpages.analysis.cite import sig
    from kvpages.analysis.findings import findings

    analysis = reported_reference.analysis
    section = (reported_reference.path / "APPENDIX.md").read_text().split("## Predictions behind the findings", 1)[1]
    section = section.split("\n## ", 1)[0]
    made = findings(analysis, None)
    assert any(f.question.startswith("Per step, payloads") for f in made)
    for f in made:
        rows = [line for line in section.splitlines() if line.startswith(f"| {f.question} | `{f.id}` |")]
        assert len(rows) == len(f.predictions), f.question
        assert bool(f.predictions) == f.figure.startswith("model: "), f.question
        for p, row in zip(f.predictions, rows, strict=True):
            assert f"{p.profile.name}{' (what-if)' if p.profile.pinned else ''} {sig(p.ratio)} [" in f.figure
            assert f"| {sig(p.ratio)} [" in row, (f.question, row)


def test_a_measured_gain_of_a_pair_without_an_interval_says_so():
    """A pair of one repetition has no interval (kept as [0, inf]): its gain says so, as a finding's figure does."""
    from kvpages.analysis.recommend import MEASURED, Recommendation

    alone = Recommendation("rec-x", "do", "here", "a", "b", 1.16, 0.0, math.inf, False, MEASURED, "unclear", "")
    assert alone.gain == "1.16 (no interval)"
    assert dataclasses.replace(alone, ci_high=1.42).gain == "1.16 [0, 1.42]"


def test_findings_and_recommendations_made_once_per_baseline_of_one_loaded_run():
    """One loaded run analysed against two baselines (as `compare` and the notebook may): each analysis gets the
    findings and recommendations of its own baseline, the same as a run loaded afresh gives."""
    from kvpages.analysis.recommend import recommendations

    path = reference_runs()[-1]
    run = load_run(path)
    own, other = analyze(run), analyze(run, "device_stride")
    assert findings(own) is findings(own)  # made once
    assert findings(other) != findings(own)
    assert findings(other) == findings(analyze(load_run(path), "device_stride"))
    assert recommendations(own) and recommendations(other) == ()  # the candidates are set against pre-PR only


@needs_reference
def test_the_bytes_caption_names_adaptive_where_it_copies_every_index(reported_reference):
    """`adaptive` is host stride below its threshold: there it hands over L indices, off the ideal line, and the
    caption of the reference run's bytes chart says at how many points (it once said every variant but pre-PR sat on
    the line)."""
    from kvpages.core.adaptive import ADAPTIVE, DEFAULT_THRESHOLD

    rows = reported_reference.analysis.run.ok_rows()
    mine = rows[rows["variant"] == ADAPTIVE]
    below = mine[(mine["seq_len"] < DEFAULT_THRESHOLD) & (mine["page_size"] > 1)]
    assert len(below) and (below["d2h_bytes"] == below["seq_len"] * 4).all()
    report = (reported_reference.path / "REPORT.md").read_text()
    assert f"and `{ADAPTIVE}` ({len(below)} of {len(mine)} points); a variant that hands over 0 bytes" in report


def test_a_step_whose_candidate_did_not_time_leaves_that_size_out_of_its_recommendation(reported_reference, tmp_path):
    """A candidate's row at one step that ran out of memory (no counters, so nothing to price) leaves that step out of
    the recommendation's other sizes; the report is still made (its counters read as None raised a TypeError)."""
    from kvpages.analysis.recommend import BATCHED, recommendations
    from kvpages.render.report import render

    run = tmp_path / reported_reference.path.name
    shutil.copytree(reported_reference.path, run)
    frame = pd.read_csv(run / "scenarios.csv")
    hit = (frame["variant"] == BATCHED) & (frame["scenario"] == "step-B8-lognormal_4096_1.0_65536-p64-int32")
    assert hit.sum() == 1
    frame.loc[hit, "status"] = "out_of_memory"
    frame.loc[hit, ["d2h_bytes", "d2h_transfers", "host_syncs", "device_ops"]] = None
    frame.to_csv(run / "scenarios.csv", index=False)
    analysis = analyze(load_run(run))
    ids = {r.id for r in recommendations(analysis)}
    assert {"rec-batch-per-step", "rec-batch-per-step-B32"} <= ids and "rec-batch-per-step-B8" not in ids, ids
    assert "## What to do" in render(analysis)


def test_other_sizes_are_named_by_size_and_steps_sharing_a_b_by_their_scenario():
    """A row per other size is named by its size ('L2048', 'B8'); where two steps share a B (two distributions of
    lengths), every step by its scenario, and the calls keep their lengths (they were all named '' once)."""
    from kvpages.analysis.recommend import Setting, size_names

    calls = [Setting("a", "b", 1, seq_len=L) for L in (2048, 8192)]
    steps = [Setting("a", "b", 1, scenario=f"step-B{b}-{d}", requests=b) for b, d in ((8, "x"), (32, "x"))]
    assert size_names(calls + steps) == ["L2048", "L8192", "B8", "B32"]
    twice = steps + [Setting("a", "b", 1, scenario="step-B8-y", requests=8)]
    assert size_names(calls + twice) == ["L2048", "L8192", "step-B8-x", "step-B32-x", "step-B8-y"]


def test_the_gpu_runs_figure_beside_a_predicted_recommendation_says_when_it_misses_the_range():
    from kvpages.analysis.recommend import MEASURED, PREDICTED, Recommendation
    from kvpages.render.recommend import measured_cell

    predicted = Recommendation("rec-x", "do", "here", "a", "b", 0.106, 0.0465, 0.263, True, PREDICTED, "below", "")
    inside = dataclasses.replace(predicted, ratio=0.05, ci_low=0.0412, ci_high=0.0592, basis=MEASURED, verdict="faster")
    assert measured_cell(predicted, inside) == "0.0500 [0.0412, 0.0592] faster"  # the intervals overlap
    outside = dataclasses.replace(inside, ratio=0.586, ci_low=0.568, ci_high=0.617)
    assert measured_cell(predicted, outside) == "0.586 [0.568, 0.617] faster; outside the predicted range"
    assert measured_cell(predicted, None) == "-"
