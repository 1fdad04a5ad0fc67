"""What the adapters promise beyond one call: a setting assigned after construction is checked
as at construction (and a refused value undone), the async paths embed the query once and keep
RobustRAG's CPU work off the event loop, and the public names are exported."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.runnables import RunnableLambda
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core import Document as LIDocument
from llama_index.core import VectorStoreIndex
from llama_index.core.postprocessor import SimilarityPostprocessor
from pydantic import ValidationError

import langchain_ragdefense
from langchain_ragdefense import (
    ConsensusCompressor,
    GRADACompressor,
    RagdefenseEmbeddings,
    RobustRAGChain,
)
from langchain_ragdefense import defend as lc_defend
from llama_index.postprocessor.ragdefense import (
    ConsensusPostprocessor,
    DefendedRetriever,
    RagdefenseEmbedding,
)
from llama_index.postprocessor.ragdefense import defend as li_defend
from ragdefense.robustrag.flow import adrive

from .test_provenance_adapters import QUERY, TOPICS


@pytest.mark.parametrize("compressor", [ConsensusCompressor, ConsensusPostprocessor])
def test_a_setting_assigned_later_is_checked_and_undone(compressor: Any) -> None:
    """A wrong type, and a value only the core defense refuses, fail when assigned (they
    failed at the next query, and the object kept them); the setting before stays."""
    c = compressor()
    with pytest.raises(ValidationError):
        c.tightness = "high"
    with pytest.raises(ValueError, match="min_passages"):
        c.min_passages = 1  # the core wants >= 2
    assert c.tightness == 0.9 and c.min_passages == 3
    assert "min_passages" not in c.model_fields_set  # undone as if never set
    c.tightness = 0.8  # a good value still takes
    assert c.core.tightness == 0.8


def test_grada_compressor_refuses_a_negative_n_when_assigned() -> None:
    c = GRADACompressor(n=3)
    with pytest.raises(ValueError):
        c.n = -3
    assert c.n == 3


def test_a_retrievers_rounds_and_sizes_are_checked_when_assigned(toy_embedder: Any) -> None:
    """``max_rounds = 0`` set later ran no fetch, and the next query failed inside the loop
    (UnboundLocalError)."""
    store = InMemoryVectorStore.from_documents(
        [Document(t) for t in TOPICS], RagdefenseEmbeddings(toy_embedder)
    )
    index = VectorStoreIndex.from_documents(
        [LIDocument(text=t) for t in TOPICS], embed_model=RagdefenseEmbedding(toy_embedder)
    )
    lc, li = lc_defend(store.as_retriever()), li_defend(index)
    for retriever, error in ((lc, ValidationError), (li, ValueError)):
        before = retriever.max_rounds  # LangChain's: None, read per call as defend() fetches
        with pytest.raises(error, match="max_rounds"):
            retriever.max_rounds = 0
        with pytest.raises(error, match="k"):
            retriever.k = -1
        assert retriever.max_rounds == before
    li.max_rounds = None  # as k and fetch_k: back to the default, as defend() fetches
    assert li.max_rounds == 1  # the retriever's own k: one fetch
    assert lc.invoke(QUERY) and li.retrieve(QUERY)


def test_a_llamaindex_retrievers_pool_follows_settings_assigned_later(
    toy_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As LangChain's: the pool is worked out at each call, so ``k``, ``fetch_k`` and the
    retriever assigned after ``defend()`` take effect (they were fixed at construction: after
    ``k = 6`` the store was still asked for 8, after ``fetch_k = None`` for the retriever's 2)."""
    from llama_index.core.vector_stores import SimpleVectorStore

    asked: list[int] = []
    query = SimpleVectorStore.query

    def counted(self: SimpleVectorStore, q: Any, **kwargs: Any) -> Any:
        asked.append(q.similarity_top_k)
        return query(self, q, **kwargs)

    monkeypatch.setattr(SimpleVectorStore, "query", counted)
    index = VectorStoreIndex.from_documents(
        [LIDocument(text=t) for t in TOPICS], embed_model=RagdefenseEmbedding(toy_embedder)
    )
    li = li_defend(index)
    assert (li.k, li.fetch_k) == (2, 8)
    li.k = 6
    assert (li.k, li.fetch_k) == (6, 12) and len(li.retrieve(QUERY)) <= 6 and asked[-1] == 12
    li.k, li.fetch_k = None, 3
    assert (li.k, li.fetch_k) == (2, 3)  # None: the retriever's own again
    li.fetch_k = None
    li.retrieve(QUERY)
    assert asked[-1] == 8  # the defense's pool, not the retriever's 2
    li.retriever = index.as_retriever(similarity_top_k=5)
    assert (li.k, li.fetch_k) == (5, 10)


def test_a_llamaindex_call_reads_its_settings_once(
    toy_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retriever assigned while a call runs takes effect at the next call: the call in
    progress returns the k it fetched for (it sliced by the new retriever's k)."""
    index = VectorStoreIndex.from_documents(
        [LIDocument(text=t) for t in TOPICS], embed_model=RagdefenseEmbedding(toy_embedder)
    )
    li = li_defend(index)
    postprocess = type(li.postprocessor).postprocess_nodes

    def swapping(self: Any, *args: Any, **kwargs: Any) -> Any:
        li.retriever = index.as_retriever(similarity_top_k=6)  # another thread's assignment
        return postprocess(self, *args, **kwargs)

    monkeypatch.setattr(type(li.postprocessor), "postprocess_nodes", swapping)
    assert len(li.retrieve(QUERY)) <= 2 and li.k == 6


def test_llamaindex_refuses_a_postprocessor_that_is_no_defense(toy_embedder: Any) -> None:
    index = VectorStoreIndex.from_documents(
        [LIDocument(text=t) for t in TOPICS], embed_model=RagdefenseEmbedding(toy_embedder)
    )
    with pytest.raises(TypeError, match=r"DefensePostprocessor.*node_postprocessors"):
        DefendedRetriever(index.as_retriever(), SimilarityPostprocessor())  # type: ignore[arg-type]
    retriever = li_defend(index)
    with pytest.raises(TypeError, match="DefensePostprocessor"):
        retriever.postprocessor = SimilarityPostprocessor()  # type: ignore[assignment]
    with pytest.raises(TypeError, match="BaseRetriever"):
        retriever.retriever = "index"  # type: ignore[assignment]
    assert type(retriever.postprocessor).__name__ == "DefensePostprocessor"  # kept


def test_a_robustrag_chains_aggregation_assigned_later_is_checked(toy_embedder: Any) -> None:
    store = InMemoryVectorStore.from_documents(
        [Document(t) for t in TOPICS], RagdefenseEmbeddings(toy_embedder)
    )
    chain = RobustRAGChain.from_llm(RunnableLambda(lambda p: "I don't know"), store.as_retriever())
    with pytest.raises(ValueError, match="aggregation"):
        chain.aggregation = "voting"
    assert chain.aggregation == "keyword"


def test_async_retrieval_embeds_the_query_once(toy_embedder: Any) -> None:
    """LlamaIndex's async vector retriever embeds the query into a bundle of its own, so the
    defense (given the store) embedded it again; each further round too."""
    calls: list[str] = []

    class Counting(RagdefenseEmbedding):
        def _get_query_embedding(self, query: str) -> list[float]:
            calls.append(query)
            return super()._get_query_embedding(query)

        async def _aget_query_embedding(self, query: str) -> list[float]:
            calls.append(query)
            return super()._get_query_embedding(query)

    model = Counting(toy_embedder)
    index = VectorStoreIndex.from_documents([LIDocument(text=t) for t in TOPICS], embed_model=model)
    retriever = li_defend(index, embed_model=model)
    sync = retriever.retrieve(QUERY)
    assert len(calls) == 1
    calls.clear()
    result = asyncio.run(retriever.aretrieve(QUERY))
    assert len(calls) == 1, calls
    assert [n.node.node_id for n in result] == [n.node.node_id for n in sync]


def test_robustrags_async_flow_works_off_the_event_loop() -> None:
    """The flow's own work between two LLM batches (keyword extraction, spaCy's first load,
    certification) ran on the event loop, stalling every other request meanwhile."""
    where: list[int] = []

    def flow() -> Any:
        where.append(threading.get_ident())
        got = yield ["prompt"]
        where.append(threading.get_ident())
        return got

    async def agenerate(prompts: list[str]) -> list[Any]:
        return [f"answer to {p}" for p in prompts]

    async def main() -> tuple[Any, int]:
        return await adrive(flow(), agenerate), threading.get_ident()

    result, loop = asyncio.run(main())
    assert result == ["answer to prompt"]  # its return value crosses the thread
    assert len(where) == 2 and loop not in where


def test_the_custom_event_name_is_exported() -> None:
    assert langchain_ragdefense.EVENT_NAME == "ragdefense_removed"
    assert "EVENT_NAME" in langchain_ragdefense.__all__
