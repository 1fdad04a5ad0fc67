"""The vectors a LangChain vector store already holds for the documents it returned, so a defense
does not embed them again: ``InMemoryVectorStore``, Chroma (``langchain-chroma``) and FAISS
(``langchain-community``) by document id; other stores give none (the defense then embeds the
documents, and says so once per store type)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore

__all__ = ["stored_vectors"]

logger = logging.getLogger("ragdefense")
_SAID: set[str] = set()


def stored_vectors(store: VectorStore, documents: Sequence[Document]) -> list[Any | None]:
    """One stored vector per document (``None`` where the store has none for it)."""
    ids = [d.id for d in documents]
    try:
        found = _lookup(store, [i for i in ids if i])
    except Exception as exc:  # a store that cannot answer: embed instead, and say so once
        found = None
        _say_once(store, f"reading its vectors failed ({type(exc).__name__}: {exc})")
    if found is None:
        return [None] * len(documents)
    return [found.get(i) if i else None for i in ids]


def _lookup(store: VectorStore, ids: list[str]) -> dict[str, Any] | None:
    if isinstance(store, InMemoryVectorStore):
        return {i: store.store[i]["vector"] for i in ids if i in store.store}
    kind = f"{type(store).__module__}.{type(store).__name__}"
    if kind.startswith("langchain_chroma.") and hasattr(store, "get"):
        got = store.get(ids=ids, include=["embeddings"])
        return dict(zip(got["ids"], got["embeddings"], strict=True))
    if kind.startswith("langchain_community.vectorstores.faiss"):
        faiss: Any = store  # its index and id map are public attributes of that class
        position = {doc_id: pos for pos, doc_id in faiss.index_to_docstore_id.items()}
        return {i: faiss.index.reconstruct(position[i]) for i in ids if i in position}
    _say_once(store, "it is not one whose vectors ragdefense can read")
    return None


def _say_once(store: VectorStore, why: str) -> None:
    name = type(store).__name__
    if name not in _SAID:
        _SAID.add(name)
        logger.warning("%s: the defense embeds the retrieved documents itself: %s", name, why)
