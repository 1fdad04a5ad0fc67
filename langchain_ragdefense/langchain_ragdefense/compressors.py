"""``BaseDocumentCompressor`` per core defense, for ``ContextualCompressionRetriever``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import Callbacks
from langchain_core.callbacks.manager import adispatch_custom_event, dispatch_custom_event
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore
from pydantic import ConfigDict, PrivateAttr

from ragdefense import DefenseResult, LangChainEmbedder, Passage
from ragdefense.defenses.registry import DEFAULT_DEFENSE
from ragdefense.integration import (
    Defense,
    adapter_defense,
    check_items,
    removed_report,
    run_defense,
    tagged_metadata,
    verdict_metadata,
    with_defense_fields,
)

from .vectors import stored_vectors

__all__ = [
    "EVENT_NAME",
    "AutoDefenseCompressor",
    "ConsensusCompressor",
    "DefenseCompressor",
    "GRADACompressor",
    "RAGDefenderCompressor",
]

#: name of the custom callback event that reports removed documents
EVENT_NAME = "ragdefense_removed"


def _tag(doc: Document, record: dict[str, Any]) -> Document:
    """A copy of ``doc`` with ``record`` under the namespaced metadata key."""
    return doc.model_copy(update={"metadata": tagged_metadata(doc.metadata, record)})


class DefenseCompressor(BaseDocumentCompressor):
    """Applies a core defense to retrieved documents; returns copies with the verdict in
    ``metadata["ragdefense"]`` (score, decision, reason). Removed documents are reported through
    the callback system as the custom event ``"ragdefense_removed"``.

    Args:
        defense: A name of :mod:`ragdefense.defenses.registry` (``"ragdefender"``, ``"grada"``,
            ``"grada-peel"``, ``"auto"``, ...) or a core defense object.
        embeddings: The LangChain ``Embeddings`` to use (e.g. the vector store's); ``None``
            for the packaged all-MiniLM-L6-v2.
        fail_open: On a defense error, pass the documents through with a warning instead of
            raising :class:`ragdefense.DefenseFailed`.
        vectorstore: The store the documents come from: the vectors it holds for them are
            used instead of embedding them again (:func:`langchain_ragdefense.vectors.
            stored_vectors`); ``defend(retriever)`` sets it.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    defense: Any = DEFAULT_DEFENSE
    embeddings: Embeddings | None = None
    fail_open: bool = False
    vectorstore: VectorStore | None = None
    _core: Defense | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        """Build the core defense now, so that bad parameters fail at construction."""
        super().model_post_init(context)
        embedder = LangChainEmbedder(self.embeddings) if self.embeddings is not None else None
        self._core = adapter_defense(self, DefenseCompressor, embedder)

    @property
    def core(self) -> Defense:
        """The core defense (keeps its embedding cache across queries)."""
        assert self._core is not None  # built by model_post_init
        return self._core

    def _run(self, documents: Sequence[Document], query: str) -> DefenseResult | None:
        documents = check_items(documents, Document, "LangChain Document")
        vectors = (
            stored_vectors(self.vectorstore, documents)
            if self.vectorstore is not None and documents
            else [None] * len(documents)
        )
        passages = [
            Passage(d.page_content, id=d.id, metadata=d.metadata, embedding=v)
            for d, v in zip(documents, vectors, strict=True)
        ]
        return run_defense(self.core, query, passages, self.fail_open, TOO_FEW)

    @staticmethod
    def _output(documents: Sequence[Document], result: DefenseResult | None) -> list[Document]:
        if result is None:  # nothing to check, or failed open
            note = {"checked": False} if documents else {}
            return [_tag(d, note) for d in documents]
        return [
            _tag(documents[i], verdict_metadata(result, result.verdicts[i]))
            for i in result.kept_indices
        ]

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """Filter or rerank ``documents`` for ``query`` with the core defense."""
        result = self._run(documents, query)
        if callbacks and result is not None and result.removed:
            with contextlib.suppress(RuntimeError):  # no parent run to attach the event to
                dispatch_custom_event(
                    EVENT_NAME, removed_report(result), config={"callbacks": callbacks}
                )
        return self._output(documents, result)

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """Async :meth:`compress_documents` (the CPU-bound defense runs in a worker thread)."""
        result = await asyncio.to_thread(self._run, documents, query)
        if callbacks and result is not None and result.removed:
            with contextlib.suppress(RuntimeError):
                await adispatch_custom_event(
                    EVENT_NAME, removed_report(result), config={"callbacks": callbacks}
                )
        return self._output(documents, result)


#: how to give a compressor enough documents (in the small-pool warning)
TOO_FEW = (
    "Ask the base retriever for more, e.g. vector_store.as_retriever(search_kwargs={'k': 10}), "
    "or use defend(retriever), which fetches the pool the defense needs and returns k."
)


class ConsensusCompressor(with_defense_fields(DefenseCompressor, "consensus")):  # type: ignore[misc]
    """:class:`ragdefense.Consensus` (the default) as a document compressor; its fields are the
    core's parameters (``trusted=`` goes through ``defend(retriever, trusted=...)`` or
    ``DefenseCompressor(defense=Consensus(trusted=...))``)."""


class RAGDefenderCompressor(with_defense_fields(DefenseCompressor, "ragdefender")):  # type: ignore[misc]
    """RAGDefender as a document compressor (see :class:`ragdefense.RAGDefender`); its fields
    are the core's parameters."""


class GRADACompressor(with_defense_fields(DefenseCompressor, "grada")):  # type: ignore[misc]
    """GRADA as a document compressor: keeps the top ``n`` after graph reranking (``None``: half
    of the documents given, the paper's M = 2n); its fields are the core's parameters."""


class AutoDefenseCompressor(with_defense_fields(DefenseCompressor, "auto")):  # type: ignore[misc]
    """:class:`ragdefense.AutoDefense` as a document compressor; its fields are the core's
    parameters."""
