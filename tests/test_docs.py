"""Docs are code: every Python block of the README and of every docs page runs, in order, one
namespace per page (Sybil), offline with the packaged models; the site builds with
``mkdocs build --strict`` (a broken link, nav entry or API reference fails); every page is in the
navigation; and the README stays a front page, not a manual."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unittest
from pathlib import Path

import pytest

from benchmarks.pages import README_BLOCK, readme_block

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(p.relative_to(ROOT) for p in [ROOT / "README.md", *DOCS.rglob("*.md")])
README_MAX_LINES = 200


def _blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text("utf-8"), re.M | re.S)


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if _blocks(ROOT / p)], ids=str)
def test_every_python_block_runs(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sybil import Sybil
    from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

    from ragdefense.offline import offline

    offline()
    monkeypatch.chdir(tmp_path)  # a page may write files: never into the repository
    document = Sybil([PythonCodeBlockParser(), SkipParser()]).parse(ROOT / page)
    ran = skipped = 0
    for example in document:
        try:
            example.evaluate()
        except unittest.SkipTest:
            skipped += 1
            continue
        ran += 1
    assert ran + skipped >= len(_blocks(ROOT / page)), "every block was seen"
    assert ran, "at least one block ran"


def test_a_skipped_block_says_why() -> None:
    for page in PAGES:
        for line in (ROOT / page).read_text("utf-8").splitlines():
            if line.startswith("<!-- skip"):
                assert re.match(r'<!-- skip: next ".{10,}" -->', line), f"{page}: {line}"


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text("utf-8")
    generated = DOCS / "benchmarks"
    for page in DOCS.rglob("*.md"):
        rel = page.relative_to(DOCS).as_posix()
        if page.parent == generated and page.name != "index.md":
            # generated benchmark pages are linked from benchmarks/index.md
            assert page.name in (generated / "index.md").read_text("utf-8"), rel
            continue
        assert f" {rel}" in nav, f"{rel} is not in mkdocs.yml's nav"


def test_the_readme_is_a_front_page() -> None:
    text = (ROOT / "README.md").read_text("utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "make demo" in text and "make test" in text
    start, end = README_BLOCK  # the generated table names its date; nothing else is dated
    prose = text.partition(start)[0] + text.partition(end)[2]
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", prose), "no dated diary in the README"


def test_the_readme_threat_table_is_rendered_from_the_results() -> None:
    results = ROOT / "benchmarks" / "results" / "threats.json"
    if not results.exists():
        pytest.skip("no threats result in benchmarks/results")
    import json

    text = (ROOT / "README.md").read_text("utf-8")
    start, end = README_BLOCK
    block = text.partition(start)[2].partition(end)[0].strip()
    assert block == readme_block(json.loads(results.read_text("utf-8"))), "run `make bench-docs`"
    assert "| default (text only) |" in block and "| strict |" in block


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "site"
    assert (site / "reference" / "core" / "index.html").exists()
    assert (site / "cookbook" / "langchain_quickstart" / "index.html").exists()
    api = (site / "reference" / "defenses" / "index.html").read_text("utf-8")
    assert "Consensus" in api and "defend_embeddings" in api  # rendered from the docstrings
