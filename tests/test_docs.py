"""The docs derive from the registries: the README lists every variant and preset, results/README.md every column."""

from __future__ import annotations

import re

from conftest import REPO

from kvpages.core.options import OPTIONS
from kvpages.core.presets import PARTIAL_PAGE_LEN, PRESETS
from kvpages.measure.variants import all_variants
from kvpages.schema.ranks import CONTENTION_COLUMNS
from kvpages.schema.rows import (
    COLUMNS,
    RANK_COLUMNS,
    RANK_SAMPLE_COLUMNS,
    RATIO_COLUMNS,
    SAMPLE_COLUMNS,
    SCENARIO_COLUMNS,
    SCENARIO_SAMPLE_COLUMNS,
)

README = (REPO / "README.md").read_text()


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
        assert set(sweep.seq_lens) - {PARTIAL_PAGE_LEN} == numbers - {PARTIAL_PAGE_LEN}  # README gains it (i24 notes)
        assert {int(n) for n in re.findall(r"\d+", cells[2])} == set(sweep.page_sizes)
        assert {d.strip() for d in cells[3].split(",")} == set(sweep.dtypes)
        assert cells[4].startswith(f"{sweep.time_budget_s:g} s")
        assert cells[5] == f"{sweep.processes} x {sweep.repetitions // sweep.processes} x {sweep.passes}"


def test_results_readme_documents_every_column():
    text = (REPO / "results" / "README.md").read_text()
    for column in (COLUMNS + SAMPLE_COLUMNS + RATIO_COLUMNS + SCENARIO_COLUMNS + SCENARIO_SAMPLE_COLUMNS + RANK_COLUMNS
                   + RANK_SAMPLE_COLUMNS + CONTENTION_COLUMNS):
        assert f"`{column}`" in text, column


def test_ci_runs_the_readme_test_command():
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_readme_documents_every_option():
    for option in OPTIONS:
        assert f"`{option.flag}`" in README, option.flag
