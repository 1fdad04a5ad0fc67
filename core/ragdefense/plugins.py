"""How the core reaches a framework's stores without importing its adapter: each adapter
distribution registers a :class:`Framework` under the entry-point group
``ragdefense.frameworks`` (``langchain-ragdefense``: vector stores; the LlamaIndex one: indexes).
The audit reads a store through it and ``ragdefense attack --store`` red-teams one; the core
never names an adapter."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import lru_cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .auditing.corpus import Corpus
    from .redteam import AttackTarget, RedTeamReport

__all__ = ["GROUP", "Framework", "framework_of", "frameworks"]

logger = logging.getLogger("ragdefense")

#: the entry-point group the adapters register their :class:`Framework` under
GROUP = "ragdefense.frameworks"

#: where each adapter distribution is in the repository (they are not on PyPI yet)
#: the package each adapter's framework lives in
_MODULES = {
    "langchain-ragdefense": "langchain_ragdefense",
    "llama-index-postprocessor-ragdefense": "llama_index.postprocessor.ragdefense",
}
_FOLDERS = {
    "langchain-ragdefense": "langchain_ragdefense",
    "llama-index-postprocessor-ragdefense": "llamaindex_ragdefense",
}
#: what to install for objects of a framework whose adapter is missing (by top-level module)
_ADAPTERS = {
    "langchain": "langchain-ragdefense",
    "langchain_core": "langchain-ragdefense",
    "langchain_community": "langchain-ragdefense",
    "langchain_chroma": "langchain-ragdefense",
    "llama_index": "llama-index-postprocessor-ragdefense",
}


@runtime_checkable
class Framework(Protocol):
    """What an adapter does for the core with its framework's stores."""

    name: str

    def owns(self, obj: Any) -> bool:
        """Whether ``obj`` is one of this framework's stores (a vector store, an index)."""
        ...

    def corpus(self, store: Any) -> Corpus:
        """``store`` as a corpus for :func:`ragdefense.audit` (read in bounded batches)."""
        ...

    def red_team(
        self, store: Any, targets: Sequence[AttackTarget], **options: Any
    ) -> RedTeamReport:
        """The adapter's ``red_team(store, targets, **options)``."""
        ...


@lru_cache(maxsize=1)
def frameworks() -> tuple[Framework, ...]:
    """The frameworks of the adapters installed (each entry point loaded once)."""
    found = []
    for point in sorted(entry_points(group=GROUP), key=lambda p: p.name):
        try:
            plugin = point.load()
        except Exception as exc:  # one broken adapter install must not break the others
            logger.warning(
                "ragdefense: skipping the %s adapter (%s: %s)", point.name, type(exc).__name__, exc
            )
            continue
        if not isinstance(plugin, Framework):  # nor one that is no adapter
            logger.warning("ragdefense: skipping %s = %s: not a Framework", point.name, point.value)
            continue
        found.append(plugin)
    return tuple(found)


def framework_of(obj: Any) -> Framework:
    """The framework that owns ``obj``; ``TypeError`` naming the adapter to install when its
    framework's adapter is missing, or that nothing knows the object."""
    for framework in frameworks():
        if framework.owns(obj):
            return framework
    top = type(obj).__module__.split(".")[0]
    if top in _ADAPTERS and _installed(_ADAPTERS[top]):
        loaded = any(type(f).__module__.startswith(_MODULES[_ADAPTERS[top]]) for f in frameworks())
        raise TypeError(
            f"{type(obj).__name__} is a {top} object {_ADAPTERS[top]} does not read here: pass "
            "the vector store (or index) itself, not a retriever or a query engine over it"
            if loaded
            else f"{_ADAPTERS[top]} is installed but did not load (see the warning logged)"
        )
    if top in _ADAPTERS:
        raise TypeError(
            f"{type(obj).__name__} is a {top} object: install {_ADAPTERS[top]} to use it here "
            f"(from a checkout of the repository: pip install ./{_FOLDERS[_ADAPTERS[top]]})"
        )
    raise UnknownObject(f"{type(obj).__name__} is no store of an installed framework adapter")


class UnknownObject(TypeError):
    """An object no installed adapter's framework owns (no adapter to install or to name)."""


def _installed(distribution: str) -> bool:
    """Whether ``distribution`` is installed (its metadata found; nothing imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True
