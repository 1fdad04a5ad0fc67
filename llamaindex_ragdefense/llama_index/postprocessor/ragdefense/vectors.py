"""The vectors a LlamaIndex vector store already holds for the nodes it returned, so a defense
does not embed them again: the default ``SimpleVectorStore`` and ``ChromaVectorStore``
(``llama-index-vector-stores-chroma``) by node id; other stores give none (the defense
then embeds the nodes, and says so once per store type:
:func:`ragdefense.integration.vectors.stored_vectors`).

:func:`index_corpus` reads a whole index over those stores, in batches, for ``ragdefense.audit``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from llama_index.core import VectorStoreIndex
from llama_index.core.schema import BaseNode, MetadataMode, TextNode
from llama_index.core.vector_stores import SimpleVectorStore
from llama_index.core.vector_stores.utils import metadata_dict_to_node

from ragdefense.auditing import Batch
from ragdefense.auditing.space import stored_rows
from ragdefense.integration import vectors as core_vectors

__all__ = [
    "IndexCorpus",
    "index_corpus",
    "index_nodes",
    "store_kind",
    "stored_vectors",
    "with_document",
]


def stored_vectors(
    store: Any, node_ids: Sequence[str], texts: Sequence[str] | None = None
) -> list[Any | None]:
    """One stored vector per node id (``None`` where the store has none for it). With the
    nodes' ``texts``, a store that holds texts (Chroma) gives a node's vector only where it
    holds that node's text under its id: a node whose text was replaced on the way (a sentence
    window's) or another store's node numbered alike is embedded instead, as the LangChain
    adapter does."""
    held: dict[str, str | None] = {}  # the texts a store that holds texts holds

    def lookup(found_in: Any, ids: list[str]) -> dict[str, Any] | None:
        found = _lookup(found_in, ids, with_texts=texts is not None)
        if found is None:
            return None
        if texts is not None and store_kind(found_in) == "chroma":
            held.update((i, text) for i, (_, text) in found.items())
        return {i: vector for i, (vector, _) in found.items()}

    vectors = core_vectors.stored_vectors(store, list(node_ids), lookup)
    if not held or texts is None:
        return vectors
    return [
        v if held.get(i) == t else None for i, t, v in zip(node_ids, texts, vectors, strict=True)
    ]


def store_kind(store: Any) -> Literal["simple", "chroma"] | None:
    """Which of the stores whose vectors ragdefense can read ``store`` is (``None``: another)."""
    if isinstance(store, SimpleVectorStore):
        return "simple"
    if any(c.__name__ == "ChromaVectorStore" for c in type(store).__mro__):  # or a subclass
        return "chroma"
    return None


def index_nodes(index: VectorStoreIndex) -> list[BaseNode] | None:
    """Every node of ``index`` over a store of :func:`store_kind` (``None`` for another store):
    for the default store, the docstore's own objects of the index's nodes the store holds
    vectors for (a node deleted from the index, or another index's in a shared storage context,
    is not one); fresh ones read from Chroma."""
    kind = store_kind(index.vector_store)
    if kind == "simple":
        held = _held(index)
        return list(index.docstore.get_nodes(held)) if held else []
    if kind == "chroma":  # a page at a time: one read of every record passes SQLite's limits
        return [node for page in IndexCorpus(index)._pages(1000) for node in page]
    return None


def _held(index: VectorStoreIndex) -> list[str]:
    """The ids of ``index``'s own nodes that its default store holds vectors for: indexes
    built over one storage context share its store, and each searches only its own nodes."""
    vectors: Any = index.vector_store.data.embedding_dict  # type: ignore[attr-defined]
    own = set(index.index_struct.nodes_dict.values())
    return [i for i in vectors if i in own]


def _lookup(
    store: Any, ids: list[str], with_texts: bool = False
) -> dict[str, tuple[Any, str | None]] | None:
    """Per id the store holds: its vector, and (``with_texts``, where the store holds texts:
    Chroma) its text."""
    kind = store_kind(store)
    if kind == "simple":
        vectors = store.data.embedding_dict
        return {i: (vectors[i], None) for i in ids if i in vectors}
    if kind == "chroma":  # its client is the Chroma collection
        include = ["embeddings", "documents"] if with_texts else ["embeddings"]
        got = store.client.get(ids=ids, include=include)
        texts = got["documents"] if with_texts else [None] * len(got["ids"])
        return dict(zip(got["ids"], zip(got["embeddings"], texts, strict=True), strict=True))
    return None


class IndexCorpus:
    """Every node of a ``VectorStoreIndex`` (default store or Chroma) with its stored vector, in
    batches (read only; :class:`ragdefense.auditing.Corpus`). A ``title`` in a node's metadata is
    kept, and so is the metadata with the node's document id (the audit reads the source from
    it). Nodes are read a batch at a time (ids first, then each batch's nodes from the docstore
    or the Chroma collection), so memory holds one batch of nodes, not the index."""

    def __init__(self, index: VectorStoreIndex) -> None:
        store = index.vector_store
        if store_kind(store) not in ("simple", "chroma"):
            raise TypeError(
                f"ragdefense cannot read every node of an index over a {type(store).__name__}: "
                "export it as a JSONL file of {id, text, embedding?} and audit that"
            )
        self.index = index

    def fingerprint(self) -> str:
        """The store's type and the number of nodes it holds vectors for (counted, not read)."""
        store: Any = self.index.vector_store
        kind = store_kind(store)
        n = store.client.count() if kind == "chroma" else len(_held(self.index))
        return f"{type(store).__name__} {n}"

    def _pages(self, size: int) -> Iterator[list[BaseNode]]:
        """The index's nodes, ``size`` at a time."""
        store: Any = self.index.vector_store
        kind = store_kind(store)
        if kind == "simple":  # the index's ids with vectors; the nodes from the docstore
            ids = _held(self.index)
            for start in range(0, len(ids), size):
                yield self.index.docstore.get_nodes(ids[start : start + size])
        elif kind == "chroma":  # its client is the Chroma collection
            for offset in range(0, store.client.count(), size):
                got = store.client.get(
                    limit=size, offset=offset, include=["documents", "metadatas"]
                )
                yield [
                    _chroma_node(i, meta, text)
                    for i, meta, text in zip(
                        got["ids"], got["metadatas"], got["documents"], strict=True
                    )
                ]

    def batches(self, size: int) -> Iterator[Batch]:
        store: Any = self.index.vector_store
        for part in self._pages(size):
            ids = [n.node_id for n in part]
            wanted = list(dict.fromkeys(ids))  # an emptied page asks nothing (Chroma refuses [])
            found = (_lookup(store, wanted) or {}) if wanted else {}  # a store failing: the run's
            vectors = [found[i][0] if i in found else None for i in ids]
            yield Batch(
                ids,
                [n.get_content(metadata_mode=MetadataMode.NONE) for n in part],
                [str(n.metadata.get("title") or "") for n in part],
                None if any(v is None for v in vectors) else stored_rows(ids, vectors),
                [with_document(n) for n in part],
            )


def with_document(node: BaseNode) -> Mapping[str, Any]:
    """The node's metadata as the defenses and the audit read it: plus the id of the document
    it was cut from (``ref_doc_id``), where LlamaIndex keeps it outside the metadata, so that
    chunks of one document count as one source (a reader's ``file_path`` / ``url`` come
    first)."""
    meta = node.metadata
    doc = node.ref_doc_id
    if doc is None or "ref_doc_id" in meta:
        return meta
    return {**meta, "ref_doc_id": doc}


def _chroma_node(node_id: str, meta: Mapping[str, Any] | None, text: str | None) -> BaseNode:
    """A node of a Chroma collection: as LlamaIndex wrote it, or, for records another tool
    wrote (no node content in their metadata), a text node with the record's id and metadata."""
    try:
        return metadata_dict_to_node(dict(meta or {}), text=text)
    except ValueError:
        if not isinstance(text, str):  # as the LangChain reader: never audited as ""
            raise ValueError(
                f"chunk {node_id!r} has no text string (got {type(text).__name__}): give every "
                "record of the collection a document ('' for none)"
            ) from None
        return TextNode(id_=node_id, text=text, metadata=dict(meta or {}))


def index_corpus(index: VectorStoreIndex) -> IndexCorpus:
    """``index`` as a corpus for :func:`ragdefense.audit`."""
    return IndexCorpus(index)
