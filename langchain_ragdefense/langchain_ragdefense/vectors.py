"""The vectors a LangChain vector store already holds for the documents it returned, so a defense
does not embed them again: ``InMemoryVectorStore``, Chroma (``langchain-chroma``) and FAISS
(``langchain-community``) by document id; other stores give none (the defense then embeds the
documents, and says so once per store type: :func:`ragdefense.integration.vectors.stored_vectors`).

:func:`store_corpus` reads a whole store of those kinds, in batches, for ``ragdefense.audit``;
:func:`by_vector` asks one's similarity search by a query vector already embedded (the one
line embeds the query once for the search and the defense)."""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Literal, TypeGuard

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore, VectorStoreRetriever

from ragdefense import EmbeddingError, LangChainEmbedder
from ragdefense.auditing import Batch
from ragdefense.auditing.space import stored_rows
from ragdefense.integration import vectors as core_vectors

from ._private import chroma_collection

__all__ = ["StoreCorpus", "store_corpus", "store_kind", "stored_vectors"]

# FAISS store -> (its id map as read, that map's size, docstore id -> index position), built
# again when the store's id map changed
_FAISS_POSITIONS: weakref.WeakKeyDictionary[Any, tuple[dict[int, str], int, dict[str, int]]] = (
    weakref.WeakKeyDictionary()
)


def stored_vectors(store: VectorStore, documents: Sequence[Document]) -> list[Any | None]:
    """One stored vector per document (``None`` where the store has none for it): the vector
    the store holds under the document's id, only where it holds the document's own text
    there. A document of another store (a base retriever swapped after ``defend``, a BM25
    retriever over other documents, a second store numbering its chunks as the first does) can
    carry an id this store gives to another text: that text's vector would be judged in its
    place, so it is embedded instead."""
    held_texts: dict[str, str | None] = {}

    def lookup(held: Any, ids: list[str]) -> dict[str, Any] | None:
        found = _lookup(held, ids)
        if found is None:
            return None
        held_texts.update((i, text) for i, (_, text) in found.items())
        return {i: vector for i, (vector, _) in found.items()}

    vectors = core_vectors.stored_vectors(store, [d.id for d in documents], lookup)
    return [
        v if v is not None and held_texts.get(d.id or "") == d.page_content else None
        for d, v in zip(documents, vectors, strict=True)
    ]


def store_kind(store: Any) -> Literal["inmemory", "chroma", "faiss"] | None:
    """Which of the stores whose vectors ragdefense can read ``store`` is (``None``: another)."""
    if isinstance(store, InMemoryVectorStore):
        return "inmemory"
    # by the classes it is made from: a user's subclass of Chroma is Chroma
    where = [f"{c.__module__}.{c.__name__}" for c in type(store).__mro__]
    if any(w.startswith("langchain_chroma.") for w in where) and hasattr(store, "get"):
        return "chroma"
    if any(w.startswith("langchain_community.vectorstores.faiss") for w in where):
        return "faiss"
    return None


def _lookup(store: Any, ids: list[str]) -> dict[str, tuple[Any, str | None]] | None:
    """Per id the store holds: its vector and its text."""
    kind = store_kind(store)
    if kind == "inmemory":
        held = store.store
        return {i: (held[i]["vector"], held[i].get("text")) for i in ids if i in held}
    if kind == "chroma":
        got = store.get(ids=ids, include=["embeddings", "documents"])
        rows = zip(got["embeddings"], got["documents"], strict=True)
        return dict(zip(got["ids"], rows, strict=True))
    if kind == "faiss":
        held, named = store.index.ntotal, len(store.index_to_docstore_id)
        if held != named:  # an add that failed after its vectors went in: positions are off
            raise ValueError(f"its index holds {held} vectors for {named} ids")
        position = _faiss_positions(store, ids)  # its index and id map are public attributes
        return {
            i: (store.index.reconstruct(position[i]), _faiss_text(store, i))
            for i in ids
            if i in position
        }
    return None


def _faiss_text(store: Any, doc_id: str) -> str | None:
    """The text a FAISS store's docstore holds under ``doc_id`` (``None``: none)."""
    found = store.docstore.search(doc_id)
    return found.page_content if isinstance(found, Document) else None


def _faiss_positions(store: Any, ids: list[str]) -> dict[str, int]:
    """Docstore id -> index position of a FAISS store, kept between queries and built again
    when the store's id map changed: another map (a delete replaces it, shifting the positions
    after the deleted ones), another size (an add), or one of ``ids`` not where it says (the
    map edited in place). An id the store does not hold is simply absent: it costs no
    rebuild."""
    entries = store.index_to_docstore_id
    cached = _FAISS_POSITIONS.get(store)
    if cached is not None:
        seen, size, known = cached
        same = seen is entries and size == len(entries)
        if same and all(entries.get(known[i]) == i for i in ids if i in known):
            return known
    known = {doc_id: pos for pos, doc_id in entries.items()}
    _FAISS_POSITIONS[store] = (entries, len(entries), known)
    return known


class StoreCorpus:
    """Every document of a LangChain vector store with its stored vector, in batches (read only;
    :class:`ragdefense.auditing.Corpus`). A ``title`` in a document's metadata is kept, and so is
    the metadata itself (the audit reads each document's source from it)."""

    def __init__(self, store: VectorStore) -> None:
        self.store = store

    def fingerprint(self) -> str:
        """The store's type and size."""
        store: Any = self.store
        kind = store_kind(store)
        if kind is None:
            return type(store).__name__
        if kind == "chroma":
            n = chroma_collection(store).count()
        else:
            n = len(store.store if kind == "inmemory" else store.index_to_docstore_id)
        return f"{type(store).__name__} {n}"

    def batches(self, size: int) -> Iterator[Batch]:
        store: Any = self.store
        kind = store_kind(store)
        if kind == "inmemory":
            items = list(store.store.values())
            for start in range(0, len(items), size):
                rows = items[start : start + size]
                yield _batch(
                    [r["id"] for r in rows],
                    [r["text"] for r in rows],
                    [r.get("metadata") for r in rows],
                    [r["vector"] for r in rows],
                )
        elif kind == "chroma":
            offset = 0
            while True:
                include = ["documents", "metadatas", "embeddings"]
                got = store.get(limit=size, offset=offset, include=include)
                if not got["ids"]:
                    return
                yield _batch(got["ids"], got["documents"], got["metadatas"], got["embeddings"])
                offset += len(got["ids"])
        elif kind == "faiss":
            ids = store.index_to_docstore_id
            for start in range(0, len(ids), size):
                positions = range(start, min(start + size, len(ids)))
                docs = [store.docstore.search(ids[p]) for p in positions]
                lost = next(
                    (ids[p] for p, d in zip(positions, docs, strict=True) if isinstance(d, str)),
                    None,
                )
                if lost is not None:  # the docstore answers a missing id with a message
                    raise ValueError(
                        f"FAISS store: vector of document {lost!r} has no document in its "
                        "docstore (a docstore edited apart from the index): rebuild the store"
                    )
                yield _batch(
                    [ids[p] for p in positions],
                    [d.page_content for d in docs],
                    [d.metadata for d in docs],
                    store.index.reconstruct_n(start, len(positions)),
                )
        else:
            raise TypeError(
                f"ragdefense cannot read every document of a {type(store).__name__}: export it as "
                "a JSONL file of {id, text, embedding?} and audit that"
            )


def _batch(ids: Any, texts: Any, metadatas: Any, vectors: Any) -> Batch:
    metadata = [dict(m or {}) for m in metadatas]
    titles = [str(m.get("title") or "") for m in metadata]
    named = [str(i) for i in ids]
    return Batch(named, list(texts), titles, stored_rows(named, vectors), metadata)


def store_corpus(store: VectorStore) -> StoreCorpus:
    """``store`` as a corpus for :func:`ragdefense.audit`."""
    return StoreCorpus(store)


def searches_by_vector(
    retriever: BaseRetriever, embeddings: Embeddings
) -> TypeGuard[VectorStoreRetriever]:
    """Whether ``retriever`` is a plain similarity or MMR search of a store of a kind
    ragdefense reads (InMemory, Chroma, FAISS) embedding with ``embeddings``, whose search
    embeds the query with them and searches by that vector, as the library wrote it (a subclass
    or a patch that searches otherwise, or a store swapped in with another model, is asked as
    it is)."""
    kind = getattr(retriever, "search_type", None)
    if type(retriever) is not VectorStoreRetriever or kind not in ("similarity", "mmr"):
        return False
    store = retriever.vectorstore
    if store_kind(store) is None or getattr(store, "embeddings", None) is not embeddings:
        return False
    library = ("langchain_core.", "langchain_chroma.", "langchain_community.vectorstores.faiss")
    if not type(store).__module__.startswith(library):  # a subclass may embed or score otherwise
        return False
    methods = ["similarity_search", "asimilarity_search", "similarity_search_by_vector"]
    if kind == "mmr":
        mmr = "max_marginal_relevance_search"
        methods = [mmr, f"a{mmr}", f"{mmr}_by_vector"]
    for name in methods:  # the functions' own modules: a method patched on the class is not
        found = getattr(type(store), name, None)  # the library's (a tracer, a spy)
        if not str(getattr(found, "__module__", "")).startswith(library) or name in vars(store):
            return False
    return True


def remembered(embedder: LangChainEmbedder, query: str, raw: Any) -> Any:
    """``raw``, the store's model's vector for ``query``, kept as the defense's query embedding
    (a vector the defense would refuse is left for it to refuse as before: the defense then
    embeds the query itself)."""
    with contextlib.suppress(EmbeddingError):
        embedder.remember_query(query, raw)
    return raw


def by_vector(retriever: VectorStoreRetriever, vector: Any) -> VectorStoreRetriever:
    """A copy of ``retriever`` over a shallow copy of its store whose model knows ``vector``
    (the query's, already embedded by the store's own model): the store searches as it would
    (similarity or MMR, its own arguments), one model call fewer. The caller's retriever and
    store are not changed."""
    store = copy.copy(retriever.vectorstore)
    model: Any = retriever.vectorstore.embeddings  # the store's (searches_by_vector)
    for name in [k for k, v in vars(store).items() if v is model]:  # wherever it keeps it
        setattr(store, name, _Known(model, vector))
    return retriever.model_copy(update={"vectorstore": store})


class _Known(Embeddings):
    """A store's model whose vector for the query searched is already known."""

    def __init__(self, model: Embeddings, vector: Any) -> None:
        self.model, self.vector = model, vector

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.model.embed_documents(texts)

    def embed_query(self, text: str) -> list[float]:
        return list(self.vector)

    async def aembed_query(self, text: str) -> list[float]:
        return list(self.vector)
