"""Docstrings are documentation: the API reference is generated from them. Every ``>>>`` example
in the three distributions runs and passes (offline, no model), and no docstring carries a
measured number, an issue reference or a history of changes: they say what the code does and
why; measurements live in the generated benchmark pages."""

from __future__ import annotations

import ast
import doctest
import importlib
import itertools
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: each distribution's import name -> its folder
PACKAGES = {
    "ragdefense": ROOT / "core" / "ragdefense",
    "langchain_ragdefense": ROOT / "langchain_ragdefense" / "langchain_ragdefense",
    "llama_index.postprocessor.ragdefense": (
        ROOT / "llamaindex_ragdefense" / "llama_index" / "postprocessor" / "ragdefense"
    ),
}

#: at least this many examples run (the test must not pass by finding none)
MIN_EXAMPLES = 30

#: modules whose examples must be found (the entry points the reference shows first)
WITH_EXAMPLES = (
    "ragdefense.defenses.registry",
    "ragdefense.defenses.grada",
    "ragdefense.types",
    "ragdefense.provenance",
    "ragdefense.text",
    "ragdefense.redteam",
)

#: what a shipped docstring must not say: name -> pattern (each match is shown on failure)
FORBIDDEN = {
    "issue reference": re.compile(r"(?<![\w&/])#\d+\b"),
    "the word 'issue'": re.compile(r"\bissues?\b", re.I),
    "a measured timing": re.compile(
        r"(?:\b\d+\.\d+|~\s*\d[\d.]*(?:\s*[-\u2013]\s*\d[\d.]*)?)\s*"
        r"(?:ms|s|sec|seconds?|min|minutes?|h|hours?)\b"
    ),
    "'measured'": re.compile(r"\bmeasured\b", re.I),
    "a before -> after result": re.compile(r"(?:->|→)\s*0?\.\d+"),
    "a metric's value": re.compile(
        r"\b(?:recall|precision|accuracy|F1|ASR|hijack rate|false[- ]positive rate)"
        r"\s*(?:of|=|:|at)?\s*\d",
        re.I,
    ),
    "a percentage": re.compile(r"\b\d+(?:\.\d+)?\s?%"),
    "a pointer to the README": re.compile(r"\bREADME\b"),
    "a change history": re.compile(
        r"\b(?:no longer|formerly|previously|used to be|was:|"
        r"(?:before this|an earlier|the previous|the last) (?:release|version))",
        re.I,
    ),
}


def _module_names() -> list[str]:
    names = []
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            names.append(".".join((package, *parts)).removesuffix(".__init__"))
    return names


def _import(name: str) -> ModuleType | None:
    """The module, or ``None`` when an optional third-party extra it needs is not installed
    (any other import error fails the test)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if not exc.name or exc.name.startswith(tuple(PACKAGES)):
            raise
        return None


def test_every_doctest_passes() -> None:
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    failures: list[str] = []
    ran = 0
    with_examples: set[str] = set()
    skipped: list[str] = []
    for name in _module_names():
        module = _import(name)
        if module is None:
            skipped.append(name)
            continue
        for test in finder.find(module, name):
            out: list[str] = []
            result = runner.run(test, out=out.append, clear_globs=True)
            ran += result.attempted
            if result.attempted:
                with_examples.add(name)
            if result.failed:
                failures.append("".join(out))
    assert not failures, "\n".join(failures)
    expected = set(WITH_EXAMPLES) - set(skipped)  # a module whose extra is missing is skipped
    assert expected <= with_examples, expected - with_examples
    assert ran >= (MIN_EXAMPLES if not skipped else len(expected)), f"only {ran} examples ran"


def _docstrings(path: Path) -> list[tuple[int, str, str]]:
    """``(line, owner, docstring)`` for the module, every class, function and method, and
    every attribute docstring (a string right after an assignment)."""
    tree = ast.parse(path.read_text("utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                found.append((getattr(node, "lineno", 1), getattr(node, "name", "<module>"), doc))
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for before, stmt in itertools.pairwise(body):
                if (
                    isinstance(before, (ast.Assign, ast.AnnAssign))
                    and isinstance(stmt, ast.Expr)
                    and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)
                ):
                    found.append((stmt.lineno, "attribute", stmt.value.value))
    return found


@pytest.mark.parametrize(
    "path",
    [p for folder in PACKAGES.values() for p in sorted(folder.rglob("*.py"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_docstrings_say_what_and_why_not_history_or_numbers(path: Path) -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{line} ({owner}): {what}: {match.group(0)!r} in "
        f"{' '.join(doc[max(0, match.start() - 50) : match.end() + 50].split())!r}"
        for line, owner, doc in _docstrings(path)
        for what, pattern in FORBIDDEN.items()
        for match in pattern.finditer(doc)
    ]
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("poison share 0.30 -> 0.02 on the suite", "a before -> after result"),
        ("the conversion (~15-40 s) is written once", "a measured timing"),
        ("a call takes 2.5 ms", "a measured timing"),
        ("measured: it undercounts", "'measured'"),
        ("the safe default (#27)", "issue reference"),
        ("see the issue", "the word 'issue'"),
        ("recall 0.77 on NQ", "a metric's value"),
        ("see the README", "a pointer to the README"),
        ("it no longer embeds twice", "a change history"),
        ("adds nothing at a 1% budget", "a percentage"),
    ],
)
def test_the_patterns_catch_what_they_are_for(text: str, what: str) -> None:
    assert FORBIDDEN[what].search(text)


@pytest.mark.parametrize(
    "text",
    [
        "alpha: HRSIM penalty coefficient (paper: 0.4).",
        "timeout: Default deadline of a batch in seconds (``None``: none).",
        "threshold: Cosine below which passages count as unrelated (default 0.9).",
        "at most 2000 passages; ``(passage, its source) -> trusted?``",
        "gamma: contexts whose probability is >= gamma are dropped (paper: 0.99).",
        "``list[str] -> array (n, d)``; a passage's ``metadata['source']``",
        "Used to embed the passages.",
    ],
)
def test_the_patterns_leave_parameter_docs_alone(text: str) -> None:
    assert not [what for what, pattern in FORBIDDEN.items() if pattern.search(text)]
