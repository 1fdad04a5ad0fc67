"""LangChain vector stores for the core (entry point ``ragdefense.frameworks``): what the audit
reads and ``ragdefense attack --store`` red-teams, without the core importing this package."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.vectorstores import VectorStore

from ragdefense.auditing.corpus import Corpus
from ragdefense.redteam import AttackTarget, RedTeamReport

__all__ = ["PLUGIN", "LangChainFramework"]


class LangChainFramework:
    """The :class:`ragdefense.plugins.Framework` of LangChain vector stores."""

    name = "LangChain"

    def owns(self, obj: Any) -> bool:
        """Whether ``obj`` is a LangChain ``VectorStore``."""
        return isinstance(obj, VectorStore)

    def corpus(self, store: Any) -> Corpus:
        """The store's documents and vectors, read in batches."""
        from .vectors import store_corpus

        return store_corpus(store)

    def red_team(
        self, store: Any, targets: Sequence[AttackTarget], **options: Any
    ) -> RedTeamReport:
        """:func:`langchain_ragdefense.red_team`."""
        from .redteam import red_team

        return red_team(store, targets, **options)


#: the instance the entry point names
PLUGIN = LangChainFramework()
