"""Red-teaming (`ragdefense attack`): poison planted in a copy, never in the user's store."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.runnables import RunnableLambda
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core import VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.core.schema import TextNode

from langchain_ragdefense import RagdefenseEmbeddings
from langchain_ragdefense import red_team as lc_red_team
from llama_index.postprocessor.ragdefense import RagdefenseEmbedding
from llama_index.postprocessor.ragdefense import red_team as li_red_team
from llama_index.postprocessor.ragdefense.vectors import index_nodes
from ragdefense import AttackTarget, InMemoryKnowledgeBase
from ragdefense.cli import demo_targets, main
from ragdefense.data import load_demo_kb
from ragdefense.redteam import RedTeamReport, load_targets, plant, run_red_team

KB = load_demo_kb()[:4]
BENIGN = [t for q in KB for t in q.benign]
TARGETS = [
    AttackTarget(q.question, q.incorrect_answer, q.correct_answer, tuple(q.poison)) for q in KB
]


def test_plant_writes_each_attack() -> None:
    t = AttackTarget("Who wrote Hamlet?", "Marlowe", alternatives=("Bacon",))
    assert all("Marlowe" in p and "Who wrote Hamlet?" in p for p in plant(t, "poisonedrag", 3))
    assert len(plant(t, "injection", 2)) == 2
    multi = plant(t, "multi-answer", 4)
    assert sum("Bacon" in p for p in multi) == 2 and sum("Marlowe" in p for p in multi) == 2
    with pytest.raises(ValueError, match="non-empty wrong_answer"):
        AttackTarget("q", " ")


def test_targets_are_checked_before_any_copy(minilm: Any) -> None:
    """No target, two targets of one question (the poison planted is counted per question)
    and a k below 1 are clear errors in the core and both adapters; one string as ``poison``
    is one passage's worth of letters, refused."""
    store = InMemoryVectorStore(RagdefenseEmbeddings(minilm))
    index = VectorStoreIndex([], embed_model=RagdefenseEmbedding(minilm))
    runs = [
        lambda targets, k: InMemoryKnowledgeBase(BENIGN, minilm).red_team(targets, k=k),
        lambda targets, k: lc_red_team(store, targets, k=k),
        lambda targets, k: li_red_team(index, targets, k=k),
    ]
    twice = [TARGETS[0], AttackTarget(TARGETS[0].question, "someone else")]
    for run in runs:
        with pytest.raises(ValueError, match="no targets"):
            run([], 4)
        with pytest.raises(ValueError, match="share the question"):
            run(twice, 4)
        with pytest.raises(ValueError, match="k must be a positive int"):
            run(TARGETS, 0)
    with pytest.raises(ValueError, match=r"poison must be a sequence of strings"):
        AttackTarget("q", "w", poison="one passage")  # type: ignore[arg-type]


def test_any_attacker_answer_hijacks_and_the_report_counts_what_was_planted() -> None:
    target = AttackTarget("Capital of Australia?", "Sydney", "Canberra", alternatives=("Perth",))
    planted = ["Capital of Australia? Perth.", "Capital of Australia? Sydney."]

    def pipeline(question: str) -> tuple[list[str], str]:
        return planted, "The capital of Australia is Perth."

    report = run_red_team([target], {"llm": pipeline}, {target.question: planted}, n_poison=5)
    assert report.hijack_rate("llm") == 1.0 and report.n_poison == 2
    # an alternative no planted passage states is no attacker's answer: the true answer's
    # aside ("Melbourne was the capital until 1927") hijacked nothing (an independent review)
    other = AttackTarget("Capital of Australia?", "Sydney", "Canberra", alternatives=("Melbourne",))

    def aside(question: str) -> tuple[list[str], str]:
        return planted, "Canberra (Melbourne was the capital until 1927)."

    told = run_red_team([other], {"llm": aside}, {other.question: planted})
    assert told.hijack_rate("llm") == 0.0 and told.outcomes[0].correct


def test_a_hedge_naming_the_attackers_answer_hijacks_and_an_abstention_is_no_answer() -> None:
    """Answers are read as whole words: "I don't know" names no attacker's "No", a hedge that
    names the attacker's answer still delivered it, and an abstention is never correct."""
    target = AttackTarget("Is Sydney the capital of Australia?", "No", "Yes")
    said = {"idk": "I don't know.", "hedge": "I'm not sure, but no, it is not."}
    pipelines = {name: (lambda q, a=answer: ([], a)) for name, answer in said.items()}
    report = run_red_team([target], pipelines, {target.question: []}, n_poison=5)
    assert report.hijack_rate("idk") == 0.0 and report.hijack_rate("hedge") == 1.0
    assert not any(o.correct for o in report.outcomes)


def test_a_targets_verdict_counts_its_own_poison_not_the_other_targets() -> None:
    """Passages planted for another question (a related one ranks them high) are reported
    apart: they assert that question's wrong answer, not this one's (they were counted as this
    question's poison, and made it "HIJACKED" without an answer)."""
    mona = AttackTarget("Who painted the Mona Lisa?", "Michelangelo")
    night = AttackTarget("Who painted The Starry Night?", "Claude Monet")
    poison = {t.question: plant(t, n=3) for t in (mona, night)}
    honest = "Leonardo da Vinci painted the Mona Lisa."

    def pipeline(question: str) -> tuple[list[str], None]:
        other = night if question == mona.question else mona
        return [honest, *poison[other.question], poison[question][0]], None

    report = run_red_team([mona, night], {"defended": pipeline}, poison, n_poison=3)
    assert [(o.poison_retrieved, o.other_poison) for o in report.outcomes] == [(1, 3), (1, 3)]
    assert report.hijack_rate("defended") == 0.0
    assert "ok (1/5 poison, 3 for other questions)" in report.to_table()
    assert report.to_dict()["outcomes"][0]["other_poison"] == 3


def test_the_cli_demo_targets_carry_claims_without_the_question() -> None:
    for target in demo_targets():
        assert all(not p.startswith(target.question) for p in target.poison)
        assert plant(target, "poisonedrag", 1)[0].count(target.question) == 1


def test_targets_file_errors_name_file_record_and_field(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"question": "q", "wrong_answer": "w"}, {"question": "q2"}]))
    with pytest.raises(ValueError, match=r"t.json: record 1 has no field 'wrong_answer'"):
        load_targets(path)
    path.write_text(
        json.dumps({"x": {"question": "q", "incorrect answer": "w", "adv_texts": ["a"]}})
    )
    assert load_targets(path) == [AttackTarget("q", "w", None, ("a",))]
    record = {"id": "t1", "question": "q", "wrong_answer": "w", "corect_answer": "c"}
    path.write_text(json.dumps([record]))  # the correct answer lost without a word before
    with pytest.raises(ValueError, match=r"record 0 has unknown field 'corect_answer' \(did you"):
        load_targets(path)
    record = {"question": "q", "incorrect answer": "w", "keywords": ["k"], "qid": 3}
    path.write_text(json.dumps({"question": "q", "wrong_answer": "w"}))  # one target, unlisted
    with pytest.raises(ValueError, match=r"t.json: holds one target, not a list"):
        load_targets(path)  # was "record 0 is not an object"
    path.write_text(json.dumps({"t": record}))  # a derived dataset's own fields: left alone
    assert load_targets(path) == [AttackTarget("q", "w")]
    path.write_text(json.dumps({"t": record}), encoding="utf-8-sig")  # an editor's BOM first
    assert load_targets(path) == [AttackTarget("q", "w")]
    from ragdefense.cli import _kb_texts

    path.write_text(json.dumps(["a passage"]), encoding="utf-8-sig")  # and so the --kb file
    assert _kb_texts(str(path)) == ["a passage"]


def test_core_knowledge_base_red_team(minilm: Any) -> None:
    kb = InMemoryKnowledgeBase(BENIGN, minilm)
    report = kb.red_team(TARGETS, k=5)
    assert kb.texts == BENIGN  # the copy got the poison
    assert report.pipelines == ["no defense", "consensus"]
    assert report.hijack_rate("no defense") == 1.0
    assert report.hijack_rate("consensus") < report.hijack_rate("no defense")
    assert "HIJACKED" in report.to_table() and report.to_dict()["n_poison"] == 5
    # answer-level verdicts: a scripted "LLM" that repeats the top passage
    answered = kb.red_team(TARGETS, k=5, answer=lambda q, ctx: ctx[0])
    assert all(o.answer is not None for o in answered.outcomes)
    assert answered.hijack_rate("consensus") < answered.hijack_rate("no defense")
    # a defense named as typed (case, "_") is labelled as the registry names it, and a
    # pipeline the report does not hold is an error, never a rate of 0
    typed = kb.red_team(TARGETS[:1], k=5, defense="GRADA_peel")
    assert typed.pipelines == ["no defense", "grada-peel"]
    assert typed.hijack_rate("GRADA_peel") == typed.hijack_rate("grada-peel")
    for ask in (typed.hijack_rate, typed.hijacked):
        with pytest.raises(KeyError, match="no pipeline 'grada peel' in this report"):
            ask("grada peel")
    with pytest.raises(KeyError, match="no pipeline 'consensus'"):
        RedTeamReport("corpus", 1).hijack_rate("consensus")  # an empty report: no pipeline


def test_langchain_store_is_copied_never_touched(minilm: Any) -> None:
    store = InMemoryVectorStore(RagdefenseEmbeddings(minilm))
    store.add_documents([Document(page_content=t) for t in BENIGN])
    before = dict(store.store)

    def chain(retriever: Any) -> Any:  # the user's chain: a scripted LLM repeating the top doc
        return retriever | RunnableLambda(lambda docs: docs[0].page_content)

    report = lc_red_team(store, TARGETS, k=4, chain=chain)
    assert store.store == before
    assert report.hijack_rate("no defense") >= 0.5  # the top document states the wrong answer
    assert report.hijack_rate("consensus") < report.hijack_rate("no defense")
    assert all(o.answer for o in report.outcomes)

    def keyed(retriever: Any) -> Any:  # create_retrieval_chain's shape: {"input"} -> {"answer"}
        return RunnableLambda(lambda d: {"answer": retriever.invoke(d["input"])[0].page_content})

    asked = lc_red_team(store, TARGETS[:2], k=4, chain=keyed)
    assert all(o.answer for o in asked.outcomes) and asked.hijack_rate("no defense") > 0
    with pytest.raises(ValueError, match="needs a copy"):
        lc_red_team(store, TARGETS, copy_store=lambda s: s)
    assert store.store == before


def test_langchain_red_team_reads_the_answer_key_of_a_mapping(minilm: Any) -> None:
    """RetrievalQA answers under ``result``, beside its source documents: the whole mapping,
    poison included, was read as the answer ("HIJACKED" and "correct" at once). A mapping
    without an answer key is refused."""
    store = InMemoryVectorStore(RagdefenseEmbeddings(minilm))
    store.add_documents([Document(page_content=t) for t in BENIGN])
    target = TARGETS[0]
    right = target.correct_answer

    def qa(retriever: Any) -> Any:
        return RunnableLambda(
            lambda q: {"query": q, "result": right, "source_documents": retriever.invoke(q)}
        )

    report = lc_red_team(store, [target], k=4, chain=qa)
    assert all(o.answer == right and o.correct and not o.hijacked for o in report.outcomes)
    with pytest.raises(ValueError, match=r"keys \['docs', 'q'\], none of \['answer'"):
        lc_red_team(
            store, [target], k=4, chain=lambda r: RunnableLambda(lambda q: {"q": q, "docs": []})
        )


def test_llamaindex_index_is_copied_never_touched(minilm: Any) -> None:
    embed = RagdefenseEmbedding(minilm)
    index = VectorStoreIndex([TextNode(text=t) for t in BENIGN], embed_model=embed)
    n_docs = len(index.docstore.docs)
    n_vectors = len(index.vector_store.data.embedding_dict)  # type: ignore[attr-defined]
    report = li_red_team(index, TARGETS, k=4, defense="grada")
    assert len(index.docstore.docs) == n_docs
    assert len(index.vector_store.data.embedding_dict) == n_vectors  # type: ignore[attr-defined]
    assert report.pipelines == ["no defense", "grada"]
    plain = [o for o in report.outcomes if o.pipeline == "no defense"]
    assert all(o.poison_retrieved for o in plain)  # the poison reaches every context
    # hijacked without an answer: poison is most of the context (2 of 4 is not)
    assert report.hijack_rate("no defense") == sum(o.poison_retrieved > 2 for o in plain) / 4
    assert report.hijack_rate("no defense") >= 0.75
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the pool defend() fetches: no small-pool warning
        li_red_team(index, TARGETS[:2], k=2)
    index.delete_nodes([next(iter(index.docstore.docs))])  # kept in the docstore, not retrieved
    assert len(index_nodes(index) or []) == n_vectors - 1  # the copy holds what is retrieved
    answered = li_red_team(index, TARGETS[:2], k=4, llm=MockLLM())  # echoes its prompt
    assert all(o.answer for o in answered.outcomes)
    assert answered.hijack_rate("no defense") == 1.0


def test_cli_attack_on_the_built_in_knowledge_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "reports").mkdir()
    out = tmp_path / "r.json"  # a link to the file kept elsewhere: written through, kept a link
    out.symlink_to(tmp_path / "reports" / "r.json")
    assert main(["attack", "--attack", "injection", "--n-poison", "2", "--json", str(out)]) == 0
    assert "| **hijacked** |" in capsys.readouterr().out
    assert out.is_symlink() and not list(tmp_path.glob("**/*.part"))
    report = json.loads((tmp_path / "reports" / "r.json").read_text())
    assert report["n_poison"] == 2 and len(report["outcomes"]) == 2 * len(load_demo_kb())
    assert main(["attack", "--targets", str(tmp_path / "missing.json")]) == 2


def test_llamaindex_red_team_defends_with_the_embed_model_given(minilm: Any) -> None:
    """``embed_model=`` other than the index's embeds the query and the passages for the
    defense (the store's vectors are another space): it is called, and the verdicts agree.
    The index's model is a deterministic one of its own (a constant mock made every passage
    tie, and the store broke ties by random node ids: which passages were retrieved, and so
    the comparison, changed from run to run)."""
    from .conftest import bag_of_words

    calls: list[int] = []

    class Counted(RagdefenseEmbedding):
        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            calls.append(len(texts))
            return super()._get_text_embeddings(texts)

    own = RagdefenseEmbedding(bag_of_words)
    index = VectorStoreIndex([TextNode(text=t) for t in BENIGN], embed_model=own)
    report = li_red_team(index, TARGETS[:2], k=4, embed_model=Counted(minilm))
    assert calls and report.hijack_rate("consensus") <= report.hijack_rate("no defense")


def test_langchain_red_team_defends_with_the_embeddings_given(minilm: Any) -> None:
    """``embeddings=`` (as ``defend()`` takes them, LlamaIndex's ``embed_model=``) reach the
    defended pipeline: the model is called; beside a defense object it is refused before any
    copy is made."""
    from langchain_core.embeddings import DeterministicFakeEmbedding

    from ragdefense import Consensus

    calls: list[int] = []

    class Counted(RagdefenseEmbeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            calls.append(len(texts))
            return super().embed_documents(texts)

    store = InMemoryVectorStore(embedding=DeterministicFakeEmbedding(size=384))  # not random
    store.add_documents([Document(page_content=t) for t in BENIGN])
    report = lc_red_team(store, TARGETS[:2], k=4, embeddings=Counted(minilm))
    assert calls and report.hijack_rate("consensus") <= report.hijack_rate("no defense")
    copied: list[Any] = []
    with pytest.raises(TypeError, match="embeddings: a defense object comes configured"):
        lc_red_team(store, TARGETS[:1], defense=Consensus(), embeddings=Counted(minilm),
                    copy_store=lambda s: copied.append(s) or s)  # fmt: skip
    assert not copied


# ------------------------------------------------ the copy: private, cleaned up, the one line


def _chroma_store(embeddings: Any, client: Any, name: str = "app-kb") -> Any:
    from langchain_chroma import Chroma

    docs = [Document(page_content=f"benign passage number {i}") for i in range(8)]
    return Chroma.from_documents(docs, embeddings, client=client, collection_name=name)


def _systems() -> set[str]:
    from chromadb.api.shared_system_client import SharedSystemClient

    return set(SharedSystemClient._identifier_to_system)


def test_the_chroma_copy_uses_no_process_wide_client(
    toy_embedder: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy lived in Chroma's process-wide in-memory system, which refuses a client of
    other settings: an app's ``EphemeralClient(settings=...)`` made the red team fail, and
    after a red team the app could not make one. The copy has a client of its own, released
    afterwards (no system left behind), in both adapters."""
    import chromadb
    from llama_index.core import StorageContext
    from llama_index.vector_stores.chroma import ChromaVectorStore

    target = AttackTarget("Who wrote Hamlet?", "Marlowe")
    client = chromadb.PersistentClient(path=str(tmp_path / "db"))
    store = _chroma_store(RagdefenseEmbeddings(toy_embedder), client)
    index = VectorStoreIndex(
        [TextNode(text=f"benign passage {i}") for i in range(8)],
        storage_context=StorageContext.from_defaults(
            vector_store=ChromaVectorStore(client.get_or_create_collection("app-li"))
        ),
        embed_model=RagdefenseEmbedding(toy_embedder),
    )
    before = _systems()

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("An instance of Chroma already exists for ephemeral with other settings")

    monkeypatch.setattr(chromadb, "EphemeralClient", refused)
    assert lc_red_team(store, [target], k=2).pipelines == ["no defense", "consensus"]
    assert li_red_team(index, [target], k=2).pipelines == ["no defense", "consensus"]
    assert _systems() == before
    assert sorted(c.name for c in client.list_collections()) == ["app-kb", "app-li"]


def test_a_chroma_copy_failing_midway_leaves_nothing(
    toy_embedder: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy interrupted while it is filled (an error, Ctrl-C) was left behind in the
    process-wide client, holding up to the whole store: its client and folder go too."""
    import glob
    import tempfile

    import chromadb
    from chromadb.api.models.Collection import Collection

    store = _chroma_store(RagdefenseEmbeddings(toy_embedder), chromadb.PersistentClient(
        path=str(tmp_path / "db")
    ))  # fmt: skip
    folders = set(glob.glob(f"{tempfile.gettempdir()}/ragdefense-chroma-*"))
    systems = _systems()

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Collection, "add", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lc_red_team(store, [AttackTarget("Who wrote Hamlet?", "Marlowe")], k=2)
    assert set(glob.glob(f"{tempfile.gettempdir()}/ragdefense-chroma-*")) == folders
    assert _systems() == systems


def test_the_llamaindex_copy_holds_its_own_index_only(toy_embedder: Any) -> None:
    """Indexes built over one storage context share its vector store; each searches only its
    own nodes. The copy (and the audit's reader) took every node of the store: another
    index's nodes filled the red team's contexts."""
    from llama_index.core import StorageContext

    from llama_index.postprocessor.ragdefense.vectors import IndexCorpus

    embed = RagdefenseEmbedding(toy_embedder)
    storage = StorageContext.from_defaults()
    mine = [TextNode(text=f"benign passage about topic {i}", id_=f"a{i}") for i in range(6)]
    other = [TextNode(text=f"another index's passage {i}", id_=f"b{i}") for i in range(20)]
    index = VectorStoreIndex(mine, storage_context=storage, embed_model=embed)
    VectorStoreIndex(other, storage_context=storage, embed_model=embed)
    assert sorted(n.node_id for n in index_nodes(index) or []) == [f"a{i}" for i in range(6)]
    read = [i for batch in IndexCorpus(index).batches(4) for i in batch.ids]
    assert sorted(read) == [f"a{i}" for i in range(6)]
    assert IndexCorpus(index).fingerprint().endswith(" 6")


def test_the_langchain_red_team_runs_the_one_line(toy_embedder: Any) -> None:
    """The defended pipeline fetched 2k whatever the defense; ``defend()`` fetches the
    defense's pool for the retriever's k (RAGDefender: k): the report judged another pipeline
    than the one a user deploys."""
    from langchain_ragdefense import defend

    asked: list[int] = []

    class Spy(InMemoryVectorStore):
        def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
            asked.append(k)
            return super().similarity_search(query, k, **kwargs)

    def fresh(store: Any) -> Any:  # the user's store, or an independent copy of it
        out = Spy(embedding=RagdefenseEmbeddings(toy_embedder))
        out.add_documents([Document(page_content=f"benign passage {i}") for i in range(30)])
        return out

    user = fresh(None)
    defend(user.as_retriever(search_kwargs={"k": 10}), "ragdefender").invoke("Who wrote Hamlet?")
    deployed = asked[-1]
    asked.clear()
    target = AttackTarget("Who wrote Hamlet?", "Marlowe")
    lc_red_team(user, [target], k=10, defense="ragdefender", copy_store=fresh)
    assert asked == [10, deployed]  # no defense, then the one line


def test_a_second_wrapper_of_the_users_storage_is_no_copy(toy_embedder: Any) -> None:
    """A FAISS index wrapped again (``faiss.downcast_index``) and a docstore over the user's
    key-value store were taken for copies: the poison went into the user's index (its vectors
    out of step with its id map) or docstore."""
    import warnings

    import faiss
    from llama_index.core import StorageContext
    from llama_index.core.storage.docstore import SimpleDocumentStore

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.vectorstores import FAISS
    target = AttackTarget("Who wrote Hamlet?", "Marlowe")
    docs = [Document(page_content=f"benign passage {i}") for i in range(6)]
    store = FAISS.from_documents(docs, RagdefenseEmbeddings(toy_embedder))

    def rewrapped(s: Any) -> Any:
        return FAISS(s.embedding_function, faiss.downcast_index(s.index), type(s.docstore)(
            dict(s.docstore._dict)), dict(s.index_to_docstore_id))  # fmt: skip

    with pytest.raises(ValueError, match="shares storage with yours"):
        lc_red_team(store, [target], copy_store=rewrapped)
    assert store.index.ntotal == 6
    embed = RagdefenseEmbedding(toy_embedder)
    index = VectorStoreIndex([TextNode(text=d.page_content) for d in docs], embed_model=embed)

    def same_kv(idx: Any, nodes: list[Any]) -> Any:
        kv = SimpleDocumentStore(simple_kvstore=idx.docstore._kvstore)
        return VectorStoreIndex(
            nodes, storage_context=StorageContext.from_defaults(docstore=kv), embed_model=embed
        )

    with pytest.raises(ValueError, match="shares its stores with yours"):
        li_red_team(index, [target], copy_index=same_kv)
    assert len(index.docstore.docs) == 6


def test_red_team_arguments_are_checked_before_any_copy(toy_embedder: Any) -> None:
    copied: list[Any] = []

    def copy_store(store: Any) -> Any:
        copied.append(store)
        return None

    store = InMemoryVectorStore(RagdefenseEmbeddings(toy_embedder))
    index = VectorStoreIndex([TextNode(text="a benign passage")], embed_model=RagdefenseEmbedding(
        toy_embedder))  # fmt: skip
    kb = InMemoryKnowledgeBase(["a benign passage", "another one"], toy_embedder)
    runs = [
        lambda **kw: kb.red_team(TARGETS[:1], **kw),
        lambda **kw: lc_red_team(store, TARGETS[:1], copy_store=copy_store, **kw),
        lambda **kw: li_red_team(index, TARGETS[:1], copy_index=lambda i, n: copy_store(i), **kw),
    ]
    for run in runs:
        for bad in (2.5, "3", True, 0):
            with pytest.raises(ValueError, match="n_poison must be a positive int"):
                run(n_poison=bad)
        with pytest.raises(ValueError, match="unknown defense 'consensu'"):
            run(defense="consensu")
        with pytest.raises(ValueError, match="unknown attack 'poisoned-rag'"):
            run(attack="poisoned-rag")  # LangChain's used to copy the store first
        with pytest.raises(ValueError, match="multi-answer plants several wrong answers"):
            run(attack="multi-answer")  # one target without alternatives: one answer to plant
    assert not copied
    with pytest.raises(TypeError, match="copy_store must return a LangChain VectorStore"):
        lc_red_team(store, TARGETS[:1], copy_store=copy_store)
    with pytest.raises(TypeError, match="copy_index must return a VectorStoreIndex"):
        li_red_team(index, TARGETS[:1], copy_index=lambda i, n: None)
    with pytest.raises(TypeError, match="takes a VectorStoreIndex, got NoneType"):
        li_red_team(None, TARGETS[:1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="llm must be a LlamaIndex LLM, got str"):
        li_red_team(index, TARGETS[:1], llm="gpt")  # type: ignore[arg-type]
    for fetch_k in (-1, 4):  # a pool under k: the two columns would not compare
        with pytest.raises(ValueError, match=r"fetch_k must be an int >= k \(5\)"):
            kb.red_team(TARGETS[:1], fetch_k=fetch_k, k=5)
    with pytest.raises(TypeError, match="give a list of them"):
        kb.red_team(TARGETS[0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="extra: give a list of strings"):
        kb.with_texts("one more passage")
    with pytest.raises(TypeError, match="not one string"):
        InMemoryKnowledgeBase("one passage", toy_embedder)
    with pytest.raises(TypeError, match=r"answered .* with a dict: an answer is a str"):
        kb.red_team(TARGETS[:1], answer=lambda q, ctx: {"answer": ctx[0]})  # type: ignore[misc]


def test_a_chroma_store_without_embeddings_is_refused_before_copying(tmp_path: Path) -> None:
    """Chroma without a LangChain embedding function cannot be searched by text; its copy
    tried to download Chroma's own model."""
    import chromadb
    from langchain_chroma import Chroma

    client = chromadb.PersistentClient(path=str(tmp_path / "db"))
    client.create_collection("kb-raw").add(ids=["1"], documents=["a"], embeddings=[[0.1, 0.2]])
    store = Chroma(client=client, collection_name="kb-raw")
    with pytest.raises(TypeError, match="no LangChain embedding function"):
        lc_red_team(store, TARGETS[:1])


def test_a_chroma_scratch_client_is_released_without_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where chromadb has no ``Client.close`` (older releases), each copy's system stayed in the
    process-wide table, its files open and its data in memory, until the process ended."""
    import chromadb
    from chromadb.api.client import Client

    from ragdefense.integration.vectors import chroma_scratch

    source = chromadb.EphemeralClient().get_or_create_collection("scratch-source")
    monkeypatch.delattr(Client, "close", raising=False)
    before = _systems()
    for _ in range(3):
        with chroma_scratch(source) as (_, target):
            target.add(ids=["a"], embeddings=[[0.1, 0.2]])
    assert _systems() == before


def test_red_team_refuses_a_copy_over_the_users_remote_collection(toy_embedder: Any) -> None:
    """A "copy" that is a new wrapper over the user's remote collection (one name, one client)
    was refused by LangChain's red team and written into by LlamaIndex's: both refuse it before
    writing anything, and a store on another server under the same name is no copy of it."""
    from langchain_core.vectorstores import VectorStore
    from llama_index.core import StorageContext
    from llama_index.core.vector_stores.types import (
        BasePydanticVectorStore,
        VectorStoreQueryResult,
    )
    from pydantic import PrivateAttr

    from ragdefense.integration.vectors import same_remote

    server: dict[str, list[str]] = {}  # collection name -> texts, what a database holds

    class Client:
        def __init__(self, host: str) -> None:
            self.host = host

    client = Client("db.example")

    class RemoteIndexStore(BasePydanticVectorStore):
        stores_text: bool = True
        collection_name: str
        _client: Any = PrivateAttr(default=None)

        def __init__(self, collection_name: str, client: Any) -> None:
            super().__init__(collection_name=collection_name)
            self._client = client

        @property
        def client(self) -> Any:
            return self._client

        def add(self, nodes: Any, **kwargs: Any) -> list[str]:
            server.setdefault(self.collection_name, []).extend(n.get_content() for n in nodes)
            return [n.node_id for n in nodes]

        def delete(self, ref_doc_id: str, **kwargs: Any) -> None:
            raise NotImplementedError

        def query(self, query: Any, **kwargs: Any) -> VectorStoreQueryResult:
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])

    class RemoteStore(VectorStore):
        def __init__(self, collection_name: str, client: Any) -> None:
            self.collection_name, self.client = collection_name, client

        def add_texts(self, texts: Any, metadatas: Any = None, **kwargs: Any) -> list[str]:
            server.setdefault(self.collection_name, []).extend(texts)
            return []

        def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
            return []

        @classmethod
        def from_texts(cls, texts: Any, embedding: Any, metadatas: Any = None, **kw: Any) -> Any:
            raise NotImplementedError

    target = AttackTarget("Who wrote Hamlet?", "Marlowe")
    embed = RagdefenseEmbedding(toy_embedder)
    users = StorageContext.from_defaults(vector_store=RemoteIndexStore("li-user", client))
    index = VectorStoreIndex([TextNode(text="Shakespeare wrote Hamlet.")], storage_context=users,
                             embed_model=embed)  # fmt: skip

    def reopened(idx: Any, nodes: list[Any]) -> Any:
        store = RemoteIndexStore("li-user", client)
        return VectorStoreIndex.from_vector_store(store, embed_model=embed)

    with pytest.raises(
        ValueError, match=r"the same collection_name \('li-user'\) on the same client"
    ):
        li_red_team(index, [target], copy_index=reopened)
    store = RemoteStore("lc-user", client)
    store.add_texts(["Shakespeare wrote Hamlet."])
    with pytest.raises(
        ValueError, match=r"the same collection_name \('lc-user'\) on the same client"
    ):
        lc_red_team(store, [target], copy_store=lambda s: RemoteStore("lc-user", client))
    assert server == {
        "li-user": ["Shakespeare wrote Hamlet."],
        "lc-user": ["Shakespeare wrote Hamlet."],
    }
    elsewhere = RemoteIndexStore("li-user", Client("replica.example"))
    assert same_remote(index.vector_store, elsewhere) is None
    assert same_remote(index.vector_store, RemoteIndexStore("li-user", Client("db.example")))
    unsaid = Client("")  # a client keeping its address inside: nothing tells the two apart
    assert same_remote(RemoteIndexStore("li-user", unsaid), RemoteIndexStore("li-user", Client("")))
    assert (
        same_remote(RemoteIndexStore("li-user", unsaid), RemoteIndexStore("li-other", unsaid))
        is None
    )

    class Table:  # a store holding no client, saying where its data lives
        def __init__(self, uri: str | None) -> None:
            self.table_name, self.uri = "vectors", uri

    assert same_remote(Table("/data/users"), Table("/tmp/scratch")) is None
    assert same_remote(Table("/data/users"), Table("/data/users"))
    assert same_remote(Table("/data/users"), Table("/data/users/"))  # one place, two spellings
    assert same_remote(Table("/data/users"), Table(Path("/data/./users")))  # type: ignore[arg-type]
    assert same_remote(Table("http://db:8000/"), Table("HTTP://db:8000"))
    assert same_remote(Table(None), Table(None))  # nothing tells them apart: refused


def test_multi_answer_red_team_plants_several_wrong_answers(toy_embedder: Any) -> None:
    """Targets without alternatives (as PoisonedRAG files and the demo's are) took one wrong
    answer each under ``multi-answer``, the ``poisonedrag`` attack under another name; they
    now take the other targets' wrong answers, as the benchmarks plant them."""
    from ragdefense.redteam import check_red_team

    targets = [AttackTarget(f"Who wrote play {i}?", f"Author {i}") for i in range(3)]
    given = AttackTarget("Who wrote play 9?", "Author 9", alternatives=("Someone",))
    ready = check_red_team([*targets, given], k=4, attack="multi-answer")
    assert ready[0].alternatives == ("Author 1", "Author 2", "Author 9")
    # never a target's own correct answer, nor its wrong answer written otherwise
    honest = AttackTarget("Who wrote play 5?", "Author 5", correct_answer="author 1")
    odd = AttackTarget("Who wrote play 6?", "AUTHOR 0")
    found = check_red_team([*targets, honest, odd], k=4, attack="multi-answer")
    assert found[3].alternatives == ("Author 0", "Author 2")  # "AUTHOR 0" is "Author 0"
    assert found[4].alternatives == ("Author 1", "Author 2", "Author 5")
    assert ready[3] == given  # alternatives given are kept
    assert check_red_team(targets, k=4) == targets  # other attacks plant as given
    kb = InMemoryKnowledgeBase(["a benign passage", "another one"], toy_embedder)
    report = kb.red_team(targets, attack="multi-answer", n_poison=4)
    assert report.attack == "multi-answer"
    first = plant(ready[0], "multi-answer", 4)
    assert sum("Author 0" in p for p in first) == 2 and any("Author 1" in p for p in first)


def test_red_team_inputs_fail_clearly(toy_embedder: Any) -> None:
    """A pipeline returning Documents counted no poison, and one returning a string counted it
    letter by letter; ``poison=None`` failed as "'NoneType' object is not iterable";
    ``search(q, -1)`` returned every text but the last; a bar in a question split its table
    row."""
    target = AttackTarget("Who | wrote\nHamlet?", "Marlowe", poison=None, alternatives=None)
    assert target.poison == () and target.alternatives == ()
    with pytest.raises(ValueError, match="poison must be a sequence of strings"):
        AttackTarget("Who wrote Hamlet?", "Marlowe", poison=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="correct_answer must be a string or None, got int"):
        AttackTarget("Who wrote Hamlet?", "Marlowe", correct_answer=7)  # type: ignore[arg-type]
    poison = {target.question: plant(target, n=2)}
    for context in ([Document(page_content=poison[target.question][0])], "some text"):
        with pytest.raises(TypeError, match=r"returned a context of \w+: it must return"):
            run_red_team([target], {"mine": lambda q, c=context: (c, None)}, poison)
    report = run_red_team([target], {"mine": lambda q: (poison[q], None)}, poison)
    row = report.to_table().splitlines()[2]
    assert row.startswith("| Who \\| wrote Hamlet? | HIJACKED") and row.count(" | ") == 1
    kb = InMemoryKnowledgeBase(["one", "two", "three"], toy_embedder)
    with pytest.raises(ValueError, match="k must be a positive int, got -1"):
        kb.search("one", -1)


# ------------------------------------------------ from an independent review of the red team


def test_an_injected_instruction_hijacks_alone_without_an_answer() -> None:
    """Without an answer, a planted passage must be most of the context to count, but one copy
    of an injected instruction is enough for an LLM that obeys it: one in four is a hijack
    under ``injection``, not under ``poisonedrag``."""
    target = TARGETS[0]
    planted = plant(target, "injection", 3)
    context = [planted[0], *BENIGN[:3]]
    for attack, expected in (("injection", True), ("poisonedrag", False)):
        report = run_red_team(
            [target], {"p": lambda q: (context, None)}, {target.question: planted}, attack
        )
        assert report.outcomes[0].hijacked is expected


def test_red_team_takes_the_named_defenses_parameters(
    minilm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline a user deploys (``defend(retriever, support=False)``) is the one red-teamed:
    its parameters reach it, a misspelled one is refused before any copy, and beside a
    defense object they are an error; a retriever given for the store names what to pass."""
    from ragdefense import Consensus

    store = InMemoryVectorStore(RagdefenseEmbeddings(minilm))
    store.add_documents([Document(page_content=t) for t in BENIGN])
    index = VectorStoreIndex(
        [TextNode(text=t) for t in BENIGN], embed_model=RagdefenseEmbedding(minilm)
    )
    copied: list[Any] = []

    def copier(s: Any) -> Any:
        copied.append(s)
        return s

    for run in (
        lambda **kw: lc_red_team(store, TARGETS[:1], k=4, copy_store=copier, **kw),
        lambda **kw: li_red_team(index, TARGETS[:1], k=4, copy_index=copier, **kw),
    ):
        with pytest.raises(TypeError, match="no parameter 'suport'"):
            run(suport=False)
        with pytest.raises(TypeError, match="support: parameters are for a defense given by"):
            run(defense=Consensus(), support=False)
    assert not copied
    import langchain_ragdefense.redteam as lc_module
    import llama_index.postprocessor.ragdefense.redteam as li_module

    asked: list[tuple[Any, ...]] = []
    for module in (lc_module, li_module):
        real = module.defend

        def spy(*a: Any, _real: Any = real, **kw: Any) -> Any:
            asked.append((*a, kw))
            return _real(*a, **kw)

        monkeypatch.setattr(module, "defend", spy)
    lc_red_team(store, TARGETS[:2], k=4, support=False, quotes=False)
    li_red_team(index, TARGETS[:2], support=False)
    assert {"support": False, "quotes": False}.items() <= asked[0][-1].items()
    assert asked[-1][1].params == {"support": False}  # the postprocessor defend() is given
    with pytest.raises(TypeError, match=r"pass retriever\.vectorstore"):
        lc_red_team(store.as_retriever(), TARGETS[:1])  # type: ignore[arg-type]


def test_llamaindex_red_team_judges_llamaindex_s_own_context(minilm: Any) -> None:
    """By default the context is LlamaIndex's ``similarity_top_k`` (2): what ``defend(index)``
    hands the generator."""
    index = VectorStoreIndex(
        [TextNode(text=t) for t in BENIGN], embed_model=RagdefenseEmbedding(minilm)
    )
    report = li_red_team(index, TARGETS[:2])
    assert {o.retrieved for o in report.outcomes if o.pipeline == "no defense"} == {2}


def test_a_shallow_copy_of_the_default_store_s_data_is_refused(minilm: Any) -> None:
    """A ``copy_index`` whose store shares the user's vector dicts (a shallow copy of its
    data) would write the poison into the user's store: refused, nothing written."""
    import copy

    from llama_index.core import StorageContext
    from llama_index.core.vector_stores import SimpleVectorStore

    index = VectorStoreIndex(
        [TextNode(text=t) for t in BENIGN], embed_model=RagdefenseEmbedding(minilm)
    )
    held = dict(index.vector_store.data.embedding_dict)  # type: ignore[attr-defined]

    def shallow(ix: Any, nodes: Any) -> Any:
        store = SimpleVectorStore(data=copy.copy(ix.vector_store.data))
        storage = StorageContext.from_defaults(vector_store=store)
        return VectorStoreIndex([], storage_context=storage, embed_model=ix._embed_model)

    with pytest.raises(ValueError, match="the same vector data"):
        li_red_team(index, TARGETS[:1], copy_index=shallow)
    assert index.vector_store.data.embedding_dict == held  # type: ignore[attr-defined]


def test_a_compressor_s_column_is_named_by_its_defense(minilm: Any) -> None:
    """A compressor given as ``defense`` (what ``defend()`` accepts) names its column by the
    defense it holds, so ``hijacked("grada")`` finds it (the column read ``DefenseCompressor``)."""
    from langchain_ragdefense import DefenseCompressor

    store = InMemoryVectorStore(RagdefenseEmbeddings(minilm))
    store.add_documents([Document(page_content=t) for t in BENIGN])
    compressor = DefenseCompressor(defense="grada", embeddings=RagdefenseEmbeddings(minilm))
    report = lc_red_team(store, TARGETS[:1], k=4, defense=compressor)
    assert report.pipelines == ["no defense", "grada"]
    assert report.hijacked("grada") == report.hijacked("GRADA")


def test_llamaindex_red_team_takes_a_postprocessor_as_defend_does(minilm: Any) -> None:
    """A configured postprocessor (what ``defend(index, post)`` takes) is red-teamed as it is,
    its column named by its defense (it was refused: "is not a defense")."""
    from llama_index.postprocessor.ragdefense import DefensePostprocessor

    embed = RagdefenseEmbedding(minilm)
    index = VectorStoreIndex([TextNode(text=t) for t in BENIGN], embed_model=embed)
    post = DefensePostprocessor(defense="grada", embed_model=embed)
    report = li_red_team(index, TARGETS[:1], k=4, defense=post)
    assert report.pipelines == ["no defense", "grada"]


def test_alternatives_that_repeat_an_answer_are_refused_and_spellings_merged() -> None:
    """An alternative equal to the correct answer was planted and counted as a hijack when the
    model answered the truth; one repeating the wrong answer turned ``multi-answer`` into a
    one-answer attack without a word."""
    with pytest.raises(ValueError, match="'Shakespeare' is the correct one"):
        AttackTarget("Who wrote Hamlet?", "Marlowe", "Shakespeare", alternatives=("Shakespeare",))
    with pytest.raises(ValueError, match="'MARLOWE' is the wrong answer"):
        AttackTarget("Who wrote Hamlet?", "Marlowe", alternatives=("Bacon", "MARLOWE"))
    with pytest.raises(ValueError, match="the wrong answer is the correct one"):
        AttackTarget("Who wrote Hamlet?", "Shakespeare", "shakespeare")
    merged = AttackTarget("Q?", "Marlowe", alternatives=("Bacon", "Kyd", "bacon", "Ford"))
    assert merged.alternatives == ("Bacon", "Kyd", "Ford")  # in order, as first written


def test_cli_attack_refuses_empty_flags_and_reads_the_kb_before_the_llm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--targets ""`` and ``--kb ""`` fell back to the demo's without a word; a bad ``--kb``
    failed only after the ``--llm`` module was imported (a model loading on import)."""
    for flag in ("--targets", "--kb"):
        assert main(["attack", flag, ""]) == 2
        assert f"{flag} is empty" in capsys.readouterr().err
    import ragdefense.cli as cli

    loaded: list[str] = []
    monkeypatch.setattr(cli, "_llm", lambda spec: loaded.append(spec))
    assert main(["attack", "--kb", str(tmp_path / "nope.json"), "--llm", "slow:llm"]) == 2
    assert "cannot read" in capsys.readouterr().err and loaded == []


def test_a_wrong_answer_inside_the_right_one_is_no_hijack_when_the_right_one_is_given() -> None:
    """The wrong answer "Virginia" is words of the right one, "West Virginia"."""
    target = AttackTarget("Which state is Charleston, WV in?", "Virginia", "West Virginia")
    said = {"right": "Charleston is in West Virginia.", "wrong": "It is in Virginia, I think."}
    said["both"] = "Virginia, not West Virginia."
    pipelines = {name: (lambda q, a=a: ([], a)) for name, a in said.items()}
    report = run_red_team(iter([target]), pipelines, {target.question: []})
    assert report.pipelines == ["right", "wrong", "both"]  # an iterator serves every pipeline
    assert [report.hijack_rate(p) for p in report.pipelines] == [0, 1, 1]
    assert [o.correct for o in report.outcomes] == [True, False, True]
    flipped = AttackTarget("Which state is Charleston, WV in?", "West Virginia", "Virginia")
    told = run_red_team([flipped], {"llm": lambda q: ([], "West Virginia")}, {flipped.question: []})
    assert told.hijack_rate("llm") == 1 and told.outcomes[0].correct is False


def test_a_reasoning_models_thinking_is_no_answer(toy_embedder: Any) -> None:
    """A message whose content holds a thinking block beside its text was read as the list's
    string, poison weighed in the thinking included: every pipeline counted hijacked. An
    answer key holding None is no answer (it was the answer "None")."""
    from langchain_core.messages import AIMessage

    store = InMemoryVectorStore(RagdefenseEmbeddings(toy_embedder))
    store.add_documents([Document(page_content=t) for t in BENIGN])
    target = TARGETS[0]
    thinking = {"type": "thinking", "thinking": f"One passage claims {target.wrong_answer}."}
    said = AIMessage(content=[thinking, {"type": "text", "text": target.correct_answer}])
    report = lc_red_team(store, [target], k=4, chain=lambda r: RunnableLambda(lambda q: said))
    assert all(o.answer == target.correct_answer and not o.hijacked for o in report.outcomes)
    none = lc_red_team(
        store, [target], k=4, chain=lambda r: RunnableLambda(lambda q: {"answer": None})
    )
    assert all(o.answer is None and o.correct is None for o in none.outcomes)


def test_the_context_is_what_the_chains_own_retrieval_returned(toy_embedder: Any) -> None:
    """The poison was counted from a retrieval of the question made beside the chain: a chain
    asking its retriever something else (a rewritten query) saw another context, and the
    defense ran twice per question."""
    store = InMemoryVectorStore(RagdefenseEmbeddings(toy_embedder))
    store.add_documents([Document(page_content=t) for t in BENIGN])
    target, other = TARGETS[0], TARGETS[1]
    asked: list[str] = []

    def rewriting(retriever: Any) -> Any:
        def answer(question: str) -> str:
            asked.append(question)
            return " ".join(d.page_content for d in retriever.invoke(other.question))

        return RunnableLambda(answer)

    report = lc_red_team(store, [target], k=4, chain=rewriting, defense="strict")
    assert len(asked) == 2  # one call per pipeline, no retrieval beside it
    plain = next(o for o in report.outcomes if o.pipeline == "no defense")
    expected = store.as_retriever(search_kwargs={"k": 4}).invoke(other.question)
    assert plain.retrieved == 4 and plain.poison_retrieved == 0  # the other question's context
    assert plain.other_poison == 0 and all(d.page_content in BENIGN for d in expected)


def test_only_the_outermost_retriever_runs_are_the_chains_context() -> None:
    """A retriever run two levels inside the chain's own (a defended retriever's fetch under a
    query rewriter) was counted: its parent, itself inside, was not an outermost run."""
    from uuid import uuid4

    from langchain_ragdefense.redteam import _Retrieved

    seen = _Retrieved()
    outer, middle, inner = uuid4(), uuid4(), uuid4()
    seen.on_retriever_start({}, "q", run_id=outer, parent_run_id=uuid4())  # under the chain
    seen.on_retriever_start({}, "q", run_id=middle, parent_run_id=outer)
    seen.on_retriever_start({}, "q", run_id=inner, parent_run_id=middle)
    pool = [Document(page_content=f"p{i}") for i in range(8)]
    kept = pool[:2]
    seen.on_retriever_end(pool, run_id=inner)
    seen.on_retriever_end(pool[:4], run_id=middle)
    seen.on_retriever_end(kept, run_id=outer)
    assert seen.documents == kept
