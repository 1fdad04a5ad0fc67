"""Passages' and a query's embeddings for a defense: the vectors passages carry, checked, and
the rest computed with an embedder (re-exported by :mod:`ragdefense.embedders`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import types as _types
from .carried import carried_vectors, check_carried
from .types import DefenseInputError, Passage, check_embeddings, check_query_embedding

__all__ = ["embed_passages", "passage_and_query_embeddings"]


def embed_passages(passages: Sequence[_types.PassageLike], embedder: Any = None) -> np.ndarray:
    """Embeddings of ``passages``: carried ones as is, the rest in one call to the embedder.

    The embedder is only resolved (and the default model only loaded) if some passage carries
    no embedding. Beside carried embeddings, the default model must be the one that made them.

    Raises:
        DefenseInputError: a carried embedding is not a finite 1-D vector of the common size,
            or not the default model's where that model embeds the others.
        EmbeddingError: the embedding model failed.
    """
    from .embedders import as_embedder, default_embedder  # which imports this module

    passages = _types.to_passages(passages)  # what every defense accepts, checked alike
    if not passages:
        return np.zeros((0, 0), dtype=np.float32)
    vecs = carried_vectors(passages)
    todo = [i for i, v in enumerate(vecs) if v is None]
    if not todo:
        return np.stack(vecs)  # type: ignore[arg-type]
    computed = iter(as_embedder(embedder).embed([passages[i].text for i in todo]))
    full = [next(computed) if v is None else v for v in vecs]
    carried = [i for i, v in enumerate(vecs) if v is not None]
    if carried:
        check_carried(passages, full, embedder, default_embedder)
        i, j = carried[0], todo[0]
        if full[i].shape != full[j].shape:
            raise DefenseInputError(
                f"passage {i} carries an embedding of {full[i].shape[0]} numbers, the embedder "
                f"gives passage {j} one of {full[j].shape[0]}: give one model's embeddings"
            )
    return np.stack(full)


def passage_and_query_embeddings(
    query: str,
    passages: Sequence[Passage],
    embedder: Any = None,
    embeddings: Any = None,
    query_embedding: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The passages' (M, d) and the query's (d,) embeddings: the given ones checked, the
    missing ones computed with ``embedder`` (see :func:`embed_passages`; a path loaded once)."""
    from .embedders import as_embedder, default_embedder  # which imports this module

    embedder = as_embedder(embedder) if isinstance(embedder, (str, os.PathLike)) else embedder
    if carried := embeddings is None:
        embeddings = embed_passages(passages, embedder)
    emb = check_embeddings(embeddings, len(passages))
    fix = ""
    if query_embedding is None:
        # given beside the passages, or all carried (else checked in embed_passages): the
        # default model must have made them where it embeds the query
        if not carried or all(p.embedding is not None for p in passages):
            check_carried(passages, list(emb), embedder, default_embedder, not carried)
        query_embedding = as_embedder(embedder).embed_query(query)
        fix = ": pass query_embedding= by the passages' model, or that model as embedder="
    return emb, check_query_embedding(query_embedding, emb.shape[1], fix)
