"""Every cookbook notebook is built from its checked percent source (``cookbook/*.py``), matches
it, and runs top to bottom offline; any cell error fails the test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

COOKBOOK = Path(__file__).parents[1] / "cookbook"
NAMES = ["benchmark", "langchain_quickstart", "llamaindex_quickstart", "robustrag_certification"]


def _build() -> object:
    sys.path.insert(0, str(COOKBOOK))
    try:
        import build
    finally:
        sys.path.remove(str(COOKBOOK))
    return build


def test_each_notebook_has_its_source() -> None:
    assert sorted(_build().sources()) == NAMES  # type: ignore[attr-defined]
    assert sorted(p.stem for p in COOKBOOK.glob("*.ipynb")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_notebook_matches_its_source_and_keeps_outputs(name: str) -> None:
    import nbformat

    built = _build().notebook(COOKBOOK / f"{name}.py")  # type: ignore[attr-defined]
    saved = nbformat.read(COOKBOOK / f"{name}.ipynb", as_version=4)
    assert [(c.cell_type, c.source) for c in saved.cells] == [
        (c.cell_type, c.source) for c in built.cells
    ], f"{name}.ipynb is stale: run .venv/bin/python cookbook/build.py {name}"
    assert any(c.get("outputs") for c in saved.cells if c.cell_type == "code"), "outputs saved"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_executes(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's temporary folders go with the test
    build = _build()
    nb = build.execute(build.notebook(COOKBOOK / f"{name}.py"))  # type: ignore[attr-defined]
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
