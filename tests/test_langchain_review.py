"""The LangChain adapter's contracts with LangChain itself: the caller's config reaches the base
retriever, a chain copies and takes any retriever-like Runnable, removals reach handlers given
directly, stored vectors go to their own text only, the red team reports a chain's own error,
and a ``k`` asked per call is fetched for."""

from __future__ import annotations

import asyncio
import copy
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import FakeListChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import ConfigurableField, RunnableConfig, RunnableLambda
from langchain_core.runnables.config import ensure_config
from langchain_core.vectorstores import InMemoryVectorStore
from pydantic import Field

from langchain_ragdefense import DefenseCompressor, RobustRAGChain, defend, red_team
from langchain_ragdefense.vectors import stored_vectors
from ragdefense import DefenseFailed, DefenseInputError, QueryInputError, RAGDefender
from ragdefense.llm.calls import model_slots
from ragdefense.redteam import AttackTarget
from tests.conftest import bag_of_words
from tests.test_langchain import _Fixed  # returns its documents; module-level: pickles


class Words(Embeddings):
    """The tests' hashed bag of words as LangChain embeddings."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return bag_of_words(texts).tolist()  # type: ignore[no-any-return]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


class _Keep(BaseDocumentCompressor):
    """Keeps every document, or drops those holding ``drop``."""

    drop: str | None = None

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Any = None
    ) -> Sequence[Document]:
        return [d for d in documents if not (self.drop and self.drop in d.page_content)]


class _Recording(BaseRetriever):
    """Records the config each call is given."""

    seen: list[RunnableConfig] = Field(default_factory=list)

    def invoke(self, input: str, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        self.seen.append(ensure_config(config))
        return super().invoke(input, config, **kwargs)

    async def ainvoke(self, input: str, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        self.seen.append(ensure_config(config))
        return await super().ainvoke(input, config, **kwargs)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [Document("Canberra is the capital of Australia")]


def test_the_base_retriever_runs_under_the_callers_config() -> None:
    base = _Recording()
    defended = defend(base, _Keep())
    config: RunnableConfig = {
        "configurable": {"user": "alice"},
        "recursion_limit": 7,
        "max_concurrency": 2,
        "tags": ["tenant-a"],
        "metadata": {"m": 1},
    }
    defended.invoke("q", config)
    asyncio.run(defended.ainvoke("q", config))
    assert len(base.seen) == 2
    for seen in base.seen:
        assert seen["configurable"] == {"user": "alice"}
        assert seen["recursion_limit"] == 7 and seen["max_concurrency"] == 2
        assert "tenant-a" in seen["tags"] and seen["metadata"]["m"] == 1
        # a child of the defended run
        assert getattr(seen["callbacks"], "parent_run_id", None) is not None


def test_a_per_user_filter_inside_a_hybrid_retriever_holds_through_defend() -> None:
    from langchain_classic.retrievers import EnsembleRetriever

    docs = [
        Document(f"{who}'s note {i}: the project budget is {i}00 dollars", metadata={"who": who})
        for who in ("alice", "bob")
        for i in range(6)
    ]
    store = InMemoryVectorStore.from_documents(docs, Words())
    per_user = store.as_retriever().configurable_fields(
        search_kwargs=ConfigurableField(id="search_kwargs")
    )
    hybrid = EnsembleRetriever(retrievers=[per_user], weights=[1.0])
    only = {"k": 6, "filter": lambda d: d.metadata["who"] == "alice"}
    config: RunnableConfig = {"configurable": {"search_kwargs": only}}
    defended = defend(hybrid, _Keep())
    for out in (defended.invoke("project budget", config),
                asyncio.run(defended.ainvoke("project budget", config))):  # fmt: skip
        assert out and {d.metadata["who"] for d in out} == {"alice"}


CONTEXT = [Document(f"Canberra is the capital of Australia ({i})") for i in range(3)]


def _chain(retriever: Any, **kwargs: Any) -> RobustRAGChain:
    llm = FakeListChatModel(responses=["Canberra"])
    return RobustRAGChain.from_llm(llm, retriever, **kwargs)


def test_a_chain_copies_and_pickles_after_a_run() -> None:
    chain = _chain(_Fixed(docs=CONTEXT))
    chain.invoke("capital of Australia?")
    copies = [copy.deepcopy(chain), chain.model_copy(deep=True), pickle.loads(pickle.dumps(chain))]
    for other in copies:
        assert other.invoke("capital of Australia?")["answer"] == "Canberra"
        # another model (copied): a limit of its own; a shallow copy calls the same model
        assert model_slots(other.llm, 8) is not model_slots(chain.llm, 8)
    shallow = chain.model_copy()  # the same model: its limit
    assert model_slots(shallow.llm, 8) is model_slots(chain.llm, 8)


def test_a_chain_takes_any_retriever_like_runnable() -> None:
    base = _Fixed(docs=CONTEXT)
    other = _Fixed(docs=[Document("Sydney is the capital of Australia")])
    per_call = defend(base, _Keep()).configurable_fields(
        base_retriever=ConfigurableField(id="retriever")
    )
    for retriever in (
        defend(base, _Keep()).with_config(tags=["tenant-a"]),
        defend(base, _Keep()).with_retry(),
        per_call,
    ):
        assert len(_chain(retriever).invoke("capital?")["context"]) == 3
    config: RunnableConfig = {"configurable": {"retriever": other}}
    assert _chain(per_call).invoke("capital?", config)["context"][0].page_content.startswith("Syd")
    store = InMemoryVectorStore(Words())
    with pytest.raises(ValueError, match=r"store\.as_retriever"):
        _chain(store)
    with pytest.raises(ValueError, match="expected a retriever, got FakeListChatModel"):
        _chain(FakeListChatModel(responses=["x"]))  # from_llm's arguments swapped
    with pytest.raises(DefenseInputError, match="LangChain Document"):
        _chain(RunnableLambda(lambda q: q)).invoke("capital?")


class _Events(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.events.append((name, len(data["removed"])))


def test_removals_reach_handlers_given_directly(toy_embedder: Any) -> None:
    planted = [Document("the capital of Australia is Sydney says the planted text")] * 5
    honest = [
        "Canberra is the capital of Australia",
        "Australia capital city Canberra was chosen in 1908",
        "The Australian parliament sits in Canberra, the capital",
        "Sydney is the largest city of Australia",
        "Melbourne was the temporary capital",
    ]
    docs = planted + [Document(t) for t in honest]
    compressor = DefenseCompressor(defense=RAGDefender(embedder=toy_embedder))
    sync, concurrent = _Events(), _Events()
    kept = compressor.compress_documents(docs, "capital of Australia", callbacks=[sync])
    removed = len(docs) - len(kept)
    asyncio.run(
        compressor.acompress_documents(docs, "capital of Australia", callbacks=[concurrent])
    )
    assert removed and sync.events == concurrent.events == [("ragdefense_removed", removed)]


def test_a_defended_retriever_reports_its_last_rounds_removals_alone() -> None:
    """Each fetch round sent its own removal event: documents reported removed in a narrow
    round were handed to the LLM by a wider one, and alert counts doubled."""
    from langchain_ragdefense import RagdefenseEmbeddings
    from ragdefense.data import demo_documents

    store = InMemoryVectorStore.from_documents(
        [Document(t, metadata=m) for t, m in demo_documents()], RagdefenseEmbeddings()
    )
    question = "What is the largest ocean on Earth?"

    class Seen(BaseCallbackHandler):
        def __init__(self) -> None:
            self.removed: list[list[str]] = []
            self.searches = 0

        def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
            self.removed.append([r["id"] for r in data["removed"]])

        def on_retriever_start(self, *args: Any, **kwargs: Any) -> None:
            self.searches += 1

    for defended in (
        defend(store.as_retriever(), "grada", k=4, fetch_k=4),
        defend(store.as_retriever(), k=4),
    ):
        for sync in (True, False):
            seen = Seen()
            config: RunnableConfig = {"callbacks": [seen]}
            out = (
                defended.invoke(question, config)
                if sync
                else asyncio.run(defended.ainvoke(question, config))
            )
            assert seen.searches > 2  # the defended retriever and more than one round
            [removed] = seen.removed  # one event: the last round's
            assert removed and not {d.id for d in out} & set(removed)


def test_every_defense_of_the_last_round_reports_and_the_bases_own_too() -> None:
    """(review) only the last result a round kept was reported: a pipeline's first defense,
    and a defense inside the base retriever (a compression retriever), went unreported."""
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from langchain_classic.retrievers.document_compressors import DocumentCompressorPipeline

    planted = [
        Document(f"the capital of Australia is Sydney, the planted text {i}") for i in range(5)
    ]
    honest = ["Canberra is the capital of Australia", "Canberra was chosen in 1908",
              "The Australian parliament sits in Canberra", "Melbourne was the first capital",
              "Canberra hosts the High Court", "Canberra is in the ACT"]  # fmt: skip
    docs = planted + [Document(t) for t in honest]
    for i, d in enumerate(docs):
        d.id = f"d{i}"

    class Seen(BaseCallbackHandler):
        def __init__(self) -> None:
            self.defenses: list[str] = []

        def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
            self.defenses.append(data["defense"])

    pipeline = DocumentCompressorPipeline(
        transformers=[DefenseCompressor(defense="strict"), DefenseCompressor(defense="grada")]
    )
    screened = ContextualCompressionRetriever(
        base_compressor=DefenseCompressor(defense="strict"), base_retriever=_Fixed(docs=docs)
    )
    for defended in (
        defend(_Fixed(docs=docs), pipeline, k=4, fetch_k=11),
        defend(screened, "grada", k=4, fetch_k=11),
    ):
        seen = Seen()
        defended.invoke("capital of Australia", {"callbacks": [seen]})
        assert seen.defenses[-1] == "GRADA" and "RAGDefender" in seen.defenses, seen.defenses


def test_a_wrapper_asking_one_query_returns_its_retrievers_k() -> None:
    """Any retriever with a ``retriever`` field (a logging or access-check wrapper, a
    ``RePhraseQueryRetriever``) was read as a multi-query retriever: ``defend()`` returned all
    it kept of the widened pool, twice the retriever's own k."""
    from langchain_classic.retrievers import RePhraseQueryRetriever

    store = InMemoryVectorStore.from_texts(
        [f"The Pacific is the largest ocean, note {i}" for i in range(12)], Words()
    )

    class Logged(BaseRetriever):
        retriever: BaseRetriever

        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            return self.retriever.invoke(query, {"callbacks": run_manager.get_child()})

    rephrased = RePhraseQueryRetriever(
        retriever=store.as_retriever(), llm_chain=RunnableLambda(lambda q: q)
    )
    for wrapper in (Logged(retriever=store.as_retriever()), rephrased):
        assert len(wrapper.invoke("largest ocean")) == 4
        assert len(defend(wrapper).invoke("largest ocean")) == 4


def test_retrievers_sized_by_top_k_are_widened() -> None:
    """A retriever holding its size in ``top_k`` (Kendra, Pinecone hybrid search) or
    ``top_k_results`` (Wikipedia, arXiv) was never widened, ``fetch_k`` was ignored, and the
    warning advised a larger ``fetch_k``: the defense judged the retriever's 3 documents."""
    store = InMemoryVectorStore.from_texts(
        [f"The Pacific is the largest ocean, note {i}" for i in range(12)], Words()
    )
    asked: list[int] = []

    class TopK(BaseRetriever):
        top_k: int = 3

        def size(self) -> int:
            return self.top_k

        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            asked.append(self.size())
            return store.similarity_search(query, k=self.size())

    class TopKResults(TopK):
        top_k: int = 0  # not a size: the next field is
        top_k_results: int = 3

        def size(self) -> int:
            return self.top_k_results

    for retriever in (TopK(), TopKResults()):
        asked.clear()
        assert len(defend(retriever).invoke("largest ocean")) <= 3
        assert asked == [8] and retriever.size() == 3  # the pool, from a copy; its own 3 kept
        asked.clear()
        defend(retriever, fetch_k=10).invoke("largest ocean")
        assert asked == [10]


def test_a_compressor_called_in_a_run_reports_to_it() -> None:
    """Called without ``callbacks=`` inside a traced run (a ``RunnableLambda``), a compressor
    sent no removal event at all."""
    planted = [Document("the capital of Australia is Sydney says the planted text")] * 5
    honest = [
        "Canberra is the capital of Australia",
        "Canberra was chosen in 1908",
        "The Australian parliament sits in Canberra",
        "Melbourne was the first capital",
    ]
    docs = planted + [Document(t) for t in honest]
    compressor = DefenseCompressor(defense="strict")
    step = RunnableLambda(lambda q: compressor.compress_documents(docs, q))
    seen = _Events()
    kept = step.invoke("capital of Australia", {"callbacks": [seen]})
    assert seen.events == [("ragdefense_removed", len(docs) - len(kept))] and kept
    assert compressor.compress_documents(docs, "capital of Australia")  # no run: no event


def test_documents_sharing_an_id_get_only_their_own_stored_vector() -> None:
    store = InMemoryVectorStore(Words())
    store.add_documents([Document("The Pacific is the largest ocean on Earth.", id="0")])
    mine = store.get_by_ids(["0"])[0]
    other = Document("Bananas are a yellow fruit grown in the tropics.", id="0")  # another store's
    held = np.asarray(store.store["0"]["vector"])
    for docs, own in (([mine, other], 0), ([other, mine], 1)):
        vectors = stored_vectors(store, docs)
        assert np.array_equal(np.asarray(vectors[own]), held) and vectors[1 - own] is None


def test_the_red_team_reports_the_chains_own_error() -> None:
    store = InMemoryVectorStore.from_texts(
        [f"The Pacific is the largest ocean ({i})" for i in range(8)], Words()
    )
    target = AttackTarget("What is the largest ocean?", "Atlantic", "Pacific")
    calls: list[str] = []

    def unparsable(x: Any) -> Any:  # no annotation: its input schema says no type
        calls.append(type(x).__name__)
        if isinstance(x, str):
            raise ValueError("could not parse the model's output")
        return x.lower()  # a string-only chain given a mapping

    with pytest.raises(ValueError, match="could not parse") as raised:
        red_team(store, [target], chain=lambda r: RunnableLambda(unparsable))
    assert isinstance(raised.value.__context__, AttributeError) and calls == ["str", "dict"]

    def typed(x: str) -> str:  # a string chain: asked once, as a string
        calls.append(type(x).__name__)
        raise ValueError("provider refused the request")

    calls.clear()
    with pytest.raises(ValueError, match="provider refused"):
        red_team(store, [target], chain=lambda r: RunnableLambda(typed))
    assert calls == ["str"]


def test_a_k_asked_per_call_is_fetched_for(toy_embedder: Any) -> None:
    store = InMemoryVectorStore(Words())
    store.add_texts(["capital of France planted"] * 6)
    store.add_texts([f"capital of France is Paris, honest note {i} of many" for i in range(14)])
    drop = _Keep(drop="planted")
    base = store.as_retriever()
    assert len(drop.compress_documents(base.invoke("capital of France", k=8), "")) < 4
    assert len(defend(base, drop, k=4).invoke("capital of France")) == 4
    assert len(defend(base, drop).invoke("capital of France", k=4)) == 4
    assert len(asyncio.run(defend(base, drop).ainvoke("capital of France", k=4))) == 4


class _Counted(Words):
    """:class:`Words` recording the texts it embeds as documents."""

    def __init__(self) -> None:
        self.embedded: list[str] = []

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.embedded.extend(texts)
        return super().embed_documents(texts)


_OCEAN = [f"The Pacific is the largest ocean on Earth, note {i}" for i in range(10)]


@pytest.mark.parametrize("wrapped", [False, True])  # the object itself, or in a quarantine
@pytest.mark.parametrize("dim", [128, 256])  # another size than the store's, and the same size
def test_a_defense_object_with_its_own_model_embeds_the_documents_itself(
    dim: int, wrapped: bool
) -> None:
    """The store's vectors are its model's: a defense object embedding with another model
    (``embedder=``, a quarantine's inner defense's) embeds the retrieved documents with it,
    the query's space."""
    from ragdefense import CallableEmbedder, Consensus, Quarantine

    store = InMemoryVectorStore.from_texts(_OCEAN, Words())
    seen: list[str] = []

    def mine(texts: list[str]) -> np.ndarray:
        seen.extend(texts)
        return bag_of_words(texts, dim)[:, ::-1]  # another space

    defense: Any = Consensus(embedder=CallableEmbedder(mine))
    if wrapped:
        defense = Quarantine(defense, frozenset(), frozenset(), {})
    got = defend(store.as_retriever(), defense).invoke("ocean")
    assert got and {d.page_content for d in got} <= set(seen)


def test_the_stores_own_model_reuses_its_vectors() -> None:
    """A defense embedding with the store's model, by name or as an object's ``embedder``,
    reads the vectors the store holds instead of embedding the documents again."""
    from ragdefense import Consensus

    model = _Counted()
    store = InMemoryVectorStore.from_texts(_OCEAN, model)
    for defense in ("consensus", Consensus(embedder=model)):
        model.embedded.clear()
        assert defend(store.as_retriever(), defense).invoke("ocean")
        assert not set(model.embedded) & set(_OCEAN)  # the query only
    # a compressor built by hand, by name without embeddings (None: the store's model)
    compressor = DefenseCompressor(defense="consensus", vectorstore=store)
    model.embedded.clear()
    assert compressor.compress_documents(store.similarity_search("ocean", k=8), "ocean")
    assert not set(model.embedded) & set(_OCEAN)


def test_a_default_defense_object_on_another_models_store_embeds_the_text(minilm: Any) -> None:
    """A defense object on the packaged model (no ``embedder=``) over a store of another
    model embeds the retrieved texts itself, as the object alone would, instead of failing
    every query on the store's vectors; over a store of the packaged model it reads them."""
    from langchain_ragdefense import RagdefenseEmbeddings
    from ragdefense import Consensus

    store = InMemoryVectorStore.from_texts(_OCEAN, Words())
    compressor = defend(store.as_retriever(), Consensus()).compressor
    assert not compressor._store_space()
    assert defend(store.as_retriever(), Consensus()).invoke("ocean")
    packaged = InMemoryVectorStore.from_texts(_OCEAN, RagdefenseEmbeddings())
    assert defend(packaged.as_retriever(), Consensus()).compressor._store_space()


def test_embeddings_beside_a_defense_object_are_refused() -> None:
    """A defense object embeds with its own ``embedder``: ``embeddings=`` beside it would be
    dropped without a word, so it is an error, in ``defend`` and on a compressor alike."""
    from ragdefense import Consensus

    store = InMemoryVectorStore.from_texts(_OCEAN, Words())
    with pytest.raises(TypeError, match="a defense object comes configured"):
        defend(store.as_retriever(), Consensus(), embeddings=Words())
    with pytest.raises(TypeError, match="give it embedder="):
        DefenseCompressor(defense=Consensus(), embeddings=Words())
    assert defend(store.as_retriever(), "consensus", embeddings=Words())  # by name: its model


class _Asked(InMemoryVectorStore):
    """Records the ``k`` each similarity search is asked for."""

    def __init__(self, embedding: Embeddings) -> None:
        super().__init__(embedding)
        self.asked: list[int] = []

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        self.asked.append(k)
        return super().similarity_search(query, k, **kwargs)


def test_a_retriever_set_to_fetch_more_is_not_narrowed() -> None:
    """The pool is at least what the base retriever returns by default (the defense judges
    what it would have returned), unless ``fetch_k`` is given."""
    store = _Asked(Words())
    store.add_texts([f"The Pacific is the largest ocean, note {i}" for i in range(30)])
    wide = store.as_retriever(search_kwargs={"k": 20})
    for defended, asked in (
        (defend(wide, "consensus", k=3), 20),
        (defend(wide, _Keep(), k=3), 20),
        (defend(wide, "consensus", k=3, fetch_k=5), 5),
        (defend(store.as_retriever(), "consensus", k=3), 8),
    ):
        store.asked.clear()
        assert len(defended.invoke("ocean")) <= 3
        assert store.asked[0] == asked
    store.asked.clear()
    defend(wide, "consensus").invoke("ocean", k=3)  # a k asked per call
    assert store.asked[0] == 20


def test_a_reranker_set_to_rerank_more_candidates_still_does() -> None:
    """A compression pipeline whose base fetches 20 for a reranker keeping 3: the defense's
    pool is sized by the 3, and the base is still asked for its 20 (the reranker reranks what
    it would have), never narrowed to the pool."""
    from langchain_classic.retrievers import ContextualCompressionRetriever

    from tests.test_langchain import _TopN

    store = _Asked(Words())
    store.add_texts([f"The Pacific is the largest ocean, note {i}" for i in range(30)])
    base = store.as_retriever(search_kwargs={"k": 20})
    piped = ContextualCompressionRetriever(base_compressor=_TopN(top_n=3), base_retriever=base)
    defended = defend(piped, "consensus")
    assert defended._plan({})[0] == 3  # the reranker's top_n, read per call
    assert len(defended.invoke("ocean")) <= 3
    assert store.asked == [20]
    store.asked.clear()
    defend(piped, "consensus", k=12).invoke("ocean")  # a pool above the base's own k
    assert store.asked[0] == 24


class _Counting(BaseRetriever):
    """Returns its documents whatever it is asked for, counting the calls."""

    docs: list[Document]
    calls: int = 0

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        self.calls += 1
        return list(self.docs)


def test_a_retriever_ignoring_the_size_asked_is_asked_again_once() -> None:
    """Where the defense keeps fewer than ``k`` and the retriever gives no more when asked for
    more (it takes no ``k``), widening stops at the round that shows it: asked twice, not
    once per round allowed, sync and async alike."""
    docs = [Document(f"The Pacific is the largest ocean, note {i}") for i in range(6)]
    for run in ("sync", "async"):
        retriever = _Counting(docs=docs)
        defended = defend(retriever, _Keep(drop="note 1"), k=6)
        asked = defended.ainvoke("ocean") if run == "async" else None
        got = asyncio.run(asked) if asked else defended.invoke("ocean")
        assert len(got) == 5 and retriever.calls == 2


class _Deep(BaseRetriever):
    """Searches ``search_kwargs["k"]`` candidates and returns those a filter lets through:
    none among the first 16, so asking for 8 and for 16 gives the same (nothing), and 32
    gives more."""

    search_kwargs: dict[str, Any] = Field(default_factory=lambda: {"k": 4})
    asked: list[int] = Field(default_factory=list)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        k = self.search_kwargs["k"]
        self.asked.append(k)
        return [Document(f"The Pacific, tenant note {i}") for i in range(20, 30) if i < k]


def test_a_retriever_asked_for_more_is_asked_again_though_two_rounds_gave_alike() -> None:
    """Widening stops on "no more than the round before" only for a retriever called as it
    is (it may ignore the size): one whose setting was raised (a filter over its candidates,
    a parent-document retriever) can give nothing twice and more the third time."""
    base = _Deep()
    assert len(defend(base, _Keep(), k=4).invoke("ocean")) == 4
    assert base.asked == [8, 16, 32]  # its copies share the record (a shallow copy)
    assert base.search_kwargs == {"k": 4}  # the caller's retriever is not changed


def test_a_filtered_faiss_store_gives_the_defense_every_match() -> None:
    """FAISS with a filter filters its candidates after the search: a small index is searched
    whole, so one tenant's every document reaches the defense in the first round, and a store
    that gives fewer than asked after its filter is asked again (not taken as exhausted)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.vectorstores import FAISS

    topics = ["ocean tides", "mountain rivers", "desert winds", "forest birds"]
    docs = [
        Document(f"{topic} note {i} {topics[(t + i) % 4]}", metadata={"tenant": f"t{t}"})
        for t, topic in enumerate(topics)
        for i in range(24)
    ]
    store = FAISS.from_documents(docs, Words())
    retriever = store.as_retriever(search_kwargs={"filter": {"tenant": "t1"}})
    seen: list[int] = []
    keep = _Keep()

    class Counting(_Keep):
        def compress_documents(
            self, documents: Sequence[Document], query: str, callbacks: Any = None
        ) -> Sequence[Document]:
            seen.append(len(documents))
            return keep.compress_documents(documents, query)

    with warnings.catch_warnings(record=True):
        out = defend(retriever, Counting(), k=4).invoke("desert winds")
    assert seen == [8] and len(out) == 4  # the pool asked for, of t1's documents only
    assert all(d.metadata["tenant"] == "t1" for d in out)


def test_documents_without_ids_ask_the_store_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """A parent-document retriever's documents carry no id: no vector is read for them, and no
    warning blames the store (which would also hide a real failure later)."""
    from ragdefense.integration.vectors import stored_vectors as read

    def lookup(store: Any, ids: list[str]) -> Any:
        raise AssertionError("the store is never asked for no ids")

    with caplog.at_level("WARNING", logger="ragdefense"):
        assert read(object(), [None, None], lookup) == [None, None]
    assert not caplog.records


def test_a_subclassed_store_is_read_as_its_base() -> None:
    """A user's subclass of Chroma or FAISS holds the same vectors: read as its base's."""
    import warnings

    from langchain_chroma import Chroma

    from langchain_ragdefense.vectors import store_kind

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.vectorstores import FAISS

    class MyChroma(Chroma):
        pass

    class MyFAISS(FAISS):
        pass

    assert store_kind(MyChroma(embedding_function=Words())) == "chroma"
    assert store_kind(MyFAISS.from_texts(["a b"], Words())) == "faiss"


def test_the_first_fetch_is_capped_at_what_a_defense_compares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(review) Later rounds were capped at ``MAX_PASSAGES``, the first was not: a retriever
    asking for more than half of it failed closed where the undefended one worked."""
    from ragdefense import types

    monkeypatch.setattr(types, "MAX_PASSAGES", 10)
    store = _Asked(Words())
    store.add_texts([f"The Pacific is the largest ocean, note {i}" for i in range(30)])
    defend(store.as_retriever(search_kwargs={"k": 6}), "consensus").invoke("ocean")
    assert store.asked[0] == 10


def test_settings_given_are_kept_and_checked_as_defend_checks_them() -> None:
    """(review) A ``max_rounds`` set was raised to three rounds by a ``k`` given per call;
    ``DefendedRetriever(k=True)`` was read as ``k=1`` (``defend(k=True)`` refuses it); a query
    that is not a string failed inside the store's model (``unhashable type: 'list'``)."""
    from pydantic import ValidationError

    from langchain_ragdefense import DefendedRetriever
    from langchain_ragdefense.compressors import ConsensusCompressor
    from ragdefense import QueryInputError

    store = _Asked(Words())
    store.add_texts([f"The Pacific is the largest ocean, note {i}" for i in range(30)])
    compressor = ConsensusCompressor(embeddings=Words())
    once = DefendedRetriever(
        base_retriever=store.as_retriever(), compressor=compressor, k=6, fetch_k=6, max_rounds=1
    )
    once.invoke("ocean", k=6)
    assert store.asked == [6]  # one round, as set
    for field in ("k", "fetch_k", "max_rounds"):
        with pytest.raises(ValidationError):
            DefendedRetriever(
                base_retriever=store.as_retriever(), compressor=compressor, **{field: True}
            )
    for query in (123, ["ocean"]):
        with pytest.raises(QueryInputError, match="query must be str"):
            defend(store.as_retriever()).invoke(query)  # type: ignore[arg-type]


def test_a_configurable_retriever_in_an_ensemble_counts_toward_its_size() -> None:
    """(review) An ensemble's size left out a child that is a configurable retriever: the
    defended ensemble returned the other child's k (3) where the undefended one returned 7."""
    from langchain_classic.retrievers import EnsembleRetriever

    from langchain_ragdefense._nesting import _retriever_k

    store = InMemoryVectorStore.from_texts([f"budget note {i}" for i in range(20)], Words())
    tuned = store.as_retriever().configurable_fields(search_kwargs=ConfigurableField(id="sk"))
    other = store.as_retriever(search_kwargs={"k": 3})
    ensemble = EnsembleRetriever(retrievers=[tuned, other], weights=[0.5, 0.5])
    assert _retriever_k(ensemble) == 7
    assert len(defend(ensemble, _Keep()).invoke("budget")) > 3


def test_a_custom_defense_returning_its_kept_documents_fails_closed_by_name() -> None:
    """A user's defense object returning the passages it keeps (not a DefenseResult) failed
    inside the adapter's conversion with an AttributeError far from its cause."""

    class KeptOnly:
        name, pool_factor, min_pool, min_passages = "kept-only", 1, 0, 0

        def defend(self, query: str, passages: Any) -> Any:
            return list(passages)[:1]

    docs = [Document("a"), Document("b")]
    with pytest.raises(DefenseFailed, match=r"kept-only\.defend returned list, not a Defense"):
        DefenseCompressor(defense=KeptOnly()).compress_documents(docs, "q")


def test_async_compression_copies_the_documents_off_the_event_loop() -> None:
    """``acompress_documents`` made the copies of the documents it passes on (their metadata
    deep-copied: a layout, a vector) on the event loop, stalling every other request."""
    import threading

    from ragdefense import Verdict

    copied_in: list[str] = []

    class Recorded:
        def __deepcopy__(self, memo: Any) -> Recorded:
            copied_in.append(threading.current_thread().name)
            return Recorded()

    class KeepAll:
        name, pool_factor, min_pool, min_passages = "keep-all", 1, 0, 0

        def defend(self, query: str, passages: Any) -> Any:
            from ragdefense import DefenseResult

            verdicts = tuple(Verdict(i, p, True, 0.0, "kept") for i, p in enumerate(passages))
            return DefenseResult("keep-all", query, verdicts, "score")

    docs = [Document(f"text {i}", metadata={"layout": Recorded()}) for i in range(3)]
    out = asyncio.run(DefenseCompressor(defense=KeepAll()).acompress_documents(docs, "q?"))
    assert len(out) == 3 and len(copied_in) == 3
    assert threading.main_thread().name not in copied_in


class Hosted(Embeddings):
    """A hosted model: native async calls, counted apart from the sync ones."""

    def __init__(self) -> None:
        self.sync_calls = self.async_calls = 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.sync_calls += 1
        return bag_of_words(texts).tolist()  # type: ignore[no-any-return]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        self.async_calls += 1
        return bag_of_words(texts).tolist()  # type: ignore[no-any-return]

    async def aembed_query(self, text: str) -> list[float]:
        return (await self.aembed_documents([text]))[0]


def test_async_compression_embeds_through_a_hosted_models_own_async_api() -> None:
    """``acompress_documents`` embedded through the model's sync API from a worker thread of
    the event loop's shared pool: with a hosted model, requests in flight were capped at the
    pool's few threads. A model with an async API of its own is asked through it."""
    from ragdefense.data import demo_documents

    docs = [Document(t) for t, m in demo_documents() if not m["poison"]][:12]
    query = "What is the largest ocean on Earth?"
    hosted = Hosted()
    compressor = DefenseCompressor(embeddings=hosted)
    out = asyncio.run(compressor.acompress_documents(docs, query))
    assert hosted.sync_calls == 0 and hosted.async_calls == 2  # the passages, the query
    same = DefenseCompressor(embeddings=Hosted()).compress_documents(docs, query)
    assert [d.page_content for d in out] == [d.page_content for d in same]
    assert [d.metadata for d in out] == [d.metadata for d in same]
    asyncio.run(compressor.acompress_documents(docs, query))
    assert hosted.async_calls == 2  # remembered, as the sync path's embeddings are

    class Down(Hosted):
        async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
            raise ConnectionError("async endpoint down")

    down = Down()  # a failure is left to the defense's own calls, and its fail_open
    kept = asyncio.run(DefenseCompressor(embeddings=down).acompress_documents(docs, query))
    assert down.sync_calls == 2 and len(kept) == len(out)
    from ragdefense import Consensus, LangChainEmbedder

    for cache_size in (0, 5):  # the vectors asked are handed on, whatever the cache keeps
        uncached = Hosted()
        own = Consensus(embedder=LangChainEmbedder(uncached, cache_size=cache_size))
        asyncio.run(DefenseCompressor(defense=own).acompress_documents(docs, query))
        assert (uncached.sync_calls, uncached.async_calls) == (0, 2)
    idle = Hosted()  # no documents, or fewer than the defense judges: no call, as when sync
    assert asyncio.run(DefenseCompressor(embeddings=idle).acompress_documents([], query)) == []
    with pytest.warns(UserWarning, match="fewer than the 3 it needs"):
        asyncio.run(DefenseCompressor(embeddings=idle).acompress_documents(docs[:2], query))
    assert idle.sync_calls == idle.async_calls == 0
    busy = Hosted()  # many requests at once on one compressor: no sync call in the threads
    shared = DefenseCompressor(embeddings=busy)

    async def many() -> None:
        questions = [f"{query} ({i})" for i in range(48)]
        await asyncio.gather(*(shared.acompress_documents(docs, q) for q in questions))

    asyncio.run(many())
    assert busy.sync_calls == 0


def test_the_packaged_embeddings_pickle_as_the_loading_processs_own() -> None:
    # a copy of the default embeddings (a pickled store, a deep-copied retriever) shares the
    # process's model and cache (it made a second model, loaded again); another embedder
    # travels with its settings
    import copy
    import pickle

    from langchain_ragdefense import RagdefenseEmbeddings
    from ragdefense.embedders import SentenceTransformerEmbedder, default_embedder

    plain = RagdefenseEmbeddings()
    assert pickle.loads(pickle.dumps(plain)).embedder is default_embedder()
    assert copy.deepcopy(plain).embedder is default_embedder()
    own = RagdefenseEmbeddings(SentenceTransformerEmbedder(batch_size=4))
    back = pickle.loads(pickle.dumps(own)).embedder
    assert back.batch_size == 4 and back is not default_embedder()


def test_an_id_no_store_holds_and_a_model_giving_the_query_another_size() -> None:
    """A document whose id is a list (LangChain checks ids only when a document is made) made
    the compressor raise outside fail-open; a model whose query vector is of another size than
    the document vectors it made is named as such, sync and async alike."""
    store = InMemoryVectorStore(Words())
    texts = [f"The Pacific is the largest ocean, report {i} on the oceans." for i in range(8)]
    store.add_texts(texts)
    docs = store.similarity_search("Which ocean is the largest?", k=8)
    docs[0].id = ["not", "an", "id"]  # type: ignore[assignment]
    kept = DefenseCompressor(vectorstore=store).compress_documents(docs, "Which ocean?")
    assert len(kept) == len(docs)

    class Sized(Words):
        def embed_query(self, text: str) -> list[float]:
            return [1.0] * 10

        async def aembed_query(self, text: str) -> list[float]:
            return self.embed_query(text)

    # a model misconfigured, no document's fault: raised past fail-open, sync and async alike,
    # naming the model (it named a fix for vectors nobody gave; async named none)
    fresh = [Document(t) for t in texts]
    compressor = DefenseCompressor(embeddings=Sized(), fail_open=True)
    why = "query embedding size 10, passages 256: the embedding model gives the query another"
    with pytest.raises(QueryInputError, match=why):
        compressor.compress_documents(fresh, "Which ocean?")
    with pytest.raises(QueryInputError, match=why):
        asyncio.run(compressor.acompress_documents(fresh, "Which ocean?"))
