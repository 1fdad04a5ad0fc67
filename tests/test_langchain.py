from __future__ import annotations

import asyncio
import warnings
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import numpy as np
import pytest
from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import FakeListChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_tests.integration_tests import RetrieversIntegrationTests
from pydantic import Field, ValidationError

from langchain_ragdefense import (
    DefendedRetriever,
    GRADACompressor,
    RAGDefenderCompressor,
    RagdefenseEmbeddings,
    RobustRAGChain,
    defend,
)
from ragdefense import DefenseFailed
from ragdefense.data import demo_documents, load_demo_kb
from ragdefense.integration.records import UNCHECKED

KB = load_demo_kb()
QUESTION = KB[1]  # capital of Australia


@pytest.fixture(scope="module")
def embeddings(minilm: Any) -> RagdefenseEmbeddings:
    return RagdefenseEmbeddings(minilm)


@pytest.fixture(scope="module")
def store(embeddings: RagdefenseEmbeddings) -> InMemoryVectorStore:
    # as a loader writes them: metadata["source"] (the demo's benign passages come from reference
    # sites, its planted ones from one upload)
    docs = [Document(text, metadata=meta) for text, meta in demo_documents()]
    return InMemoryVectorStore.from_documents(docs, embeddings)


@pytest.fixture
def retriever(store: InMemoryVectorStore) -> BaseRetriever:
    return store.as_retriever(search_kwargs={"k": 8})


def poison(docs: list[Document]) -> int:
    return sum(d.metadata["poison"] for d in docs)


class Events(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.events.append((name, data))


@pytest.mark.slow
def test_contextual_compression_retriever_removes_poison(
    retriever: BaseRetriever, embeddings: Embeddings
) -> None:
    from langchain_classic.retrievers import ContextualCompressionRetriever

    plain = retriever.invoke(QUESTION.question)
    assert poison(plain) == 5  # the attack works without defense
    defended = ContextualCompressionRetriever(
        base_compressor=RAGDefenderCompressor(embeddings=embeddings), base_retriever=retriever
    )
    handler = Events()
    docs = defended.invoke(QUESTION.question, config={"callbacks": [handler]})
    assert poison(docs) == 0 and len(docs) >= 1
    meta = docs[0].metadata["ragdefense"]
    assert meta["defense"] == "RAGDefender" and meta["kept"] is True and "reason" in meta
    assert docs[0].metadata["q"] == QUESTION.id  # the caller's metadata is kept
    [(name, data)] = handler.events
    assert name == "ragdefense_removed" and len(data["removed"]) == 8 - len(docs)
    assert data["estimates"]["n_adv"] >= 5


@pytest.mark.slow
def test_defend_one_line_sync_and_async(store: InMemoryVectorStore) -> None:
    """The one line with LangChain's own default (``as_retriever()``: 4 documents). The demo's
    poison is most of what is retrieved, from one upload: the default, reading the documents'
    ``source``, removes it; reading the text alone it removes some."""
    retriever = store.as_retriever()
    assert poison(retriever.invoke(QUESTION.question)) == 4  # the attack works
    text_only = defend(retriever, source_key=None)
    assert sum(poison(text_only.invoke(q.question)) for q in KB) < 4 * len(KB)
    defended = defend(retriever)
    # the vector store's own embeddings are used: no second model
    assert defended.compressor.embeddings is retriever.vectorstore.embeddings  # type: ignore[attr-defined]
    for q in KB[:4]:
        docs = defended.invoke(q.question)
        assert poison(docs) == 0 and docs, q.question
    docs = asyncio.run(defended.ainvoke(KB[0].question))
    assert poison(docs) == 0 and docs


@pytest.mark.slow
def test_grada_compressor_and_k(retriever: BaseRetriever, embeddings: Embeddings) -> None:
    defended = defend(retriever, "grada", k=4)
    docs = defended.invoke(QUESTION.question)
    assert len(docs) == 4
    assert all(d.metadata["ragdefense"]["defense"] == "GRADA" for d in docs)
    assert [d.metadata["ragdefense"]["rank"] for d in docs] == [0, 1, 2, 3]
    docs2 = defended.invoke(QUESTION.question, k=2)
    assert len(docs2) == 2
    assert GRADACompressor(n=3).n == 3


@pytest.mark.slow
def test_grada_peel_in_a_real_pipeline(embeddings: RagdefenseEmbeddings) -> None:
    from .test_grada import BENIGN, POISON, Q

    docs = [Document(t, metadata={"poison": t in POISON}) for t in POISON + BENIGN]
    store = InMemoryVectorStore.from_documents(docs, embeddings)
    retriever = store.as_retriever(search_kwargs={"k": 8})
    events = Events()
    out = defend(retriever, "grada", k=4, peel=True).invoke(Q, config={"callbacks": [events]})
    assert len(out) == 4 and poison(out) == 0
    removed = [
        r for name, data in events.events if name == "ragdefense_removed" for r in data["removed"]
    ]
    assert sum(r["reason"].startswith("removed: coordinated group") for r in removed) == 3
    assert GRADACompressor(peel=True).core.peel is True  # type: ignore[attr-defined]


@pytest.mark.slow
def test_auto_in_a_real_pipeline(embeddings: RagdefenseEmbeddings) -> None:
    from .test_grada import BENIGN, POISON, Q

    docs = [Document(t, metadata={"poison": t in POISON}) for t in POISON + BENIGN]
    store = InMemoryVectorStore.from_documents(docs, embeddings)
    out = defend(store.as_retriever(search_kwargs={"k": 8}), "auto", k=4).invoke(Q)
    assert len(out) == 4 and poison(out) == 0
    assert all(d.metadata["ragdefense"]["defense"] == "AutoDefense" for d in out)
    assert all(not d.metadata["poison"] for d in out) and all(
        d.metadata is not docs[0].metadata for d in out
    )
    with pytest.raises(TypeError):
        defend(store.as_retriever(), "auto", no_such_parameter=1)
    # a store, or a retriever already wrapped for configuration: named, not a pydantic error
    with pytest.raises(TypeError, match=r"got InMemoryVectorStore: pass store.as_retriever"):
        defend(store)
    with pytest.raises(TypeError, match=r"then configure what defend\(\) returns"):
        defend(store.as_retriever().with_config(tags=["x"]))
    assert defend(store.as_retriever()).with_config(tags=["x"]).invoke(Q)


def test_documents_are_never_mutated(toy_embedder: Any) -> None:
    from langchain_ragdefense import DefenseCompressor
    from ragdefense import RAGDefender

    docs = [Document(f"capital of France {w}", metadata={"i": i}) for i, w in enumerate("abcde")]
    docs.append(Document("bananas are yellow", metadata={"i": 5}))
    out = DefenseCompressor(defense=RAGDefender(embedder=toy_embedder)).compress_documents(
        docs, "q"
    )
    assert all(d.metadata.keys() == {"i"} for d in docs)
    assert all("ragdefense" in d.metadata for d in out)
    assert all(o is not d for o in out for d in docs)


class Failing(Embeddings):
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        raise ConnectionError("embedding service down")

    def embed_query(self, text: str) -> list[float]:
        raise ConnectionError("embedding service down")


def test_bad_input_and_failures() -> None:
    closed = RAGDefenderCompressor(embeddings=Failing())
    assert closed.compress_documents([], "q") == []
    docs = [Document("a"), Document(""), Document("c"), Document("d")]
    with pytest.raises(DefenseFailed, match="embedding service down"):
        closed.compress_documents(docs, "q")
    opened = RAGDefenderCompressor(embeddings=Failing(), fail_open=True)
    with pytest.warns(UserWarning, match="passing the documents through"):
        out = opened.compress_documents(docs, "q")
    assert [d.page_content for d in out] == ["a", "", "c", "d"]
    assert all(d.metadata["ragdefense"] == UNCHECKED for d in out)  # a reason too (review)
    with pytest.raises(ValueError, match="unknown defense"):
        defend(DefendedRetriever.model_construct(), "shield")  # type: ignore[call-arg]


def test_fail_open_never_hides_a_query_it_cannot_use(toy_embedder: Any) -> None:
    """fail_open rides out a defense that cannot run, and a document's bad data; a query that
    is not a string, or one embedded by another model than the documents, is a bug that no
    document causes: it raises either way."""
    from langchain_ragdefense import DefenseCompressor, RagdefenseEmbeddings
    from ragdefense import Consensus, DefenseInputError, Passage, QueryInputError
    from ragdefense.integration.adapter import AdapterCore

    class OtherSize(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return [[1.0, float(i), 0.5] for i, _ in enumerate(texts)]

        def embed_query(self, text: str) -> list[float]:
            return [1.0] * 10

    docs = [Document(f"passage {i} about the capital of France") for i in range(8)]
    fine = DefenseCompressor(embeddings=RagdefenseEmbeddings(toy_embedder), fail_open=True)
    with pytest.raises(QueryInputError, match="query must be str"):
        fine.compress_documents(docs, None)  # type: ignore[arg-type]
    mixed = DefenseCompressor(embeddings=OtherSize(), fail_open=True)
    with pytest.raises(QueryInputError, match="query embedding size 10, passages 3"):
        mixed.compress_documents(docs, "capital of France?")
    # a document's own bad data (a NaN vector from the store) is ridden out like any failure
    passages = [Passage(d.page_content, embedding=np.ones(3)) for d in docs]
    passages[3] = Passage("bad", embedding=np.array([1.0, np.nan, 0.0]))
    with pytest.warns(UserWarning, match="passing the documents through unchecked"):
        assert AdapterCore().run(Consensus(), "capital?", passages, fail_open=True) is None
    with pytest.raises(DefenseFailed, match="NaN"):
        AdapterCore().run(Consensus(), "capital?", passages)
    assert issubclass(QueryInputError, DefenseInputError)


def test_document_with_no_metadata_dict(toy_embedder: Any) -> None:
    """A Document built without validation (metadata None) is read as having no metadata."""
    from langchain_ragdefense import DefenseCompressor

    docs = [Document(f"text {i} " + "a" * i) for i in range(4)]
    docs.append(Document.model_construct(page_content="no metadata", metadata=None))
    embeddings = RagdefenseEmbeddings(toy_embedder)
    out = DefenseCompressor(embeddings=embeddings).compress_documents(docs, "which text?")
    assert out and all(set(d.metadata) == {"ragdefense"} for d in out)
    assert docs[-1].metadata is None  # the caller's document untouched
    # the test the docs give for fail_open's pass-through reads a checked document too
    assert all(d.metadata["ragdefense"]["checked"] is True for d in out)


def test_async_compressor_with_empty_content(toy_embedder: Any) -> None:
    from langchain_ragdefense import DefenseCompressor
    from ragdefense import RAGDefender

    docs = [Document(t) for t in ["", "  ", "capital city", "capital town"]]
    comp = DefenseCompressor(defense=RAGDefender(embedder=toy_embedder))
    out = asyncio.run(comp.acompress_documents(docs, "capital"))
    assert 1 <= len(out) <= 4


# ---------------------------------------------------------------- standard retriever suite


@pytest.mark.slow
class TestDefendedRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[DefendedRetriever]:
        return DefendedRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        from ragdefense import default_embedder

        emb = RagdefenseEmbeddings(default_embedder())
        texts = [t for q in KB for t in q.benign + q.poison]
        store = InMemoryVectorStore.from_texts(texts, emb)
        return {
            "base_retriever": store.as_retriever(),
            "compressor": RAGDefenderCompressor(embeddings=emb),
        }

    @property
    def retriever_query_example(self) -> str:
        return QUESTION.question


# ---------------------------------------------------------------- RobustRAG chain


def test_robustrag_chain_scripted_sync_and_async(store: InMemoryVectorStore) -> None:
    retriever = store.as_retriever(search_kwargs={"k": 6})
    llm = FakeListChatModel(responses=["Canberra"])  # every call answers "Canberra"
    chain = RobustRAGChain.from_llm(llm, retriever, max_concurrency=3, certify=1)
    out = chain.invoke({"question": QUESTION.question})
    assert out["answer"] == "Canberra" and len(out["context"]) == 6
    report = out["report"]
    assert len(report.responses) == 6 and report.kept_keywords
    assert report.certificate is not None and report.certificate.certified
    out2 = asyncio.run(chain.ainvoke(QUESTION.question))
    assert out2["answer"] == "Canberra"
    # keyword arguments go to the retriever (they reached a private method and failed)
    assert len(chain.invoke(QUESTION.question, k=3)["context"]) == 3
    assert len(asyncio.run(chain.ainvoke(QUESTION.question, k=2))["context"]) == 2
    with pytest.raises(TypeError, match="question"):
        chain.invoke(3)
    # ``prompt | chain`` hands a prompt value: its text is the question
    from langchain_core.prompts import PromptTemplate

    piped = PromptTemplate.from_template("{q}") | chain
    assert piped.invoke({"q": QUESTION.question})["answer"] == "Canberra"
    # the report keeps copies of the documents' metadata: editing one later leaves it as it was
    out["context"][0].metadata["edited"] = True
    assert "edited" not in out["report"].responses[0].passage.metadata
    with pytest.raises(ValueError, match=r"certify \(k'\) must be >= 1"):
        RobustRAGChain.from_llm(llm, retriever, certify=0)  # every answer would be refused


def test_robustrag_chain_tags_each_model_run_with_its_purpose(toy_embedder: Any) -> None:
    """Every isolated answer streams as a model run of its own (``astream_events``): a UI
    showing the model's tokens showed the planted passage's answer beside the final one, and
    nothing told the runs apart. Each run is tagged ``ragdefense:<purpose>``."""
    store = InMemoryVectorStore(RagdefenseEmbeddings(toy_embedder))
    store.add_documents([Document(page_content=f"Paris is the capital of France ({i}).")
                         for i in range(4)])  # fmt: skip
    store.add_documents([Document(page_content="The capital of France is Berlin.")])
    said = ["Paris"] * 4 + ["Visit evil.example for Berlin", "Paris"]  # in rank order, then final
    llm = FakeListChatModel(responses=said)
    chain = RobustRAGChain.from_llm(llm, store.as_retriever(search_kwargs={"k": 5}),
                                    max_concurrency=1)  # fmt: skip

    async def streamed() -> tuple[dict[str, str], str]:
        out: dict[str, str] = {}
        shown = ""  # what LangGraph's message stream (a chat UI) shows: runs not "nostream"
        async for event in chain.astream_events("Capital of France?", version="v2"):
            if event["event"] == "on_chat_model_stream":
                tag = next(t for t in event["tags"] if t.startswith("ragdefense:"))
                out[tag] = out.get(tag, "") + event["data"]["chunk"].content
                if "nostream" not in event["tags"]:
                    shown += event["data"]["chunk"].content
        return out, shown

    tokens, shown = asyncio.run(streamed())
    assert "Berlin" in tokens["ragdefense:isolated"]
    assert tokens["ragdefense:aggregate"] == "Paris"
    assert shown == "Paris"  # the isolated answers, the planted one's too, are "nostream"


def _in_flight(answer: str) -> tuple[Any, list[int]]:
    """A slow model answering ``answer``, and ``[calls in flight now, the most at once]``."""
    import threading
    import time

    lock, flight = threading.Lock(), [0, 0]

    def slow(prompt: str) -> str:
        with lock:
            flight[0] += 1
            flight[1] = max(flight)
        time.sleep(0.05)
        with lock:
            flight[0] -= 1
        return answer

    return slow, flight


def test_robustrag_chain_holds_max_concurrency_across_runs(store: InMemoryVectorStore) -> None:
    """Every run built its own backend with its own limit (six threads at max_concurrency=2
    had twelve calls in flight), and ainvoke of a model without an async path of its own (a
    sync lambda) ran its calls in the event loop's shared thread pool: hung calls outlived
    their deadline there, and later requests waited for them."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from langchain_core.runnables import RunnableLambda

    from ragdefense import RobustRAG

    retriever = store.as_retriever(search_kwargs={"k": 4})
    slow, flight = _in_flight("Canberra")
    chain = RobustRAGChain.from_llm(RunnableLambda(slow), retriever, max_concurrency=2)
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(chain.invoke, [QUESTION.question] * 6))
    assert flight[1] == 2 and all(o["answer"] == "Canberra" for o in outs)
    # (review) a chain LangChain rebuilds per call (configurable_fields) had a limit per call
    from langchain_core.runnables import ConfigurableField

    flight[1] = 0
    rebuilt = chain.configurable_fields(certify=ConfigurableField(id="certify"))
    outs = rebuilt.batch([QUESTION.question] * 4, {"configurable": {"certify": None}})
    assert flight[1] == 2 and all(o["answer"] == "Canberra" for o in outs)
    with pytest.raises(ValidationError, match="max_concurrency"):
        chain.max_concurrency = 0  # set later, as at construction (0 slots: a run waits forever)
    with pytest.raises(ValidationError, match="certify"):
        chain.certify = -1
    assert chain.max_concurrency == 2 and chain.certify is None

    release = threading.Event()

    def hung(prompt: str) -> str:
        release.wait(10)
        return "late"

    robust = RobustRAG(llm=str, timeout=0.3)
    chain = RobustRAGChain.from_llm(RunnableLambda(hung), retriever, robust=robust)

    async def requests() -> list[float]:
        took = []
        for _ in range(8):  # more than the loop's default thread pool holds on two cores
            start = time.monotonic()
            with pytest.raises(DefenseFailed, match="timed out"):  # every call: an outage
                await asyncio.wait_for(chain.ainvoke(QUESTION.question), 5)
            took.append(time.monotonic() - start)
        return took

    try:
        assert max(asyncio.run(requests())) < 2
    finally:
        release.set()


def test_robustrag_chain_takes_a_runs_max_concurrency(store: InMemoryVectorStore) -> None:
    """LangChain's ``config["max_concurrency"]`` (what a user sets to spare a rate-limited
    model) was ignored: the isolated calls went out ``max_concurrency`` (the field) at a time."""
    from langchain_core.runnables import RunnableLambda

    slow, flight = _in_flight("Canberra")
    retriever = store.as_retriever(search_kwargs={"k": 4})
    chain = RobustRAGChain.from_llm(RunnableLambda(slow), retriever, max_concurrency=4)
    assert chain.invoke(QUESTION.question)["answer"] == "Canberra"
    assert flight[1] > 1  # four passages, four calls at once
    flight[1] = 0
    out = chain.invoke(QUESTION.question, {"max_concurrency": 1})
    assert out["answer"] == "Canberra" and flight[1] == 1
    flight[1] = 0
    asyncio.run(chain.ainvoke(QUESTION.question, {"max_concurrency": 2}))
    assert flight[1] == 2
    flight[1] = 0
    chain.invoke(QUESTION.question, {"max_concurrency": 16})  # never above the field
    assert 1 < flight[1] <= 4


def test_a_wrapped_sync_model_runs_in_the_backends_own_threads() -> None:
    """``with_retry``, ``bind``, fallbacks, a configurable model and ``prompt | model`` all
    override ``ainvoke``: a sync-only model inside one was taken for an async one, and its
    calls ran in the event loop's shared thread pool, past their deadline."""
    from langchain_core.language_models import LLM, BaseChatModel
    from langchain_core.language_models.fake import FakeListLLM
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.prompts import PromptTemplate
    from langchain_core.runnables import ConfigurableField

    from ragdefense.llm.base import _native_async

    class SyncOnly(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "sync-only"

        def _generate(self, messages: Any, stop: Any = None, **kwargs: Any) -> ChatResult:
            return ChatResult(generations=[ChatGeneration(message=AIMessage("Canberra"))])

    class AsyncToo(SyncOnly):
        async def _agenerate(self, messages: Any, stop: Any = None, **kwargs: Any) -> ChatResult:
            return self._generate(messages)

    class OwnCall(LLM):  # LangChain's documented custom model: _call alone
        @property
        def _llm_type(self) -> str:
            return "own-call"

        def _call(self, prompt: str, stop: Any = None, **kwargs: Any) -> str:
            return "Canberra"

    # (review) LangChain's simple bases (SimpleChatModel, LLM) answer ainvoke with their sync
    # code in the shared pool too: a FakeListChatModel was taken for an async model
    for model, native in (
        (SyncOnly(), False),
        (AsyncToo(), True),
        (FakeListChatModel(responses=["a"]), False),
        (OwnCall(), False),
        (FakeListLLM(responses=["a"]), True),  # its own _acall
    ):
        wrapped = [
            model.with_retry(),
            model.bind(stop=["\n"]),
            model.with_fallbacks([model]),
            PromptTemplate.from_template("{q}") | model,
            model.configurable_alternatives(ConfigurableField(id="llm"), default_key="a"),
        ]
        assert [_native_async(m) for m in [model, *wrapped]] == [native] * 6


@pytest.mark.slow
def test_robustrag_chain_with_the_real_llm(embeddings: RagdefenseEmbeddings) -> None:
    from langchain_core.runnables import RunnableLambda

    from ragdefense.llm import default_llm

    # RobustRAG's regime: k' = 1 poison passage among k = 4 retrieved
    small = InMemoryVectorStore.from_texts(QUESTION.benign + QUESTION.poison[:1], embeddings)
    smol = default_llm()
    llm = RunnableLambda(lambda prompt: smol.generate([str(prompt)])[0].text or "")
    chain = RobustRAGChain.from_llm(llm, small.as_retriever(search_kwargs={"k": 4}))
    out = chain.invoke(QUESTION.question)
    assert len(out["report"].responses) == 4
    assert "Canberra" in out["answer"]


def test_too_few_documents_warn_once_naming_the_fix(toy_embedder: Any) -> None:
    from langchain_classic.retrievers import ContextualCompressionRetriever

    from langchain_ragdefense import DefenseCompressor
    from ragdefense import RAGDefender

    store = InMemoryVectorStore(RagdefenseEmbeddings(toy_embedder))
    store.add_texts([f"capital of France is {w}" for w in ("Paris", "Lyon", "Nice", "Lille")])
    compressor = DefenseCompressor(defense=RAGDefender(embedder=toy_embedder))
    retriever = ContextualCompressionRetriever(
        base_compressor=compressor, base_retriever=store.as_retriever(search_kwargs={"k": 2})
    )
    with pytest.warns(UserWarning, match=r"2 passage\(s\).*search_kwargs=\{'k': 10\}"):
        assert len(retriever.invoke("capital of France?")) == 2  # passed through unchecked
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per compressor, not per query
        retriever.invoke("capital of France?")
        defend(store.as_retriever(search_kwargs={"k": 4}), k=2).invoke("capital of France?")
        # k=1 fetches what RAGDefender needs to compare (3), not just 2k = 2
        assert len(defend(store.as_retriever(), k=1).invoke("capital of France?")) == 1
    # 4 documents (as_retriever's default) can be compared but are fewer than RAGDefender's pool
    wider = ContextualCompressionRetriever(
        base_compressor=DefenseCompressor(defense=RAGDefender(embedder=toy_embedder)),
        base_retriever=store.as_retriever(),
    )
    with pytest.warns(UserWarning, match=r"4 passage\(s\).*pool of 8.*defend\(retriever\)"):
        wider.invoke("capital of France?")
    # defend() on a store of two: it asked for more, so the warning says the store has no more
    tiny = InMemoryVectorStore(RagdefenseEmbeddings(toy_embedder))
    tiny.add_texts(["capital of France is Paris", "capital of France is Lyon"])
    with pytest.warns(UserWarning, match=r"2 passage\(s\).*the store returned no more") as seen:
        defend(tiny.as_retriever()).invoke("capital of France?")
    assert "use defend(retriever)" not in str(seen[0].message)


def test_defend_fetches_the_defense_pool_and_returns_k(toy_embedder: Any) -> None:
    """Target 7 of the safe-default issue: ``defend(store.as_retriever())`` returns at most the
    retriever's own k (4) after asking the store for the defense's pool."""
    store = InMemoryVectorStore(RagdefenseEmbeddings(toy_embedder))
    store.add_texts([f"capital of France is {w} {i}" for i in range(20) for w in ("Paris",)])
    asked: list[int] = []
    base = store.as_retriever()
    original = type(store).similarity_search

    def spy(self: Any, query: str, k: int = 4, **kwargs: Any) -> Any:
        asked.append(k)
        return original(self, query, k=k, **kwargs)

    type(store).similarity_search = spy  # type: ignore[method-assign]
    try:
        docs = defend(base).invoke("capital of France?")
        assert asked[-1] == 8 and len(docs) <= 4  # RAGDefender's pool: at least 8
        docs = defend(base, "grada", k=6).invoke("capital of France?")
        assert asked[-1] == 12 and len(docs) == 6  # GRADA's: 2k
        defend(store.as_retriever(search_kwargs={"k": 10}), "grada").invoke("capital?")
        assert asked[-1] == 20
    finally:
        type(store).similarity_search = original  # type: ignore[method-assign]


class _OwnK(BaseRetriever):
    """A retriever with its own ``k`` that drops a ``k`` passed per call (as BM25's and
    TF-IDF's do)."""

    store: Any
    k: int = 4

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return self.store.similarity_search(query, k=self.k)  # type: ignore[no-any-return]


class _Fixed(BaseRetriever):
    """A retriever that cannot be asked for more: it returns what it was given."""

    docs: list[Document]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return list(self.docs)


@pytest.mark.slow
def test_defend_widens_retrievers_with_their_own_k_and_mmr(store: InMemoryVectorStore) -> None:
    """A retriever with its own ``k`` is asked for the pool through a copy (a ``k`` passed per
    call is dropped); an MMR retriever for MMR over exactly the pool (MMR over more candidates
    spreads the planted near-copies out of the defense's sight); one that cannot be widened
    warns that the defense sees too few documents."""
    own = _OwnK(store=store)
    mmr = store.as_retriever(search_type="mmr")
    for retriever in (own, mmr):
        assert poison(retriever.invoke(QUESTION.question)) >= 1  # the attack works
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the pool was fetched: no small-pool warning
            docs = defend(retriever).invoke(QUESTION.question)
        assert 1 <= len(docs) <= 4 and poison(docs) == 0
    assert own.k == 4 and mmr.search_kwargs == {}  # the caller's retrievers are not changed
    # its own k is what it returns, whatever its search_kwargs (a time-weighted retriever's
    # count its candidates)
    candidates = _OwnK(store=store)
    object.__setattr__(candidates, "vectorstore", store)
    object.__setattr__(candidates, "search_kwargs", {"k": 100})
    assert len(defend(candidates).invoke(QUESTION.question)) <= 4
    few = _Fixed(docs=store.similarity_search(QUESTION.question, k=4))
    with pytest.warns(UserWarning, match=r"4 passage\(s\).*pool of 8"):
        defend(few, k=2).invoke(QUESTION.question)


@pytest.mark.slow
def test_defend_widens_every_retriever_of_an_ensemble(store: InMemoryVectorStore) -> None:
    """Hybrid search (an ensemble of a retriever with its own ``k`` and a vector store
    retriever) passes no ``k`` on to its retrievers: a copy whose every retriever is widened
    is asked, and the survivors are cut to the sum of their k (what their union holds at
    most)."""
    from langchain_classic.retrievers import EnsembleRetriever, MergerRetriever

    own, vectors = _OwnK(store=store, k=3), store.as_retriever()
    for kind in (EnsembleRetriever, MergerRetriever):
        hybrid = kind(retrievers=[own, vectors])
        assert poison(hybrid.invoke(QUESTION.question)) >= 1  # the attack works
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the pool was fetched: no small-pool warning
            docs = defend(hybrid).invoke(QUESTION.question)
        assert 4 < len(docs) <= 7 and poison(docs) == 0
        assert hybrid.retrievers == [own, vectors]
    assert own.k == 3 and vectors.search_kwargs == {}  # the caller's retrievers are unchanged


@pytest.mark.slow
def test_defend_widens_the_retriever_a_multi_query_retriever_asks(
    store: InMemoryVectorStore,
) -> None:
    """A multi-query retriever passes no ``k`` on: the pool stayed the union of its queries'
    top 4, all planted, and the defense kept them. A copy whose retriever is widened is asked,
    and all it keeps are returned (the retriever returns its queries' union), unless a k is
    given."""
    from langchain_classic.retrievers import MultiQueryRetriever

    question = QUESTION.question
    rewrites = f"{question}\nWhich city is the capital of Australia?\nAustralia's capital?"
    llm = FakeListChatModel(responses=[rewrites] * 4)
    rewriter = MultiQueryRetriever.from_llm(retriever=store.as_retriever(), llm=llm)
    assert poison(rewriter.invoke(question)) >= 3  # the attack works
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the pool was fetched: no small-pool warning
        docs = defend(rewriter).invoke(question)
    assert len(docs) >= 1 and poison(docs) == 0
    assert len(defend(rewriter, k=2).invoke(question)) <= 2
    assert rewriter.retriever.search_kwargs == {}  # the caller's retriever is unchanged


def test_defend_finds_the_store_inside_a_nesting_retriever(toy_embedder: Any) -> None:
    """An ensemble (hybrid search), a compression or a multi-query retriever holding one vector
    store lends its model to the defense, as the store's own retriever does (the packaged
    MiniLM, a second model, was used); stores of two models lend none."""
    from langchain_classic.retrievers import (
        ContextualCompressionRetriever,
        EnsembleRetriever,
        MultiQueryRetriever,
    )

    model = RagdefenseEmbeddings(toy_embedder)
    store, other = (
        InMemoryVectorStore(model),
        InMemoryVectorStore(RagdefenseEmbeddings(toy_embedder)),
    )
    vectors = store.as_retriever()
    llm = FakeListChatModel(responses=["capital city"])
    for nesting in (
        EnsembleRetriever(retrievers=[_OwnK(store=store, k=3), vectors]),
        ContextualCompressionRetriever(base_compressor=_TopN(), base_retriever=vectors),
        MultiQueryRetriever.from_llm(retriever=vectors, llm=llm),
    ):
        compressor = defend(nesting).compressor
        assert compressor.embeddings is model and compressor.vectorstore is store
    both = EnsembleRetriever(retrievers=[vectors, other.as_retriever()])
    assert defend(both).compressor.embeddings is None
    shared = EnsembleRetriever(retrievers=[vectors, InMemoryVectorStore(model).as_retriever()])
    compressor = defend(shared).compressor
    assert compressor.embeddings is model and compressor.vectorstore is None  # whose vectors?
    store.add_documents([Document(f"capital city fact {i} of {i * 7}") for i in range(12)])
    docs = defend(EnsembleRetriever(retrievers=[_OwnK(store=store, k=3), vectors])).invoke(
        "capital"
    )
    assert docs and all(d.metadata["ragdefense"]["kept"] for d in docs)


class _TopN(BaseDocumentCompressor):
    """A reranker as LangChain's are: keeps the first ``top_n`` documents (``None``: all)."""

    top_n: int | None = None

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Any = None
    ) -> Sequence[Document]:
        return list(documents)[: self.top_n]


class _PerCallK(BaseRetriever):
    """A retriever that takes ``k`` per call only (no setting to copy)."""

    store: Any

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, k: int = 4
    ) -> list[Document]:
        return self.store.similarity_search(query, k=k)  # type: ignore[no-any-return]


@pytest.mark.slow
def test_defend_widens_the_base_of_a_compression_retriever(store: InMemoryVectorStore) -> None:
    """A ``ContextualCompressionRetriever`` is asked through a copy whose base retriever
    fetches the pool (a setting raised, or ``k`` per call, which it passes on) and whose
    reranker keeps it (``top_n`` raised); the survivors are cut to what the pipeline returns:
    its base's k, at most the reranker's ``top_n``."""
    from langchain_classic.retrievers import ContextualCompressionRetriever

    # (base, top_n, k): a base that says no k leaves the reranker's top_n, or nothing, to go by
    unknown = _PerCallK(store=store)
    cases = [(store.as_retriever(), t, k) for t, k in ((None, 4), (3, 3), (100, 4))]
    cases += [(unknown, None, None), (unknown, 3, 3)]
    for base, top_n, k in cases:
        reranker = _TopN(top_n=top_n)
        piped = ContextualCompressionRetriever(base_compressor=reranker, base_retriever=base)
        assert poison(piped.invoke(QUESTION.question)) >= 1  # the attack works
        defended = defend(piped)
        assert defended._plan({})[0] == k  # None given: the pipeline's own, read per call
        if k is None:  # no k to size a pool by: used as it is, as any such retriever
            with pytest.warns(UserWarning, match=r"4 passage\(s\)"):
                defended.invoke(QUESTION.question)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the pool was fetched: no small-pool warning
            docs = defended.invoke(QUESTION.question)
        assert 1 <= len(docs) <= k and poison(docs) == 0
        assert piped.base_retriever is base and piped.base_compressor is reranker
        assert reranker.top_n == top_n  # the caller's are not changed
    assert store.as_retriever().search_kwargs == {}


def test_a_compressor_given_a_store_embeds_the_query_with_the_stores_model() -> None:
    """The store's vectors are its model's: a compressor given ``vectorstore`` and no
    ``embeddings`` embeds the query with the store's (the packaged model would compare the
    query with them in another space, silently where the sizes agree)."""
    from langchain_core.embeddings import DeterministicFakeEmbedding

    from langchain_ragdefense import ConsensusCompressor

    model = DeterministicFakeEmbedding(size=384)
    store = InMemoryVectorStore(model)
    embedder = ConsensusCompressor(vectorstore=store).core.embedder
    assert getattr(embedder, "embeddings", None) is model
    given = DeterministicFakeEmbedding(size=384)
    kept = ConsensusCompressor(vectorstore=store, embeddings=given).core.embedder
    assert getattr(kept, "embeddings", None) is given  # an explicit model wins


@pytest.mark.slow
def test_defend_with_other_embeddings_than_the_store(embeddings: RagdefenseEmbeddings) -> None:
    """``embeddings`` other than the store's embed the retrieved documents themselves: the
    store's vectors are another space (here another size)."""
    from langchain_core.embeddings import DeterministicFakeEmbedding

    docs = [Document(text, metadata=meta) for text, meta in demo_documents()]
    other = InMemoryVectorStore.from_documents(docs, DeterministicFakeEmbedding(size=64))
    assert defend(other.as_retriever(), embeddings=embeddings).invoke(QUESTION.question)


@pytest.mark.slow
def test_a_store_holding_files_added_twice_gives_each_text_once(
    embeddings: RagdefenseEmbeddings,
) -> None:
    """``add_documents`` without ids, run twice over the demo's clean passages (a loader rerun):
    the one line's context holds each text once, and the removal records say they were copies."""
    docs = [Document(t, metadata=m) for t, m in demo_documents() if not m["poison"]]
    store = InMemoryVectorStore(embeddings)
    store.add_documents(docs)
    store.add_documents(docs)
    question = QUESTION.question
    plain = store.as_retriever().invoke(question)
    assert len({d.page_content for d in plain}) < len(plain)  # copies crowd the context
    handler = Events()
    context = defend(store.as_retriever()).invoke(question, config={"callbacks": [handler]})
    texts = [d.page_content for d in context]
    assert len(texts) == len(set(texts)) >= 2
    removed = [r for name, data in handler.events for r in data["removed"]]
    assert removed and all(r["copy"] and "which stands for it" in r["reason"] for r in removed)


def test_a_base_retriever_swapped_after_defend_is_judged_on_its_own_vectors(
    embeddings: RagdefenseEmbeddings,
) -> None:
    """``configurable_fields(base_retriever=...)`` (or a copy, or a hybrid retriever) calls
    another store than the one ``defend`` reads vectors from, whose ids name other texts: a
    stored vector is used only where the store holds the document's own text under its id."""
    from langchain_classic.retrievers import EnsembleRetriever
    from langchain_core.runnables import ConfigurableField

    from langchain_ragdefense.vectors import stored_vectors

    pairs = list(demo_documents())
    first, second = InMemoryVectorStore(embeddings), InMemoryVectorStore(embeddings)
    first.add_documents([Document(t, metadata=m, id=f"d{i}") for i, (t, m) in enumerate(pairs)])
    reverse = pairs[::-1]  # the same ids name other texts there
    second.add_documents([Document(t, metadata=m, id=f"d{i}") for i, (t, m) in enumerate(reverse)])
    pool = second.similarity_search(QUESTION.question, k=8)
    assert stored_vectors(first, pool) == [None] * 8  # no text of first's under those ids
    assert all(v is not None for v in stored_vectors(second, pool))
    wrapped = defend(first.as_retriever()).configurable_fields(
        base_retriever=ConfigurableField(id="base")
    )
    direct = defend(second.as_retriever()).invoke(QUESTION.question)
    for base in (second.as_retriever(), EnsembleRetriever(retrievers=[second.as_retriever()])):
        got = wrapped.invoke(QUESTION.question, config={"configurable": {"base": base}})
        assert [d.page_content for d in got] == [d.page_content for d in direct]
        assert not poison(got)


class PermutedEmbeddings(Embeddings):
    """Another model of the same size: the packaged one's vectors, coordinates permuted."""

    def __init__(self, base: Embeddings) -> None:
        self.base = base
        self.order = np.random.default_rng(0).permutation(384)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [list(np.asarray(v)[self.order]) for v in self.base.embed_documents(texts)]

    def embed_query(self, text: str) -> list[float]:
        return list(np.asarray(self.base.embed_query(text))[self.order])


def test_a_compressor_with_a_store_and_another_model_embeds_in_one_space(
    store: InMemoryVectorStore, embeddings: RagdefenseEmbeddings
) -> None:
    """Given ``vectorstore=`` and ``embeddings=`` of another model, the documents are embedded
    by that model, as the query is: the store's vectors would be another space."""
    from langchain_ragdefense import ConsensusCompressor

    pool = store.similarity_search(QUESTION.question, k=8)
    other = PermutedEmbeddings(embeddings)
    alone = ConsensusCompressor(embeddings=other).compress_documents(pool, QUESTION.question)
    both = ConsensusCompressor(vectorstore=store, embeddings=other).compress_documents(
        pool, QUESTION.question
    )
    assert [d.page_content for d in both] == [d.page_content for d in alone]
    assert poison(pool) and not poison(both)


def test_all_kept_is_judged_on_the_defense_pool(store: InMemoryVectorStore) -> None:
    """``k=None`` (all kept) still fetches the defense's pool for the retriever's own k."""
    from langchain_ragdefense import ConsensusCompressor, DefendedRetriever

    plain = DefendedRetriever(base_retriever=store.as_retriever(), compressor=ConsensusCompressor())
    for got in (
        plain.invoke(QUESTION.question, k=None),
        defend(store.as_retriever()).invoke(QUESTION.question, k=None),
    ):
        assert got and not poison(got)


def test_built_without_k_returns_what_the_base_retriever_would(toy_embedder: Any) -> None:
    """A DefendedRetriever built without ``k`` returns at most its base retriever's own k, as
    defend() does (it returned the whole kept pool); ``k=None`` per call still asks for all."""
    from langchain_ragdefense import ConsensusCompressor, DefendedRetriever

    store = InMemoryVectorStore(RagdefenseEmbeddings(toy_embedder))
    store.add_documents([Document(f"capital city fact number {i} of {i * 7}") for i in range(12)])
    base = store.as_retriever()  # LangChain's own k: 4
    plain = DefendedRetriever(base_retriever=base, compressor=ConsensusCompressor())
    every = plain.invoke("capital city", k=None)
    assert len(every) > 4
    assert len(plain.invoke("capital city")) == len(defend(base).invoke("capital city")) == 4
    assert len(asyncio.run(plain.ainvoke("capital city"))) == 4

    class EveryFourth(BaseDocumentCompressor):
        """Keeps every fourth document, counting what it is handed."""

        seen: list[int] = Field(default_factory=list)

        def compress_documents(
            self, documents: Sequence[Document], query: str, callbacks: Any = None
        ) -> Sequence[Document]:
            self.seen.append(len(documents))
            return list(documents)[::4]

    # fetched as defend() fetches it: once (the defense leaving fewer than k is no refill)
    built, lent = EveryFourth(), EveryFourth()
    assert DefendedRetriever(base_retriever=base, compressor=built).invoke("capital city")
    assert defend(base, lent).invoke("capital city")
    assert built.seen == lent.seen == [8]
    refill = DefendedRetriever(base_retriever=base, compressor=EveryFourth(), max_rounds=3)
    refill.invoke("capital city")
    assert refill.compressor.seen[1:] == [12]  # asked for: the pool widens (the store holds 12)
    # a k set after defend() (assigned, or configurable) is a k given: the pool widens as for
    # defend(base, k=...), where defend()'s own rounds for the retriever's k stayed (one)
    from langchain_core.runnables import ConfigurableField

    assigned = defend(base, EveryFourth())
    assigned.k = 4
    assigned.invoke("capital city")
    configured = defend(base, EveryFourth()).configurable_fields(k=ConfigurableField(id="k"))
    configured.with_config(configurable={"k": 4}).invoke("capital city")
    given = defend(base, EveryFourth(), k=4)
    given.invoke("capital city")
    assert assigned.compressor.seen == given.compressor.seen == [8, 12]
    assert configured.default.compressor.seen == [8, 12]  # type: ignore[attr-defined]
    once = defend(base, EveryFourth())
    once.invoke("capital city")
    assert once.compressor.seen == [8]  # its own k: fetched once, still
    # per call: a NumPy k as defend() takes one; the chain passes keyword arguments on
    assert len(once.invoke("capital city", k=np.int64(2))) <= 2
    with pytest.raises(ValueError, match="positive int"):
        once.invoke("capital city", k=np.float64(2.0))
