"""The two framework adapters behave alike (#28): ``defend()`` takes the same arguments, refuses
the same mistakes and fetches the same pools; a reranking defense's order survives a re-sort by
score; the postprocessor that ``defend()`` builds serializes; the LlamaIndex internals the
adapter reads still exist in the version installed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core import Document as LIDocument
from llama_index.core import VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from langchain_ragdefense import DefenseCompressor, RagdefenseEmbeddings
from langchain_ragdefense import defend as lc_defend
from llama_index.postprocessor.ragdefense import (
    AutoDefensePostprocessor,
    DefensePostprocessor,
    RagdefenseEmbedding,
)
from llama_index.postprocessor.ragdefense import defend as li_defend
from ragdefense import GRADA, DefenseResult, Verdict
from ragdefense.types import to_passages

from .test_provenance_adapters import QUERY, TOPICS


class EveryOther:
    """A filter keeping every other passage, recording the pool it was handed each call."""

    name = "every-other"
    pool_factor = 1
    min_pool = 0
    min_passages = 1

    def __init__(self) -> None:
        self.pools: list[int] = []

    def defend(self, query: str, passages: Sequence[Any]) -> DefenseResult:
        given = to_passages(passages)
        self.pools.append(len(given))
        verdicts = tuple(
            Verdict(i, p, i % 2 == 0, 0.0, "kept" if i % 2 == 0 else "odd")
            for i, p in enumerate(given)
        )
        return DefenseResult(self.name, query, verdicts, "none")


@pytest.fixture
def both(toy_embedder: Any) -> tuple[Any, Any]:
    texts = TOPICS * 2
    store = InMemoryVectorStore.from_documents(
        [Document(t) for t in texts], RagdefenseEmbeddings(toy_embedder)
    )
    index = VectorStoreIndex.from_documents(
        [LIDocument(text=t) for t in texts], embed_model=RagdefenseEmbedding(toy_embedder)
    )
    return store.as_retriever(), index.as_retriever()


def test_the_same_fetch_policy(both: tuple[Any, Any]) -> None:
    """A k the caller names: the pool doubles while the defense leaves fewer than k; the
    framework's own k: one fetch, never more than it would return."""
    lc_retriever, li_retriever = both
    pools = []
    for defend, retriever, call in (
        (lc_defend, lc_retriever, lambda r: r.invoke(QUERY)),
        (li_defend, li_retriever, lambda r: r.retrieve(QUERY)),
    ):
        named, own = EveryOther(), EveryOther()
        assert len(call(defend(retriever, named, k=5))) == 5
        call(defend(retriever, own))
        pools.append((named.pools, len(own.pools)))
    assert pools[0] == pools[1] == ([5, 10], 1), pools


def test_the_same_mistakes_are_refused(both: tuple[Any, Any]) -> None:
    lc_retriever, li_retriever = both
    for defend, retriever, adapter in (
        (lc_defend, lc_retriever, DefenseCompressor()),
        (li_defend, li_retriever, DefensePostprocessor()),
    ):
        with pytest.raises(TypeError, match="no parameter 'bogus'"):
            defend(retriever, "grada", bogus=1)
        with pytest.raises(TypeError, match="only a defense name takes parameters"):
            defend(retriever, GRADA(), n=3)
        with pytest.raises(TypeError, match=r"fail_open: .* comes configured"):
            defend(retriever, adapter, fail_open=True)
        with pytest.raises(TypeError, match="not a defense"):
            defend(retriever, 42)
        # the core's own plain errors, not a framework's validation error wrapping them
        with pytest.raises(ValueError, match=r"^unknown defense 'consenus': use one of"):
            defend(retriever, "consenus")
        for size in ("4", 0, -1, True, 2.0):
            for name in ("k", "fetch_k"):
                for given in (None, adapter):  # a name, or an adapter configured already
                    with pytest.raises(ValueError, match=f"^{name} must be a positive int"):
                        defend(retriever, given, **{name: size})
        assert defend(retriever, k=np.int64(3)).k == 3  # a NumPy integer is an integer
        # (review) accepted, then every query failed on the defense's passage limit
        with pytest.raises(ValueError, match=r"^fetch_k=2500 is more than a defense compares"):
            defend(retriever, fetch_k=2500)
        with pytest.raises(ValueError, match=r"fetch_k=2500 is more than a defense compares"):
            defend(retriever).fetch_k = 2500  # set later, as at construction
    engine = lc_retriever.vectorstore  # a store, not its retriever
    with pytest.raises(TypeError, match=r"pass store\.as_retriever"):
        lc_defend(engine)
    engine = li_retriever._index.as_query_engine(llm=MockLLM())  # an engine, not a retriever
    with pytest.raises(TypeError, match=r"got RetrieverQueryEngine: pass its \.retriever$"):
        li_defend(engine)
    nodes = li_retriever.retrieve(QUERY)  # its repr alone ran to tens of kilobytes
    with pytest.raises(TypeError, match=r"got list: pass index\.as_retriever"):
        li_defend(nodes)


def test_a_reranking_defense_keeps_its_order_under_the_node_scores(toy_embedder: Any) -> None:
    """AutoDefense deciding for GRADA reranks: the nodes come back with its scores, best first,
    so anything sorting by score keeps its order (they kept the retriever's scores before)."""
    scores = [0.8, 0.6, 0.7, 0.9, 0.55, 0.5, 0.65, 0.75, 0.4, 0.45]
    nodes = [
        NodeWithScore(node=TextNode(text=t, id_=f"n{i}"), score=s)
        for i, (t, s) in enumerate(zip(TOPICS, scores, strict=True))
    ]
    post = AutoDefensePostprocessor(embed_model=RagdefenseEmbedding(toy_embedder))
    out = post.postprocess_nodes(nodes, query_bundle=QueryBundle(QUERY))
    assert out and {n.node.metadata["ragdefense"]["score_name"] for n in out} == {"GRADA: pagerank"}
    got = [n.score for n in out]
    assert got == sorted(got, reverse=True) and got != [s for s in scores if s in got]
    assert sorted(out, key=lambda n: -(n.score or 0)) == out


def test_the_postprocessor_defend_builds_serializes(both: tuple[Any, Any]) -> None:
    _, li_retriever = both
    post = li_defend(li_retriever, "consensus", trusted={"docs.example.org"}).postprocessor
    data = post.to_dict()
    assert data["defense"] == "consensus" and "vector_store" not in data
    back = DefensePostprocessor.from_json(post.to_json(), embed_model=post.embed_model)
    assert type(back.core).__name__ == "Consensus"
    assert list(back.core.trusted) == back.params["trusted"] == ["docs.example.org"]
    for misplaced in ({"trusted": ["who.int"]}, {"defense": "grada", "n": 1}, {"trustd": []}):
        with pytest.raises(ValueError, match="Extra inputs are not permitted"):
            DefensePostprocessor(**misplaced)  # as the LangChain compressor refuses them


def test_the_llamaindex_internals_the_adapter_reads_exist(both: tuple[Any, Any]) -> None:
    """Each private read sits in ``_private.py``; if LlamaIndex renames one, this fails here
    instead of the adapter silently re-embedding or losing the index's model."""
    from llama_index.postprocessor.ragdefense._private import index_embed_model, retriever_index

    _, li_retriever = both
    index = retriever_index(li_retriever)
    assert isinstance(index, VectorStoreIndex)
    assert isinstance(index_embed_model(index), RagdefenseEmbedding)
    from llama_index.retrievers.bm25 import BM25Retriever

    from llama_index.postprocessor.ragdefense._private import corpus_size

    nodes = index.docstore.docs.values()
    assert corpus_size(BM25Retriever.from_defaults(nodes=list(nodes))) == len(nodes)


def test_the_core_reaches_the_frameworks_through_their_entry_points(
    toy_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(#28) the audit and ``ragdefense attack --store`` reach a store through the adapter that
    registered its framework (entry point ``ragdefense.frameworks``), never by importing it.
    An object of a framework whose adapter is installed is no store of it (a retriever): it
    was told to install the adapter it has."""
    from ragdefense import plugins
    from ragdefense.plugins import framework_of, frameworks

    assert {f.name for f in frameworks()} == {"LangChain", "LlamaIndex"}
    store = InMemoryVectorStore.from_documents(
        [Document(t, id=str(i)) for i, t in enumerate(TOPICS)], RagdefenseEmbeddings(toy_embedder)
    )
    index = VectorStoreIndex.from_documents(
        [LIDocument(text=t) for t in TOPICS], embed_model=RagdefenseEmbedding(toy_embedder)
    )
    assert framework_of(store).name == "LangChain" and framework_of(index).name == "LlamaIndex"
    assert sorted(next(framework_of(store).corpus(store).batches(100)).texts) == sorted(TOPICS)
    with pytest.raises(TypeError, match="no store of an installed framework adapter"):
        framework_of(object())
    with pytest.raises(TypeError, match=r"pass the vector store .*not a retriever"):
        framework_of(store.as_retriever())
    monkeypatch.setattr(plugins, "frameworks", lambda: ())  # installed, failed to load
    with pytest.raises(TypeError, match="installed but did not load"):
        framework_of(store)
    missing = type("Index", (), {"__module__": "llama_index.core.other"})()
    monkeypatch.setattr(plugins, "_installed", lambda distribution: False)
    named = r"install llama-index-postprocessor-ragdefense .*install \./llamaindex_ragdefense"
    with pytest.raises(TypeError, match=named):
        framework_of(missing)


def test_params_never_silently_lose_to_a_field_and_copies_own_their_core() -> None:
    """(review) ``params={"n": 3}`` on a class declaring ``n`` was dropped for the field's
    default; ``model_copy`` shared the original's core, rebuilding both at every turn."""
    from langchain_ragdefense import GRADACompressor
    from llama_index.postprocessor.ragdefense import GRADAPostprocessor

    for cls in (GRADACompressor, GRADAPostprocessor):
        with pytest.raises(TypeError, match=r"n: a field of GRADA\w+, not a params entry"):
            cls(params={"n": 3})
        a = cls(n=3)
        b = a.model_copy(update={"n": 5})
        first_a, first_b = a.core, b.core
        for _ in range(3):
            assert a.core is first_a and b.core is first_b  # no rebuild back and forth
        assert (a.core.n, b.core.n) == (3, 5)


def test_the_postprocessor_round_trips_with_another_embedding_model(both: tuple[Any, Any]) -> None:
    """(review) the model's own fields were dropped (serialized as the base class): a
    LlamaIndex model such as MockEmbedding could not be loaded back; one LlamaIndex cannot load
    by name is a clear error naming the way out, never a different model."""
    from llama_index.core.embeddings import MockEmbedding

    post = DefensePostprocessor(embed_model=MockEmbedding(embed_dim=8))
    back = DefensePostprocessor.from_json(post.to_json())
    assert isinstance(back.embed_model, MockEmbedding) and back.embed_model.embed_dim == 8

    class Unknown(MockEmbedding):
        @classmethod
        def class_name(cls) -> str:
            return "UnknownEmbedding"

    data = DefensePostprocessor(embed_model=Unknown(embed_dim=4)).to_json()
    with pytest.raises(ValueError, match="pass embed_model= to from_json"):
        DefensePostprocessor.from_json(data)
    again = DefensePostprocessor.from_json(data, embed_model=Unknown(embed_dim=4))
    assert again.embed_model is not None
    # our wrapper over another embedder: its JSON holds no model, so loading it needs one
    from llama_index.postprocessor.ragdefense import RagdefenseEmbedding
    from llama_index.postprocessor.ragdefense.embeddings import PACKAGED

    def eight(texts: list[str]) -> Any:
        return [[1.0] * 8 for _ in texts]

    custom = DefensePostprocessor(embed_model=RagdefenseEmbedding(eight)).to_json()
    with pytest.raises(ValueError, match=r"custom: function.*pass embedder="):
        DefensePostprocessor.from_json(custom)
    model = RagdefenseEmbedding(eight)
    assert DefensePostprocessor.from_json(custom, embed_model=model).embed_model is model
    packaged = DefensePostprocessor(embed_model=RagdefenseEmbedding()).to_json()
    assert DefensePostprocessor.from_json(packaged).embed_model.model_name == PACKAGED  # type: ignore[union-attr]
    # a defense object or a trusted predicate does not serialize: said so, with the way out
    from ragdefense import GRADA

    with pytest.raises(TypeError, match=r"defense= a name and plain values.*GRADA"):
        DefensePostprocessor(defense=GRADA()).to_json()


def test_decoding_is_refused_where_the_framework_llm_cannot_serve_it() -> None:
    """(review) the adapters' LLMs expose no next-token probabilities: refused when built,
    not after retrieval; and a defense class (not an instance) is refused by the front door."""
    from langchain_core.runnables import RunnableLambda
    from llama_index.core.llms import MockLLM

    import ragdefense
    from langchain_ragdefense import RobustRAGChain
    from llama_index.postprocessor.ragdefense import RobustRAGSynthesizer

    # the engine's own advice (pass a transformers model) is none an adapter can take
    from ragdefense.robustrag import SecureDecoding

    said = "a LangChain or LlamaIndex LLM does not expose: use aggregation='keyword'"
    with pytest.raises(ValueError, match=said):
        RobustRAGSynthesizer(llm=MockLLM(), aggregation="decoding")
    with pytest.raises(ValueError, match=said):
        RobustRAGChain(llm=RunnableLambda(str), retriever=_Empty(), aggregation="decoding")
    with pytest.raises(ValueError, match=said):
        RobustRAGSynthesizer(llm=MockLLM(), aggregation=SecureDecoding())
    with pytest.raises(TypeError, match="GRADA is a class: pass an instance"):
        ragdefense.defense(GRADA)


class _Empty(BaseRetriever):
    def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
        return []


def test_an_index_over_a_chroma_collection_another_tool_filled_is_read() -> None:
    """(review) records without LlamaIndex's node content (a collection filled with chromadb
    directly) made the batched reader raise: they are read as text nodes with their ids."""
    import uuid

    import chromadb
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.vector_stores.chroma import ChromaVectorStore

    from llama_index.postprocessor.ragdefense.vectors import index_corpus

    client = chromadb.EphemeralClient()
    name = f"external-{uuid.uuid4().hex}"
    collection = client.create_collection(name)
    try:
        collection.add(
            ids=[f"e{i}" for i in range(5)],
            documents=TOPICS[:5],
            embeddings=[[float(i), 1.0, 0.0] for i in range(5)],
            metadatas=[{"source": "x"}] * 5,
        )
        index = VectorStoreIndex.from_vector_store(
            ChromaVectorStore(chroma_collection=collection), embed_model=MockEmbedding(embed_dim=3)
        )
        got = list(index_corpus(index).batches(2))
        assert [i for b in got for i in b.ids] == [f"e{i}" for i in range(5)]
        assert [t for b in got for t in b.texts] == TOPICS[:5]
        assert all(b.vectors is not None and b.vectors.shape[1] == 3 for b in got)
    finally:
        client.delete_collection(name)


def test_both_give_each_text_of_a_store_ingested_twice_once(both: tuple[Any, Any]) -> None:
    """The stores hold every text twice: the one line's context holds each once, in both
    (``keep_copies=True`` keeps them)."""
    lc_retriever, li_retriever = both
    lc = [d.page_content for d in lc_defend(lc_retriever, k=4).invoke(QUERY)]
    li = [n.node.get_content() for n in li_defend(li_retriever, k=4).retrieve(QUERY)]
    assert len(set(lc)) == len(lc) == 4 and len(set(li)) == len(li) == 4
    assert sorted(lc) == sorted(li)
    plain = [d.page_content for d in lc_defend(lc_retriever, k=4, keep_copies=True).invoke(QUERY)]
    assert len(set(plain)) < len(plain)


def test_an_entry_point_that_is_no_framework_is_skipped_not_fatal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One broken adapter must not break the others: an entry point that loads but is no
    ``Framework`` raised, and no framework was found at all."""
    from importlib.metadata import EntryPoint

    from ragdefense import plugins

    real = list(plugins.entry_points(group=plugins.GROUP))
    broken = EntryPoint("aaa-broken", "json:dumps", plugins.GROUP)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [broken, *real])
    plugins.frameworks.cache_clear()
    try:
        with caplog.at_level("WARNING", logger=plugins.logger.name):
            assert {f.name for f in plugins.frameworks()} == {"LangChain", "LlamaIndex"}
        assert "not a Framework" in caplog.text
    finally:
        plugins.frameworks.cache_clear()
