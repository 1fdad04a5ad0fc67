"""The repository's layout: no import cycle across the three distributions and the harness
(function-local imports included), no arrow from the core to an adapter or from a distribution to
the harness, no module over the size limit, a docstring on every module, and a light
``import ragdefense``."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core" / "ragdefense"
ADAPTERS = (
    ROOT / "langchain_ragdefense" / "langchain_ragdefense",
    ROOT / "llamaindex_ragdefense" / "llama_index" / "postprocessor" / "ragdefense",
)
MAX_LINES = 400


#: each package of the repository: its import name -> its folder
PACKAGES = {
    "ragdefense": CORE,
    "langchain_ragdefense": ADAPTERS[0],
    "llama_index.postprocessor.ragdefense": ADAPTERS[1],
    "benchmarks": ROOT / "benchmarks",
}


def _modules(packages: tuple[str, ...] = ("ragdefense",)) -> dict[str, Path]:
    out = {}
    for package in packages:
        folder = PACKAGES[package]
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts))
            out[name.removesuffix(".__init__")] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``name`` imports at run time (anywhere in the file,
    function-local imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node)
            for n in ast.walk(node)}  # fmt: skip
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:  # `from . import x` may name a submodule
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules(tuple(PACKAGES))
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _owner(module: str) -> str:
    return next(p for p in PACKAGES if module == p or module.startswith(p + "."))


def test_no_import_cycle_across_the_three_distributions_and_the_harness() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])
    assert graph["benchmarks.cases"] >= {"ragdefense.cases"}  # the walk sees every package
    assert graph["ragdefense.auditing.corpus"] >= {"ragdefense.plugins"}  # and local imports


def test_the_core_imports_no_adapter_and_no_library_imports_the_harness() -> None:
    """(#28) the core reaches the frameworks through ``ragdefense.plugins`` (entry points), and
    nothing shipped imports ``benchmarks``: the arrows go adapters -> core <- harness only."""
    allowed = {
        "ragdefense": {"ragdefense"},
        "langchain_ragdefense": {"langchain_ragdefense", "ragdefense"},
        "llama_index.postprocessor.ragdefense": {
            "llama_index.postprocessor.ragdefense",
            "ragdefense",
        },
        "benchmarks": set(PACKAGES),
    }
    wrong = sorted(
        (name, target)
        for name, targets in _graph().items()
        for target in targets
        if _owner(target) not in allowed[_owner(name)]
    )
    assert wrong == []


def test_modules_are_small_and_say_their_job() -> None:
    for name, path in _modules(tuple(PACKAGES)).items():
        text = path.read_text(encoding="utf-8")
        assert len(text.splitlines()) <= MAX_LINES, f"{name} is over {MAX_LINES} lines"
        assert ast.get_docstring(ast.parse(text)), f"{name} has no module docstring"


OLD_PATHS = {
    "ragdefense.robustrag": ("RobustRAG", "ragdefense.robustrag.engine"),
    "ragdefense.embedders": ("cosine_matrix", "ragdefense.similarity"),
}


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_import_paths_of_earlier_releases_give_the_same_objects(old: str) -> None:
    name, new = OLD_PATHS[old]
    moved = getattr(importlib.import_module(new), name)
    assert getattr(importlib.import_module(old), name) is moved


def test_every_public_name_resolves() -> None:
    import benchmarks
    import ragdefense

    for module in (ragdefense, benchmarks):
        for name in module.__all__:
            assert getattr(module, name) is not None, name
    with pytest.raises(AttributeError):
        _ = ragdefense.NoSuchName  # type: ignore[attr-defined]


def test_import_ragdefense_loads_nothing_heavy() -> None:
    probe = (
        "import sys, ragdefense; "
        "print(sorted(m for m in ('numpy', 'scipy', 'sklearn', 'torch', 'networkx') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _core_imports(path: Path) -> list[tuple[str, str]]:
    """(core module, name) for every ``from ragdefense... import name`` in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ragdefense":
            out += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("ragdefense.") for a in node.names), path
    return out


@pytest.mark.parametrize("folder", ADAPTERS, ids=lambda p: p.parts[-1])
def test_adapters_use_only_the_cores_public_api(folder: Path) -> None:
    """An adapter imports from the core only names its modules export (``__all__``), never a
    private module or name: ``ragdefense.integration`` is the documented contract."""
    found = [(m, n, p.name) for p in folder.rglob("*.py") for m, n in _core_imports(p)]
    assert found
    for module, name, file in found:
        assert not any(part.startswith("_") for part in module.split(".")), (file, module)
        imported = importlib.import_module(module)
        exported = getattr(imported, "__all__", ())
        is_module = hasattr(imported, "__path__") and bool(
            importlib.util.find_spec(f"{module}.{name}")
        )
        assert name in exported or is_module, f"{file}: {name} is not in {module}.__all__"


def test_each_distribution_ships_the_repositorys_licence() -> None:
    """A wheel or sdist carries its project folder's ``LICENSE`` (a licence file cannot be
    reached outside it): each is the repository's, word for word, and declared."""
    licence = (ROOT / "LICENSE").read_text(encoding="utf-8")
    for folder in ("core", "langchain_ragdefense", "llamaindex_ragdefense"):
        assert (ROOT / folder / "LICENSE").read_text(encoding="utf-8") == licence, folder
        pyproject = (ROOT / folder / "pyproject.toml").read_text(encoding="utf-8")
        assert 'license-files = ["LICENSE"]' in pyproject, folder
