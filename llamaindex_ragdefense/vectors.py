"""The vectors a LlamaIndex vector store already holds for the nodes it returned, so a defense
does not embed them again: the default ``SimpleVectorStore`` and ``ChromaVectorStore``
(``llama-index-vector-stores-chroma``) by node id; other stores give none (the defense then
embeds the nodes, and says so once per store type)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from llama_index.core.vector_stores import SimpleVectorStore

__all__ = ["stored_vectors"]

logger = logging.getLogger("ragdefense")
_SAID: set[str] = set()


def stored_vectors(store: Any, node_ids: Sequence[str]) -> list[Any | None]:
    """One stored vector per node id (``None`` where the store has none for it)."""
    try:
        found = _lookup(store, list(node_ids))
    except Exception as exc:  # a store that cannot answer: embed instead, and say so once
        found = None
        _say_once(store, f"reading its vectors failed ({type(exc).__name__}: {exc})")
    if found is None:
        return [None] * len(node_ids)
    return [found.get(i) for i in node_ids]


def _lookup(store: Any, ids: list[str]) -> dict[str, Any] | None:
    if isinstance(store, SimpleVectorStore):
        vectors = store.data.embedding_dict
        return {i: vectors[i] for i in ids if i in vectors}
    if type(store).__name__ == "ChromaVectorStore":  # its client is the Chroma collection
        got = store.client.get(ids=ids, include=["embeddings"])
        return dict(zip(got["ids"], got["embeddings"], strict=True))
    _say_once(store, "it is not one whose vectors ragdefense can read")
    return None


def _say_once(store: Any, why: str) -> None:
    name = type(store).__name__
    if name not in _SAID:
        _SAID.add(name)
        logger.warning("%s: the defense embeds the retrieved nodes itself: %s", name, why)
