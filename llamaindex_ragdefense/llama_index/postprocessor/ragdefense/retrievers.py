"""A retriever that widens retrieval before a defense: ``defend(index)`` in one line.

A node postprocessor only sees what the retriever already gave it (LlamaIndex retrieves 2 nodes
by default): too few for a defense to compare. :class:`DefendedRetriever` asks the underlying
retriever for the pool the defense needs to return ``k`` (twice ``k`` for GRADA; at least what
RAGDefender needs to compare), runs the defense on the pool, and returns the top ``k`` survivors.
"""

from __future__ import annotations

import copy
from typing import Any

from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.schema import NodeWithScore, QueryBundle

from ragdefense import LlamaIndexEmbedder
from ragdefense.integration import fetched_pool, make_defense, pool_size, positive_int

from .postprocessors import DefensePostprocessor

__all__ = ["DefendedRetriever", "defend"]


def _top_k(retriever: BaseRetriever) -> int | None:
    return positive_int(getattr(retriever, "similarity_top_k", None))


class DefendedRetriever(BaseRetriever):
    """Retrieves a pool with ``retriever``, applies ``postprocessor`` (a defense), returns ``k``.

    Args:
        retriever: The retriever to protect; one with a ``similarity_top_k`` (e.g.
            ``index.as_retriever()``) is asked for the pool by a copy with that value raised
            (the caller's retriever is never changed). Others are used as they are.
        postprocessor: A :class:`DefensePostprocessor`.
        k: Nodes returned; ``None``: the retriever's own ``similarity_top_k`` (LlamaIndex's
            default 2), else all kept.
        fetch_k: Pool size asked of the retriever; ``None``: the defense's pool for ``k``
            (:func:`ragdefense.integration.pool_size`: ``2 * k`` for GRADA, ``k`` for
            RAGDefender, and at least what the defense needs to compare).
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        postprocessor: DefensePostprocessor,
        k: int | None = None,
        fetch_k: int | None = None,
    ) -> None:
        for label, value in (("k", k), ("fetch_k", fetch_k)):
            if value is not None and positive_int(value) is None:
                raise ValueError(f"{label} must be a positive int or None, got {value!r}")
        if not isinstance(retriever, BaseRetriever):
            raise TypeError(f"retriever must be a LlamaIndex BaseRetriever, got {retriever!r}")
        self.k = k if k is not None else _top_k(retriever)
        self.fetch_k = fetch_k or (pool_size(postprocessor.core, self.k) if self.k else None)
        base = _top_k(retriever)
        if base is not None and self.fetch_k and self.fetch_k != base:
            retriever = copy.copy(retriever)
            retriever.similarity_top_k = self.fetch_k  # type: ignore[attr-defined]
        if self.fetch_k:
            fetched_pool(postprocessor.core)  # fewer than its pool is all the index holds
        self.retriever = retriever
        self.postprocessor = postprocessor
        super().__init__(callback_manager=getattr(retriever, "callback_manager", None))

    def _cut(self, nodes: list[NodeWithScore]) -> list[NodeWithScore]:
        return nodes[: self.k] if self.k else nodes

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        pool = self.retriever.retrieve(query_bundle)
        return self._cut(self.postprocessor.postprocess_nodes(pool, query_bundle=query_bundle))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        pool = await self.retriever.aretrieve(query_bundle)
        kept = await self.postprocessor.apostprocess_nodes(pool, query_bundle=query_bundle)
        return self._cut(kept)


def defend(
    retriever: BaseRetriever | VectorStoreIndex,
    defense: Any = None,
    *,
    k: int | None = None,
    fetch_k: int | None = None,
    embed_model: BaseEmbedding | None = None,
    fail_open: bool = False,
    **params: Any,
) -> DefendedRetriever:
    """Protect a retriever (or an index's default retriever) in one line:
    ``RetrieverQueryEngine.from_args(defend(index), llm=llm)``.

    Args:
        retriever: A LlamaIndex retriever, or a ``VectorStoreIndex`` (its ``as_retriever()``).
        defense: A name of :mod:`ragdefense.defenses.registry` (``None``: the default defense),
            a core defense object, or a :class:`DefensePostprocessor`.
        k, fetch_k: As :class:`DefendedRetriever`.
        embed_model: Embeddings for the defense; by default the index's own (vectors the index
            holds are reused, not recomputed), else the packaged all-MiniLM-L6-v2.
        params: Parameters of the named defense.
    """
    store = None
    index: Any = retriever
    if isinstance(retriever, VectorStoreIndex):
        retriever = retriever.as_retriever()
    else:
        index = getattr(retriever, "_index", None)
    if isinstance(index, VectorStoreIndex):
        store = index.vector_store
        if embed_model is None:
            embed_model = getattr(index, "_embed_model", None)
    if isinstance(defense, DefensePostprocessor):
        post = defense
    else:
        embedder = LlamaIndexEmbedder(embed_model) if embed_model is not None else None
        core = make_defense(defense, embedder, **params)
        post = DefensePostprocessor(
            defense=core, embed_model=embed_model, fail_open=fail_open, vector_store=store
        )
    return DefendedRetriever(retriever, post, k=k, fetch_k=fetch_k)
