"""The docs derive from the registries: the README lists every variant and preset and links every docs page,
docs/guide.md holds the options table written from OPTIONS, the docs name every option and `kvpages` command, and
results/README.md every column."""

from __future__ import annotations

import argparse
import re

from conftest import REPO, reference_runs

from kvpages.cli import build_parser
from kvpages.core.options import OPTIONS, with_options_table
from kvpages.core.presets import PRESETS
from kvpages.measure.variants import all_variants
from kvpages.schema.ranks import CONTENTION_COLUMNS
from kvpages.schema.rows import RATIO_COLUMNS, TABLES

README = (REPO / "README.md").read_text()
PAGES = sorted((REPO / "docs").glob("*.md"))
DOCS = "\n".join([README] + [page.read_text() for page in PAGES])


def test_readme_starts_with_the_two_commands():
    first_block = README.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in first_block.strip().splitlines()] == ["make bench", "make test"]


def test_readme_lists_every_variant_with_its_description_and_requirements():
    for v in all_variants():
        row = next(line for line in README.splitlines() if line.startswith(f"| `{v.name}` |"))
        assert v.description in row
        assert ("cuda" in row) == ("cuda" in v.requires)


def test_readme_preset_table_matches_the_presets():
    rows: dict[str, str] = {}
    for line in README.splitlines():  # the first table that names the presets is the sweep's
        if m := re.match(r"\| `(\w+)` \|", line):
            rows.setdefault(m.group(1), line)
    for name, preset in PRESETS.items():
        sweep = preset.sweep
        cells = [c.strip() for c in rows[name].split("|")[1:-1]]
        numbers = {int(n) for n in re.findall(r"\d+", cells[1])}
        if cells[1].startswith("default +"):
            numbers |= set(PRESETS["default"].sweep.seq_lens)
        assert set(sweep.seq_lens) == numbers
        assert {int(n) for n in re.findall(r"\d+", cells[2])} == set(sweep.page_sizes)
        assert {d.strip() for d in cells[3].split(",")} == set(sweep.dtypes)
        assert cells[4].startswith(f"{sweep.time_budget_s:g} s")
        assert cells[5] == f"{sweep.processes} x {sweep.repetitions // sweep.processes} x {sweep.passes}"


def test_results_readme_documents_every_column():
    text = (REPO / "results" / "README.md").read_text()
    from kvpages.analysis.recommend import Recommendation
    from kvpages.schema.rows import columns

    tables = [column for table in TABLES.values() for column in table.columns + table.sample_columns]
    for column in tables + list(RATIO_COLUMNS + CONTENTION_COLUMNS) + list(columns(Recommendation)):
        assert f"`{column}`" in text, column


def test_the_guides_figures_of_the_reference_report_are_read_from_it():
    """docs/guide.md says how long the reference run's REPORT.md is and that its charts come within its first lines:
    both as the committed report has them (the length had said 124 lines where it held 164)."""
    guide = (REPO / "docs" / "guide.md").read_text()
    within = re.search(r"captioned charts \(within the first (\d+) lines\)", guide)
    length = re.search(r"(\d+) lines on the\s+reference\s+run", guide)
    assert within and length
    report = (reference_runs()[-1] / "REPORT.md").read_text().splitlines()
    assert int(length.group(1)) == len(report)
    charts = [number for number, line in enumerate(report, 1) if line.startswith("![")]
    assert charts and max(charts) <= int(within.group(1))


def test_ci_runs_the_readme_test_command():
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_readme_is_at_most_12_kb_and_links_every_docs_page():
    assert len(README.encode()) <= 12 * 1024
    assert PAGES
    for page in PAGES:
        assert f"](docs/{page.name})" in README, page.name


def test_every_relative_link_in_the_docs_leads_to_a_file():
    for page in [REPO / "README.md", *PAGES]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_the_guide_holds_the_options_table_written_from_options():
    guide = REPO / "docs" / "guide.md"
    text = guide.read_text()
    assert with_options_table(text, str(guide)) == text, "stale: run `kvpages options --markdown docs/guide.md`"


def test_the_docs_name_every_option_and_every_kvpages_command():
    for option in OPTIONS:
        assert f"`{option.flag}`" in DOCS, option.flag
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert len(commands) >= 10
    for command in commands:
        assert f"kvpages {command}" in DOCS, command
