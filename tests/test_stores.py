"""The one-line defense on real vector stores, started the way users start them (embedded,
offline): LangChain InMemory, Chroma (persistent client in a temporary folder) and FAISS;
LlamaIndex's default store and Chroma. The vectors each store holds are reused: the defense
embeds nothing but the query."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from ragdefense.data import load_demo_kb

KB = load_demo_kb()
QUESTION = KB[0]
TEXTS = [t for q in KB for t in q.benign] + [t for q in KB for t in q.poison]
POISON = {t for q in KB for t in q.poison}
#: each passage's source, as a loader records it (benign: reference sites; poison: one upload)
SOURCE = {
    t: s for q in KB for t, s in zip(q.benign + q.poison, q.sources + q.poison_sources, strict=True)
}

pytestmark = pytest.mark.slow


class Counting:
    """Wraps an embeddings object and counts the passages it embeds."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.passages = 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.passages += len(texts)
        return self.inner.embed_documents(texts)  # type: ignore[no-any-return]

    def embed_query(self, text: str) -> list[float]:
        return self.inner.embed_query(text)  # type: ignore[no-any-return]


def _lc_store(kind: str, embeddings: Any, folder: Path, texts: list[str] = TEXTS) -> Any:
    from langchain_core.documents import Document

    docs = [Document(page_content=t, metadata={"source": SOURCE.get(t, "user")}) for t in texts]
    if kind == "inmemory":
        from langchain_core.vectorstores import InMemoryVectorStore

        return InMemoryVectorStore.from_documents(docs, embeddings)
    if kind == "chroma":
        import chromadb
        from langchain_chroma import Chroma

        client = chromadb.PersistentClient(path=str(folder))
        return Chroma.from_documents(docs, embeddings, client=client, collection_name="knowledge")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.vectorstores import FAISS
    return FAISS.from_documents(docs, embeddings)


@pytest.mark.parametrize("kind", ["inmemory", "chroma", "faiss"])
def test_langchain_one_line_defense_reuses_the_stored_vectors(
    kind: str, minilm: Any, tmp_path: Path
) -> None:
    from langchain_core.embeddings import Embeddings

    from langchain_ragdefense import RagdefenseEmbeddings, defend

    counting = Counting(RagdefenseEmbeddings(minilm))
    Embeddings.register(Counting)
    store = _lc_store(kind, counting, tmp_path)
    retriever = store.as_retriever()  # LangChain's default: 4 documents
    plain = retriever.invoke(QUESTION.question)
    assert sum(d.page_content in POISON for d in plain) == 4  # the attack works

    before = counting.passages
    docs = defend(retriever).invoke(QUESTION.question)
    assert counting.passages == before  # no retrieved document was embedded again
    assert docs and not any(d.page_content in POISON for d in docs)


@pytest.mark.parametrize("search", ["similarity", "mmr"])
@pytest.mark.parametrize("kind", ["inmemory", "chroma", "faiss"])
def test_langchain_one_line_defense_embeds_the_query_once(
    kind: str, search: str, minilm: Any, tmp_path: Path
) -> None:
    """The store's search (similarity or MMR) and the defense need the query's vector by one
    model: it is computed once (a hosted model is paid once per question), sync and async, and
    the documents are those of the store's own search, defended; the caller's store is not
    changed."""
    import asyncio

    from langchain_core.embeddings import Embeddings

    from langchain_ragdefense import RagdefenseEmbeddings, defend

    class Queries(Embeddings):
        def __init__(self) -> None:
            self.inner, self.calls = RagdefenseEmbeddings(minilm), 0

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return self.inner.embed_documents(texts)

        def embed_query(self, text: str) -> list[float]:
            self.calls += 1
            return self.inner.embed_query(text)

        async def aembed_query(self, text: str) -> list[float]:
            self.calls += 1
            return self.inner.embed_query(text)

    embeddings = Queries()
    store = _lc_store(kind, embeddings, tmp_path)
    kwargs: dict[str, Any] = {"filter": None} if kind == "chroma" else {}
    if search == "mmr":  # its own settings, and one another search type left behind
        kwargs |= {"lambda_mult": 0.3, "score_threshold": 0.1}
    retriever = store.as_retriever(search_type=search, search_kwargs=kwargs)
    defended = defend(retriever)
    for ask, question in ((defended.invoke, KB[1].question), (defended.ainvoke, KB[2].question)):
        embeddings.calls = 0
        got = ask(question)
        docs = asyncio.run(got) if asyncio.iscoroutine(got) else got
        assert embeddings.calls == 1
        pool = (
            store.similarity_search(question, k=8, **kwargs)
            if search == "similarity"
            else store.max_marginal_relevance_search(question, k=8, fetch_k=8, **kwargs)
        )
        expected = defended.compressor.compress_documents(pool, question)[:4]
        assert [(d.id, d.page_content, d.metadata) for d in docs] == [
            (d.id, d.page_content, d.metadata) for d in expected
        ]
        assert docs and not any(d.page_content in POISON for d in docs)
    assert not {"similarity_search", "max_marginal_relevance_search"} & set(vars(store))
    assert retriever.vectorstore is store and store.embeddings is embeddings


def test_the_query_is_embedded_by_the_store_where_it_searches_its_own_way(minilm: Any) -> None:
    """A store subclass (which may embed or score the query its own way: an instruction prefix)
    and a defense embedder with a query side of its own are asked as before: the query-once
    path would have searched, or judged, with another vector."""
    from langchain_core.documents import Document
    from langchain_core.vectorstores import InMemoryVectorStore

    from langchain_ragdefense import RagdefenseEmbeddings, defend
    from langchain_ragdefense.vectors import searches_by_vector
    from ragdefense import Consensus, LangChainEmbedder

    embeddings = RagdefenseEmbeddings(minilm)

    class Prefixed(InMemoryVectorStore):
        def similarity_search_with_score(self, query: str, k: int = 4, **kw: Any) -> Any:
            return super().similarity_search_with_score("query: " + query, k, **kw)

    docs = [Document(t) for t in TEXTS]
    assert searches_by_vector(
        InMemoryVectorStore.from_documents(docs, embeddings).as_retriever(), embeddings
    )
    assert not searches_by_vector(
        Prefixed.from_documents(docs, embeddings).as_retriever(), embeddings
    )
    asked: list[str] = []

    class Instructed(LangChainEmbedder):
        def _embed_query(self, text: str) -> Any:
            asked.append(text)
            return self.embeddings.embed_query("query: " + text)

    store = InMemoryVectorStore.from_documents(docs, embeddings)
    guard = Consensus(embedder=Instructed(embeddings))
    defend(store.as_retriever(), guard).invoke(KB[3].question)
    assert asked == [KB[3].question]  # its own query vector, not the store's


@pytest.mark.parametrize("search_type", ["similarity", "mmr"])
def test_langchain_faiss_with_a_filter_is_asked_for_candidates(
    search_type: str, minilm: Any, tmp_path: Path
) -> None:
    """FAISS filters after its search (``fetch_k`` candidates): one tenant's pool comes from
    candidates in the user's proportion, and an MMR retriever is asked for the similarity pool
    over the filter. Other tenants' documents never reach the defense."""
    from langchain_core.documents import Document

    from langchain_ragdefense import RagdefenseEmbeddings, defend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.vectorstores import FAISS
    docs = [
        Document(t, metadata={"source": SOURCE[t], "tenant": f"t{n}"})
        for t in TEXTS
        for n in range(4)
    ]
    store = FAISS.from_documents(docs, RagdefenseEmbeddings(minilm))
    kwargs: dict[str, Any] = {"k": 4, "filter": {"tenant": "t2"}}  # FAISS's fetch_k: 20
    if search_type == "mmr":
        kwargs["fetch_k"] = 100  # the user's, for their filter: kept
    retriever = store.as_retriever(search_type=search_type, search_kwargs=kwargs)
    assert sum(d.page_content in POISON for d in retriever.invoke(QUESTION.question)) >= 1
    seen: list[Any] = []
    with warnings.catch_warnings(record=True):
        out = defend(retriever).invoke(QUESTION.question)
        seen = defend(retriever, k=8).invoke(QUESTION.question)
    assert out and not any(d.page_content in POISON for d in out)
    assert len(seen) == 8 and all(d.metadata["tenant"] == "t2" for d in [*out, *seen])
    assert retriever.search_kwargs == kwargs and retriever.search_type == search_type
    # the filter given per call instead is widened alike
    unfiltered = {key: v for key, v in kwargs.items() if key != "filter"}
    per_call = store.as_retriever(search_type=search_type, search_kwargs=unfiltered)
    with warnings.catch_warnings(record=True):
        called = defend(per_call).invoke(QUESTION.question, filter=kwargs["filter"])
    assert [d.page_content for d in called] == [d.page_content for d in out]


@pytest.mark.parametrize("kind", ["chroma", "faiss"])
def test_stored_vectors_stay_each_documents_own_after_edits(
    kind: str, minilm: Any, tmp_path: Path
) -> None:
    """A delete then an add leaves a FAISS store as large as before, its positions shifted: the
    vectors read back are still each document's own. An id asked twice (one document retrieved
    twice) is read, not refused."""
    import numpy as np
    from langchain_core.documents import Document

    from langchain_ragdefense import RagdefenseEmbeddings
    from langchain_ragdefense.vectors import stored_vectors

    embeddings = RagdefenseEmbeddings(minilm)
    store = _lc_store(kind, embeddings, tmp_path)
    stored_vectors(store, store.similarity_search(QUESTION.question, k=8))  # cached positions
    first = store.similarity_search(TEXTS[0], k=1)[0]
    store.delete([first.id])
    store.add_documents([Document("A passage about volcanoes in Iceland.")])
    pool = store.similarity_search(QUESTION.question, k=8)
    pool.append(pool[0])
    got = stored_vectors(store, pool)
    own = embeddings.embed_documents([d.page_content for d in pool])
    pairs = zip(got, own, strict=True)
    assert all(g is not None and np.allclose(g, t, atol=1e-4) for g, t in pairs)


def test_faiss_positions_are_built_again_only_when_the_store_changes(
    minilm: Any, tmp_path: Path
) -> None:
    """A document the store does not hold (no id, or another store's) is absent, and costs no
    rebuild of the id map on every query; an add or a delete does rebuild it."""
    from langchain_core.documents import Document

    from langchain_ragdefense import RagdefenseEmbeddings
    from langchain_ragdefense.vectors import _faiss_positions, stored_vectors

    store = _lc_store("faiss", RagdefenseEmbeddings(minilm), tmp_path)
    pool = [*store.similarity_search(QUESTION.question, k=4), Document("elsewhere", id="x-1")]
    got = stored_vectors(store, pool)
    assert got[-1] is None and all(v is not None for v in got[:-1])
    known = _faiss_positions(store, ["x-1"])
    assert _faiss_positions(store, ["x-1", pool[0].id or ""]) is known  # no rebuild
    store.add_documents([Document("A passage about volcanoes in Iceland.", id="v-1")])
    grown = _faiss_positions(store, ["v-1"])
    assert grown is not known and "v-1" in grown
    store.delete([pool[0].id or ""])
    assert pool[0].id not in _faiss_positions(store, [pool[1].id or ""])
    # one deleted and one added between two lookups: the same size, every position shifted
    before = _faiss_positions(store, [pool[1].id or ""])
    store.delete([pool[1].id or ""])
    store.add_documents([Document("A passage about glaciers in Norway.", id="v-2")])
    moved = _faiss_positions(store, ["v-2", pool[2].id or ""])
    assert moved is not before and "v-2" in moved
    assert store.index_to_docstore_id[moved[pool[2].id or ""]] == pool[2].id
    # two entries swapped in place (same map, same size): the looked-up id says so
    entries = store.index_to_docstore_id
    a, b = moved[pool[2].id or ""], moved["v-2"]
    entries[a], entries[b] = entries[b], entries[a]
    assert _faiss_positions(store, [pool[2].id or ""])[pool[2].id or ""] == b
    entries[a], entries[b] = entries[b], entries[a]
    # an add that fails after its vector went in (an id already held): read nothing, embed
    with pytest.raises(ValueError):
        store.add_documents([Document("Again.", id="v-2")])
    assert store.index.ntotal != len(store.index_to_docstore_id)
    assert stored_vectors(store, pool[2:3]) == [None]


@pytest.mark.parametrize("kind", ["simple", "chroma"])
def test_llamaindex_postprocessor_reuses_the_stored_vectors(
    kind: str, minilm: Any, tmp_path: Path
) -> None:
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.schema import TextNode

    from llama_index.postprocessor.ragdefense import RAGDefenderPostprocessor, RagdefenseEmbedding

    embed = RagdefenseEmbedding(minilm)
    nodes = [TextNode(text=t) for t in TEXTS]
    if kind == "chroma":
        import chromadb
        from llama_index.vector_stores.chroma import ChromaVectorStore

        collection = chromadb.PersistentClient(path=str(tmp_path)).get_or_create_collection(
            "knowledge"
        )
        storage = StorageContext.from_defaults(vector_store=ChromaVectorStore(collection))
        index = VectorStoreIndex(nodes, storage_context=storage, embed_model=embed)
    else:
        index = VectorStoreIndex(nodes, embed_model=embed)
    found = index.as_retriever(similarity_top_k=8).retrieve(QUESTION.question)
    assert all(n.node.embedding is None for n in found)  # the retriever does not carry them
    calls: list[int] = []
    embed_model = RagdefenseEmbedding(minilm)
    original = embed_model._get_text_embeddings  # count what the defense would embed
    object.__setattr__(
        embed_model,
        "_get_text_embeddings",
        lambda texts: calls.append(len(texts)) or original(texts),
    )
    guard = RAGDefenderPostprocessor(embed_model=embed_model, vector_store=index.vector_store)
    kept = guard.postprocess_nodes(found, query_str=QUESTION.question)
    assert calls == []
    assert kept and not any(n.node.get_content() in POISON for n in kept)
    assert sum(n.node.get_content() in POISON for n in found) == 5


def test_llamaindex_mmr_retriever_on_chroma_with_mmr_settings(minilm: Any, tmp_path: Path) -> None:
    """An MMR retriever is asked for the similarity pool without its MMR settings, which Chroma
    refuses outside MMR."""
    import chromadb
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.schema import TextNode
    from llama_index.vector_stores.chroma import ChromaVectorStore

    from llama_index.postprocessor.ragdefense import RagdefenseEmbedding, defend

    collection = chromadb.PersistentClient(path=str(tmp_path)).get_or_create_collection("knowledge")
    storage = StorageContext.from_defaults(vector_store=ChromaVectorStore(collection))
    nodes = [TextNode(text=t, metadata={"source": SOURCE[t]}) for t in TEXTS]
    index = VectorStoreIndex(
        nodes, storage_context=storage, embed_model=RagdefenseEmbedding(minilm)
    )
    mmr = index.as_retriever(
        vector_store_query_mode="mmr",
        similarity_top_k=4,
        vector_store_kwargs={"mmr_threshold": 0.5},
    )
    assert len(mmr.retrieve(QUESTION.question)) == 4
    found = defend(mmr).retrieve(QUESTION.question)
    assert found and not any(n.node.get_content() in POISON for n in found)


def _targets() -> list[Any]:
    from ragdefense import AttackTarget

    return [
        AttackTarget(q.question, q.incorrect_answer, q.correct_answer, tuple(q.poison))
        for q in KB[:3]
    ]


def _planted_and_defended(report: Any) -> None:
    """The poison was planted in the copy (it reaches every undefended context, most of most of
    them), and the default defense does better."""
    assert report.pipelines == ["no defense", "consensus"]
    plain = [o for o in report.outcomes if o.pipeline == "no defense"]
    assert all(o.poison_retrieved for o in plain)
    assert report.hijack_rate("no defense") >= 2 / 3
    assert report.hijack_rate("consensus") < report.hijack_rate("no defense")


def _lc_count(store: Any, kind: str) -> int:
    if kind == "chroma":
        return int(store._collection.count())
    if kind == "faiss":
        return int(store.index.ntotal)
    return len(store.store)


@pytest.mark.parametrize("kind", ["inmemory", "chroma", "faiss"])
def test_langchain_red_team_on_a_copy_of_each_store(kind: str, minilm: Any, tmp_path: Path) -> None:
    from langchain_core.embeddings import Embeddings

    from langchain_ragdefense import RagdefenseEmbeddings, red_team

    counting = Counting(RagdefenseEmbeddings(minilm))
    Embeddings.register(Counting)
    store = _lc_store(kind, counting, tmp_path, [t for q in KB for t in q.benign])
    count, embedded = _lc_count(store, kind), counting.passages
    report = red_team(store, _targets(), k=4)
    assert _lc_count(store, kind) == count  # the user's collection: not one document more
    # the copy reused the stored vectors: only the planted poison (and queries) were embedded
    assert counting.passages - embedded <= 5 * 3 + 1
    _planted_and_defended(report)
    if kind == "chroma":  # and the database on disk was not given a collection
        import chromadb

        assert [
            c.name for c in chromadb.PersistentClient(path=str(tmp_path)).list_collections()
        ] == ["knowledge"]


@pytest.mark.parametrize("kind", ["simple", "chroma"])
def test_llamaindex_red_team_on_a_copy_of_each_store(
    kind: str, minilm: Any, tmp_path: Path
) -> None:
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.schema import TextNode

    from llama_index.postprocessor.ragdefense import RagdefenseEmbedding, red_team

    embed = RagdefenseEmbedding(minilm)
    nodes = [TextNode(text=t) for q in KB for t in q.benign]
    collection = None
    if kind == "chroma":
        import chromadb
        from llama_index.vector_stores.chroma import ChromaVectorStore

        client = chromadb.PersistentClient(path=str(tmp_path))
        collection = client.get_or_create_collection("knowledge")
        storage = StorageContext.from_defaults(vector_store=ChromaVectorStore(collection))
        index = VectorStoreIndex(nodes, storage_context=storage, embed_model=embed)
    else:
        index = VectorStoreIndex(nodes, embed_model=embed)

    def count() -> int:
        if collection is not None:
            return int(collection.count())
        return len(index.vector_store.data.embedding_dict)  # type: ignore[attr-defined]

    before = count()
    report = red_team(index, _targets(), k=4)
    assert count() == before == len(nodes)
    _planted_and_defended(report)


def test_a_red_team_copy_of_a_chroma_collection_keeps_its_distance(tmp_path: Path) -> None:
    """Set in the configuration (Chroma 1.x) or in the metadata (``hnsw:space``): the copy
    ranks as the user's collection does (made without it, Chroma measures L2)."""
    import chromadb

    from ragdefense.integration.vectors import chroma_copy_settings

    client = chromadb.PersistentClient(path=str(tmp_path))
    configured = client.create_collection("configured", configuration={"hnsw": {"space": "ip"}})
    legacy = client.create_collection("legacy", metadata={"hnsw:space": "cosine"})
    copies = chromadb.EphemeralClient()
    for source, space in ((configured, "ip"), (legacy, "cosine")):
        copy = copies.create_collection(f"copy-{space}", **chroma_copy_settings(source))
        assert copy.configuration["hnsw"]["space"] == space
        copies.delete_collection(copy.name)


def test_a_store_that_cannot_be_copied_safely_is_refused(minilm: Any, tmp_path: Path) -> None:
    from langchain_core.vectorstores import InMemoryVectorStore

    from langchain_ragdefense import RagdefenseEmbeddings, red_team

    class Remote(InMemoryVectorStore):  # stands for a store ragdefense does not know
        pass

    store = Remote(RagdefenseEmbeddings(minilm))
    with pytest.raises(TypeError, match="cannot copy a Remote safely: pass copy_store="):
        red_team(store, _targets())


@pytest.mark.parametrize("kind", ["chroma", "faiss"])
def test_the_langchain_store_internals_the_adapter_reads_exist(
    kind: str, minilm: Any, tmp_path: Path
) -> None:
    """Each private read sits in ``langchain_ragdefense/_private.py``; if a store renames one,
    this fails here instead of the red team or the audit failing in a user's hands."""
    from langchain_ragdefense import RagdefenseEmbeddings
    from langchain_ragdefense._private import (
        chroma_client,
        chroma_collection,
        faiss_documents,
        faiss_normalizes,
    )

    store = _lc_store(kind, RagdefenseEmbeddings(minilm), tmp_path, TEXTS[:6])
    if kind == "chroma":
        assert chroma_collection(store).count() == 6
        assert chroma_collection(store).name in {
            c.name for c in chroma_client(store).list_collections()
        }
    else:
        assert sorted(d.page_content for d in faiss_documents(store).values()) == sorted(TEXTS[:6])
        assert isinstance(faiss_normalizes(store), bool)


def test_llamaindex_chroma_vectors_are_read_only_for_the_text_they_were_made_from(
    minilm: Any, tmp_path: Path
) -> None:
    """A node's stored vector was read by id whatever its text now (a sentence window's
    replaced text, another store's node numbered alike); it is read only where Chroma holds
    the node's text, as in the LangChain adapter."""
    import chromadb
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.schema import TextNode
    from llama_index.vector_stores.chroma import ChromaVectorStore

    from llama_index.postprocessor.ragdefense import RagdefenseEmbedding
    from llama_index.postprocessor.ragdefense.vectors import stored_vectors

    collection = chromadb.PersistentClient(path=str(tmp_path)).get_or_create_collection("kb-li")
    store = ChromaVectorStore(collection)
    nodes = [TextNode(text=t, id_=f"n{i}") for i, t in enumerate(TEXTS[:3])]
    VectorStoreIndex(nodes, storage_context=StorageContext.from_defaults(vector_store=store),
                     embed_model=RagdefenseEmbedding(minilm))  # fmt: skip
    ids = ["n0", "n1", "n2"]
    assert all(v is not None for v in stored_vectors(store, ids))
    window = ["a window around it: " + TEXTS[0], TEXTS[1], TEXTS[2]]
    found = stored_vectors(store, ids, window)
    assert found[0] is None and found[1] is not None and found[2] is not None


def test_llamaindex_red_team_copies_a_chroma_collection_past_sqlite_s_limits(
    toy_embedder: Any, tmp_path: Path
) -> None:
    """A collection of tens of thousands of records is copied a batch at a time: one read of
    every record passes SQLite's limit on a query's variables (it failed there)."""
    import chromadb
    from llama_index.core import VectorStoreIndex
    from llama_index.vector_stores.chroma import ChromaVectorStore

    from llama_index.postprocessor.ragdefense import RagdefenseEmbedding, red_team
    from tests.conftest import bag_of_words

    client = chromadb.PersistentClient(path=str(tmp_path))
    collection = client.get_or_create_collection("many", metadata={"hnsw:space": "cosine"})
    texts = [f"note {i} on topic {i % 97}" for i in range(33_000)]
    vectors = bag_of_words(texts)
    vectors[:, 0] += 1e-3  # no all-zero row
    for start in range(0, len(texts), 5_000):
        end = min(start + 5_000, len(texts))
        collection.add(
            ids=[f"n{i}" for i in range(start, end)],
            documents=texts[start:end],
            embeddings=vectors[start:end],
        )
    embed = RagdefenseEmbedding(toy_embedder)
    index = VectorStoreIndex.from_vector_store(ChromaVectorStore(collection), embed_model=embed)
    report = red_team(index, _targets()[:1])  # (an approximate search finds what it finds)
    assert collection.count() == len(texts) and report.pipelines == ["no defense", "consensus"]
