"""Loading, bootstrap, crossover, compare and the analysis CLI, on real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, reference_runs, synthetic_run
from kvpages.analysis import bootstrap_ratio, compare_runs, crossovers, load_run, ratio_points
from kvpages.cli import main
from kvpages.report import render

SEQ = (512, 8192, 131072)


def medians(device_stride_factor: dict[tuple[int, int], float]) -> dict:
    out = {}
    for (seq_len, page_size), factor in device_stride_factor.items():
        out[("host_stride", seq_len, page_size)] = 10.0
        out[("device_stride", seq_len, page_size)] = 10.0 * factor
    return out


@pytest.fixture
def crossing_run(tmp_path: Path) -> Path:
    # page 64: device_stride loses at 512, wins from 8192; page 1: never wins
    factors = {(512, 64): 1.5, (8192, 64): 0.6, (131072, 64): 0.2, (512, 1): 1.4, (8192, 1): 1.3, (131072, 1): 1.2}
    return synthetic_run(tmp_path / "run-a", medians(factors))


def test_bootstrap_ratio_covers_the_truth():
    rng = np.random.default_rng(1)
    base = 10 * (1 + 0.05 * rng.standard_normal(300))
    same = 10 * (1 + 0.05 * rng.standard_normal(300))
    double = 20 * (1 + 0.05 * rng.standard_normal(300))
    ratio, lo, hi = bootstrap_ratio(base, same)
    assert lo < 1 < hi and lo < ratio < hi
    ratio, lo, hi = bootstrap_ratio(base, double)
    assert 1.9 < lo < ratio < hi < 2.1
    assert bootstrap_ratio(base, double) == bootstrap_ratio(base, double)  # seeded


def test_crossover_per_page_size_including_not_within_range(crossing_run):
    found = {c.page_size: c for c in crossovers(ratio_points(load_run(crossing_run)))}
    assert found[64].seq_len == 8192 and found[64].describe() == "seq_len 8192"
    assert found[1].seq_len is None
    assert found[1].describe() == "not within the swept range (512..131072)"


def test_report_numbers_come_from_the_run(crossing_run):
    run = load_run(crossing_run)
    text = render(run)
    assert "| 64 | int32 | fragmented | seq_len 8192 |" in text
    assert "| 1 | int32 | fragmented | not within the swept range (512..131072) |" in text
    assert "no PCIe link was crossed" in text
    ratio = next(p for p in ratio_points(run) if (p.page_size, p.seq_len) == (64, 131072))
    assert f"| {ratio.ratio:.3f} | [{ratio.ci_low:.3f}, {ratio.ci_high:.3f}] |" in text
    assert "pytest bench/" in text


def test_noisy_rows_and_skipped_variants_become_caveats(tmp_path):
    folder = synthetic_run(tmp_path / "noisy", medians({(512, 16): 1.0}), spread=0.3)
    text = render(load_run(folder))
    assert "Noisy rows (IQR/median >= 10%)" in text


def test_compare_verdicts_and_the_gate(tmp_path, capsys):
    a = synthetic_run(tmp_path / "a", medians({(512, 16): 1.0, (8192, 16): 1.0, (131072, 16): 1.0}), seed=1)
    b_medians = medians({(512, 16): 1.0, (8192, 16): 1.0})
    b_medians[("device_stride", 8192, 16)] = 13.0  # 30% slower
    b_medians[("host_stride", 512, 16)] = 7.0  # 30% faster
    b_medians[("device_stride", 2048, 16)] = 5.0  # only in B
    b = synthetic_run(tmp_path / "b", b_medians, seed=2)
    result = compare_runs(load_run(a), load_run(b))
    verdicts = {p.key[0] + str(p.key[3]): p.verdict for p in result.points}
    assert verdicts == {"host_stride512": "faster", "device_stride512": "same within noise",
                        "host_stride8192": "same within noise", "device_stride8192": "slower"}
    assert [k[3] for k in result.only_a] == [131072, 131072] and [k[3] for k in result.only_b] == [2048]
    assert main(["compare", str(a), str(b), "--fail-above", "20"]) == 1
    out = capsys.readouterr()
    assert "FAIL: 1 point(s) slower by more than 20% beyond noise" in out.err
    assert "only in A: host_stride int32 fragmented 131072 16" in out.out
    assert "only in B: device_stride int32 fragmented 2048 16" in out.out
    assert main(["compare", str(a), str(b), "--fail-above", "40"]) == 0
    assert main(["compare", str(a), str(b)]) == 0


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run the kvpages CLI in a fresh interpreter in which `import torch` fails."""
    code = "import sys; sys.modules['torch'] = None; from kvpages.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda t: t / "missing", "no such file or folder"),
        (lambda t: (t / "empty").mkdir() or t / "empty", "no results.csv here; not a kvpages run folder"),
        (lambda t: write(t / "e.csv", b""), "e.csv: empty file"),
        (lambda t: write(t / "b.csv", b"\x89PNG\r\n\x1a\n\x00\x00"), "b.csv: binary file"),
        (lambda t: write(t / "c.csv", b"variant,seq_len\nx,1\n"), "c.csv: missing required columns: device, device_name"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, make, words):
    target = make(tmp_path)
    for command in (["plot"], ["report"], ["summary"]):
        done = cli(*command, str(target))
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1 and words in done.stderr and "Traceback" not in done.stderr
        assert done.stderr.startswith(f"kvpages: error: {target}")


def test_nothing_to_plot_and_an_unwritable_folder_are_one_line_errors(tmp_path, crossing_run):
    skipped_only = tmp_path / "skipped"
    skipped_only.mkdir()
    (skipped_only / "meta.json").write_bytes((crossing_run / "meta.json").read_bytes())
    lines = (crossing_run / "results.csv").read_text().splitlines()
    (skipped_only / "results.csv").write_text(lines[0] + "\n" + lines[1].replace(",ok,", ",skipped,") + "\n")
    done = cli("plot", str(skipped_only))
    assert done.returncode == 2 and "no timed rows (status ok), so there is nothing to plot" in done.stderr
    (crossing_run / "latency_int32_fragmented.png").mkdir()  # a folder where a chart must go
    done = cli("plot", str(crossing_run))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_incompatible_schema_version_and_nothing_in_common(tmp_path, crossing_run):
    meta = json.loads((crossing_run / "meta.json").read_text())
    meta["schema_version"] = 99
    write(tmp_path / "old" / "meta.json", json.dumps(meta).encode())
    write(tmp_path / "old" / "results.csv", (crossing_run / "results.csv").read_bytes())
    done = cli("report", str(tmp_path / "old"))
    assert done.returncode == 2 and "meta.json: schema version 99; this kvpages reads schema version 1" in done.stderr
    other = synthetic_run(tmp_path / "other", {("host_stride", 77, 7): 1.0})
    done = cli("compare", str(crossing_run), str(other))
    assert done.returncode == 2 and "no timed (variant, point) in common" in done.stderr
    done = cli("compare", str(crossing_run), str(crossing_run), "--fail-above", "-3")
    assert done.returncode == 2 and "--fail-above: -3.0 must be a percentage >= 0" in done.stderr
    done = cli("frobnicate")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "invalid choice: 'frobnicate'" in done.stderr


@pytest.mark.skipif(not reference_runs(), reason="no run committed under results/")
def test_plot_report_compare_on_the_committed_reference_run_without_torch(tmp_path):
    import shutil

    run = tmp_path / reference_runs()[-1].name
    shutil.copytree(reference_runs()[-1], run)
    done = cli("plot", str(run), "--svg")
    assert done.returncode == 0, done.stderr
    charts = [Path(line) for line in done.stdout.splitlines()]
    assert {p.suffix for p in charts} == {".png", ".svg"} and all(p.stat().st_size > 1000 for p in charts)
    done = cli("report", str(run))
    assert done.returncode == 0, done.stderr
    assert (run / "REPORT.md").read_text() == done.stdout.rstrip("\n") + "\n"
    assert "## Crossover" in done.stdout
    done = cli("compare", str(run), str(run / "results.csv"), "--fail-above", "0")
    assert done.returncode == 0, done.stderr
    assert "slower" not in done.stdout.split("points:")[-1].split(",")[1] or " 0 slower" in done.stdout
    done = cli("summary", str(run))
    assert done.returncode == 0 and "page_size=64" in done.stdout


def test_kvpages_list_prints_the_registry():
    from kvpages.variants import all_variants

    done = subprocess.run([sys.executable, "-m", "kvpages", "list"], capture_output=True, text=True, check=True)
    for v in all_variants():
        assert v.name in done.stdout and v.description in done.stdout


def test_a_cuda_run_compares_the_model_with_the_measurement(tmp_path):
    from kvpages.links import profile_for

    folder = synthetic_run(tmp_path / "cuda", medians({(8192, 64): 0.5}))
    csv = (folder / "results.csv").read_text().replace("none (cpu)", "pcie pageable")
    (folder / "results.csv").write_text(csv)
    meta = json.loads((folder / "meta.json").read_text())
    meta["environment"].update(device="cuda", pcie_link="Gen5 x16 (max Gen5 x16)", link_crossed=True,
                               link_note="CUDA run: d2h_bytes crossed the device-host link.")
    (folder / "meta.json").write_text(json.dumps(meta))
    run = load_run(folder)
    profile = profile_for("Gen5 x16 (max Gen5 x16)", "pcie pageable")
    assert profile is not None and profile.name == "pcie5_pageable"
    assert profile_for("Gen4 x16", "pcie pinned").name == "pcie4_pinned"
    assert profile_for(None, "pcie pinned") is None and profile_for("Gen5 x16", "none (cpu)") is None
    text = render(run)
    assert "### Model vs measurement" in text and "no PCIe link was crossed" not in text
    host = run.ok_rows().set_index("variant").loc["host_stride"]
    modeled = profile.modeled_us(host["d2h_bytes"], host["d2h_transfers"])
    assert f"| {modeled:.2f} | {host['median_us'] - modeled:+.2f} |" in text
