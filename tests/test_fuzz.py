"""Property-based fuzzing of every public entry point (Hypothesis, bounded example counts).

Whatever the input, each entry point either answers or raises one of its documented exception
types; it never changes its inputs, never returns a passage it was not given, and RobustRAG keeps
its deadline whatever the LLM does (raise, hang, return the wrong type or a huge answer).
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragdefense import (
    GRADA,
    AutoDefense,
    CallableEmbedder,
    Consensus,
    DefenseInputError,
    Passage,
    RAGDefender,
    RobustRAG,
)
from ragdefense.llm import CallableLLM
from ragdefense.robustrag import KeywordAggregation

from .conftest import bag_of_words

FUZZ = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
EMBEDDER = CallableEmbedder(bag_of_words)
TEXT = st.text(max_size=80) | st.sampled_from(
    ["", " ", "Paris is the capital of France.", "The capital of France is Lyon.", "日本の首都"]
)


def _defenses() -> list[Any]:
    return [
        RAGDefender(embedder=EMBEDDER),
        GRADA(embedder=EMBEDDER),
        GRADA(similarity="ebd", peel=True, embedder=EMBEDDER),
        AutoDefense(embedder=EMBEDDER),
        Consensus(embedder=EMBEDDER),
    ]


DEFENSES = _defenses()


def _check_result(result: Any, given_passages: list[Passage]) -> None:
    assert len(result.verdicts) == len(given_passages)
    ids = {id(p) for p in given_passages}
    assert all(id(p) in ids for p in result.kept)  # nothing that was not an input
    assert sorted(result.kept_indices + result.removed_indices) == list(range(len(given_passages)))


@FUZZ
@given(query=TEXT, texts=st.lists(TEXT, max_size=12), which=st.integers(0, len(DEFENSES) - 1))
def test_defend_on_any_texts(query: str, texts: list[str], which: int) -> None:
    passages = [Passage(t, id=str(i)) for i, t in enumerate(texts)]
    before = copy.deepcopy(passages)
    result = DEFENSES[which].defend(query, passages)
    assert passages == before
    _check_result(result, passages)


EMBEDDINGS = st.sampled_from(["random", "nan", "zero", "wrong-dim", "ragged", "inf", "none"])


@FUZZ
@given(
    n=st.integers(0, 10),
    kind=EMBEDDINGS,
    which=st.integers(0, len(DEFENSES) - 1),
    seed=st.integers(0, 2**16),
)
def test_defend_embeddings_on_any_embeddings(n: int, kind: str, which: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    passages = [Passage(f"passage {i} about topic {i % 3}") for i in range(n)]
    emb: Any = rng.normal(size=(n, 8))
    if kind == "nan" and n:
        emb[rng.integers(n), 0] = np.nan
    elif kind == "inf" and n:
        emb[0, 0] = np.inf
    elif kind == "zero":
        emb = np.zeros((n, 8))
    elif kind == "wrong-dim":
        emb = rng.normal(size=(n + 1, 8))
    elif kind == "ragged" and n:
        emb = [list(r) for r in emb]
        emb[0] = emb[0][:3]
    elif kind == "none":
        emb = None
    given_emb = copy.deepcopy(emb)
    defense = DEFENSES[which]
    try:
        if isinstance(defense, RAGDefender):
            if emb is None:
                return
            result = defense.defend_embeddings("topic?", passages, emb)
        else:
            q = rng.normal(size=8) if emb is not None else None
            result = defense.defend_embeddings("topic?", passages, emb, q)
    except DefenseInputError:
        assert kind in ("nan", "inf", "wrong-dim", "ragged")
        return
    if isinstance(emb, np.ndarray):
        np.testing.assert_array_equal(emb, given_emb)
    _check_result(result, passages)


# ---------------------------------------------------------------- RobustRAG with a fuzzed LLM

BEHAVIOURS = st.sampled_from(["answer", "idk", "raise", "hang", "none", "dict", "bytes", "huge"])
TIMEOUT = 0.3


def _llm(behaviours: list[str]) -> CallableLLM:
    def fn(prompt: str) -> Any:
        kind = behaviours[len(prompt) % len(behaviours)]
        if kind == "raise":
            raise RuntimeError("boom")
        if kind == "hang":
            time.sleep(5)
        return {
            "answer": "Canberra",
            "idk": "I don't know",
            "none": None,
            "dict": {"text": "Canberra"},
            "bytes": b"Canberra",
            "huge": "Canberra " * 50_000,
        }.get(kind, "Canberra")

    return CallableLLM(fn, max_concurrency=8)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    behaviours=st.lists(BEHAVIOURS, min_size=1, max_size=4),
    texts=st.lists(TEXT, max_size=6),
    certify=st.sampled_from([None, 1, 2]),
    use_async=st.booleans(),
)
def test_robustrag_keeps_its_deadline_whatever_the_llm_does(
    nlp: Any, behaviours: list[str], texts: list[str], certify: int | None, use_async: bool
) -> None:
    rr = RobustRAG(
        llm=_llm(behaviours),
        aggregation=KeywordAggregation(max_certify_calls=16),
        nlp=nlp,
        timeout=TIMEOUT,
    )
    passages = list(texts)
    t0 = time.monotonic()
    if use_async:
        r = asyncio.run(rr.aanswer("capital of Australia?", passages, certify=certify))
    else:
        r = rr.answer("capital of Australia?", passages, certify=certify)
    # answer + certification each get the deadline; scheduling slack on a loaded machine
    assert time.monotonic() - t0 < 2 * TIMEOUT + 2.0
    assert passages == texts and len(r.responses) == len(texts)
    assert isinstance(r.answer, str) and len(r.answer.split()) <= rr.max_new_tokens
    assert all(x.passage.text == t for x, t in zip(r.responses, texts, strict=True))
    if certify is not None and texts:
        assert r.certificate is not None


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(0, 30_000), min_size=1, max_size=4),
    spaced=st.booleans(),
    budget=st.sampled_from([50, 400, 1500]),
)
def test_no_prompt_holds_more_of_a_passage_than_its_budget(
    nlp: Any, sizes: list[int], spaced: bool, budget: int
) -> None:
    """(#27 item 6) one huge passage cannot hold every isolated answer past the deadline: each
    passage reaches its prompt cut to ``max_passage_chars``, with or without spaces."""
    prompts: list[str] = []

    def record(prompt: str) -> str:
        prompts.append(prompt)
        return "Canberra"

    unit = "word " if spaced else "x"
    passages = [(unit * n)[:n] for n in sizes]
    rr = RobustRAG(llm=CallableLLM(record), nlp=nlp, max_passage_chars=budget)
    rr.answer("capital of Australia?", passages)
    empty = RobustRAG(llm=CallableLLM(record), nlp=nlp).isolated_prompt.format(
        context="", query="capital of Australia?"
    )
    isolated = [p for p in prompts if "capital of Australia?" in p][: len(passages)]
    assert len(isolated) == len(passages)
    assert all(len(p) <= len(empty) + budget + len(" …") for p in isolated)  # marked as cut


# ---------------------------------------------------------------- the adapters

DOC_TEXTS = st.lists(TEXT, max_size=8)


@FUZZ
@given(texts=DOC_TEXTS, query=TEXT, fail_open=st.booleans())
def test_langchain_compressor(texts: list[str], query: str, fail_open: bool) -> None:
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings

    from langchain_ragdefense import DefenseCompressor

    class Toy(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return bag_of_words(texts).tolist()

        def embed_query(self, text: str) -> list[float]:
            return bag_of_words([text])[0].tolist()

    docs = [Document(page_content=t, metadata={"i": i, "nested": [i]}) for i, t in enumerate(texts)]
    before = [d.model_copy(deep=True) for d in docs]
    for name in ("ragdefender", "grada", "auto"):
        out = DefenseCompressor(defense=name, embeddings=Toy(), fail_open=fail_open)
        kept = out.compress_documents(docs, query)
        assert docs == before
        assert {d.page_content for d in kept} <= set(texts)
        assert all("ragdefense" in d.metadata for d in kept)


@FUZZ
@given(texts=DOC_TEXTS, query=TEXT)
def test_llamaindex_postprocessor(texts: list[str], query: str) -> None:
    from llama_index.core.schema import NodeWithScore, TextNode

    from llama_index.postprocessor.ragdefense import DefensePostprocessor

    vecs = bag_of_words(texts) if texts else np.zeros((0, 1))
    nodes = [
        NodeWithScore(node=TextNode(text=t, embedding=v.tolist()), score=0.5)
        for t, v in zip(texts, vecs, strict=True)
    ]
    before = [n.model_copy(deep=True) for n in nodes]
    for name in ("ragdefender", "grada"):
        out = DefensePostprocessor(defense=name).postprocess_nodes(nodes, query_str=query)
        assert [n.node.text for n in nodes] == [n.node.text for n in before]
        assert all(n.node.metadata == {} for n in nodes)
        assert {n.node.node_id for n in out} <= {n.node.node_id for n in nodes}


# ---------------------------------------------------------------- the command line

TOKENS = st.sampled_from(
    ["demo", "bench", "attack", "suite", "grada", "ragdefender", "-k", "-m", "-n", "--limit",
     "--jobs", "--poison", "--ratios", "--n-poison", "--llm", "--defense", "0", "-1", "3",
     "1,3", "x", "", "--data", "--out", "nope"]
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(argv=st.lists(TOKENS, max_size=6))
def test_cli_parser_accepts_or_exits_2(argv: list[str]) -> None:
    from ragdefense.cli import build_parser

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 2
        return
    for name in ("k", "m", "n", "limit", "jobs", "n_poison"):
        value = getattr(args, name, None)
        assert value is None or value >= 1, (name, value)
    for name in ("poison", "ratios"):
        value = getattr(args, name, None)
        assert value is None or all(v >= 0 for v in value)


@pytest.mark.parametrize("spec", ["", "x", ":", "json:", ":loads", "json:loads.nope"])
def test_cli_resolve_never_raises_raw(spec: str) -> None:
    from ragdefense.cli import UsageError, _resolve

    with pytest.raises(UsageError):
        _resolve(spec, "--store")


# ---------------------------------------------------------------- the user's data, under faults

AUDIT_TEXTS = [
    f"Topic {i % 5} note {i}: " + " ".join(["alpha", "beta", "river"][: 1 + i % 3])
    for i in range(40)
]


@settings(max_examples=15, deadline=None)
@given(
    names=st.lists(
        st.sampled_from(["notes.md", "src/app.js", "manifest.json", "chunks.txt", "data/x.csv"]),
        min_size=1,
        max_size=4,
        unique=True,
    ),
    fresh=st.booleans(),
)
def test_an_audit_never_deletes_or_writes_foreign_files(names: list[str], fresh: bool) -> None:
    """Folders holding other files (a manifest.json of another tool among them): refused, with
    or without fresh, and every file stays as it was."""
    import tempfile
    from pathlib import Path

    from ragdefense.auditing import ListCorpus, audit

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in names:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(f'{{"owner": "someone else", "file": "{name}"}}')
        before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        with pytest.raises(ValueError, match="holds no audit"):
            audit(ListCorpus(AUDIT_TEXTS), embedder=EMBEDDER, workdir=folder, fresh=fresh)
        assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


class _Store:
    """A knowledge base as the adapters read a store: it fingerprints by size only."""

    def __init__(self, texts: list[str]) -> None:
        from ragdefense.auditing import ListCorpus

        self.inner = ListCorpus(texts)

    def fingerprint(self) -> str:
        return f"store {len(self.inner.texts)}"

    def batches(self, size: int) -> Any:
        return self.inner.batches(size)


@settings(max_examples=10, deadline=None)
@given(edits=st.lists(st.integers(0, len(AUDIT_TEXTS) - 1), max_size=3, unique=True))
def test_a_resumed_audit_refuses_any_same_size_edit(edits: list[int]) -> None:
    import tempfile

    from ragdefense.auditing import audit

    with tempfile.TemporaryDirectory() as tmp:
        audit(_Store(AUDIT_TEXTS), embedder=EMBEDDER, workdir=tmp, part_size=16)
        changed = [t + " (edited)" if i in edits else t for i, t in enumerate(AUDIT_TEXTS)]
        if edits:
            with pytest.raises(ValueError, match="knowledge base changed"):
                audit(_Store(changed), embedder=EMBEDDER, workdir=tmp, part_size=16)
        else:  # the same knowledge base resumes
            assert audit(_Store(changed), embedder=EMBEDDER, workdir=tmp, part_size=16).findings


@settings(max_examples=20, deadline=None)
@given(shallow=st.booleans(), attribute=st.sampled_from(["store", "copy"]))
def test_a_copy_sharing_storage_is_refused_before_anything_is_written(
    shallow: bool, attribute: str
) -> None:
    import copy

    from langchain_core.documents import Document
    from langchain_core.vectorstores import InMemoryVectorStore

    from langchain_ragdefense import RagdefenseEmbeddings, red_team
    from ragdefense import AttackTarget

    store = InMemoryVectorStore(RagdefenseEmbeddings(EMBEDDER))
    store.add_documents([Document(page_content=f"benign passage {i}") for i in range(6)])
    before = copy.deepcopy(store.store)

    def copier(s: Any) -> Any:
        if not shallow:
            return copy.deepcopy(s)
        if attribute == "store":  # a new object over the same dict
            other = InMemoryVectorStore(s.embedding)
            other.store = s.store
            return other
        return copy.copy(s)

    target = AttackTarget("Who wrote Hamlet?", "Marlowe")
    if shallow:
        with pytest.raises(ValueError, match="shares storage"):
            red_team(store, [target], copy_store=copier, k=2)
    else:
        red_team(store, [target], copy_store=copier, k=2)
    assert store.store == before


@settings(max_examples=20, deadline=None)
@given(failing=st.lists(st.booleans(), min_size=1, max_size=12))
def test_a_certificate_never_stands_on_failed_aggregation_calls(
    failing: list[bool], nlp: Any
) -> None:
    """Isolated calls succeed; some aggregation (keyword) calls fail: certified only when none
    of the certification calls failed."""
    import itertools

    answers = ["Canberra"] * 7 + ["Sydney"] * 2 + ["Perth"]
    pattern = itertools.cycle(failing)
    made: list[bool] = []

    def llm(prompt: str) -> str:
        if prompt.startswith("Word suggestion"):
            fail = next(pattern)
            made.append(fail)
            if fail:
                raise ConnectionError("503")
            return "Sydney" if "Sydney" in prompt else "Canberra"
        for i, a in enumerate(answers):
            if f"p{i}!" in prompt:
                return a
        return "I don't know"

    rr = RobustRAG(llm=CallableLLM(llm, max_concurrency=1), nlp=nlp)
    r = rr.answer("What is the capital of Australia?", [f"p{i}!" for i in range(10)], certify=1)
    assert r.certificate is not None
    if r.certificate.certified:
        assert not any(made[1:]), made  # the first call is the answer's own aggregation
