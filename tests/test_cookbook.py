"""Every cookbook notebook runs top to bottom (offline); any cell error fails the test."""

from __future__ import annotations

from pathlib import Path

import pytest

COOKBOOK = Path(__file__).parents[1] / "cookbook"
NOTEBOOKS = sorted(p.name for p in COOKBOOK.glob("*.ipynb"))


def test_the_four_notebooks_are_there() -> None:
    assert set(NOTEBOOKS) == {
        "benchmark.ipynb",
        "langchain_quickstart.ipynb",
        "llamaindex_quickstart.ipynb",
        "robustrag_certification.ipynb",
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes(name: str) -> None:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(COOKBOOK / name, as_version=4)
    assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "outputs are saved"
    client = NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(COOKBOOK)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
