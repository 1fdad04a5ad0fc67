"""LlamaIndex indexes for the core (entry point ``ragdefense.frameworks``): what the audit reads
and ``ragdefense attack --store`` red-teams, without the core importing this package."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core import VectorStoreIndex

from ragdefense.auditing.corpus import Corpus
from ragdefense.redteam import AttackTarget, RedTeamReport

__all__ = ["PLUGIN", "LlamaIndexFramework"]


class LlamaIndexFramework:
    """The :class:`ragdefense.plugins.Framework` of LlamaIndex vector store indexes."""

    name = "LlamaIndex"

    def owns(self, obj: Any) -> bool:
        """Whether ``obj`` is a LlamaIndex ``VectorStoreIndex``."""
        return isinstance(obj, VectorStoreIndex)

    def corpus(self, store: Any) -> Corpus:
        """The index's nodes and vectors."""
        from .vectors import index_corpus

        return index_corpus(store)

    def red_team(
        self, store: Any, targets: Sequence[AttackTarget], **options: Any
    ) -> RedTeamReport:
        """:func:`llama_index.postprocessor.ragdefense.red_team`."""
        from .redteam import red_team

        return red_team(store, targets, **options)


#: the instance the entry point names
PLUGIN = LlamaIndexFramework()
