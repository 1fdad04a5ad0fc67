"""Every read of a LangChain store's internals the adapter needs, in one place: the stores
offer no public API for these (checked against the versions we support by
``tests/test_stores.py``, which fails loudly if one is renamed)."""

from __future__ import annotations

from typing import Any

__all__ = ["chroma_client", "chroma_collection", "faiss_documents", "faiss_normalizes"]


def chroma_collection(store: Any) -> Any:
    """The Chroma collection a langchain-chroma ``Chroma`` store wraps (``Chroma._collection``)."""
    return store._collection


def chroma_client(store: Any) -> Any:
    """The Chroma client a langchain-chroma ``Chroma`` store holds (``Chroma._client``)."""
    return store._client


def faiss_documents(store: Any) -> dict[str, Any]:
    """The documents of a FAISS store's ``InMemoryDocstore`` by id (``InMemoryDocstore._dict``)."""
    documents: dict[str, Any] = store.docstore._dict
    return documents


def faiss_normalizes(store: Any) -> bool:
    """Whether a FAISS store normalizes its vectors (``FAISS._normalize_L2``)."""
    return bool(store._normalize_L2)
