"""The committed notebook runs top to bottom in a real kernel against the committed reference run."""

from __future__ import annotations

import nbformat
import pytest
from conftest import REPO, reference_runs
from nbclient import NotebookClient

NOTEBOOK = REPO / "notebooks" / "analysis.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


@pytest.mark.skipif(not reference_runs(), reason="no run committed under results/")
def test_notebook_executes_against_the_reference_run(monkeypatch, tmp_path):
    monkeypatch.delenv("KVPAGES_RUN", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's temporary files: its chart scratch folder must not stay
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    text = "\n".join(
        out.get("text", "") + str(out.get("data", {}).get("text/plain", "")) + str(out.get("data", {}).get("text/markdown", ""))
        for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
    )
    sweeps = sorted(p.parent for p in (REPO / "results").glob("*/meta.json") if not (p.parent / "ranks.csv").exists())
    assert sweeps[-1].name in text  # the newest sweep under results/, as the notebook picks it (`make bench`'s, once run)
    assert "page_size=64" in text and "crossover" in text
    images = [out for cell in nb.cells for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
    assert len(images) >= 4
    errors = [out for cell in nb.cells for out in cell.get("outputs", []) if out.output_type == "error"]
    assert errors == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("kvpages-")] == []
