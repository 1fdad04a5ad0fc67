"""Docs are code: every Python block of the README and of every docs page runs, in order, one
namespace per page (Sybil), offline with the packaged models; the site builds with
``mkdocs build --strict`` (a broken link, nav entry or API reference fails); every page is in the
navigation; and the README stays a front page, not a manual."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import pytest

from benchmarks.pages import README_BLOCK, readme_block

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: every page with snippets a reader copies: the READMEs (the repository's and each
#: distribution's, its PyPI page) and the docs site
READMES = [
    "README.md",
    "core/README.md",
    "langchain_ragdefense/README.md",
    "llamaindex_ragdefense/README.md",
]
PAGES = sorted(p.relative_to(ROOT) for p in [*(ROOT / r for r in READMES), *DOCS.rglob("*.md")])
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

    from ragdefense.offline import SETTINGS

    for key, value in SETTINGS.items():  # offline, for this test only
        monkeypatch.setenv(key, os.environ.get(key, value))
    monkeypatch.chdir(tmp_path)  # a page may write files: never into the repository
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # nor leave folders in /tmp
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


def test_every_page_is_in_the_navigation_and_every_entry_exists() -> None:
    nav = (ROOT / "mkdocs.yml").read_text("utf-8").partition("\nnav:\n")[2]
    entries = set(re.findall(r"(?:: |- )(\S+\.(?:md|ipynb))$", nav, re.M))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages - entries == set(), "pages missing from mkdocs.yml's nav"
    notebooks = {f"cookbook/{p.name}" for p in (ROOT / "cookbook").glob("*.ipynb")}
    assert entries - pages - notebooks == set(), "nav entries without a page"


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
    for page in site.glob("reference/*/index.html"):  # Sphinx roles are code spans, not raw
        assert not re.search(r":(class|func|meth|data|attr|mod):<", page.read_text("utf-8"))


#: a dotted name of the API in a code span: `ragdefense.x.y`, `RobustRAG.answer_calls(...)`
_NAME = re.compile(
    r"`((?:ragdefense|langchain_ragdefense|llama_index\.postprocessor\.ragdefense)"
    r"(?:\.[A-Za-z_]\w*)+|[A-Z]\w+\.[a-z_]\w*)(\([^`]*\))?`"
)


def _exports() -> dict[str, object]:
    from llama_index.postprocessor import ragdefense as li

    import langchain_ragdefense
    import ragdefense

    return {n: getattr(m, n) for m in (li, langchain_ragdefense, ragdefense) for n in m.__all__}


def _resolve(name: str, exports: dict[str, object]) -> object:
    import importlib

    parts = name.split(".")
    obj: object
    if parts[0] in exports:  # a class the packages export, then its attribute
        obj, rest = exports[parts[0]], parts[1:]
    else:
        for cut in range(len(parts), 0, -1):
            try:
                obj, rest = importlib.import_module(".".join(parts[:cut])), parts[cut:]
                break
            except ImportError:
                continue
        else:
            raise LookupError(f"no module in {name}")
    for part in rest:
        fields = (
            {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
        )
        fields |= set(getattr(obj, "model_fields", {}))  # pydantic
        obj = getattr(obj, part) if part not in fields else getattr(obj, part, part)
    return obj


def test_every_api_name_the_docs_mention_exists() -> None:
    """A name in a code span of the README or a docs page must resolve, and be callable where
    it is called (``ragdefense.offline()``, ``RobustRAG._decoding_certificate`` would fail):
    prose cannot drift from the code."""
    exports = _exports()
    seen, missing = 0, []
    for page in PAGES:
        for name, call in _NAME.findall((ROOT / page).read_text("utf-8")):
            if name[0].isupper() and name.split(".")[0] not in exports:
                continue  # Class.attr of another library (e.g. Settings.llm)
            seen += 1
            try:
                obj = _resolve(name, exports)
            except (AttributeError, LookupError) as exc:
                missing.append(f"{page}: {name} ({exc})")
                continue
            if call and not callable(obj):
                missing.append(f"{page}: {name} is called but is not callable")
    assert seen >= 10
    assert not missing, "\n".join(missing)


#: a call of an exported name in a code span, e.g. `KeywordAggregation(alpha=0.3, beta=3)`
_CALL = re.compile(r"`([A-Z]\w+|defend|[a-z_]+\.defense)\(([^`]*)\)`")


def _parameters(obj: object) -> set[str] | None:
    """The keyword names ``obj`` accepts (``None``: any)."""
    import inspect

    fields = set(getattr(obj, "model_fields", {}))  # pydantic models take their fields
    try:
        sig = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return fields or None
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()) and not fields:
        return None
    return fields | set(sig.parameters)


def test_every_keyword_the_docs_pass_exists() -> None:
    """`KeywordAggregation(alpha=0.3, beta=3)` in prose: each keyword is a parameter of the
    exported callable it is passed to (a renamed parameter cannot linger in the docs)."""
    exports = _exports()
    checked, wrong = 0, []
    for page in PAGES:
        for name, args in _CALL.findall((ROOT / page).read_text("utf-8")):
            obj = exports.get(name.split(".")[-1]) if "." not in name else exports.get("defense")
            accepted = None if obj is None else _parameters(obj)
            if accepted is None:
                continue
            for keyword in re.findall(r"(?:^|[,(]\s*)([a-z_]\w*)=", args):
                checked += 1
                if keyword not in accepted:
                    wrong.append(f"{page}: {name}(... {keyword}= ...)")
    assert checked >= 10
    assert not wrong, "\n".join(wrong)


def test_sphinx_roles_become_code_spans_outside_code() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("griffe_roles", ROOT / "docs" / "griffe_roles.py")
    assert spec is not None and spec.loader is not None
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)
    text = (
        "See :class:`~ragdefense.Passage`, :py:func:`ragdefense.defense` and "
        ":class:`the passage <ragdefense.Passage>`, :func:`ragdefense.\n    defense`.\n"
        '>>> doc = ":func:`f`"\n```python\nx = ":data:`X`"\n```\n'
    )
    assert roles.plain(text) == (
        "See `Passage`, `ragdefense.defense` and `the passage`, `ragdefense.defense`.\n"
        '>>> doc = ":func:`f`"\n```python\nx = ":data:`X`"\n```\n'
    )


def test_every_extra_an_install_line_names_exists() -> None:
    """An install line naming an extra a distribution does not declare installs nothing more,
    silently (pip only warns): each ``./folder[extra,...]`` in the pages is checked against the
    folder's ``pyproject.toml``."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    named: set[tuple[str, str]] = set()
    for page in PAGES:
        text = (ROOT / page).read_text("utf-8")
        for folder, extras in re.findall(r"\./(\w+)\[([\w,-]+)\]", text):
            named |= {(folder, extra) for extra in extras.split(",")}
    assert ("core", "nlp") in named and ("langchain_ragdefense", "classic") in named
    for folder, extra in sorted(named):
        project = tomllib.loads((ROOT / folder / "pyproject.toml").read_text("utf-8"))["project"]
        assert extra in project.get("optional-dependencies", {}), (folder, extra)
