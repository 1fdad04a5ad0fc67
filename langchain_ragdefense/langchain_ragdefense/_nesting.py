"""How a LangChain retriever nests others (a compression retriever's base, an ensemble's
retrievers, a multi-query retriever's inner one), read to size the pool and to find the
store whose model embedded the documents."""

from __future__ import annotations

from typing import Any

from langchain_core.retrievers import BaseRetriever
from pydantic import BaseModel

from ragdefense.integration.retrieval import positive_int

__all__ = [
    "SIZE_FIELDS",
    "_compressed",
    "_ensemble",
    "_retriever_k",
    "_size_field",
    "_store_and_model",
    "_stores",
    "_unions",
]


def _compressed(retriever: BaseRetriever) -> BaseRetriever | None:
    """The base retriever of a ``ContextualCompressionRetriever`` (a ``base_retriever`` beside a
    ``base_compressor``), ``None`` for another."""
    base = getattr(retriever, "base_retriever", None)
    compressing = hasattr(retriever, "base_compressor") and isinstance(retriever, BaseModel)
    return base if compressing and isinstance(base, BaseRetriever) else None


def _ensemble(retriever: BaseRetriever) -> list[Any] | None:
    """The retrievers of an ensemble or merger (``retrievers``), ``None`` for another."""
    children = getattr(retriever, "retrievers", None)
    return children if isinstance(retriever, BaseModel) and isinstance(children, list) else None


def _wrapped(retriever: BaseRetriever) -> BaseRetriever | None:
    """The retriever a query rewriter asks (a ``MultiQueryRetriever``'s or
    ``RePhraseQueryRetriever``'s ``retriever``), ``None`` for another."""
    inner = getattr(retriever, "retriever", None)
    return inner if isinstance(retriever, BaseModel) and isinstance(inner, BaseRetriever) else None


#: the fields in which retrievers hold how many documents they return: BM25's and most custom
#: ones' ``k``; Kendra's and Pinecone hybrid search's ``top_k``; Wikipedia's
#: and arXiv's ``top_k_results``
SIZE_FIELDS = ("k", "top_k", "top_k_results")


def _size_field(retriever: Any) -> str | None:
    """The field of :data:`SIZE_FIELDS` holding ``retriever``'s size (a positive int), if any."""
    if not isinstance(retriever, BaseModel):
        return None
    return next((f for f in SIZE_FIELDS if positive_int(getattr(retriever, f, None))), None)


def _unions(retriever: BaseRetriever) -> bool:
    """Whether ``retriever`` returns the union of several queries' results, more than the
    retriever it asks returns (a ``MultiQueryRetriever``: it ``generate_queries``); a wrapper
    asking one query (``RePhraseQueryRetriever``, a logging or access-check wrapper) returns
    what its retriever does."""
    multi = callable(getattr(retriever, "generate_queries", None))
    return multi and _wrapped(retriever) is not None


def _retriever_k(retriever: BaseRetriever) -> int | None:
    """How many documents ``retriever`` returns by default, when it says (``None`` otherwise):
    its own ``k`` (or ``top_k``, ``top_k_results``) where it has one (a time-weighted retriever's
    ``search_kwargs["k"]`` counts its candidates), else its ``search_kwargs["k"]`` (a vector store
    retriever's, 4 unless set), as :func:`widened` asks it; an ensemble's, the sum of its
    retrievers' (it returns their union, at most that many); a compression retriever's, its base
    retriever's, at most its compressor's ``top_n``; a query rewriter's, the retriever's it asks."""
    if (inner := _wrapped(retriever)) is not None:
        return _retriever_k(inner)
    base = _compressed(retriever)
    if base is not None:  # what its compressor keeps of its base's: at most a reranker's top_n
        top_n = positive_int(getattr(getattr(retriever, "base_compressor", None), "top_n", None))
        under = _retriever_k(base)
        return min(top_n, under) if top_n and under else top_n or under
    children = _ensemble(retriever)
    if children is not None:
        found = [getattr(c, "default", c) for c in children]  # a configurable one: its default
        ks = [_retriever_k(c) for c in found if isinstance(c, BaseRetriever)]
        return sum(k for k in ks if k is not None) or None
    field = _size_field(retriever)
    own = positive_int(getattr(retriever, field, None)) if field else None
    search_kwargs = getattr(retriever, "search_kwargs", None)
    if own is None and isinstance(search_kwargs, dict) and hasattr(retriever, "vectorstore"):
        return positive_int(search_kwargs.get("k", 4))  # VectorStoreRetriever's default
    return own


def _stores(retriever: Any) -> list[Any]:
    """The vector stores ``retriever`` searches, each once: its own, a compression retriever's
    base's, a multi-query retriever's inner one's, an ensemble's retrievers' (beside BM25 and
    the like)."""
    own = getattr(retriever, "vectorstore", None)
    if own is not None:
        return [own]
    inner = _compressed(retriever) or _wrapped(retriever)  # a MultiQueryRetriever's
    if inner is not None:
        return _stores(inner)
    found = {id(s): s for child in _ensemble(retriever) or [] for s in _stores(child)}
    return list(found.values())


def _store_and_model(retriever: Any) -> tuple[Any, Any]:
    """The one store ``retriever`` searches (``None``: none, or several: which one holds a
    document's vector would be a guess), and the one embeddings model its stores share
    (``None``: none, or several)."""
    stores = _stores(retriever)
    models = {id(m): m for m in (getattr(s, "embeddings", None) for s in stores) if m is not None}
    model = next(iter(models.values())) if len(models) == 1 else None
    return (stores[0] if len(stores) == 1 else None), model
