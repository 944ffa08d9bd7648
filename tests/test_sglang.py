"""--kv-sglang: SGLang's own kv_to_page_indices, read by its source from trees the tests write, and from two real
releases when the package index is reachable. Registration runs in subprocesses, so this process's registry
stays as it is."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from conftest import built_once, synthetic_run

from kvpages.analysis.findings import findings
from kvpages.analysis.predict import point_predictions
from kvpages.analysis.ratios import analyze
from kvpages.analysis.wording import CELL_CHARS
from kvpages.cli import main
from kvpages.core.options import BenchOptions
from kvpages.core.sglang import COMMON, load_all, load_function, parse_specs, resolve
from kvpages.schema.reader import load_run
from kvpages.schema.rows import RATIOS_CSV

BENCH = (Path(__file__).parents[1] / "bench" / "test_d2h.py").read_text()
FAST = ("--benchmark-only", "--kv-time-budget", "0.001", "-p", "no:cacheprovider", "--kv-device", "cpu",
        "--kv-breakdown", "off", "--kv-scenarios", "none", "--kv-remeasure-budget", "0")  # rounds: test_remeasure.py

OLD = '''from __future__ import annotations

import numpy as np
import torch


def kv_to_page_indices(kv_indices: np.ndarray, page_size: int):
    # The page is guaranteed to be full except the last page.
    if page_size == 1:
        return kv_indices

    return kv_indices[::page_size] // page_size
'''
NEW = '''from __future__ import annotations

import numpy as np
import torch


def kv_to_page_indices(kv_indices: torch.Tensor, page_size: int) -> np.ndarray:
    return (kv_indices[::page_size] // page_size).cpu().numpy()
'''


def tree(root: Path, source: str, version: str | None = None, python_folder: bool = True) -> Path:
    """An SGLang-like source tree: <root>/python/sglang/srt/mem_cache/common.py (and sglang/version.py)."""
    base = root / "python" if python_folder else root
    (base / COMMON).parent.mkdir(parents=True)
    (base / COMMON).write_text(source)
    if version:
        (base / "sglang" / "version.py").write_text(f'__version__ = "{version}"\n')
    return root


def test_specs_are_checked_for_their_form():
    assert parse_specs("--kv-sglang", "installed,0.5.15,./here,/abs/path") == ("installed", "0.5.15", "./here",
                                                                               "/abs/path")
    with pytest.raises(ValueError, match=r"--kv-sglang: 'latest' is not a SPEC; valid: 'installed', a path"):
        parse_specs("--kv-sglang", "latest")


def test_the_option_round_trips_for_repro_commands():
    options = BenchOptions(sglang=("0.5.15", "/src/sglang"))
    assert options.to_args() == ("--kv-sglang", "0.5.15,/src/sglang")
    assert BenchOptions.parse(dict(zip(options.to_args()[::2], options.to_args()[1::2], strict=True)).get) == options


def test_a_checkout_and_its_python_folder_resolve_to_their_common_py(tmp_path):
    root = tree(tmp_path / "sglang-pr31173", NEW, "0.5.23")
    for spec in (str(root), str(root / "python")):
        source = resolve(spec)
        assert source.file == (root / "python" / COMMON).resolve()
        assert source.name == "sglang@sglang-pr31173"  # a path is labelled by its checkout, not its version


def test_the_signature_sets_the_calling_convention(tmp_path):
    old = load_function(resolve(str(tree(tmp_path / "old", OLD))))
    new = load_function(resolve(str(tree(tmp_path / "new", NEW, python_folder=False))))
    assert (old.convention, new.convention) == ("numpy", "tensor")
    assert old.code.startswith("def kv_to_page_indices(kv_indices: np.ndarray") and old.line == 7


@pytest.mark.parametrize(("source", "words"), [
    ("def other(x):\n    return x\n", "has no top-level function kv_to_page_indices; its top-level functions: other"),
    ("import numpy as np\ndef kv_to_page_indices(kv_indices: list, page_size: int):\n    return kv_indices\n",
     "the first parameter's annotation is list; kvpages places np.ndarray"),
    ("def kv_to_page_indices(kv_indices, page_size):\n    return kv_indices\n",
     "the first parameter's annotation is no annotation"),
    ("import torch\ndef kv_to_page_indices(kv: torch.Tensor, page_size: int, req: int):\n    return kv\n",
     "cannot place the signature kv_to_page_indices(kv: torch.Tensor, page_size: int, req: int)"),
    ("import torch\nasync def kv_to_page_indices(kv: torch.Tensor, page_size: int):\n    return kv\n", "is async"),
    ("import torch\ndef kv_to_page_indices(kv: torch.Tensor, page_size: int):\n    return helper(kv)\n",
     "uses helper, defined elsewhere in the file"),
    ("def kv_to_page_indices(:\n", "cannot read it as Python"),
])
def test_a_file_kvpages_cannot_use_is_an_error_naming_it_and_what_it_found(tmp_path, source, words):
    root = tree(tmp_path / "bad", source)
    with pytest.raises(ValueError) as info:
        load_function(resolve(str(root)))
    assert str(root / "python" / COMMON) in str(info.value) and words in str(info.value)


def test_two_specs_that_make_one_name_are_refused(tmp_path):
    root = tree(tmp_path / "same", NEW)
    with pytest.raises(ValueError, match="both make the variant sglang@same"):
        load_all((str(root), str(root / "python")))


def test_a_bad_source_is_a_usage_error_before_anything_runs(pytester, tmp_path):
    pytester.makepyfile(test_kv_sweep=BENCH)
    root = tree(tmp_path / "bad", "def nothing():\n    pass\n")
    result = pytester.runpytest(*FAST, "--kv-sglang", str(root))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--kv-sglang {root}: {root / 'python' / COMMON} has no top-level function "
                                 "kv_to_page_indices*"])
    assert not (pytester.path / "results").exists()


def test_offline_the_error_names_the_path_to_pass_instead(pytester, tmp_path, monkeypatch):
    pytester.makepyfile(test_kv_sweep=BENCH)
    monkeypatch.setenv("KVPAGES_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # nothing to download from: what an offline machine sees
    result = pytester.runpytest(*FAST, "--kv-sglang", "0.5.15")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*could not fetch sglang==0.5.15 with pip download*offline, pass a path instead*"
                                 f"*{tmp_path / 'cache' / 'sglang' / '0.5.15'}*"])


def test_source_trees_run_as_variants_beside_the_builtin_ones(pytester, tmp_path):
    """Old (numpy input) and new (tensor input) conventions, metered and checked like any variant; a wrong
    function is a mismatch row; every repro command carries the --kv-sglang that made it."""
    pytester.makepyfile(test_kv_sweep=BENCH)
    old, new = tree(tmp_path / "old", OLD), tree(tmp_path / "new", NEW)
    wrong = tree(tmp_path / "wrong", NEW.replace("// page_size)", "// page_size + 1)"))
    specs = f"{old},{new},{wrong}"
    result = pytester.runpytest_subprocess(*FAST, "--kv-sglang", specs, "--kv-seq-lens", "300", "--kv-page-sizes",
                                           "1,16", "--kv-variants", "host_stride,sglang@old,sglang@new,sglang@wrong",
                                           "--kv-repetitions", "1", "--kv-passes", "1")
    result.assert_outcomes(passed=6, failed=2)
    run = load_run(next((pytester.path / "results").iterdir()))
    rows = run.rows.set_index(["variant", "page_size"])
    for page_size in (1, 16):
        assert rows.loc[("sglang@old", page_size), "d2h_bytes"] == 300 * 4  # copies every token first
        assert rows.loc[("sglang@new", page_size), "d2h_bytes"] == -(-300 // page_size) * 4
        assert rows.loc[("sglang@wrong", page_size), "status"] == "mismatch"
    assert (rows["repro"].str.contains(f"--kv-sglang {specs}")).all()


@pytest.fixture(scope="module")
def releases(request: pytest.FixtureRequest):
    """0.5.15 and 0.5.16 from the package index, into a cache of these tests' own, fetched once per session
    (`built_once`); skipped when it is unreachable."""
    def fetch(cache: Path) -> None:
        try:
            load_all(RELEASES, cache / "sglang")
        except ValueError as exc:
            if "could not fetch" not in str(exc):
                raise
            (cache / "unreachable").write_text(str(exc))

    cache = built_once(request.config, "sglang-releases", fetch)
    if (cache / "unreachable").exists():
        pytest.skip(f"the package index is not reachable: {(cache / 'unreachable').read_text()}")
    return cache, load_all(RELEASES, cache / "sglang")  # read from the cache


RELEASES = ("0.5.15", "0.5.16")


@pytest.mark.early
def test_two_real_releases_are_read_by_their_source(releases):
    _, (old, new) = releases
    assert (old.source.name, old.convention) == ("sglang@0.5.15", "numpy")
    assert "if page_size == 1:" in old.code  # 0.5.15 returns early at page size 1
    assert (new.source.name, new.convention) == ("sglang@0.5.16", "tensor")
    assert "return (kv_indices[::page_size] // page_size).cpu().numpy()" in new.code


def test_two_real_releases_run_beside_host_stride_and_device_stride(releases, pytester, monkeypatch):
    cache, _ = releases
    monkeypatch.setenv("KVPAGES_CACHE", str(cache))  # fetched once: the run reads the cache, no download
    pytester.makepyfile(test_kv_sweep=BENCH)
    result = pytester.runpytest_subprocess(*FAST, "--kv-sglang", "0.5.15,0.5.16", "--kv-seq-lens", "4096",
                                           "--kv-page-sizes", "1,64", "--kv-repetitions", "1", "--kv-passes", "1",
                                           "--kv-variants", "host_stride,device_stride,sglang@0.5.15,sglang@0.5.16")
    result.assert_outcomes(passed=8)
    rows = load_run(next((pytester.path / "results").iterdir())).rows.set_index(["variant", "page_size"])
    for page_size in (1, 64):
        assert rows.loc[("sglang@0.5.15", page_size), "d2h_bytes"] == rows.loc[("host_stride", page_size), "d2h_bytes"]
        assert rows.loc[("sglang@0.5.16", page_size), "d2h_bytes"] == rows.loc[("device_stride", page_size),
                                                                               "d2h_bytes"]


def checkout(folder: Path, source: str) -> tuple[Path, str]:
    """A real git checkout of an SGLang-like tree, committed; with its short commit."""
    tree(folder, source)
    git = ("git", "-C", str(folder), "-c", "user.name=kvpages", "-c", "user.email=kvpages@example.invalid")
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "kv_to_page_indices")):
        subprocess.run([*git, *args], check=True, capture_output=True)
    return folder, subprocess.run([*git, "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                                  text=True).stdout.strip()


def test_checkouts_in_folders_of_one_name_are_labelled_apart_by_their_commit(tmp_path):
    (a, first), (b, second) = checkout(tmp_path / "a" / "sglang", OLD), checkout(tmp_path / "b" / "sglang", NEW)
    assert [f.source.name for f in load_all((str(a), str(b)))] == [f"sglang@sglang-{first}", f"sglang@sglang-{second}"]
    assert [f.source.name for f in load_all((str(a),))] == ["sglang@sglang"]  # alone, the folder's name
    c, d = tree(tmp_path / "c" / "same", NEW), tree(tmp_path / "d" / "same", NEW)  # not git checkouts
    with pytest.raises(ValueError, match="both make the variant sglang@same, and no git commit tells them apart"):
        load_all((str(c), str(d)))


def test_an_unknown_baseline_is_a_usage_error_naming_the_valid_ones(pytester):
    pytester.makepyfile(test_kv_sweep=BENCH)
    result = pytester.runpytest(*FAST, "--kv-baseline", "sglang@nowhere")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kv-baseline: unknown variant 'sglang@nowhere'; valid: host_stride, device_stride*"])
    assert not (pytester.path / "results").exists()


def test_a_baseline_of_one_s_own_reaches_ratios_findings_citations_and_compare(pytester, tmp_path, capsys):
    """--kv-baseline sglang@old: every ratio is against it, the findings ask whether sglang@new is faster than it
    (priced by the model from what each moved: sglang@old copies every token index, so its stride is host work), the
    ids and repro commands carry it, and compare takes it from the runs, refusing a run against another."""
    pytester.makepyfile(test_kv_sweep=BENCH)
    old, new = tree(tmp_path / "old", OLD), tree(tmp_path / "new", NEW)
    result = pytester.runpytest_subprocess(*FAST, "--kv-sglang", f"{old},{new}", "--kv-baseline", "sglang@old",
                                           "--kv-variants", "device_stride,sglang@old,sglang@new", "--kv-seq-lens",
                                           "300", "--kv-page-sizes", "1,16", "--kv-repetitions", "2", "--kv-passes",
                                           "1", "--kv-analyze")
    result.assert_outcomes(passed=6)
    folder = next((pytester.path / "results").iterdir())
    ratios = pd.read_csv(folder / RATIOS_CSV)
    assert set(ratios["baseline"]) == {"sglang@old"} and ratios["id"].str.endswith("-vs-sglang@old").all()
    assert ratios["repro"].str.contains("--kv-baseline sglang@old").all()
    analysis = analyze(load_run(folder))
    assert "sglang@old" in analysis.host_work and "sglang@new" not in analysis.host_work
    r = next(r for r in analysis.ratios_of("sglang@new") if r.page_size == 16)
    twin = analysis.time_band("sglang@old", r.dtype, r.layout, 1, r.seq_len)  # the same copy at p=1, no stride
    assert twin is not None
    stride = max(0.0, r.baseline_median_us - twin.ratio)
    for p in point_predictions(analysis, r):  # sglang@old: its measured stride, no device op; sglang@new: one op
        assert p.baseline_us == pytest.approx(stride + p.profile.modeled_us(r.baseline_d2h_bytes, 1, 0))
        assert p.variant_us == pytest.approx(p.profile.modeled_us(r.variant_d2h_bytes, 1, 1))
    first = findings(analysis)[0]
    assert first.question == "sglang@new vs sglang@old" and first.answer.startswith("Predicted (model) at ")
    assert "priced at one device op per call (sglang@), blind to a path it skips" in first.answer  # a shortcut, say
    assert len(first.answer) <= CELL_CHARS, first.answer
    assert f"`{first.id}`" in (folder / "REPORT.md").read_text() and first.id.endswith("-vs-sglang@old")
    assert main(["cite", str(folder), first.id]) == 0
    assert "sglang@new / sglang@old" in capsys.readouterr().out
    twin = tmp_path / "twin"  # a copy: one run given twice is refused
    shutil.copytree(folder, twin)
    assert main(["compare", str(folder), str(twin)]) == 0
    assert "each variant / sglang@old within its run" in capsys.readouterr().out
    other = synthetic_run(tmp_path / "default", {("sglang@new", 300, 16): 1.0, ("host_stride", 300, 16): 1.0})
    assert main(["compare", str(other), str(folder)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
