"""Build the cookbook notebooks from their checked sources and execute them, saving outputs.

The source of each notebook is a jupytext percent file beside it (``langchain_quickstart.py``
-> ``langchain_quickstart.ipynb``): plain Python that ruff and mypy check, cells marked
``# %%``. Run from the repository root: ``.venv/bin/python cookbook/build.py [name ...]``. The
test suite checks that each notebook matches its source and executes the sources again
(tests/test_cookbook.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).parent
KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}


def sources() -> dict[str, Path]:
    """Notebook name -> its percent source (every ``*.py`` here but this script)."""
    return {p.stem: p for p in sorted(HERE.glob("*.py")) if p.name != Path(__file__).name}


def notebook(source: Path) -> nbformat.NotebookNode:
    """The notebook of a percent source, without outputs."""
    nb: nbformat.NotebookNode = jupytext.read(source, fmt="py:percent")
    nb.metadata = {"kernelspec": KERNEL, "language_info": {"name": "python"}}
    return nb


def execute(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Run every cell in the cookbook folder (raises on the first failing cell)."""
    client = NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}
    )
    client.execute()
    return nb


def build(names: list[str]) -> None:
    for name, source in sources().items():
        if names and name not in names:
            continue
        print(f"building {name}.ipynb", flush=True)
        nbformat.write(execute(notebook(source)), HERE / f"{name}.ipynb")  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    build(sys.argv[1:])
