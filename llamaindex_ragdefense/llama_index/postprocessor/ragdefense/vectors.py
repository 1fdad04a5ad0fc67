"""The vectors a LlamaIndex vector store already holds for the nodes it returned, so a defense
does not embed them again: the default ``SimpleVectorStore`` and ``ChromaVectorStore``
(``llama-index-vector-stores-chroma``) by node id; other stores give none (the defense
then embeds the nodes, and says so once per store type:
:func:`ragdefense.integration.stored_vectors`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.vector_stores import SimpleVectorStore

from ragdefense import integration

__all__ = ["stored_vectors"]


def stored_vectors(store: Any, node_ids: Sequence[str]) -> list[Any | None]:
    """One stored vector per node id (``None`` where the store has none for it)."""
    return integration.stored_vectors(store, list(node_ids), _lookup)


def _lookup(store: Any, ids: list[str]) -> dict[str, Any] | None:
    if isinstance(store, SimpleVectorStore):
        vectors = store.data.embedding_dict
        return {i: vectors[i] for i in ids if i in vectors}
    if type(store).__name__ == "ChromaVectorStore":  # its client is the Chroma collection
        got = store.client.get(ids=ids, include=["embeddings"])
        return dict(zip(got["ids"], got["embeddings"], strict=True))
    return None
