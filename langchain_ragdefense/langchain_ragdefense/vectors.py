"""The vectors a LangChain vector store already holds for the documents it returned, so a defense
does not embed them again: ``InMemoryVectorStore``, Chroma (``langchain-chroma``) and FAISS
(``langchain-community``) by document id; other stores give none (the defense then embeds the
documents, and says so once per store type: :func:`ragdefense.integration.stored_vectors`)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore

from ragdefense import integration

__all__ = ["stored_vectors"]

# FAISS store -> (entries when built, docstore id -> index position): rebuilt only when it grows
_FAISS_POSITIONS: weakref.WeakKeyDictionary[Any, tuple[int, dict[str, int]]] = (
    weakref.WeakKeyDictionary()
)


def stored_vectors(store: VectorStore, documents: Sequence[Document]) -> list[Any | None]:
    """One stored vector per document (``None`` where the store has none for it)."""
    return integration.stored_vectors(store, [d.id for d in documents], _lookup)


def _lookup(store: Any, ids: list[str]) -> dict[str, Any] | None:
    if isinstance(store, InMemoryVectorStore):
        return {i: store.store[i]["vector"] for i in ids if i in store.store}
    kind = f"{type(store).__module__}.{type(store).__name__}"
    if kind.startswith("langchain_chroma.") and hasattr(store, "get"):
        got = store.get(ids=ids, include=["embeddings"])
        return dict(zip(got["ids"], got["embeddings"], strict=True))
    if kind.startswith("langchain_community.vectorstores.faiss"):
        position = _faiss_positions(store)  # its index and id map are public attributes
        return {i: store.index.reconstruct(position[i]) for i in ids if i in position}
    return None


def _faiss_positions(store: Any) -> dict[str, int]:
    """Docstore id -> index position of a FAISS store, kept between queries."""
    entries = store.index_to_docstore_id
    known = _FAISS_POSITIONS.get(store)
    if known is None or known[0] != len(entries):
        known = (len(entries), {doc_id: pos for pos, doc_id in entries.items()})
        _FAISS_POSITIONS[store] = known
    return known[1]
