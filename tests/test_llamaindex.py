from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.llms import CompletionResponse, CompletionResponseGen, CustomLLM, LLMMetadata
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from pydantic import Field

from llama_index.postprocessor.ragdefense import (
    ConsensusPostprocessor,
    DefensePostprocessor,
    DefenseRemovedEvent,
    GRADAPostprocessor,
    RAGDefenderPostprocessor,
    RagdefenseEmbedding,
    RobustRAGQueryEngine,
    RobustRAGSynthesizer,
    defend,
)
from ragdefense import CallableEmbedder, DefenseFailed
from ragdefense.data import demo_documents, load_demo_kb
from ragdefense.integration.records import UNCHECKED

KB = load_demo_kb()
QUESTION = KB[1]  # capital of Australia


class ScriptedLLM(CustomLLM):
    """Answers by a rule on the prompt; records the prompts it saw."""

    rule: Callable[[str], str]
    prompts: list[str] = Field(default_factory=list)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="scripted")

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.prompts.append(prompt)
        return CompletionResponse(text=self.rule(prompt))

    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        yield self.complete(prompt)


def by_context(prompt: str) -> str:
    """Isolated prompts: answer what the passage says; keyword prompts: the first keyword."""
    if prompt.startswith("Word suggestion"):
        return (
            "Sydney"
            if "Sydney" in prompt.split("---")[1] and "Canberra" not in prompt
            else "Canberra"
        )
    context = prompt.split("---------------------")[1] if "-----" in prompt else prompt
    if "Sydney is" in context or "capital of Australia is Sydney" in context:
        return "Sydney"
    if "Canberra" in context:
        return "Canberra"
    return "I don't know"


@pytest.fixture(scope="module")
def embed(minilm: Any) -> RagdefenseEmbedding:
    return RagdefenseEmbedding(minilm)


@pytest.fixture(scope="module")
def index(embed: RagdefenseEmbedding) -> VectorStoreIndex:
    # as a reader writes them: a source per node (the demo's benign passages come from reference
    # sites, its planted ones from one upload), kept out of the embedded and prompted text (the
    # labels must not reach the vectors the defense compares)
    nodes = [
        TextNode(
            text=text,
            metadata=meta,
            excluded_embed_metadata_keys=list(meta),
            excluded_llm_metadata_keys=list(meta),
        )
        for text, meta in demo_documents()
    ]
    return VectorStoreIndex(nodes, embed_model=embed)


def poison(nodes: list[NodeWithScore]) -> int:
    return sum(n.node.metadata["poison"] for n in nodes)


class Collect(BaseEventHandler):
    events: list[Any] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "Collect"

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, DefenseRemovedEvent):
            self.events.append(event)


@pytest.mark.slow
def test_query_engine_with_and_without_the_postprocessor(
    index: VectorStoreIndex, embed: RagdefenseEmbedding
) -> None:
    llm = ScriptedLLM(rule=lambda p: "ok")
    plain = index.as_query_engine(llm=llm, similarity_top_k=8).query(QUESTION.question)
    assert poison(plain.source_nodes) == 5
    handler = Collect()
    get_dispatcher().add_event_handler(handler)
    engine = index.as_query_engine(
        llm=llm,
        similarity_top_k=8,
        node_postprocessors=[RAGDefenderPostprocessor(embed_model=embed)],
    )
    response = engine.query(QUESTION.question)
    assert poison(response.source_nodes) == 0 and response.source_nodes
    meta = response.source_nodes[0].node.metadata["ragdefense"]
    assert meta["kept"] and meta["defense"] == "RAGDefender"
    # the verdict never reaches the LLM prompt
    assert "ragdefense" not in llm.prompts[-1] and "pair_score" not in llm.prompts[-1]
    assert any(e.defense == "RAGDefender" and len(e.removed) >= 5 for e in handler.events)
    async_response = asyncio.run(engine.aquery(KB[0].question))
    assert poison(async_response.source_nodes) == 0
    from llama_index.core import Settings

    assert Settings._llm is None and Settings._embed_model is None  # never touched implicitly


def test_node_embeddings_are_reused_and_nodes_not_mutated(toy_embedder: Any) -> None:
    from .conftest import bag_of_words

    texts = [f"capital of France {w}" for w in "abcde"] + ["bananas are yellow", "apples are red"]
    vecs = bag_of_words(texts)
    nodes = [
        NodeWithScore(node=TextNode(text=t, embedding=v.tolist(), metadata={"i": i}), score=0.5)
        for i, (t, v) in enumerate(zip(texts, vecs, strict=True))
    ]

    class Broken(RagdefenseEmbedding):
        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            raise AssertionError("node embeddings should have been reused")

    post = RAGDefenderPostprocessor(embed_model=Broken(toy_embedder))
    out = post.postprocess_nodes(nodes, query_str="capital of France")
    assert len(out) < len(nodes)
    assert all(n.node.metadata == {"i": i} for i, n in enumerate(nodes))
    assert all("ragdefense" in n.node.metadata for n in out)
    assert all("ragdefense" in n.node.excluded_llm_metadata_keys for n in out)
    # a later step editing a returned node leaves the caller's alone
    from llama_index.core.schema import NodeRelationship, RelatedNodeInfo

    source = RelatedNodeInfo(node_id="doc-1", metadata={"title": "t"})
    nodes[0].node.relationships = {NodeRelationship.SOURCE: source}
    first = GRADAPostprocessor(embed_model=Broken(toy_embedder), n=len(nodes))
    copied = next(n.node for n in first.postprocess_nodes(nodes, query_str="capital of France")
                  if n.node.node_id == nodes[0].node.node_id)  # fmt: skip
    assert copied.embedding is not None
    copied.embedding[0] += 1.0
    copied.relationships[NodeRelationship.SOURCE].metadata["title"] = "edited"  # type: ignore[union-attr]
    assert nodes[0].node.embedding == vecs[0].tolist() and source.metadata["title"] == "t"


def test_grada_postprocessor_rescoring(toy_embedder: Any) -> None:
    texts = [f"what is the capital of australia. sydney is the capital {w}" for w in "abc"]
    texts += ["canberra parliament federal", "canberra federal territory", "parliament canberra"]
    nodes = [NodeWithScore(node=TextNode(text=t), score=1.0 - i / 10) for i, t in enumerate(texts)]
    out = GRADAPostprocessor(n=3).postprocess_nodes(
        nodes, query_str="what is the capital of australia"
    )
    assert len(out) == 3
    assert [n.node.metadata["ragdefense"]["rank"] for n in out] == [0, 1, 2]
    scores = [n.score for n in out]
    assert scores == sorted(scores, reverse=True) and all(s is not None and s < 1 for s in scores)
    peel = GRADAPostprocessor(n=3, peel=True, embed_model=RagdefenseEmbedding(toy_embedder))
    kept = peel.postprocess_nodes(nodes, query_str="what is the capital of australia")
    assert kept and not any("sydney" in n.node.get_content() for n in kept)


def test_auto_postprocessor(toy_embedder: Any) -> None:
    texts = [f"what is the capital of australia. sydney is the capital {w}" for w in "abc"]
    texts += ["canberra parliament federal", "canberra federal territory", "parliament canberra"]
    nodes = [NodeWithScore(node=TextNode(text=t), score=1.0 - i / 10) for i, t in enumerate(texts)]
    post = DefensePostprocessor(defense="auto", embed_model=RagdefenseEmbedding(toy_embedder))
    kept = post.postprocess_nodes(nodes, query_str="what is the capital of australia")
    assert kept and not any("sydney" in n.node.get_content() for n in kept)
    records = [n.node.metadata["ragdefense"] for n in kept]
    assert all(r["defense"] == "AutoDefense" for r in records)
    assert all(r["checked"] is True for r in records)  # fail_open's pass-through says False
    assert all("ragdefense" not in n.node.metadata for n in nodes)


def test_bad_input() -> None:
    post = RAGDefenderPostprocessor()
    assert post.postprocess_nodes([], query_str="q") == []
    nodes = [NodeWithScore(node=TextNode(text=t)) for t in ["a", "", "c", "d"]]
    with pytest.raises(ValueError, match="needs the query"):
        post.postprocess_nodes(nodes)

    class Down(RagdefenseEmbedding):
        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            raise ConnectionError("embedding service down")

    with pytest.raises(DefenseFailed, match="embedding service down"):
        RAGDefenderPostprocessor(embed_model=Down()).postprocess_nodes(nodes, query_str="q")
    with pytest.warns(UserWarning, match="passing the documents through"):
        out = RAGDefenderPostprocessor(embed_model=Down(), fail_open=True).postprocess_nodes(
            nodes, query_str="q"
        )
    assert len(out) == 4 and all(n.node.metadata["ragdefense"] == UNCHECKED for n in out)
    assert "fail_open passed" in out[0].node.metadata["ragdefense"]["reason"]  # (review)
    assert asyncio.run(post.apostprocess_nodes([], QueryBundle("q"))) == []


@pytest.mark.slow
def test_robustrag_synthesizer_with_and_without_poison(index: VectorStoreIndex) -> None:
    llm = ScriptedLLM(rule=by_context)
    synth = RobustRAGSynthesizer(llm=llm, certify=1)
    engine = index.as_query_engine(llm=llm, response_synthesizer=synth, similarity_top_k=6)
    response = engine.query(QUESTION.question)  # 5 poison + 1 benign: the attacker wins
    report = response.metadata["ragdefense"]
    assert len(report.responses) == 6
    assert report.certificate is not None and not report.certificate.certified
    # RobustRAG's regime: one poison among benign passages
    nodes = [NodeWithScore(node=TextNode(text=t)) for t in QUESTION.benign + QUESTION.poison[:1]]
    clean = synth.synthesize(QUESTION.question, nodes)
    assert str(clean) == "Canberra"
    assert clean.metadata["ragdefense"].keyword_counts["Sydney"] == 1
    aclean = asyncio.run(synth.asynthesize(QUESTION.question, nodes))
    assert str(aclean) == "Canberra"
    assert aclean.metadata["ragdefense"].keyword_counts["Sydney"] == 1
    empty = synth.synthesize(QUESTION.question, [])  # its own report, never an earlier one's
    report = empty.metadata["ragdefense"]  # type: ignore[index]
    assert report.responses == () and report.reason == "no passages were given"
    assert str(empty) == "I don't know" and not report.certificate.certified
    with pytest.raises(ValueError, match="needs llm"):
        RobustRAGSynthesizer(llm=None)  # type: ignore[arg-type]
    for wrong in ("gpt-4", lambda prompt: "Sydney"):  # failed deep inside LlamaIndex
        with pytest.raises(TypeError, match="llm must be a LlamaIndex LLM, got"):
            RobustRAGSynthesizer(llm=wrong)  # type: ignore[arg-type]


@pytest.mark.slow
def test_robustrag_query_engine_with_the_real_llm(embed: RagdefenseEmbedding) -> None:
    from ragdefense.llm import default_llm

    smol = default_llm()
    llm = ScriptedLLM(rule=lambda p: smol.generate([p])[0].text or "")
    nodes = [TextNode(text=t) for t in QUESTION.benign + QUESTION.poison[:1]]
    small = VectorStoreIndex(nodes, embed_model=embed)
    engine = RobustRAGQueryEngine.from_args(small.as_retriever(similarity_top_k=4), llm=llm)
    response = engine.query(QUESTION.question)
    assert "Canberra" in str(response)
    assert len(response.source_nodes) == 4


def test_rerank_instrumentation_events_frame_the_defense() -> None:
    from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent

    from .conftest import bag_of_words

    class Rerank(BaseEventHandler):
        events: list[Any] = Field(default_factory=list)

        @classmethod
        def class_name(cls) -> str:
            return "Rerank"

        def handle(self, event: Any, **kwargs: Any) -> None:
            if isinstance(event, (ReRankStartEvent, ReRankEndEvent)):
                self.events.append(event)

    texts = [f"capital of France is Lyon {w}" for w in "abcd"] + ["Paris is the capital."] * 2
    nodes = [
        NodeWithScore(node=TextNode(text=t, embedding=v.tolist()), score=0.5)
        for t, v in zip(texts, bag_of_words(texts), strict=True)
    ]
    handler = Rerank()
    root = get_dispatcher()
    root.add_event_handler(handler)
    try:
        out = GRADAPostprocessor(n=3).postprocess_nodes(nodes, query_str="capital of France?")
    finally:
        root.event_handlers.remove(handler)
    start, end = handler.events
    assert isinstance(start, ReRankStartEvent) and start.model_name == "GRADA"
    assert len(start.nodes) == 6 and start.query is not None
    assert isinstance(end, ReRankEndEvent) and [n.node.node_id for n in end.nodes] == [
        n.node.node_id for n in out
    ]


def test_too_few_nodes_warn_once_naming_the_fix(toy_embedder: Any) -> None:
    embed = RagdefenseEmbedding(toy_embedder)
    texts = [f"capital of France is {w}" for w in ("Paris", "Lyon", "Nice", "Lille")]
    index = VectorStoreIndex([TextNode(text=t) for t in texts], embed_model=embed)
    engine = index.as_query_engine(  # LlamaIndex's default: 2 nodes
        llm=ScriptedLLM(rule=lambda p: "ok"),
        node_postprocessors=[RAGDefenderPostprocessor(embed_model=embed)],
    )
    with pytest.warns(UserWarning, match=r"2 passage\(s\).*similarity_top_k=10"):
        assert len(engine.query("capital of France?").source_nodes) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per postprocessor, not per query
        engine.query("capital of France?")
        # defend(index) fetches the pool itself: 4 nodes is all this index holds, no warning
        assert len(defend(index, embed_model=embed).retrieve("capital of France?")) <= 2
    # 4 nodes can be compared but are fewer than the pool of 8 RAGDefender filters from
    wider = index.as_query_engine(
        llm=ScriptedLLM(rule=lambda p: "ok"),
        similarity_top_k=4,
        node_postprocessors=[RAGDefenderPostprocessor(embed_model=embed)],
    )
    with pytest.warns(UserWarning, match=r"4 passage\(s\).*pool of 8.*similarity_top_k=10"):
        wider.query("capital of France?")


@pytest.mark.slow
def test_defend_index_widens_llamaindex_default_top_k(index: VectorStoreIndex) -> None:
    """Target 7 of the safe-default issue: LlamaIndex retrieves 2 nodes by default, all poison
    here; ``defend(index)`` asks for the pool the defense needs and returns 2, none poison."""
    from llama_index.core.query_engine import RetrieverQueryEngine

    from llama_index.postprocessor.ragdefense import DefendedRetriever

    plain = index.as_retriever()
    assert poison(plain.retrieve(QUESTION.question)) == 2  # the attack works at the default
    defended = defend(index)
    assert isinstance(defended, DefendedRetriever)
    assert (defended.k, defended.fetch_k) == (2, 8)  # RAGDefender's pool: at least 8
    for q in KB[:4]:
        nodes = defended.retrieve(q.question)
        assert 1 <= len(nodes) <= 2 and poison(nodes) == 0, q.question
        assert all(n.node.metadata["ragdefense"]["kept"] for n in nodes)
    llm = ScriptedLLM(rule=by_context)
    engine = RetrieverQueryEngine.from_args(defended, llm=llm)
    response = engine.query(QUESTION.question)
    assert poison(response.source_nodes) == 0 and "Canberra" in str(response)
    assert poison(asyncio.run(defended.aretrieve(QUESTION.question))) == 0
    # GRADA's pool is twice k; the caller's retriever is not changed
    retriever = index.as_retriever(similarity_top_k=3)
    wide = defend(retriever, "grada", k=3)
    assert wide.fetch_k == 6 and retriever.similarity_top_k == 3  # type: ignore[attr-defined]
    assert len(wide.retrieve(QUESTION.question)) == 3
    # GRADA's peel needs the planted set whole beside the honest ones: AutoDefense's floor
    # of 8 (it fetched 4 at LlamaIndex's k of 2, and the peel kept the demo's poison)
    assert (defend(index, "grada").fetch_k, defend(index, "grada-peel").fetch_k) == (4, 8)
    peeled, narrow = defend(index, "grada-peel"), defend(index, "grada-peel", fetch_k=4)
    found = [(poison(peeled.retrieve(q.question)), poison(narrow.retrieve(q.question))) for q in KB]
    assert 2 * sum(a for a, _ in found) <= sum(b for _, b in found), found


def test_defend_retriever_bad_arguments(toy_embedder: Any) -> None:
    nodes = [TextNode(text=t) for t in ("a b", "b c", "c d", "d e")]
    index = VectorStoreIndex(nodes, embed_model=RagdefenseEmbedding(toy_embedder))
    with pytest.raises(ValueError, match="k must be a positive int"):
        defend(index, k=0)
    with pytest.raises(TypeError, match="takes a retriever or an index, got str"):
        defend("not a retriever")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown defense"):
        defend(index, "nope")
    assert defend(index, "grada", k=2, fetch_k=3).fetch_k == 3


class _Fixed(BaseRetriever):
    """A retriever with no ``similarity_top_k``: it returns what it was given."""

    def __init__(self, nodes: list[NodeWithScore]) -> None:
        self.nodes = nodes
        super().__init__()

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return list(self.nodes)


@pytest.mark.slow
def test_defend_widens_fusion_and_mmr_retrievers(index: VectorStoreIndex) -> None:
    """A fusion retriever's own retrievers fetch the pool too, and an MMR retriever is asked for
    the similarity pool (MMR spreads the planted near-copies out of the defense's sight); a
    retriever that cannot be widened warns that the defense sees too few nodes."""
    from llama_index.core.llms import MockLLM
    from llama_index.core.retrievers import QueryFusionRetriever

    inner = index.as_retriever(similarity_top_k=4)
    fusion = QueryFusionRetriever(
        [inner], llm=MockLLM(), num_queries=1, similarity_top_k=4, use_async=False
    )
    mmr = index.as_retriever(vector_store_query_mode="mmr", similarity_top_k=4)
    for retriever in (fusion, mmr):
        assert poison(retriever.retrieve(QUESTION.question)) >= 2  # the attack works
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the pool was fetched: no small-pool warning
            nodes = defend(retriever).retrieve(QUESTION.question)
        assert 1 <= len(nodes) <= 4 and poison(nodes) == 0
    assert inner.similarity_top_k == 4 and fusion.similarity_top_k == 4  # type: ignore[attr-defined]
    four = index.as_retriever(similarity_top_k=4).retrieve(QUESTION.question)
    with pytest.warns(UserWarning, match=r"4 passage\(s\).*pool of 8"):
        defend(_Fixed(four), k=2).retrieve(QUESTION.question)
    # the pool a retriever fetched is per call: the same postprocessor used alone still warns
    post = DefensePostprocessor(embed_model=index._embed_model, vector_store=index.vector_store)
    defend(index, post).retrieve(QUESTION.question)
    with pytest.warns(UserWarning, match=r"4 passage\(s\).*pool of 8"):
        post.postprocess_nodes(four, query_str=QUESTION.question)
    # hybrid mode: a hybrid store returns hybrid_top_k, fused from sparse_top_k candidates
    from llama_index.postprocessor.ragdefense.retrievers import _top_k, widened

    hybrid = index.as_retriever(
        vector_store_query_mode="hybrid", similarity_top_k=4, hybrid_top_k=3, sparse_top_k=10
    )
    pool, _ = widened(hybrid, 16)
    assert _top_k(hybrid) == 3  # what it returns, so what defend() returns
    assert (pool._hybrid_top_k, pool._sparse_top_k, pool.similarity_top_k) == (16, 16, 16)
    assert (hybrid._hybrid_top_k, hybrid._sparse_top_k) == (3, 10)  # the caller's unchanged


@pytest.mark.slow
def test_defend_widens_an_auto_merging_retrievers_vector_retriever(
    embed: RagdefenseEmbedding,
) -> None:
    """An auto-merging retriever has no ``similarity_top_k`` of its own: its vector retriever
    is asked for the pool (through a copy), and what it merges is cut to that retriever's k."""
    from llama_index.core import Document, StorageContext
    from llama_index.core.node_parser import HierarchicalNodeParser, get_leaf_nodes
    from llama_index.core.retrievers import AutoMergingRetriever

    docs = [
        Document(text=text, metadata=meta, excluded_embed_metadata_keys=list(meta))
        for text, meta in demo_documents()
    ]
    nodes = HierarchicalNodeParser.from_defaults(chunk_sizes=[512, 128]).get_nodes_from_documents(
        docs
    )
    storage = StorageContext.from_defaults()
    storage.docstore.add_documents(nodes)
    leaves = VectorStoreIndex(get_leaf_nodes(nodes), storage_context=storage, embed_model=embed)
    merging = AutoMergingRetriever(leaves.as_retriever(similarity_top_k=4), storage)
    assert poison(merging.retrieve(QUESTION.question)) >= 2  # the attack works
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the pool was fetched: no small-pool warning
        defended = defend(merging)
        nodes_out = defended.retrieve(QUESTION.question)
    assert defended.k == 4 and 1 <= len(nodes_out) <= 4 and poison(nodes_out) == 0
    assert merging._vector_retriever.similarity_top_k == 4  # the caller's is unchanged


@pytest.mark.slow
def test_defend_with_another_embed_model_than_the_index(embed: RagdefenseEmbedding) -> None:
    """An ``embed_model`` other than the index's embeds the retrieved nodes itself: the index's
    vectors are another space (here another size)."""
    from llama_index.core.embeddings import MockEmbedding

    nodes = [TextNode(text=t) for q in KB for t in q.benign]
    index = VectorStoreIndex(nodes, embed_model=MockEmbedding(embed_dim=64))
    assert len(defend(index, embed_model=embed).retrieve(QUESTION.question)) >= 1


def test_pickling_keeps_every_setting_or_refuses(embed: RagdefenseEmbedding) -> None:
    """LlamaIndex drops a setting it cannot pickle with a log line: a postprocessor trusting by
    a lambda would come back trusting nothing. It is refused instead; plain settings travel."""
    import pickle

    plain = ConsensusPostprocessor(trusted={"who.int"}, quotes=False)
    back = pickle.loads(pickle.dumps(plain))
    assert back.trusted == ["who.int"] and back.quotes is False
    with pytest.raises(TypeError, match=r"its trusted .* cannot"):
        pickle.dumps(ConsensusPostprocessor(trusted=lambda m: True))
    with pytest.raises(TypeError, match=r"its params .* cannot"):
        pickle.dumps(DefensePostprocessor(params={"trusted": lambda m: True}))
    with pytest.raises(TypeError, match=r"its embedder .* cannot"):
        pickle.dumps(RagdefenseEmbedding(lambda texts: [[1.0, 0.0] for _ in texts]))
    assert pickle.loads(pickle.dumps(embed)).get_query_embedding("hi")


def test_a_postprocessor_whose_model_cannot_pickle_is_refused_and_left_whole() -> None:
    """LlamaIndex drops an ``embed_model`` it cannot pickle (the copy then embeds with the
    packaged model, in another space) and removes it from the object pickled too: refused,
    and the postprocessor keeps working; a store that cannot pickle is left out of the copy
    alone."""
    import pickle
    import threading

    model = RagdefenseEmbedding(CallableEmbedder(lambda texts: [[1.0, 0.0] for _ in texts]))
    post = ConsensusPostprocessor(embed_model=model)
    with pytest.raises(TypeError, match=r"its embed_model .* cannot"):
        pickle.dumps(post)
    assert post.embed_model is model

    class Store:  # a store holding what cannot be pickled (a client, a lock)
        def __init__(self) -> None:
            self.lock = threading.Lock()

        def get_nodes(self, *args: Any, **kwargs: Any) -> list[Any]:
            return []

    store = Store()
    kept = ConsensusPostprocessor(vector_store=store, quotes=False)
    back = pickle.loads(pickle.dumps(kept))
    assert back.vector_store is None and back.quotes is False and kept.vector_store is store
    nodes = [NodeWithScore(node=TextNode(text=t), score=1.0) for t in ("a b", "c d", "e f")]
    assert len(kept.postprocess_nodes(nodes, query_str="a")) == 3


def test_a_model_over_a_configured_embedder_pickles_with_its_settings() -> None:
    """The packaged model with settings of its own comes back with them (it came back as the
    process's default); the default itself comes back as the loading process's own."""
    import pickle
    import threading

    from ragdefense.embedders import SentenceTransformerEmbedder, default_embedder

    own = RagdefenseEmbedding(SentenceTransformerEmbedder(batch_size=4, cache_size=0))
    back = pickle.loads(pickle.dumps(own))._embedder
    assert (back.batch_size, back.cache_size) == (4, 0) and back is not default_embedder()
    assert pickle.loads(pickle.dumps(RagdefenseEmbedding()))._embedder is default_embedder()
    # LlamaIndex drops what it cannot pickle (a handler holding a lock) from the copy alone
    from llama_index.core.callbacks import CallbackManager, LlamaDebugHandler

    handler = LlamaDebugHandler()
    handler.__dict__["lock"] = threading.Lock()
    watched = RagdefenseEmbedding(callback_manager=CallbackManager([handler]))
    pickle.dumps(watched)
    assert watched.callback_manager.handlers == [handler]


def test_nodes_without_text_are_never_copies_of_each_other() -> None:
    """Image nodes carry no text: their embeddings tell them apart, none is a copy."""
    import numpy as np
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.schema import ImageNode

    rng = np.random.default_rng(0)
    images = [
        NodeWithScore(
            node=ImageNode(image_path=f"/pics/{i}.png", embedding=list(rng.normal(size=8))),
            score=0.9 - i / 20,
        )
        for i in range(8)
    ]
    bundle = QueryBundle("a photo of a cat", embedding=list(rng.normal(size=8)))
    model = MockEmbedding(embed_dim=8)  # the model the images' vectors are in, as an index's
    kept = ConsensusPostprocessor(embed_model=model).postprocess_nodes(images, query_bundle=bundle)
    assert not any("a copy of" in n.node.metadata["ragdefense"]["reason"] for n in kept)
    assert len(kept) == 8


def test_a_fetch_below_the_defense_names_the_fetch(index: VectorStoreIndex) -> None:
    """The store holds more than ``fetch_k`` asks for: the warning names the fetch, not the
    store."""
    with pytest.warns(UserWarning, match="asked for 2 only: raise its fetch_k to 8"):
        defend(index, fetch_k=2).retrieve(QUESTION.question)


def test_async_embeddings_run_off_the_event_loop() -> None:
    """``aget_query_embedding`` and the async text embeddings ran the model on the event loop,
    stalling every other request while it embedded."""
    import threading

    from ragdefense import CallableEmbedder

    released = threading.Event()

    def embed(texts: list[str]) -> list[list[float]]:  # waits for the loop to release it
        if not released.wait(5):
            raise RuntimeError("the event loop was blocked while embedding")
        return [[1.0, float(len(t))] for t in texts]

    model = RagdefenseEmbedding(CallableEmbedder(embed, cache_size=0))

    async def main() -> Any:
        asked = asyncio.gather(
            model.aget_query_embedding("q"),
            model.aget_text_embedding("two"),
            model.aget_text_embedding_batch(["a", "bb"]),
        )
        await asyncio.sleep(0.05)  # the loop runs while the model works
        released.set()
        return await asked

    query, text, batch = asyncio.run(main())
    assert query == [1.0, 1.0] and text == [1.0, 3.0] and batch == [[1.0, 1.0], [1.0, 2.0]]


def test_robustrag_synthesizer_streams_and_shows_its_prompts() -> None:
    """``streaming=True`` was refused (LlamaIndex reads it from the synthesizer given), and
    ``update_prompts`` was accepted and ignored; an unknown prompt or a k' below 1 is refused."""
    from llama_index.core.prompts import PromptTemplate
    from llama_index.core.query_engine import RetrieverQueryEngine

    llm = ScriptedLLM(rule=by_context)
    nodes = [NodeWithScore(node=TextNode(text=t)) for t in QUESTION.benign + QUESTION.poison[:1]]
    synth = RobustRAGSynthesizer(llm=llm, streaming=True)
    engine = RetrieverQueryEngine.from_args(_Fixed(nodes), llm=llm, response_synthesizer=synth)
    streamed = engine.query(QUESTION.question)
    assert "".join(streamed.response_gen) == "Canberra"  # type: ignore[union-attr]
    assert streamed.metadata["ragdefense"].answer == "Canberra"  # type: ignore[index]

    async def chunks() -> str:
        response = await engine.aquery(QUESTION.question)
        return "".join([t async for t in response.async_response_gen()])  # type: ignore[union-attr]

    assert asyncio.run(chunks()) == "Canberra"
    empty = synth.synthesize(QUESTION.question, [])  # as the report says, streamed too
    assert "".join(empty.response_gen) == "I don't know"  # type: ignore[union-attr]
    assert empty.metadata["ragdefense"].answer == "I don't know"  # type: ignore[index]
    plain = RobustRAGSynthesizer(llm=llm)
    assert sorted(plain.get_prompts()) == ["isolated_prompt", "keyword_prompt"]
    mine = "Passage: {context}\nQuestion: {query}\nShort answer:"
    plain.update_prompts({"isolated_prompt": PromptTemplate(mine)})
    assert plain.get_prompts()["isolated_prompt"].get_template() == mine
    llm.prompts.clear()
    plain.synthesize(QUESTION.question, nodes[:2])
    assert all(p.startswith("Passage: ") for p in llm.prompts[:2])
    with pytest.raises(ValueError, match=r"unknown prompt\(s\) \['text_qa_template'\]"):
        plain.update_prompts({"text_qa_template": PromptTemplate(mine)})
    with pytest.raises(ValueError, match="isolated_prompt cannot be filled"):
        plain.update_prompts({"isolated_prompt": PromptTemplate("{passage}: {query}")})
    from llama_index.core.llms import ChatMessage
    from llama_index.core.prompts import ChatPromptTemplate

    asked = ChatMessage(role="user", content="{context_str}\n{query_str}")
    chat = ChatPromptTemplate([ChatMessage(role="system", content="Be brief"), asked])
    with pytest.raises(TypeError, match="give a PromptTemplate"):  # its roles were flattened
        plain.update_prompts({"isolated_prompt": chat})
    from llama_index.core.prompts import SelectorPromptTemplate

    with pytest.raises(TypeError, match="give a PromptTemplate"):  # nor behind a selector
        plain.update_prompts({"isolated_prompt": SelectorPromptTemplate(default_template=chat)})
    with pytest.raises(ValueError, match=r"certify \(k'\) must be >= 1"):
        RobustRAGSynthesizer(llm=llm, certify=0)
    # majority vote asks each passage with its choice prompt: an isolated one would be ignored
    voting = RobustRAGSynthesizer(llm=llm, aggregation="majority")
    assert sorted(voting.get_prompts()) == ["choice_prompt"]
    with pytest.raises(ValueError, match=r"unknown prompt\(s\) \['isolated_prompt'\]"):
        voting.update_prompts({"isolated_prompt": PromptTemplate(mine)})


def test_robustrag_synthesizer_prompts_keep_what_llamaindex_templates_carry() -> None:
    """A template given to ``update_prompts`` reaches the LLM as LlamaIndex would format it:
    its ``partial_format`` values (dropped before), its variable mappings, LlamaIndex's own
    ``{context_str}`` / ``{query_str}``, literal braces kept literal; a variable nothing fills
    is refused, not sent as text."""
    from llama_index.core.prompts import PromptTemplate

    llm = ScriptedLLM(rule=by_context)
    nodes = [NodeWithScore(node=TextNode(text=t)) for t in QUESTION.benign[:2]]
    synth = RobustRAGSynthesizer(llm=llm)
    styled = PromptTemplate("{style}\n{context_str}\nQ: {question}\nA:").partial_format(
        style='Answer as JSON: {"answer": ...}'
    )
    styled.template_var_mappings = {"query": "question"}
    synth.update_prompts({"isolated_prompt": styled})
    core = synth.robust.isolated_prompt
    assert core.startswith('Answer as JSON: {{"answer": ...}}\n{context}')
    shown = synth.get_prompts()["isolated_prompt"]  # as LlamaIndex writes it: braces single
    assert shown.get_template().startswith('Answer as JSON: {"answer": ...}\n{context}')
    synth.update_prompts({"isolated_prompt": shown})  # given back: the same template
    assert synth.robust.isolated_prompt == core
    llm.prompts.clear()
    assert synth.synthesize(QUESTION.question, nodes).response == "Canberra"
    lead = 'Answer as JSON: {"answer": ...}\n'
    asked = [f"{lead}{text}\nQ: {QUESTION.question}\nA:" for text in QUESTION.benign[:2]]
    assert sorted(llm.prompts[:2]) == sorted(asked)  # isolated calls run in threads: any order
    keyword = PromptTemplate("{lead} {query_str} Keywords: {keywords}").partial_format(lead="Hi.")
    synth.update_prompts({"keyword_prompt": keyword})
    shown = synth.get_prompts()["keyword_prompt"].get_template()
    assert shown == "Hi. {query} Keywords: {keywords}"
    with pytest.raises(ValueError, match=r"isolated_prompt cannot be filled: nothing gives \{tone"):
        synth.update_prompts({"isolated_prompt": PromptTemplate("{tone} {context} {query}")})


def test_the_robustrag_synthesizer_calls_the_llm_as_llamaindex_synthesizers_do() -> None:
    """``complete`` was called with the bare prompt: an LLM's ``system_prompt`` and
    ``query_wrapper_prompt`` (an instruction format) were left out, where LlamaIndex's own
    synthesizers apply them (``predict``)."""
    from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
    from llama_index.core.llms.callbacks import llm_completion_callback
    from llama_index.core.prompts import PromptTemplate

    from llama_index.postprocessor.ragdefense import RobustRAGSynthesizer

    seen: list[str] = []

    class Instructed(CustomLLM):
        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata()

        @llm_completion_callback()
        def complete(self, prompt: str, formatted: bool = False, **kw: Any) -> CompletionResponse:
            seen.append(prompt)
            return CompletionResponse(text="Paris")

        @llm_completion_callback()
        def stream_complete(self, prompt: str, formatted: bool = False, **kw: Any) -> Any:
            raise NotImplementedError

    llm = Instructed(
        system_prompt="SYSTEM: be brief.", query_wrapper_prompt=PromptTemplate("[INST] {query_str}")
    )
    nodes = [
        NodeWithScore(node=TextNode(text=f"Paris is France's capital ({i}).")) for i in range(2)
    ]
    response = RobustRAGSynthesizer(llm=llm).synthesize("What is the capital of France?", nodes)
    assert "Paris" in str(response)
    assert seen and all(p.startswith("[INST] SYSTEM: be brief.") for p in seen)


def test_the_robustrag_query_engine_keeps_the_bundle_and_emits_query_events() -> None:
    """(review) As a ``CustomQueryEngine`` it passed the query's text alone (a bundle's
    ``custom_embedding_strs`` and embedding lost before retrieval) and emitted no query event
    or span: traces showed no query, and its own ``callback_manager`` heard nothing."""
    from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler

    seen: list[QueryBundle] = []

    class Recording(BaseRetriever):
        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            seen.append(query_bundle)
            return [NodeWithScore(node=TextNode(text=t), score=1.0) for t in QUESTION.benign[:3]]

    class Queries(BaseEventHandler):
        names: list[str] = Field(default_factory=list)

        @classmethod
        def class_name(cls) -> str:
            return "Queries"

        def handle(self, event: Any, **kwargs: Any) -> None:
            self.names.append(type(event).__name__)

    debug = LlamaDebugHandler()
    engine = RobustRAGQueryEngine(
        retriever=Recording(),
        synthesizer=RobustRAGSynthesizer(llm=ScriptedLLM(rule=by_context)),
        callback_manager=CallbackManager([debug]),
    )
    handler = Queries()
    get_dispatcher().add_event_handler(handler)
    try:
        bundle = QueryBundle(QUESTION.question, custom_embedding_strs=["capital of Australia"])
        assert engine.query(bundle).response == "Canberra"
        assert seen[-1].custom_embedding_strs == ["capital of Australia"]
        assert asyncio.run(engine.aquery(bundle)).response == "Canberra"
        assert seen[-1].custom_embedding_strs == ["capital of Australia"]
    finally:
        get_dispatcher().event_handlers.remove(handler)
    assert handler.names.count("QueryStartEvent") == 2 and "QueryEndEvent" in handler.names
    assert [e.event_type for e in debug.get_events(CBEventType.QUERY)][:1] == [CBEventType.QUERY]
