"""Every read of a LlamaIndex internal the adapter needs, in one place: no public API gives
these (checked against the versions we support by ``tests/test_llamaindex.py``, which fails
loudly if one is renamed). Each returns ``None`` where the object does not hold it."""

from __future__ import annotations

from typing import Any

import numpy as np
from llama_index.core.embeddings import BaseEmbedding

from ragdefense.integration.retrieval import positive_int

__all__ = ["corpus_size", "index_embed_model", "merged_retriever", "retriever_index"]


def merged_retriever(retriever: Any) -> Any:
    """The retriever whose results an auto-merging retriever merges into their parents
    (``AutoMergingRetriever._vector_retriever``)."""
    return getattr(retriever, "_vector_retriever", None)


def retriever_index(retriever: Any) -> Any:
    """The index a retriever searches (``VectorIndexRetriever._index``; an auto-merging
    retriever's, its vector retriever's)."""
    inner = merged_retriever(retriever)
    return getattr(retriever if inner is None else inner, "_index", None)


def index_embed_model(index: Any) -> BaseEmbedding | None:
    """The model a ``VectorStoreIndex`` embeds with (``VectorStoreIndex._embed_model``; a
    ``SummaryIndexEmbeddingRetriever``'s own, given one)."""
    model = getattr(index, "_embed_model", None)
    return model if isinstance(model, BaseEmbedding) else None


def corpus_size(retriever: Any) -> int | None:
    """How many nodes a retriever may be asked for at most: a BM25 retriever's corpus
    (``BM25Retriever.bm25.scores["num_docs"]``: bm25s refuses a larger ``k``); a filtered one
    (``corpus_weight_mask``), its own ``similarity_top_k`` (bm25s fills what the filter
    passes with filtered-out nodes at score 0: another user's documents, where the filter is
    an access rule)."""
    if getattr(retriever, "corpus_weight_mask", None) is not None:
        return positive_int(getattr(retriever, "similarity_top_k", None)) or 1
    scores = getattr(getattr(retriever, "bm25", None), "scores", None)
    held = scores.get("num_docs") if isinstance(scores, dict) else None
    return int(held) if isinstance(held, int | np.integer) and held > 0 else None
