"""``ragdefense.audit``: a whole knowledge base audited for planted poison, in process and on a
local Ray instance, resumable, read from files and from real stores, never written to."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import random
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ragdefense
from ragdefense import CallableEmbedder, Passage, Quarantine
from ragdefense.auditing import (
    AuditSettings,
    FileCorpus,
    ListCorpus,
    Scoring,
    audit,
    derive_probes,
    read_queries,
)
from ragdefense.auditing.engines import RayEngine
from ragdefense.auditing.evidence import isolation
from ragdefense.auditing.report import BLANK
from ragdefense.auditing.steps import EmbedStep
from ragdefense.cli import main
from ragdefense.data import load_demo_kb
from tests.conftest import bag_of_words

TOPICS = [
    "volcano lava eruption magma crater",
    "football match goal stadium league",
    "piano concert orchestra symphony violin",
    "rainforest jungle canopy species parrot",
    "satellite orbit rocket launch station",
    "bakery bread flour oven yeast",
    "glacier ice melting arctic snow",
    "election ballot vote candidate parliament",
]
WORDS = [
    "alpha", "beta", "gamma", "delta", "river", "stone",
    "market", "garden", "window", "paper", "story", "light",
]  # fmt: skip


def toy_corpus(seed: int = 0) -> tuple[list[str], list[str], set[str]]:
    """Benign chunks spread over topics (graded neighbourhoods) and two planted groups of five
    near-duplicates written for one question each."""
    rng = random.Random(seed)
    texts, ids = [], []
    for t, topic in enumerate(TOPICS):
        for i in range(12):
            words = topic.split()
            text = " ".join(rng.sample(words, 3) + rng.sample(WORDS, 6) + rng.sample(words, 2))
            texts.append(f"Topic {t} note {i}. {text}")
            ids.append(f"b{t}-{i}")
    planted = set()
    for g, claim in enumerate(["zorblax invented the quantum toaster", "the moon is made of qux"]):
        for j in range(5):
            filler = " ".join(rng.sample(WORDS, 2))
            texts.append(f"Who made the quantum toaster question {g}? {claim} {filler}.")
            ids.append(f"p{g}-{j}")
            planted.add(f"p{g}-{j}")
    return texts, ids, planted


@pytest.fixture
def toy() -> CallableEmbedder:
    return CallableEmbedder(bag_of_words)


def test_a_planted_set_larger_than_the_neighbour_list_is_found(tmp_path: Path) -> None:
    """Twenty near-copies fill each other's whole ten-neighbour list: no gap there, so the
    isolation over ten neighbours misses them all; over forty it sees the set apart from the
    graded neighbourhood of the benign chunks, and the report says so."""
    rng = np.random.default_rng(0)
    benign = rng.normal(size=(400, 16))
    centre = rng.normal(size=16)
    planted = centre + 0.15 * rng.normal(size=(20, 16))
    vectors = np.vstack([benign, planted]).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    texts = [f"benign chunk {i} about things" for i in range(400)]
    texts += [f"the planted claim, copy {i}" for i in range(20)]
    ids = [f"b{i}" for i in range(400)] + [f"p{i}" for i in range(20)]

    def embed(batch: list[str]) -> np.ndarray:  # the probes: anywhere in the space
        return np.vstack([np.random.default_rng(len(t)).normal(size=16) for t in batch])

    corpus = ListCorpus(texts, ids, None, vectors)
    narrow = audit(corpus, embedder=embed, wide_neighbours=0, workdir=tmp_path / "n")
    wide = audit(corpus, embedder=embed, workdir=tmp_path / "w")
    assert not {f.id for f in narrow.suspicious} & {f"p{i}" for i in range(20)}
    found = {f.id for f in wide.suspicious}
    assert {f"p{i}" for i in range(20)} <= found and len(found - set(ids[400:])) <= 4
    assert any("wide isolation" in r for r in wide.findings[0].reasons)


def test_a_lone_passage_written_for_a_logged_question_is_found_with_the_query_log(
    tmp_path: Path,
) -> None:
    """One planted passage, no near-copy: isolation cannot see it. With the query log it is
    closer to a logged question than to any chunk of the knowledge base (targeting); the
    benign chunks that question retrieves are closer to other chunks than to it."""
    rng = np.random.default_rng(1)
    benign = rng.normal(size=(400, 16))
    question = "Who invented the quantum toaster?"
    asked = rng.normal(size=16)
    planted = asked + 0.1 * rng.normal(size=16)
    vectors = np.vstack([benign, planted]).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    texts = [f"Benign chunk {i} about things." for i in range(400)]
    texts.append("Zorblax invented the quantum toaster in 1802.")
    ids = [f"b{i}" for i in range(400)] + ["planted"]

    def embed(batch: list[str]) -> np.ndarray:  # the question where it was asked
        return np.vstack(
            [
                asked if t == question else np.random.default_rng(len(t)).normal(size=16)
                for t in batch
            ]
        )

    corpus = ListCorpus(texts, ids, None, vectors)
    derived = audit(corpus, embedder=embed, workdir=tmp_path / "d")
    logged = audit(corpus, embedder=embed, queries=[question], workdir=tmp_path / "q")
    assert "planted" not in {f.id for f in derived.suspicious}
    assert {f.id for f in logged.suspicious} == {"planted"}
    why = " ".join(logged.findings[0].reasons)
    assert "targeting" in why and repr(question) in why
    assert (logged.stats["targeted"], derived.stats["targeted"]) == (1, 0)


def test_targeting_alone_never_condemns_a_source(tmp_path: Path) -> None:
    """An honest FAQ site whose pages each answer one logged question: every page is targeted
    (the one answer ranks top for its question, as a planted passage would), and stays a lone
    suspect left to the defense; its source is not condemned for it, so a quarantine built
    from the report holds none of them (it held every true answer)."""
    rng = np.random.default_rng(2)
    benign = rng.normal(size=(400, 16))
    asked = rng.normal(size=(4, 16))
    faq = asked + 0.1 * rng.normal(size=(4, 16))
    vectors = np.vstack([benign, faq]).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    questions = [f"What does the library do about thing {i}?" for i in range(4)]
    texts = [f"Benign chunk {i} about things." for i in range(400)]
    texts += [f"The library answer about thing {i}." for i in range(4)]
    ids = [f"b{i}" for i in range(400)] + [f"faq-{i}" for i in range(4)]
    meta = [{"source": f"https://site-{i % 40}.example/{i}"} for i in range(400)]
    meta += [{"source": f"https://library.example/faq/{i}"} for i in range(4)]
    vector = dict(zip(texts, vectors, strict=True)) | dict(zip(questions, asked, strict=True))

    def embed(batch: list[str]) -> np.ndarray:  # the stored vectors' model, questions included
        rows = [vector.get(t, np.random.default_rng(len(t)).normal(size=16)) for t in batch]
        return np.vstack(rows)

    corpus = ListCorpus(texts, ids, None, vectors, meta)
    report = audit(corpus, embedder=embed, queries=questions, workdir=tmp_path / "w")
    assert report.stats["targeted"] == 4
    assert {f.id for f in report.suspicious} == {f"faq-{i}" for i in range(4)}
    assert report.stats["suspect_sources"] == []
    assert not Quarantine.from_report(report).ids


def test_a_chunk_with_no_other_chunk_is_not_targeted(toy: CallableEmbedder, tmp_path: Path) -> None:
    """Closer to the question than to any other chunk is empty when there is none."""
    report = audit(
        ["Canberra is the capital of Australia."],
        embedder=toy,
        queries=["What is the capital of Australia?"],
        workdir=tmp_path / "w",
    )
    assert report.stats["targeted"] == 0 and not report.suspicious


def test_a_lone_suspect_next_to_a_planted_looking_group_is_shown_as_its_possible_victim() -> None:
    """(#30) the honest passage a planted set targets sits right next to it and is flagged with
    it; the report says so instead of listing it as one more planted chunk."""
    from ragdefense.auditing.evidence import Evidence
    from ragdefense.auditing.victims import targeted

    group_of = np.array([0, 0, 0, -1, -1, -1, 1, 1])
    near = np.array([[1, 2], [0, 2], [0, 1], [0, 5], [5, -1], [0, 3], [7, 4], [6, 4]])
    evidence = Evidence(
        np.zeros(8), {}, np.zeros(8), group_of, [{"id": "g0"}, {"id": "g1"}], None, near
    )
    suspicious = np.array([True, True, True, True, True, False, False, False])
    # 3: next to g0, all suspicious; 4: next to no group; 5: not suspicious; g1: not suspicious
    assert targeted(evidence, suspicious) == {3: "g0"}
    assert (
        targeted(Evidence(np.zeros(8), {}, np.zeros(8), group_of, [], None, None), suspicious) == {}
    )


def test_the_honest_passage_inside_a_planted_group_is_named_its_victim(tmp_path: Path) -> None:
    """A planted set copies the subject of the passage it contradicts, which joins the set's
    near-duplicate group without its wording: the report names that member as the passage the
    group may target (its verdict stays: a planted set of varied wording has members that look
    the same way); a set with no such member has none named."""
    rng = np.random.default_rng(1)
    centre, other = rng.normal(size=(2, 16))
    honest = centre + 0.45 * np.linalg.norm(centre) * _orthogonal(rng, centre)
    vectors = np.vstack(
        [
            rng.normal(size=(400, 16)),
            centre + 0.1 * rng.normal(size=(4, 16)),  # planted, with the honest one
            honest[None, :],
            other + 0.1 * rng.normal(size=(4, 16)),  # planted, alone
        ]
    ).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = [f"b{i}" for i in range(400)] + [f"p{i}" for i in range(4)] + ["truth"]
    ids += [f"q{i}" for i in range(4)]
    corpus = ListCorpus([f"a stored chunk {i}" for i in ids], ids, None, vectors)

    def embed(batch: list[str]) -> np.ndarray:
        return np.vstack([np.random.default_rng(len(t)).normal(size=16) for t in batch])

    report = audit(corpus, embedder=embed, workdir=tmp_path / "a")
    flagged = {f.id for f in report.suspicious}
    assert {f"p{i}" for i in range(4)} | {f"q{i}" for i in range(4)} | {"truth"} <= flagged
    named = [f.id for f in report.findings if any("stands apart" in r for r in f.reasons)]
    assert named == ["truth"] and report.stats["possible_victims"] == 1
    truth = next(f for f in report.suspicious if f.id == "truth")
    assert truth.group is not None and any("check it before removing" in r for r in truth.reasons)
    off = audit(corpus, embedder=embed, workdir=tmp_path / "b", scoring=Scoring(apart=0))
    assert "truth" in {f.id for f in off.suspicious} and off.stats["possible_victims"] == 0


def test_the_member_named_apart_is_a_suspect_the_others_agree_with_least(tmp_path: Path) -> None:
    """On fixed vectors in two parts: in a group of four, three agree (cosine 1 among them) and
    the fourth sits at 0.8 to each: it is named with those means; not when it is no suspect,
    nor in a group most of which is not suspicious, nor below the bar."""
    from ragdefense.auditing.evidence import Evidence
    from ragdefense.auditing.victims import apart_in_groups
    from ragdefense.auditing.workdir import Workdir

    a, b = np.eye(3)[0], np.eye(3)[1]
    apart = 0.8 * a + 0.6 * b  # cosine 0.8 to a
    vectors = np.array([b, a, a, a, apart, b])  # positions 1-4: the group; 0 and 5 outside
    wd = Workdir(tmp_path)
    wd.write_json("manifest.json", {"part_sizes": [3, 3]})
    wd.write_array("chunks/00000.npy", vectors[:3])
    wd.write_array("chunks/00001.npy", vectors[3:])
    group_of = np.array([-1, 0, 0, 0, 0, -1])
    evidence = Evidence(np.zeros(6), {}, np.zeros(6), group_of, [{"id": "g0"}], None, None)
    every = np.array([False, True, True, True, True, False])
    found = apart_in_groups(wd, evidence, every, 0.05)
    assert list(found) == [4] and found[4][0] == "g0"
    assert found[4][1:] == pytest.approx((0.8, 1.0))
    assert apart_in_groups(wd, evidence, every, 0.25) == {}  # 0.2 apart: below the bar
    not_it = every.copy()
    not_it[4] = False
    assert apart_in_groups(wd, evidence, not_it, 0.05) == {}  # a label for suspects only
    few = np.array([False, False, False, False, True, False])
    assert apart_in_groups(wd, evidence, few, 0.05) == {}  # less than half the group is suspicious


def _orthogonal(rng: np.random.Generator, v: np.ndarray) -> np.ndarray:
    """A random unit vector orthogonal to ``v``."""
    u = rng.normal(size=v.shape)
    u -= (u @ v) / (v @ v) * v
    out: np.ndarray = u / np.linalg.norm(u)
    return out


def test_the_defenses_flags_on_logged_questions_count_by_default_gated() -> None:
    """With a query log, a chunk the defense removed on the logged questions that retrieved it
    is suspicious (by default), if its own score reaches ``flag_gate``; derived probes and
    ``flag_threshold=0`` give the flags no weight."""
    from ragdefense.auditing.evidence import Evidence, reasons, score

    def evidence(logged: bool) -> Evidence:
        return Evidence(
            retrieved=np.array([2, 2, 2, 0]), flagged={"consensus": np.array([2, 2, 0, 0])},
            isolated=np.array([0.2, 0.05, 0.2, 0.0]), group_of=np.full(4, -1), groups=[],
            nearest=np.full(4, 0.9), closest_query=np.full(4, 0.5) if logged else None,
        )  # fmt: skip

    asked = Scoring(wide_threshold=0)  # the default: flag_threshold=0.5, flag_gate=0.1
    assert (asked.flag_threshold, asked.flag_gate) == (0.5, 0.1)
    flags_weigh = 2 * asked.threshold  # all removals, at twice the rate that counts
    assert score(evidence(True), "consensus", asked).tolist() == pytest.approx(
        [flags_weigh, 0.05, 0.2, 0]
    )
    assert score(evidence(False), "consensus", asked).tolist() == pytest.approx([0.2, 0.05, 0.2, 0])
    off = Scoring(wide_threshold=0, flag_threshold=0)
    assert score(evidence(True), "consensus", off).tolist() == pytest.approx([0.2, 0.05, 0.2, 0])
    why = reasons(0, evidence(True), "consensus", asked)
    assert any("removed it on 2 of the 2 logged questions that retrieved it, 2 with a set" in r
               for r in why)  # fmt: skip
    # removals by the lone-passage veto alone are no evidence of a set
    lone = evidence(True)
    lone.with_set = {"consensus": np.array([0, 2, 0, 0])}
    assert score(lone, "consensus", asked).tolist() == pytest.approx([0.2, 0.05, 0.2, 0])
    assert any("0 with a set" in r for r in reasons(0, lone, "consensus", asked))


def test_the_lone_removal_prefix_is_consensus_own() -> None:
    """The audit tells Consensus's unsupported veto from its set evidence by the reason's
    start: pinned here, so a reworded reason cannot quietly make every flag count."""
    from ragdefense import Consensus, Passage
    from ragdefense.auditing.records import LONE_REMOVAL

    rng = np.random.default_rng(11)
    unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
    topic = unit(rng.normal(size=32))
    q = unit(topic + 0.4 * unit(rng.normal(size=32)))
    emb = np.vstack([unit(topic + 0.7 * unit(rng.normal(size=(9, 32)))), unit(q + 0.05 * topic)])
    texts = [f"the topic passage number {i} on the subject" for i in range(9)]
    passages = [Passage(t) for t in [*texts, "who won the match? the visitors won the match"]]
    result = Consensus().defend_embeddings("who won the match?", passages, emb, q)
    assert result.verdicts[9].reason.startswith(LONE_REMOVAL)
    assert not any(v.reason.startswith(LONE_REMOVAL) for v in result.verdicts if v.kept)


def test_a_knowledge_base_ingested_twice_flags_no_more_honest_texts(
    minilm: Any, tmp_path: Path
) -> None:
    """Every honest chunk stored twice (a knowledge base ingested again under new ids): a
    chunk's one copy is no near-duplicate, so no more honest texts are flagged than with one
    ingestion, and every planted set is still found."""
    from ragdefense.data import demo_documents

    docs = demo_documents()
    planted = {t for t, meta in docs if meta["poison"]}
    once = [t for t, _ in docs]
    found = {}
    for name, kb in (("once", once), ("twice", once + [t for t in once if t not in planted])):
        report = audit(ListCorpus(kb, [f"c{i}" for i in range(len(kb))]), workdir=tmp_path / name)
        found[name] = {kb[int(f.id[1:])] for f in report.suspicious}
    assert found["twice"] & planted == found["once"] & planted == planted
    assert len(found["twice"] - planted) <= len(found["once"] - planted)


def test_a_knowledge_base_ingested_three_times_flags_no_more_honest_texts(
    minilm: Any, tmp_path: Path
) -> None:
    """Every text stored three times (the honest ones and the planted): each text's copies, as
    many as the knowledge base stores of its texts as a rule, are one chunk, so the audit
    flags no more honest texts than in one ingestion (it flagged every text) and most planted
    sets still (other texts' copies crowd the neighbour lists, and each list is a neighbour
    short: read as one, not as a neighbour at cosine 0, which lifted every chunk's isolation);
    five more copies of one planted text are a set."""
    from ragdefense.data import demo_documents

    once = [t for t, _ in demo_documents()]
    planted = {t for t, meta in demo_documents() if meta["poison"]}
    extra = "Which ocean is the largest? The Atlantic Ocean is the largest ocean on Earth."
    found = {}
    for name, kb in (("once", once), ("thrice", once * 3 + [extra] * 5)):
        report = audit(ListCorpus(kb, [f"c{i}" for i in range(len(kb))]), workdir=tmp_path / name)
        found[name] = {kb[int(f.id[1:])] for f in report.suspicious}
    assert len(found["thrice"] - planted - {extra}) <= len(found["once"] - planted)
    assert len(found["thrice"] & planted) >= 0.8 * len(planted) and planted <= found["once"]
    assert extra in found["thrice"]


def test_the_copy_rule_is_read_over_the_whole_knowledge_base_one_vote_per_text(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Copies stored first (an attacker's, or one document repeated) set no rule for the
    rest: the rule is read from parts spread over the knowledge base, one vote per text, and a
    family of eight copies planted at its end is still a group."""
    from ragdefense.auditing import copies

    monkeypatch.setattr(copies, "SAMPLE", 32)
    words = [f"w{i}" for i in range(400)]
    distinct = [" ".join(random.Random(i).sample(words, 6)) for i in range(120)]
    front = [f"front topic {i} repeated text here" for i in range(4) for _ in range(10)]
    planted = ["the planted answer is atlantis for this question"] * 8
    kb = [*front, *distinct, *planted]
    embedder = CallableEmbedder(bag_of_words)
    report = audit(ListCorpus(kb, [f"c{i}" for i in range(len(kb))]), embedder=embedder,
                   workdir=tmp_path / "w", part_size=16)  # fmt: skip
    groups = {f.id: f.group for f in report.findings}
    last = [f"c{i}" for i in range(len(kb) - 8, len(kb))]
    assert all(groups.get(i) and groups[i]["size"] == 8 for i in last)


def test_two_texts_under_one_vector_are_no_copies(tmp_path: Path) -> None:
    """An embedder reads a window of each text: a chunk that appends a claim past the window of
    an honest one has its vector, but is another text, so the pair stays a near-duplicate group
    (only one text stored twice is one chunk)."""
    texts, ids, _ = toy_corpus()
    honest = texts[5]
    window = CallableEmbedder(lambda ts: bag_of_words([t[:40] for t in ts]))
    kb = [*texts, honest + " but the answer is really Atlantis"]
    assert len(honest) > 40
    report = audit(ListCorpus(kb, [*ids, "planted"]), embedder=window, workdir=tmp_path / "w")
    groups = {f.id: f.group for f in report.findings}
    assert groups.get("planted") and groups["planted"]["size"] >= 2
    assert groups.get(ids[5]) == groups["planted"]


def test_isolation_of_a_tight_small_group() -> None:
    flat = np.full((1, 10), 0.5)
    group = np.array([[0.95, 0.94, 0.93, 0.93, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3]])
    pair = np.array([[0.99, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3]])
    assert isolation(flat, 3)[0] == pytest.approx(0.0)
    assert isolation(group, 3)[0] == pytest.approx(np.mean([0.95, 0.94, 0.93, 0.93]) - 0.3)
    assert isolation(pair, 3)[0] < isolation(pair, 2)[0]  # a pair is no group of three
    assert isolation(np.zeros((0, 10)), 3).shape == (0,)
    assert isolation(np.zeros((2, 0)), 3).tolist() == [0.0, 0.0]  # no neighbour list at all


def test_isolation_reads_padding_as_no_neighbour() -> None:
    """Fewer neighbours than the list holds (a small knowledge base, or one stored several
    times, its copies dropped): the padding read as cosine 0 made one topic a set far from
    the rest."""
    row = np.array([[0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0, 0, 0]])
    assert isolation(row, 3, np.array([7]))[0] == pytest.approx(0.0)
    assert isolation(row, 3)[0] == pytest.approx(0.7)  # the list read as full
    group = np.array([[0.95, 0.94, 0.93, 0.3, 0.3, 0, 0]])
    assert isolation(group, 3, np.array([5]))[0] == pytest.approx(0.94 - 0.3)
    assert isolation(group, 3, np.array([2]))[0] == 0.0  # too few to tell


def test_a_small_single_topic_knowledge_base_is_not_suspicious(tmp_path: Path) -> None:
    vectors = np.random.default_rng(0).normal(size=(8, 32)) * 0.4 + 1.0
    texts = [f"Our product manual, section {i}, explains setting {i}." for i in range(8)]
    ids = [f"c{i}" for i in range(8)]

    def embed(batch: list[str]) -> np.ndarray:  # the probes
        return np.vstack([np.random.default_rng(len(t)).normal(size=32) for t in batch])

    corpus = ListCorpus(texts, ids, None, vectors.astype(np.float32))
    report = audit(corpus, embedder=embed, workdir=tmp_path / "w")
    assert report.stats["suspicious"] == 0


def test_probes_from_titles_and_first_sentences() -> None:
    chunks = [
        ("1", "Paris is the capital of France. It is large.", ""),
        ("2", "ignored text", "Eiffel Tower history"),
        ("3", "Too short. x", ""),
        ("4", "paris is the capital of FRANCE. Again.", ""),
        ("5", "Jane Austen wrote Pride and Prejudice in 1813. More.", "Jane Austen"),
    ]
    probes = derive_probes(chunks)
    assert probes == [
        ("Paris is the capital of France.", "1"),
        ("Eiffel Tower history", "2"),
        ("Jane Austen wrote Pride and Prejudice in 1813.", "5"),  # a name is no question
    ]
    assert len(derive_probes(chunks * 3, max_probes=1)) == 1


def test_a_probe_sample_is_drawn_in_bounded_memory() -> None:
    """Every distinct probe was held before ``max_probes`` sampled them (hundreds of bytes
    per chunk: tens of GB on the driver at 100M chunks). The sample is seeded, a subset of
    every probe in corpus order, each with the first chunk that has it."""
    import tracemalloc

    def chunks(n: int) -> Any:
        for i in range(n):
            yield str(i), f"Question number {i % (n // 2)} about a topic. More.", ""

    every = derive_probes(chunks(2_000))
    assert len(every) == 1_000
    sample = derive_probes(chunks(2_000), max_probes=50)
    assert len(sample) == 50 and sample == [p for p in every if p in sample]
    assert sample == derive_probes(chunks(2_000), max_probes=50)
    assert sample != derive_probes(chunks(2_000), max_probes=50, seed=1)
    tracemalloc.start()
    derive_probes(chunks(200_000), max_probes=100)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2_000_000  # bytes: the sample, not the corpus


def test_audit_ranks_the_planted_groups_first_and_explains(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    texts, ids, planted = toy_corpus()
    given = list(texts)
    report = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w")
    assert texts == given  # the caller's data untouched
    top = {f.id for f in report.top(len(planted))}
    assert top == planted
    assert {f.id for f in report.suspicious} >= planted
    first = report.findings[0]
    assert first.reasons[0].startswith("isolation") and first.group and first.group["size"] == 5
    assert first.retrieved > 0 and "consensus" in first.flagged
    assert report.stats["chunks"] == len(texts) and report.stats["probes"] > 0
    written = report.write(tmp_path / "out", ["md", "json", "csv", "parquet", "png"])
    assert [p.name for p in written] == [
        "report.md", "report.json", "report.csv", "report.parquet", "report.png"
    ]  # fmt: skip
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["findings"][0]["id"] == first.id
    assert "| 1 |" in (tmp_path / "out" / "report.md").read_text()


def test_report_write_checks_every_format_before_writing_any(
    toy: CallableEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing pyarrow or an unknown format is refused before a file is written (it was
    found after md / json / csv were, as a bare ModuleNotFoundError); one name is one format."""
    texts, ids, _ = toy_corpus()
    report = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w")
    with pytest.raises(ValueError, match="unknown report format 'pdf'"):
        report.write(tmp_path / "a", ["md", "pdf"])
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"parquet needs pyarrow: pip install 'ragdefense\[audit"):
        report.write(tmp_path / "b", ["md", "json", "parquet"])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert [p.name for p in report.write(tmp_path / "c", "md")] == ["report.md"]
    # a file where the folder goes, no format, a negative count: named (were a bare
    # FileExistsError, "'NoneType' object is not iterable", and a slice from the end)
    (tmp_path / "file").write_text("mine")
    with pytest.raises(ValueError, match="is a file: reports are written into a folder"):
        report.write(tmp_path / "file")
    with pytest.raises(TypeError, match="formats must be a format's name or a list"):
        report.write(tmp_path / "d", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n must be an int >= 0 or None"):
        report.top(-1)
    with pytest.raises(ValueError, match="top must be an int >= 0 or None"):
        report.to_markdown(top=-1)
    with pytest.raises(TypeError, match="top must be an int >= 0 or None"):
        report.to_markdown(top=2.0)  # type: ignore[arg-type]
    assert len(report.top(2)) == 2 and (tmp_path / "file").read_text() == "mine"
    assert report.top(None) == report.findings and "| 1 |" in report.to_markdown(top=None)


def test_hnsw_index_and_numpy_fallback_agree_on_the_top(
    toy: CallableEmbedder, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    texts, ids, planted = toy_corpus()
    hnsw = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "h", index="hnsw")
    request.getfixturevalue("no_faiss")  # from here on
    exact = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "n")
    assert hnsw.stats["index"] == "hnsw"
    for report in (hnsw, exact):
        assert {f.id for f in report.top(len(planted))} == planted


def test_a_shard_index_built_block_by_block_holds_every_vector_once(
    toy: CallableEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAISS receives a shard's parts a few at a time and keeps the only copy: the neighbours
    equal exact numpy search over the whole shard."""
    from ragdefense.auditing import steps
    from ragdefense.auditing.workdir import Workdir, part_name

    pytest.importorskip("faiss")
    texts, ids, _ = toy_corpus()
    monkeypatch.setattr(steps, "_ADD_BLOCK", 40)  # parts of 16: blocks of 3 parts, and a rest
    audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", index="flat", part_size=16)
    wd = Workdir(tmp_path / "w")
    sizes = wd.noted("part_sizes")
    shard = steps.ShardIndex(wd, range(len(sizes)), sizes, "flat")
    assert shard.faiss.ntotal == len(texts) == shard.size and len(shard.vectors) == 0
    every = np.concatenate([wd.read_array(f"{part_name('chunks', p)}.npy") for p in range(3)])
    sims, positions = shard.search(every, 5)
    exact = np.sort(every @ np.concatenate(
        [wd.read_array(f"{part_name('chunks', p)}.npy") for p in range(len(sizes))]
    ).T, axis=1)[:, ::-1][:, :5]  # fmt: skip
    np.testing.assert_allclose(sims, exact, atol=1e-5)
    assert positions.min() >= 0 and positions.max() < len(texts)


def test_a_search_killed_on_one_shard_resumes_with_its_shards_whatever_the_workers(
    toy: CallableEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started on two workers (two shards), killed while searching the second shard, resumed in
    this process (one worker): the two shards are kept, the first is not searched again, the
    killed shard's index is not left in memory, and the report is an uninterrupted one's."""
    from ragdefense.auditing import steps
    from ragdefense.auditing.engines import LocalEngine

    class TwoWorkers(LocalEngine):
        workers = 2

    texts, ids, _ = toy_corpus()
    whole = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "a", part_size=16)
    searched: list[int] = []
    original = steps.SearchStep.batch
    killed: list[bool] = []

    def dies_on_shard_1(self: steps.SearchStep, parts: list[int]) -> int:
        if self.shard == 1 and 2 in parts and not killed:
            killed.append(True)
            raise KeyboardInterrupt
        searched.append(self.shard)
        return original(self, parts)

    monkeypatch.setattr(steps.SearchStep, "batch", dies_on_shard_1)
    with pytest.raises(KeyboardInterrupt):
        audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", part_size=16,
              engine=TwoWorkers())  # fmt: skip
    assert not [k for k in steps._CACHE if k[0] == "shard"]  # freed on the way out
    searched.clear()
    again = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", part_size=16)
    assert again.stats["shards"] == 2 and set(searched) == {1}
    assert [(f.id, round(f.score, 5)) for f in again.findings] == [
        (f.id, round(f.score, 5)) for f in whole.findings
    ]


def test_a_killed_audit_resumes_without_recomputing(toy: CallableEmbedder, tmp_path: Path) -> None:
    texts, ids, _ = toy_corpus()
    calls = {"n": 0}

    def counting(batch: list[str]) -> np.ndarray:
        calls["n"] += len(batch)
        return bag_of_words(batch)

    embedder = CallableEmbedder(counting)
    original = EmbedStep.__call__

    def dies_on_probes(self: EmbedStep, part: int) -> int:
        if self.kind == "probes":
            raise KeyboardInterrupt  # killed after the chunks were embedded
        return original(self, part)

    work = tmp_path / "w"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(EmbedStep, "__call__", dies_on_probes)
        with pytest.raises(KeyboardInterrupt):
            audit(ListCorpus(texts, ids), embedder=embedder, workdir=work, part_size=32)
    mark = 2  # the text that tells the model apart on resume, as a passage and as a query
    # (each embedded once: both are cached)
    assert calls["n"] == len(texts) + mark
    resumed = audit(ListCorpus(texts, ids), embedder=embedder, workdir=work, part_size=32)
    assert calls["n"] - len(texts) - mark == resumed.stats["probes"]  # the probes, no chunk
    again = audit(ListCorpus(texts, ids), embedder=embedder, workdir=work, part_size=32)
    assert calls["n"] - len(texts) - mark == resumed.stats["probes"]  # nothing at all
    clean = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "c", part_size=32)
    assert [(f.id, round(f.score, 6)) for f in again.findings] == [
        (f.id, round(f.score, 6)) for f in clean.findings
    ]
    with pytest.raises(ValueError, match=r"other parameters \(top_m\).*fresh"):
        audit(ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32, top_m=5)
    fresh = audit(
        ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32, top_m=5, fresh=True
    )
    assert fresh.stats["top_m"] == 5
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for clear in (False, True):  # a folder of the user's is never cleared, nor written to
        with pytest.raises(ValueError, match="not empty and holds no audit"):
            audit(ListCorpus(texts, ids), embedder=toy, workdir=mine, fresh=clear)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_a_resume_is_refused_for_another_query_log_model_or_defense(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    """The manifest records what the query log, the embedding model and each defense's
    settings are, not only how many or of which type: anything else would hand back the old
    report."""
    from ragdefense import Consensus

    texts, ids, _ = toy_corpus()
    kb, work = ListCorpus(texts, ids), tmp_path / "w"
    log = ["who made the quantum toaster?", "what is the moon made of?"]
    audit(kb, embedder=toy, workdir=work, part_size=32, queries=log)
    audit(kb, embedder=CallableEmbedder(bag_of_words), workdir=work, part_size=32, queries=log)
    with pytest.raises(ValueError, match=r"other parameters \(queries\)"):
        audit(kb, embedder=toy, workdir=work, part_size=32, queries=log[::-1])
    shifted = CallableEmbedder(lambda batch: np.roll(bag_of_words(batch), 1, axis=1))
    with pytest.raises(ValueError, match=r"other parameters \(embedder\)"):
        audit(kb, embedder=shifted, workdir=work, part_size=32, queries=log)
    other = tmp_path / "d"
    audit(kb, defenses=[Consensus(tightness=0.9)], embedder=toy, workdir=other, part_size=32)
    audit(kb, defenses=[Consensus(tightness=0.9)], embedder=toy, workdir=other, part_size=32)
    with pytest.raises(ValueError, match=r"other parameters \(defenses\)"):
        audit(kb, defenses=[Consensus(tightness=0.8)], embedder=toy, workdir=other, part_size=32)
    # max_probes caps derived probes: with a query log it is unused, and blocks no resume
    logged = tmp_path / "q"
    with pytest.warns(UserWarning, match="a query log is asked whole"):
        audit(kb, embedder=toy, workdir=logged, part_size=32, queries=log, max_probes=1)
    again = audit(kb, embedder=toy, workdir=logged, part_size=32, queries=log)
    assert again.stats["probes"] == len(log)


def test_fresh_removes_only_the_audits_own_files(toy: CallableEmbedder, tmp_path: Path) -> None:
    """A folder with someone else's ``manifest.json`` (a web app, an extension) is no audit:
    refused with and without ``fresh``, nothing touched; in an audit's folder ``fresh`` removes
    the audit's files and nothing else."""
    texts, ids, _ = toy_corpus()
    app = tmp_path / "app"
    (app / "src").mkdir(parents=True)
    (app / "manifest.json").write_text('{"name": "my-extension", "version": "1.0"}')
    (app / "src" / "app.js").write_text("console.log('hi')")
    before = sorted(str(p.relative_to(app)) for p in app.rglob("*"))
    for clear in (False, True):
        with pytest.raises(ValueError, match="not empty and holds no audit"):
            audit(ListCorpus(texts, ids), embedder=toy, workdir=app, fresh=clear)
    assert sorted(str(p.relative_to(app)) for p in app.rglob("*")) == before
    work = tmp_path / "work"
    audit(ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32)
    (work / "NOTES.md").write_text("my notes about this audit")
    audit(ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32, fresh=True)
    assert (work / "NOTES.md").read_text() == "my notes about this audit"
    # a file of the user's inside one of the audit's folders (the knowledge base itself, saved
    # in chunks/) stops a fresh start before anything goes; its whole folder was removed
    (work / "chunks" / "kb.jsonl").write_text('{"id": "1", "text": "mine"}')
    (work / "search" / "notes").mkdir(parents=True)
    (work / "search" / "notes" / "todo.md").write_text("mine")
    before = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
    with pytest.raises(ValueError, match=r"never writes in its own folders \(chunks/kb.jsonl, "):
        audit(ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32, fresh=True)
    assert sorted(str(p.relative_to(work)) for p in work.rglob("*")) == before
    (work / "chunks" / "kb.jsonl").unlink()
    shutil.rmtree(work / "search" / "notes")
    (work / "chunks" / ".DS_Store").write_text("a file browser's")  # no user's file: cleared
    audit(ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32, fresh=True)
    assert not (work / "chunks" / ".DS_Store").exists()


def test_fresh_tells_the_audits_temporary_files_from_a_users(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    """A user's ``.manifest.json.bak`` is no temporary file of the audit: a folder holding it is
    not empty, and ``fresh`` keeps it; a report's temporary file left by a killed run goes. An
    audit entry that is a link goes as a link: what it names is the user's."""
    texts, ids, _ = toy_corpus()
    kb = ListCorpus(texts, ids)
    backup = tmp_path / "backup"
    backup.mkdir()
    (backup / ".manifest.json.bak").write_text("my backup")
    with pytest.raises(ValueError, match="not empty and holds no audit"):
        audit(kb, embedder=toy, workdir=backup, part_size=32, fresh=True)
    assert (backup / ".manifest.json.bak").read_text() == "my backup"
    work = tmp_path / "work"
    audit(kb, embedder=toy, workdir=work, part_size=32)
    (work / ".manifest.json.bak").write_text("my backup")
    (work / f".report.{'ab' * 16}.md").write_text("half a report")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    shutil.rmtree(work / "probes")
    (work / "probes").symlink_to(mine, target_is_directory=True)
    audit(kb, embedder=toy, workdir=work, part_size=32, fresh=True)
    assert (work / ".manifest.json.bak").read_text() == "my backup"
    assert not (work / f".report.{'ab' * 16}.md").exists()
    assert (mine / "keep.txt").read_text() == "mine" and not (work / "probes").is_symlink()


def test_a_fresh_audit_in_the_same_process_reads_its_own_knowledge_base(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    texts, ids, _ = toy_corpus()
    other = [f"Another corpus entirely, note {i}: {t[::-1]}" for i, t in enumerate(texts[:40])]
    work = tmp_path / "w"
    first = audit(ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32)
    assert {f.text for f in first.findings} <= set(texts)
    second = audit(ListCorpus(other), embedder=toy, workdir=work, part_size=32, fresh=True)
    assert second.findings and {f.text for f in second.findings} <= set(other)


def test_a_changed_knowledge_base_of_the_same_size_is_refused_on_resume(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    class Store(ListCorpus):
        """A store as the adapters read one: its fingerprint is its kind and size only."""

        def fingerprint(self) -> str:
            return f"store {len(self.texts)}"

    texts, ids, _ = toy_corpus()
    work = tmp_path / "w"
    audit(Store(texts, ids), embedder=toy, workdir=work, part_size=32)
    changed = list(texts)
    for i in range(5):  # five benign chunks replaced by planted ones: same count, same ids
        changed[i] = f"Who made the quantum toaster question 9? zorblax did it, copy {i}."
    with pytest.raises(ValueError, match=r"knowledge base changed.*part 0.*fresh"):
        audit(Store(changed, ids), embedder=toy, workdir=work, part_size=32)
    report = audit(Store(changed, ids), embedder=toy, workdir=work, part_size=32, fresh=True)
    assert {f.text for f in report.findings} <= set(changed)
    assert audit(Store(changed, ids), embedder=toy, workdir=work, part_size=32).findings


def test_changed_titles_or_stored_vectors_are_refused_on_resume(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    """A store's fingerprint is its kind and size: new titles (which choose the probes) or
    new stored vectors under the same ids and texts resumed silently, the report made from
    the old ones."""

    class Store(ListCorpus):
        def fingerprint(self) -> str:
            return f"store {len(self.texts)}"

    texts, ids, _ = toy_corpus()
    vectors = bag_of_words(texts)
    titles = [f"title {i}" for i in range(len(texts))]
    work = tmp_path / "w"
    audit(Store(texts, ids, titles, vectors), embedder=toy, workdir=work, part_size=32)
    again = audit(Store(texts, ids, titles, vectors.astype(np.float64)), embedder=toy,
                  workdir=work, part_size=32)  # fmt: skip
    assert again.findings  # the same store read again (another float type) resumes
    retitled = [f"another title {i}" for i in range(len(texts))]
    moved = vectors.copy()
    moved[3] = bag_of_words(["something else entirely"])[0]
    for changed in (Store(texts, ids, retitled, vectors), Store(texts, ids, titles, moved)):
        with pytest.raises(ValueError, match=r"knowledge base changed.*part 0"):
            audit(changed, embedder=toy, workdir=work, part_size=32)


def test_a_knowledge_base_file_resumes_by_its_content(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    """A file touched or moved with the same bytes resumes; one edited in place, even to the
    same size, is refused (the fingerprint hashes the bytes, not the path or the mtime)."""
    texts, ids, _ = toy_corpus()
    kb = tmp_path / "kb.jsonl"
    kb.write_text(
        "\n".join(json.dumps({"id": i, "text": t}) for i, t in zip(ids, texts, strict=True))
    )
    work = tmp_path / "w"
    first = audit(kb, embedder=toy, workdir=work, part_size=32)
    os.utime(kb, ns=(1, 1))  # touched: the same bytes
    moved = kb.rename(tmp_path / "moved.jsonl")
    again = audit(moved, embedder=toy, workdir=work, part_size=32)
    assert [f.id for f in again.findings] == [f.id for f in first.findings]
    data = moved.read_bytes()
    moved.write_bytes(data.replace(b"the", b"THE", 1))  # same size, other content
    with pytest.raises(ValueError, match=r"other parameters \(knowledge_base\).*fresh"):
        audit(moved, embedder=toy, workdir=work, part_size=32)


def test_file_input_and_damaged_parts_are_named(toy: CallableEmbedder, tmp_path: Path) -> None:
    """(#27 item 14) id 0 is an id; duplicate ids and NaN vectors in a file are refused, naming
    the records; a truncated part names itself and the way out."""

    def jsonl(records: list[dict[str, Any]]) -> Path:
        path = tmp_path / f"kb{len(list(tmp_path.glob('*.jsonl')))}.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in records))
        return path

    texts, _, _ = toy_corpus()
    records = [{"id": i, "text": t} for i, t in enumerate(texts)]
    kb = jsonl(records)
    report = audit(kb, embedder=toy, workdir=tmp_path / "a", part_size=32)
    assert "0" in {f.id for f in report.findings} and "row-0" not in {f.id for f in report.findings}
    twice = [*records, {"id": 3, "text": "another text"}]
    with pytest.raises(ValueError, match=rf"records 4 and {len(twice)} have the same id '3'"):
        audit(jsonl(twice), embedder=toy, workdir=tmp_path / "b")
    nan = [{"id": "x", "text": "t", "embedding": [0.1, float("nan")]}]
    with pytest.raises(ValueError, match=r"record 1 \(id 'x'\).*finite"):
        audit(jsonl(nan), embedder=toy, workdir=tmp_path / "c")
    search = next((tmp_path / "a" / "search").rglob("*.npz"))
    search.write_bytes(search.read_bytes()[:40])  # truncated
    for part in (tmp_path / "a" / "probed").glob("*.json"):
        part.unlink()  # the defend step must read the search results again
    with pytest.raises(ValueError, match=r"npz: damaged or truncated.*fresh"):
        audit(kb, embedder=toy, workdir=tmp_path / "a", part_size=32)


@pytest.mark.parametrize(
    "damage",
    [
        lambda records: records[:-1],  # cut short, still valid JSON
        lambda records: [],
        lambda records: {"records": records},
        lambda records: [{**r, "hits": [10**9]} for r in records],  # positions out of range
        lambda records: [{**r, "flags": {"x": {"-1": "?"}}} for r in records],
        lambda records: list(reversed(records)),  # another order: not this part's probes
    ],
)
def test_a_probed_part_that_parses_but_is_damaged_is_refused(
    toy: CallableEmbedder, tmp_path: Path, damage: Any
) -> None:
    """(#27 item 14) a ``probed`` part that is valid JSON but not one record per probe would
    lower every chunk's evidence silently: it is refused by name, with the way out."""
    texts, ids, _ = toy_corpus()
    work = tmp_path / "w"
    audit(ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32)
    part = next((work / "probed").glob("*.json"))
    records = json.loads(part.read_text())
    assert len(records) > 1
    part.write_text(json.dumps(damage(records)))
    with pytest.raises(ValueError, match=rf"{part.name}: damaged \(.*\).*fresh"):
        audit(ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32)
    report = audit(ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32, fresh=True)
    assert report.findings


def test_a_truncated_chunk_part_or_manifest_is_named_with_the_way_out(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    texts, ids, _ = toy_corpus()
    for name in ("chunks/00000.json", "manifest.json"):
        work = tmp_path / name.replace("/", "_")
        audit(ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32)
        damaged = work / name
        damaged.write_text(damaged.read_text()[:14])
        with pytest.raises(ValueError, match=rf"{damaged.name}: damaged.*fresh"):
            audit(ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32)
        again = audit(ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32, fresh=True)
        assert again.findings
    # chunks with sources keep them beside each part: still an audit's folder, fresh clears it
    meta = [{"source": f"site-{i % 3}"} for i in range(len(texts))]
    work = tmp_path / "sourced"
    audit(ListCorpus(texts, ids, metadata=meta), embedder=toy, workdir=work, part_size=32)
    assert any(p.name.endswith(".sources.json") for p in (work / "chunks").iterdir())
    (work / "manifest.json").write_text("{")
    with pytest.raises(ValueError, match=r"manifest.json: damaged.*fresh"):
        audit(ListCorpus(texts, ids, metadata=meta), embedder=toy, workdir=work, part_size=32)
    kb = ListCorpus(texts, ids, metadata=meta)
    assert audit(kb, embedder=toy, workdir=work, part_size=32, fresh=True).findings


def test_a_part_removed_from_the_folder_is_named_with_the_way_out(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    """A part the manifest says was written, deleted since, names itself and ``fresh`` (a
    bare FileNotFoundError said neither)."""
    texts, ids, _ = toy_corpus()
    work = tmp_path / "w"
    audit(ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32)
    for part in (work / "probed").glob("*.json"):
        part.unlink()  # the defend step must read the probes and chunks again
    shutil.rmtree(work / "probes")
    with pytest.raises(ValueError, match=r"probes/00000\.\w+: missing.*fresh"):
        audit(ListCorpus(texts, ids), embedder=toy, workdir=work, part_size=32)
    assert audit(ListCorpus(texts, ids), embedder=toy, workdir=work, fresh=True).findings


def test_a_folder_with_a_broken_manifest_and_a_users_chunks_folder_is_never_cleared(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    mine = tmp_path / "mine"
    (mine / "chunks").mkdir(parents=True)
    (mine / "chunks" / "data.txt").write_text("my data")
    (mine / "manifest.json").write_text("")
    for clear in (False, True):
        with pytest.raises(ValueError, match="holds no audit"):
            audit(["one two three four"], embedder=toy, workdir=mine, fresh=clear)
    assert (mine / "chunks" / "data.txt").read_text() == "my data"


def test_resume_marks_tell_models_and_settings_apart_not_rounding() -> None:
    from ragdefense import Consensus, Quarantine
    from ragdefense.auditing.settings import defense_mark, embedder_mark

    rng = np.random.default_rng(0)
    base = rng.standard_normal(384)

    def model(noise: float, seed: int = 0) -> CallableEmbedder:
        jitter = np.random.default_rng(seed).standard_normal(384) * noise
        return CallableEmbedder(lambda batch: np.array([base + jitter for _ in batch]))

    first = embedder_mark(model(0.0))
    assert embedder_mark(model(1e-3, seed=1), recorded=first) == first  # another machine
    # the packaged default given by name or as an object is the default a run recorded
    assert embedder_mark(ragdefense.default_embedder()) is None is embedder_mark(None)
    other = CallableEmbedder(lambda batch: rng.standard_normal((len(batch), 384)))
    assert embedder_mark(other, recorded=first) != first  # another model of the same type
    assert defense_mark(Consensus(trusted={"a"})) != defense_mark(Consensus(trusted={"b"}))
    assert defense_mark(Consensus(trusted={"a", "b"})) == defense_mark(
        Consensus(trusted={"b", "a"})
    )
    one = Quarantine.from_report(
        {"findings": [{"id": "x", "text": "t", "suspicious": True}]}, grouped=False
    )
    assert defense_mark(one) != defense_mark(Quarantine.from_report({"findings": []}))

    class Slotted:
        __slots__ = ("tightness",)

        def __init__(self) -> None:
            self.tightness = 0.9

    assert defense_mark(Slotted()) == "Slotted(tightness=0.9)"


def test_a_defense_mark_reads_dataclass_settings_and_function_code() -> None:
    """A resumed audit compared a BM25 scorer by its type and every function by its name
    (``<lambda>``): other settings resumed as the same, with the first run's flags."""
    import subprocess
    import sys

    from ragdefense.auditing.settings import defense_mark
    from ragdefense.defenses.grada import GRADA
    from ragdefense.similarity import BM25

    assert defense_mark(GRADA(bm25=BM25())) != defense_mark(GRADA(bm25=BM25(k1=0.1, b=0.0)))
    assert defense_mark(GRADA(bm25=BM25())) == defense_mark(GRADA(bm25=BM25()))

    class Judge:
        def __init__(self, rule: object) -> None:
            self.rule = rule

        def defend(self, query: str, passages: list[str]) -> None: ...

    allowed = {"a"}
    assert defense_mark(Judge(lambda m: False)) != defense_mark(Judge(lambda m: True))
    assert defense_mark(Judge(lambda m: m in allowed)) != defense_mark(Judge(lambda m: m in {"b"}))
    same = [defense_mark(Judge(lambda m: [x for x in m if x in {"c", "d"}])) for _ in range(2)]
    assert same[0] == same[1]  # a comprehension's code named its address

    class Own:  # a function referring to its defense: a cycle, written once
        def __init__(self, allowed: set[str]) -> None:
            self.allowed = allowed
            self.rule = lambda t: any(w in self.allowed for w in t.split())

        def defend(self, query: str, passages: list[str]) -> None: ...

    assert defense_mark(Own({"a"})) != defense_mark(Own({"b"}))
    from functools import partial

    def cut(x: float, at: float = 1.0) -> bool:
        return x > at

    assert defense_mark(Judge(partial(cut, at=1))) != defense_mark(Judge(partial(cut, at=2)))
    code = (
        f"import sys; sys.path[:0] = {sys.path!r}\n"
        "from ragdefense.auditing.settings import defense_mark\n"
        "class J:\n"
        "    def __init__(self): self.rule = lambda m: m in {'a', 'b', 'c', 'd', 'e'}\n"
        "    def defend(self, q, p): ...\n"
        "print(defense_mark(J()))"
    )
    marks = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(marks) == 1, marks  # a set's order changes with the hash seed; the mark does not


def test_the_audit_refuses_a_defense_with_trusted_sources() -> None:
    """The audit's defenses see each chunk's text and vector, not its metadata: trusted= was
    accepted and matched nothing, silently."""
    from ragdefense import Consensus

    with pytest.raises(ValueError, match="trusted="):
        AuditSettings(defenses=[Consensus(trusted={"who.int"})])
    held = Quarantine.from_report({"findings": []}, Consensus(trusted=lambda m: True))
    with pytest.raises(ValueError, match="trusted="):
        AuditSettings(defenses=[held])
    AuditSettings(defenses=[Consensus(), Quarantine.from_report({"findings": []})])  # no trust


def test_a_pipe_in_an_id_or_a_source_keeps_the_markdown_table(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    texts, ids, _ = toy_corpus()
    kb = ListCorpus(texts, [f"kb|{i}" for i in ids], metadata=[{"source": "a|b"}] * len(texts))
    shown = audit(kb, embedder=toy, workdir=tmp_path / "w", part_size=32).to_markdown(top=5)
    rows = [r for r in shown.splitlines() if r.startswith("| ") and "---" not in r]
    assert len(rows) == 6 and {r.replace("\\|", "").count("|") for r in rows} == {9}


def test_planted_text_cannot_drive_a_spreadsheet_or_a_terminal(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    texts, ids, _ = toy_corpus()
    texts[0] = '=HYPERLINK("http://evil.example","click") \x1b[2J\x1b[31mowned\rhidden'
    texts[1] += "\r\nits second line"  # a CRLF file's line break: kept as it is
    ids[1] = "doc\x01one"  # an id is kept as the store holds it, to match it
    report = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", part_size=32)
    report.findings.sort(key=lambda f: f.id != ids[0])  # the planted text first
    shown = report.to_markdown(top=len(texts))
    assert "\x1b" not in shown and "\r" not in shown and "\\\\x1b\\[2J" in shown  # (Markdown)
    [csv_path] = report.write(tmp_path / "out", ["csv"])
    import csv

    with csv_path.open(newline="", encoding="utf-8") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    assert rows[ids[0]]["text"].startswith("'=HYPERLINK(")
    # (review) the CSV kept the raw ESC bytes: ``cat report.csv`` ran the planted sequences
    raw = csv_path.read_bytes()
    assert b"\x1b" not in raw and b"\rhidden" not in raw and "\\x1b[2J" in rows[ids[0]]["text"]
    assert rows["doc\x01one"]["text"].endswith("\r\nits second line")


def test_report_plot_starts_at_rank_one_counts_the_audit_and_marks_groups(tmp_path: Path) -> None:
    """The plot's x axis is ranks from 1 (no negative ranks), its title the chunks audited (not
    only those listed), and each near-duplicate group has its own marked points."""
    from ragdefense.auditing import AuditReport, Finding

    def finding(i: int, group: str | None) -> Finding:
        score = 0.9 - i * 0.0005
        info = {"id": group, "size": 3, "similarity": 0.97} if group else None
        return Finding(f"c{i}", "text", score, score >= 0.8, [], 1, {}, group=info)

    groups = {0: "g0", 1: "g0", 2: "g0", 5: "g1", 7: "g1"}
    findings = [finding(i, groups.get(i)) for i in range(1000)]
    report = AuditReport(findings, 0.8, {"chunks": 123_456, "suspicious": 201, "listed": 1000})
    ax = report.figure().axes[0]
    left, right = ax.get_xlim()
    assert left == pytest.approx(1.0) and right >= 1000
    title = ax.get_title()
    assert "123,456 chunks audited" in title and "201 suspicious" in title and "1,000" in title
    marked = {c.get_label(): c.get_offsets().tolist() for c in ax.collections}
    g0 = next(pts for label, pts in marked.items() if "g0" in label)
    g1 = next(pts for label, pts in marked.items() if "g1" in label)
    assert [x for x, _ in g0] == [1, 2, 3] and [x for x, _ in g1] == [6, 8]
    labels = ax.get_legend_handles_labels()[1]
    assert any("g0" in label for label in labels) and any("g1" in label for label in labels)
    report.plot(tmp_path / "report.png")
    assert (tmp_path / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_files_jsonl_and_parquet_with_stored_vectors(toy: CallableEmbedder, tmp_path: Path) -> None:
    texts, ids, planted = toy_corpus()
    vectors = bag_of_words(texts)
    jsonl = tmp_path / "kb.jsonl"
    with jsonl.open("w") as f:
        for i, t, v in zip(ids, texts, vectors, strict=True):
            f.write(json.dumps({"id": i, "text": t, "embedding": v.tolist()}) + "\n")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    parquet = tmp_path / "kb.parquet"
    pq.write_table(pa.table({"id": ids, "text": texts}), parquet)
    from_jsonl = audit(jsonl, embedder=toy, workdir=tmp_path / "a")
    from_parquet = audit(parquet, embedder=toy, workdir=tmp_path / "b")
    for report in (from_jsonl, from_parquet):
        assert {f.id for f in report.top(len(planted))} == planted
    batch = next(FileCorpus(jsonl).batches(4))
    assert batch.vectors is not None and batch.vectors.shape == (4, vectors.shape[1])
    # vectors on some records only: refused (a part missing one was embedded again, others not)
    lines = jsonl.read_text().splitlines()
    gap = json.loads(lines[5])
    del gap["embedding"]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join([*lines[:5], json.dumps(gap), *lines[6:]]) + "\n")
    with pytest.raises(ValueError, match=r"record 6 \(id .*\) has no embedding, unlike record 1"):
        audit(mixed, embedder=toy, workdir=tmp_path / "m")


def _has_pyarrow() -> bool:
    import importlib.util

    return importlib.util.find_spec("pyarrow") is not None


def test_bad_input_is_named(tmp_path: Path, toy: CallableEmbedder) -> None:
    bad = tmp_path / "kb.jsonl"
    bad.write_text('{"id": 1, "text": "fine"}\nnot json\n')
    with pytest.raises(ValueError, match=r"kb\.jsonl:2: not JSON"):
        audit(bad, embedder=toy, workdir=tmp_path / "w")
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"id": 1, "text": "fine"}\n{"id": 2, "text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"latin\.jsonl:2: not UTF-8 \(byte 23 of the line\)"):
        audit(latin, embedder=toy, workdir=tmp_path / "w2")
    if _has_pyarrow():
        broken = tmp_path / "broken.parquet"
        broken.write_bytes(b"PAR1 not really")
        with pytest.raises(ValueError, match=r"broken\.parquet: not a readable Parquet file"):
            audit(broken, embedder=toy, workdir=tmp_path / "w3")
    with pytest.raises(FileNotFoundError):
        audit(tmp_path / "missing.jsonl")
    with pytest.raises(TypeError, match="cannot audit a int"):
        audit(42)  # type: ignore[arg-type]
    records = ["a text", {"id": "d1", "text": "one"}]  # what a list of texts is not
    with pytest.raises(
        TypeError, match=r"a list holding a dict \(item 1\), not only texts.*ListCorpus"
    ):
        audit(records, workdir=tmp_path / "w4")
    assert not (tmp_path / "w4").exists()  # refused before anything was written
    with pytest.raises(ValueError, match="top_m"):
        audit(["a b c"], top_m=1)
    with pytest.raises(ValueError, match="dimensions"):
        audit(ListCorpus(["one two three"] * 3, vectors=np.ones((3, 5))), embedder=toy)
    with pytest.raises(
        ValueError, match=r"chunk 2 of the batch \('1'\): its text is not valid Unicode"
    ):
        ListCorpus(["fine text", "broken \ud800 text"])
    with pytest.raises(ValueError, match="one row of numbers per chunk"):
        ListCorpus(["a", "b"], vectors=[[1.0, 2.0], [1.0]])
    ragged = tmp_path / "ragged.jsonl"
    ragged.write_text('{"id": "a", "text": "x", "embedding": [1, 2]}\n')
    with ragged.open("a") as f:
        f.write('{"id": "b", "text": "y", "embedding": [1, 2, 3]}\n')
    with pytest.raises(ValueError, match=r"record 2 \(id 'b'\) has an embedding of 3 numbers"):
        list(FileCorpus(ragged).batches(10))
    assert read_queries(["  who?  ", ""]) == ["who?"]
    log = tmp_path / "log.jsonl"
    log.write_text('{"question": "a b c?"}\n{"query": "d e f?"}\n')
    assert read_queries(log) == ["a b c?", "d e f?"]
    log.write_text('{"question": "a b c?"}\n{"text": "d e f?"}\n')  # never dropped silently
    with pytest.raises(ValueError, match="query log item 2: expected a question"):
        read_queries(log)
    log.write_text('{"question": "a b c?"\n')
    with pytest.raises(ValueError, match=r"log.jsonl: not JSON lines"):
        read_queries(log)
    (tmp_path / "log.csv").write_text("question\nwho?\n")
    with pytest.raises(ValueError, match=r"log.csv: not JSON \(.txt: one query per line\)"):
        read_queries(tmp_path / "log.csv")
    (tmp_path / "log.LOG").write_text('["a b c?"]')
    assert read_queries(tmp_path / "log.LOG") == ["a b c?"]  # JSON under any other name


def test_audit_settings_are_checked_when_made() -> None:
    cases: list[dict[str, Any]] = [{"top_m": 1}, {"neighbours": 0}, {"part_size": 0}]
    for bad in cases:  # each named alone, with its own bound
        ((name, value),) = bad.items()
        least = 2 if name == "top_m" else 1
        with pytest.raises(ValueError, match=f"^{name} must be >= {least}, got {value}$"):
            AuditSettings(**bad)
    with pytest.raises(ValueError, match="give at least one defense"):
        AuditSettings(defenses=[])
    for wide in (-1, 5, 10):  # off, or a list longer than the groups' own
        with pytest.raises(ValueError, match="wide_neighbours must be 0"):
            AuditSettings(wide_neighbours=wide)
    for key in ("", "  ", 3):
        with pytest.raises(ValueError, match="source_key must be a metadata key"):
            AuditSettings(source_key=key)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top_m"):
        audit(["a b c"], AuditSettings(), top_m=1)  # an override is checked as well
    assert ragdefense.AuditSettings is AuditSettings
    assert AuditSettings() == AuditSettings(("consensus",), 10, None, 10, None, 512, "auto", 1000)


def test_a_custom_corpus_is_checked_chunk_by_chunk(toy: CallableEmbedder, tmp_path: Path) -> None:
    """A store record holding a vector but no document (Chroma allows one) ended in a raw
    TypeError from a digest's join, naming no chunk; an id read twice from a user's corpus was
    reported twice. Both are refused by name, the second across parts."""
    from ragdefense.auditing import Batch

    class Records:
        def __init__(self, ids: list[str], texts: list[Any]) -> None:
            self.ids, self.texts = ids, texts

        def fingerprint(self) -> str:
            return f"records {self.ids}"

        def batches(self, size: int) -> Any:
            for start in range(0, len(self.ids), size):
                ids, texts = self.ids[start : start + size], self.texts[start : start + size]
                yield Batch(ids, texts, [""] * len(ids))

    texts, ids, _ = toy_corpus()
    holed = [*texts[:7], None, *texts[8:]]
    with pytest.raises(ValueError, match=rf"chunk {ids[7]!r} has no text string \(got NoneType\)"):
        audit(Records(ids, holed), embedder=toy, workdir=tmp_path / "a", part_size=32)
    twice = [*ids[:40], ids[3], *ids[41:]]
    with pytest.raises(ValueError, match=rf"two chunks have the id {ids[3]!r} \(parts 0 and 1\)"):
        audit(Records(twice, texts), embedder=toy, workdir=tmp_path / "b", part_size=32)
    assert audit(Records(ids, texts), embedder=toy, workdir=tmp_path / "c", part_size=32).findings


@pytest.mark.parametrize("workers", [0, -1, 2.5, "2", True])
def test_ray_workers_are_checked_before_any_work(tmp_path: Path, workers: Any) -> None:
    """Ray refused these from deep inside Ray Data (0 meant every CPU), once the working folder
    was written; the command line already refused them."""
    with pytest.raises(ValueError, match=r"workers must be a whole number >= 1"):
        audit(["a b c"], engine="ray", workers=workers, workdir=tmp_path / "w")
    assert not (tmp_path / "w").exists()
    with pytest.raises(ValueError, match=r"unknown engine 'spark'"):
        audit(["a b c"], engine="spark", workdir=tmp_path / "w")  # type: ignore[arg-type]
    for ray_only in ({"workers": 2}, {"address": "ray://elsewhere:10001"}):  # not dropped
        with pytest.raises(ValueError, match=r"address and workers are for engine='ray'"):
            audit(["a b c"], workdir=tmp_path / "w", **ray_only)  # type: ignore[arg-type]
    assert not (tmp_path / "w").exists()


def test_a_settings_object_audits_as_the_keywords_do(toy: CallableEmbedder, tmp_path: Path) -> None:
    texts, ids, _ = toy_corpus()
    by_keywords = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "k", part_size=32)
    settings = AuditSettings(part_size=32)
    by_settings = audit(ListCorpus(texts, ids), settings, embedder=toy, workdir=tmp_path / "s")
    assert [(f.id, f.score, f.flagged) for f in by_settings.findings] == [
        (f.id, f.score, f.flagged) for f in by_keywords.findings
    ]
    manifests = [json.loads((tmp_path / w / "manifest.json").read_text()) for w in "ks"]
    assert manifests[0]["params"] == manifests[1]["params"]
    assert list(manifests[0]["params"]) == [
        "knowledge_base", "defenses", "top_m", "max_probes", "neighbours", "wide_neighbours",
        "part_size", "queries", "embedder", "index", "shards", "route",
    ]  # fmt: skip
    assert manifests[0]["params"]["part_size"] == 32
    overridden = audit(
        ListCorpus(texts, ids), settings, embedder=toy, workdir=tmp_path / "o", top_m=5
    )  # the keywords win over the object, which stays as it was
    assert overridden.stats["top_m"] == 5 and settings.top_m == 10
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["params"]["part_size"] == 32
    with pytest.raises(TypeError, match=r"top_k.*the settings are defenses, top_m"):
        audit(ListCorpus(texts, ids), embedder=toy, top_k=5)
    with pytest.raises(TypeError, match="settings must be an AuditSettings"):
        audit(ListCorpus(texts, ids), {"top_m": 5})  # type: ignore[arg-type]


def test_query_log_probes(toy: CallableEmbedder, tmp_path: Path) -> None:
    texts, ids, planted = toy_corpus()
    report = audit(
        ListCorpus(texts, ids),
        queries=["Who made the quantum toaster question 0?", "volcano lava eruption"],
        embedder=toy,
        workdir=tmp_path / "w",
    )
    assert report.stats["probes"] == 2 and report.stats["probe_source"] == "query log"
    flagged = {f.id for f in report.findings if f.flagged["consensus"]}
    assert flagged & planted
    # removals with a set, as the flag evidence reads them: every reason but the lone veto's
    from ragdefense.auditing.evidence import assess
    from ragdefense.auditing.records import LONE_REMOVAL, probe_records
    from ragdefense.auditing.workdir import Workdir

    wd = Workdir(tmp_path / "w")
    evidence = assess(wd, ["consensus"], Scoring())
    tally = np.zeros(len(evidence.retrieved), dtype=np.int64)
    for record, _ in probe_records(wd, wd.noted("probe_parts"), len(tally)):
        for position, reason in record["flags"]["consensus"].items():
            tally[int(position)] += not reason.startswith(LONE_REMOVAL)
    assert evidence.with_set is not None and tally.sum() > 0
    assert evidence.with_set["consensus"].tolist() == tally.tolist()
    assert (evidence.flagged["consensus"] >= tally).all()


def test_cli_audit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kb = tmp_path / "kb.jsonl"
    with kb.open("w") as f:
        for q in load_demo_kb():
            for i, t in enumerate(q.benign + q.poison):
                record = {"id": f"{q.id}-{i}", "text": t, "url": f"https://{q.id}.org"}
                f.write(json.dumps({**record, "tenant": f"tenant-{q.id}-{i % 2}"}) + "\n")
    assert (
        main(["audit", str(kb), "--workdir", str(tmp_path / "w"), "--quiet", "--format", "md,csv"])
        == 0
    )
    assert (tmp_path / "w" / "report.md").is_file() and (tmp_path / "w" / "report.csv").is_file()
    assert "Knowledge-base audit" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "w" / "manifest.json").read_text())
    assert manifest["params"]["defenses"] == ["consensus"]  # the per-query default
    with (tmp_path / "w" / "report.csv").open() as f:
        assert {row["source"] for row in csv.DictReader(f)} == {
            f"{q.id}.org" for q in load_demo_kb()
        }
    off = ["audit", str(kb), "--workdir", str(tmp_path / "o"), "--quiet", "--source-key", "none"]
    assert main([*off, "--format", "csv"]) == 0
    with (tmp_path / "o" / "report.csv").open() as f:
        assert {row["source"] for row in csv.DictReader(f)} == {""}
    keyed = ["audit", str(kb), "--workdir", str(tmp_path / "k"), "--quiet", "--format", "csv"]
    assert main([*keyed, "--source-key", "tenant"]) == 0  # any metadata key
    with (tmp_path / "k" / "report.csv").open() as f:
        assert all(
            row["source"] == f"tenant-{row['id'].rsplit('-', 1)[0]}-{int(row['id'][-1]) % 2}"
            for row in csv.DictReader(f)
        )
    assert main(["audit", str(tmp_path / "nope.jsonl")]) == 2
    assert "no file" in capsys.readouterr().err
    # (review) a rerun asking other formats left an earlier run's report.json, which a
    # quarantine then read; and the Markdown report and table left out suspicious chunks unsaid
    again = ["audit", str(kb), "--workdir", str(tmp_path / "w"), "--quiet", "--show", "2"]
    (tmp_path / "w" / "report.parquet").mkdir()  # a folder of that name: not a report of ours
    assert main([*again, "--format", "json"]) == 0
    assert sorted(p.name for p in (tmp_path / "w").glob("report.*")) == [
        "report.json",
        "report.parquet",
    ]
    (tmp_path / "w" / "report.parquet").rmdir()
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "w" / "report.json").read_text())
    suspicious = sum(f["suspicious"] for f in report["findings"])
    assert suspicious > 2 and f"2 of the {suspicious} suspicious chunks shown" in out
    assert ">= 0.48" in out and "&gt;" not in out  # a terminal renders no HTML escapes
    assert main([*again, "--format", "md"]) == 0 and not (tmp_path / "w" / "report.json").exists()
    assert main([*again, "--format", "json", "--format", "md"]) == 0  # repeated: every one
    assert sorted(p.name for p in (tmp_path / "w").glob("report.*")) == ["report.json", "report.md"]
    table = (tmp_path / "w" / "report.md").read_text()
    assert table.count("| **") == suspicious and "suspicious chunks shown" not in table
    folder = tmp_path / "kb-folder"  # was "no knowledge base file at" it, exit 1, past the checks
    folder.mkdir()
    assert main(["audit", str(folder), "--workdir", str(tmp_path / "f")]) == 2
    assert "is a folder: give a .jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["audit", str(kb), "--format", "docx"])
    asked = tmp_path / "questions.txt"  # a query log is asked whole: a sample of it was ignored
    asked.write_text("Who painted the Mona Lisa?\n")
    assert main(["audit", str(kb), "--queries", str(asked), "--max-probes", "1",
                 "--workdir", str(tmp_path / "p")]) == 2  # fmt: skip
    assert "--max-probes samples derived probes" in capsys.readouterr().err


def test_cli_audit_takes_the_model_the_store_was_embedded_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A knowledge base embedded by another model than the packaged one could not be audited
    from the command line (the error said "pass embedder=", a flag it did not have)."""
    texts, ids, _ = toy_corpus()
    kb = tmp_path / "kb.jsonl"
    vectors = bag_of_words(texts)
    kb.write_text("".join(json.dumps({"id": i, "text": t, "embedding": v.tolist()}) + "\n"
                          for i, t, v in zip(ids, texts, vectors, strict=True)))  # fmt: skip
    (tmp_path / "mymodel.py").write_text(
        "from tests.conftest import bag_of_words\nfrom ragdefense import CallableEmbedder\n"
        "embed = bag_of_words\n"
        "def make():\n    return CallableEmbedder(bag_of_words)\n"
        "class Model(CallableEmbedder):\n    def __init__(self):\n"
        "        super().__init__(bag_of_words)\n"
        "def broken():\n    raise RuntimeError('no key')\n"
        "def constant(texts):\n    return [[1.0, 2.0, 3.0]] * len(texts)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    run = ["audit", str(kb), "--quiet", "--format", "md,md", "--workdir"]
    assert main([*run, str(tmp_path / "a")]) == 2  # 256 dimensions against MiniLM's 384
    assert "pass embedder= (--embedder)" in capsys.readouterr().err
    assert main([*run, str(tmp_path / "b"), "--embedder", "mymodel:embed"]) == 0
    assert capsys.readouterr().err.count("report.md") == 1  # a format named twice: once
    # (review) a class or a factory was called with the texts, as a function embedding them
    for n, made in enumerate(("mymodel:make", "mymodel:Model")):
        assert main([*run, str(tmp_path / f"m{n}"), "--embedder", made]) == 0
    assert main([*run, str(tmp_path / "x"), "--embedder", "./no-such-model"]) == 2
    assert "--embedder './no-such-model': no such folder" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # refused before any work
    assert main([*run, str(tmp_path / "x"), "--embedder", "mymodel:broken"]) == 2
    assert "calling it raised RuntimeError: no key" in capsys.readouterr().err
    # (review) a model giving every text one vector made a clean report, exit 0
    texts_only = tmp_path / "texts.jsonl"
    texts_only.write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                                  for i, t in zip(ids, texts, strict=True)))  # fmt: skip
    stub = ["audit", str(texts_only), "--quiet", "--embedder", "mymodel:constant", "--workdir"]
    assert main([*stub, str(tmp_path / "c1")]) != 0
    assert "gave one vector to" in capsys.readouterr().err
    fixed = ["audit", str(texts_only), "--quiet", "--embedder", "mymodel:embed", "--workdir"]
    assert main([*fixed, str(tmp_path / "c1"), "--fresh"]) == 0  # as its message says
    assert main([*run, str(tmp_path / "c"), "--workers", "2"]) == 2
    assert "are for --engine ray" in capsys.readouterr().err


def test_parquet_without_pyarrow_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    (tmp_path / "chunks.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    work = tmp_path / "w"
    assert main(["audit", str(tmp_path / "chunks.parquet"), "--workdir", str(work)]) == 2
    assert "pip install" in capsys.readouterr().err and not work.exists()


def test_an_index_over_a_store_no_adapter_reads_is_a_clear_error() -> None:
    """Qdrant, pgvector, a custom store: the adapter says so (it cannot page through it)."""
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores.types import (
        BasePydanticVectorStore,
        VectorStoreQueryResult,
    )

    class OtherStore(BasePydanticVectorStore):
        """A store of another kind (this adapter reads the default one and Chroma)."""

        stores_text: bool = True

        @property
        def client(self) -> Any:
            return None

        def add(self, nodes: Any, **kwargs: Any) -> list[str]:
            return [n.node_id for n in nodes]

        def delete(self, ref_doc_id: str, **kwargs: Any) -> None:
            return None

        def query(self, query: Any, **kwargs: Any) -> VectorStoreQueryResult:
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])

    store = OtherStore()
    index = VectorStoreIndex(
        [TextNode(text="one"), TextNode(text="two")],
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=MockEmbedding(embed_dim=4),
    )
    with pytest.raises(TypeError, match=r"cannot read every node.*OtherStore.*JSONL"):
        audit(index)


def test_the_console_script_finds_a_module_in_the_current_folder(tmp_path: Path) -> None:
    """``ragdefense audit mystore:store`` as the docs write it: the console script's path
    holds its own folder, not the current one; a function needing arguments is a clear error."""
    import subprocess
    import sys

    (tmp_path / "mystore.py").write_text("def store(path):\n    return path\n")
    script = Path(sys.executable).with_name("ragdefense")
    done = subprocess.run(
        [str(script), "audit", "mystore:store", "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "with no arguments failed" in done.stderr and "Traceback" not in done.stderr


def test_the_console_script_shows_texts_its_output_cannot_encode(tmp_path: Path) -> None:
    """Redirected on Windows, stdout encodes cp1252: a chunk's CJK text or arrow in the report
    shown ended the audit in a traceback (exit 1) after the report was written."""
    import subprocess
    import sys

    (tmp_path / "embmod.py").write_text(
        "import zlib\nimport numpy as np\n\ndef emb(texts):\n    out = np.zeros((len(texts), 64))\n"
        "    for i, t in enumerate(texts):\n        for w in t.split():\n"
        "            out[i, zlib.crc32(w.encode()) % 64] += 1\n    return out\n"
    )
    rows = [{"id": f"c{i}", "text": f"東京 → note {i} topic{i % 5} word{i % 3}"} for i in range(30)]
    (tmp_path / "kb.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    script = Path(sys.executable).with_name("ragdefense")
    done = subprocess.run(
        [str(script), "audit", "kb.jsonl", "--embedder", "embmod:emb", "--quiet", "--show", "50"],
        cwd=tmp_path,
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "cp1252"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode("cp1252", "replace")
    assert b"\\u6771\\u4eac \\u2192 note" in done.stdout  # escaped, not lost


@pytest.mark.slow
def test_stores_are_read_with_their_vectors_never_written(minilm: Any, tmp_path: Path) -> None:
    import chromadb
    from langchain_chroma import Chroma
    from langchain_core.vectorstores import InMemoryVectorStore
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.schema import TextNode
    from llama_index.vector_stores.chroma import ChromaVectorStore

    from langchain_ragdefense import RagdefenseEmbeddings
    from llama_index.postprocessor.ragdefense import RagdefenseEmbedding

    kb = load_demo_kb()
    texts = [t for q in kb for t in q.benign + q.poison]
    poison = {t for q in kb for t in q.poison}
    # where each came from, as a loader / reader writes it
    meta = [{"source": "uploads/x.txt" if t in poison else f"site-{i % 4}.example"} for i, t in
            enumerate(texts)]  # fmt: skip
    client = chromadb.PersistentClient(path=str(tmp_path / "chroma"))
    lc = RagdefenseEmbeddings(minilm)
    nodes = [  # the source is not embedded (LlamaIndex embeds metadata unless told not to)
        TextNode(text=t, metadata=m, excluded_embed_metadata_keys=["source"])
        for t, m in zip(texts, meta, strict=True)
    ]
    stores: list[Any] = [
        InMemoryVectorStore.from_texts(texts, lc, metadatas=meta),
        Chroma.from_texts(texts, lc, metadatas=meta, client=client, collection_name="lc-kb"),
        VectorStoreIndex(
            nodes,
            embed_model=RagdefenseEmbedding(minilm),
        ),
        VectorStoreIndex(
            nodes,
            storage_context=StorageContext.from_defaults(
                vector_store=ChromaVectorStore(client.get_or_create_collection("li-kb"))
            ),
            embed_model=RagdefenseEmbedding(minilm),
        ),
    ]
    collections = {c.name: c.count() for c in client.list_collections()}
    for store in stores:
        before = minilm.texts_embedded
        report = audit(store, workdir=tmp_path / f"w{id(store)}")
        embedded = minilm.texts_embedded - before
        assert embedded <= report.stats["probes"]  # the probes only: stored vectors reused
        top = report.top(len(poison))
        assert sum(f.text in poison for f in top) >= 0.8 * len(poison)
        assert {f.text: f.source for f in report.findings} == {  # the stores' metadata read
            f.text: "uploads/x.txt" if f.text in poison else meta[texts.index(f.text)]["source"]
            for f in report.findings
        }
    assert {c.name: c.count() for c in client.list_collections()} == collections
    from llama_index.postprocessor.ragdefense.vectors import index_corpus

    for index in stores[2:]:  # (#28) an index is read a batch at a time, never whole
        corpus = index_corpus(index)
        with pytest.MonkeyPatch.context() as mp:
            for cls in (type(index.vector_store), type(index.docstore)):
                mp.setattr(cls, "get_nodes", _at_most(cls.get_nodes, 7))
            mp.setattr(type(index.docstore), "docs", property(_whole))
            got = list(corpus.batches(7))
        assert max(len(b.texts) for b in got) == 7
        assert sorted(t for b in got for t in b.texts) == sorted(texts)
        assert all(b.vectors is not None for b in got)  # the stored vectors came with them
    over_chroma = stores[3]
    before = index_corpus(over_chroma).fingerprint()
    over_chroma.insert_nodes([TextNode(text="one more passage")])
    assert index_corpus(over_chroma).fingerprint() != before  # a resumed audit would refuse


def _at_most(original: Any, most: int) -> Any:
    """``original`` (a ``get_nodes``), refusing to read more than ``most`` nodes at once."""

    def get_nodes(self: Any, ids: Any = None, *args: Any, **kwargs: Any) -> Any:
        if ids is None or len(ids) > most:
            raise AssertionError("the whole index was read at once")
        return original(self, ids, *args, **kwargs)

    return get_nodes


def _whole(self: Any) -> Any:
    raise AssertionError("every node of the docstore was built at once")


def _slow_part(part: int) -> int:
    time.sleep(4)
    return part


def _damaged_part(part: int) -> int:
    raise ValueError(f"part {part} is damaged")


@pytest.mark.slow
def test_ray_engine_runs_the_same_audit(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    import ray

    texts, ids, planted = toy_corpus()
    toy = CallableEmbedder(bag_of_words)  # Ray workers import it from tests.conftest
    local = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "l", part_size=16)
    root = str(Path(__file__).resolve().parents[1])
    try:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": root}},
        )
        on_ray = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "r",
                       part_size=16, engine="ray", workers=2)  # fmt: skip
        # routed: the routes, the search and the recheck of suspects run as Ray tasks too
        routed = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "rr",
                       part_size=16, engine="ray", workers=2, shards=4, route=2)  # fmt: skip
        routed_here = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "lr",
                            part_size=16, shards=4, route=2)  # fmt: skip
        # one part may take longer than Ray Data's no-progress limit (30 min, made 1 s here):
        # a shard's index built and searched yields nothing until it is done
        context = ray.data.DataContext.get_current()
        limit, context.execution_no_progress_timeout_s = context.execution_no_progress_timeout_s, 1
        try:
            assert RayEngine(workers=1).map(_slow_part, [1, 2], "slow", progress=False) == 3
        finally:
            context.execution_no_progress_timeout_s = limit
        # a step's own error is raised as in process, not inside Ray's task error
        with pytest.raises(ValueError, match=r"^part 1 is damaged$"):
            RayEngine(workers=1).map(_damaged_part, [1], "damaged", progress=False)
        bars = ray.data.DataContext.get_current().enable_progress_bars
        with pytest.warns(UserWarning, match="already initialised here: address"):
            engine = RayEngine("ray://elsewhere:10001", workers=1)
        assert engine.map(_slow_part, [0], "bars", progress=False) == 0
        assert ray.data.DataContext.get_current().enable_progress_bars == bars  # the user's
    finally:
        ray.shutdown()
    assert on_ray.stats["shards"] == 2 and on_ray.stats["engine"] == "ray"
    assert [(f.id, round(f.score, 5)) for f in on_ray.findings] == [
        (f.id, round(f.score, 5)) for f in local.findings
    ]
    assert {f.id for f in on_ray.top(len(planted))} == planted
    assert "recheck" in routed.stats["stage_seconds"]
    assert [(f.id, round(f.score, 5)) for f in routed.findings] == [
        (f.id, round(f.score, 5)) for f in routed_here.findings
    ]


def test_audit_is_exported_lazily() -> None:
    assert ragdefense.audit is audit
    assert Scoring().threshold > 0


@pytest.mark.data
def test_benchmark_corpus_is_deterministic_and_split(data_dir: Path) -> None:
    from benchmarks.settings.audit import TUNING_FAMILIES, audit_corpus

    kb = audit_corpus(data_dir)
    again = audit_corpus(data_dir)
    assert kb.ids == again.ids and kb.texts == again.texts
    assert len(kb.questions) == 100 and len(set(kb.ids)) == len(kb.ids)
    assert sum(1 for i in kb.ids if i not in kb.planted) > 4000  # every benign passage, once
    families = {family for _, family, _ in kb.planted.values()}
    assert families > set(TUNING_FAMILIES)  # held-out families are planted too
    tuning = [i for i in kb.planted if kb.tuning(i)]
    assert 0 < len(tuning) < len(kb.planted) / 2
    from benchmarks.settings.audit import LAYOUTS
    from ragdefense.provenance import metadata_source

    benign = [n for n, i in enumerate(kb.ids) if i not in kb.planted]
    planted = [n for n, i in enumerate(kb.ids) if i in kb.planted]
    attacker_hosts = {"one upload": 1, "5 attacker sites": 5, "a site per target": 100}
    for layout in LAYOUTS:
        sources = [metadata_source({"source": s}) for s in kb.layout(layout)]
        assert sources == [metadata_source({"source": s}) for s in again.layout(layout)]
        honest = {sources[n] for n in benign}
        assert len(honest) > 1000  # the web results' hosts and the gold documents
        attacker = {sources[n] for n in planted}
        if layout in attacker_hosts:
            assert len(attacker) == attacker_hosts[layout] and not attacker & honest
        else:  # planted on honest chunks' sites
            assert attacker <= honest


@pytest.mark.data
def test_quarantine_corpus_plants_every_family_in_every_dataset_as_per_query(
    data_dir: Path,
) -> None:
    """The quarantine benchmark's split compares families, not datasets (families in blocks
    put the tuning ones on RealtimeQA alone), and its passages are the per-query benchmarks'
    (without the record's passages to hide in, ``dispersed`` quoted the question in a fixed
    paragraph, far easier to find)."""
    from benchmarks.settings.audit import audit_corpus
    from benchmarks.settings.quarantine import COUNTS
    from ragdefense.attacks import ATTACKS

    kb = audit_corpus(data_dir, n_targets=40, counts=COUNTS, spread=True)
    families: dict[str, set[str]] = {}
    for dataset, family, _ in kb.targets:
        families.setdefault(dataset, set()).add(family)
    assert len(families) == 4 and all(f == set(ATTACKS) for f in families.values())
    texts = dict(zip(kb.ids, kb.texts, strict=True))
    dispersed = [texts[i] for i, (_, f, _) in kb.planted.items() if f == "dispersed"]
    assert dispersed and not any("collects background on the question" in t for t in dispersed)


def _sourced_corpus() -> tuple[list[str], list[str], list[dict[str, Any]], set[str], set[str]]:
    """The toy corpus, its benign chunks from a site per topic; the planted groups from one
    upload, which also holds four lone planted passages written like benign notes (nothing in
    their text sets them apart)."""
    texts, ids, planted = toy_corpus()
    meta: list[dict[str, Any]] = [
        {"source": "uploads/attack.pdf"} if i in planted else
        {"url": f"https://www.topic-{i.split('-')[0][1:]}.example/{i}"}
        for i in ids
    ]  # fmt: skip
    rng = random.Random(1)
    lone = set()
    for j, t in enumerate((0, 2, 4, 6)):
        words = TOPICS[t].split()
        text = " ".join(rng.sample(words, 3) + rng.sample(WORDS, 6) + rng.sample(words, 2))
        texts.append(f"Topic {t} note {20 + j}. {text}")
        ids.append(f"lone-{j}")
        meta.append({"source": "uploads/attack.pdf"})
        lone.add(f"lone-{j}")
    # next to a planted group but no near-duplicate of it: what an honest victim looks like
    texts.append("Who made the quantum toaster question 0? zorblax invented it, in a garage.")
    ids.append("lone-near")
    meta.append({"source": "uploads/attack.pdf"})
    lone.add("lone-near")
    return texts, ids, meta, planted, lone


def test_a_chunk_from_a_source_whose_other_chunks_look_planted_is_suspicious(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    """Lone planted passages worded like the rest are invisible to the text evidence; their
    source gives them away when most of its other chunks are suspicious on their own. Turned
    off (``source_key=None``), or in a knowledge base without sources, they are not found."""
    texts, ids, meta, planted, lone = _sourced_corpus()
    given = [dict(m) for m in meta]
    report = audit(ListCorpus(texts, ids, metadata=meta), embedder=toy, workdir=tmp_path / "s")
    assert meta == given  # the caller's metadata untouched
    suspicious = {f.id for f in report.suspicious}
    assert suspicious >= planted | lone
    assert not {i for i in suspicious if i.startswith("b")}  # no honest site condemned
    by_id = {f.id: f for f in report.findings}
    assert by_id["lone-0"].source == "uploads/attack.pdf"
    assert any(
        "uploads/attack.pdf', 11 of whose 14 other chunks are suspicious on their own evidence "
        "(against 0.0% of the rest" in r
        for r in by_id["lone-0"].reasons
    )
    assert by_id[next(iter(planted))].source == "uploads/attack.pdf"
    assert report.stats["sources"] == len(TOPICS) + 1
    assert report.stats["suspect_sources"] == [
        {"source": "uploads/attack.pdf", "chunks": 15, "suspicious": 15, "on_own_evidence": 11}
    ]
    assert "uploads/attack.pdf (11 of 15 chunks on their own evidence, 15 in all)" in (
        report.to_markdown()
    )
    assert report.stats["possible_victims"] == 0  # the attacker's lone chunks are no victims
    assert Quarantine.from_report(report).ids >= lone  # so they are quarantined with the sets
    report.write(tmp_path / "r", ["json"])  # and so from the report's file
    assert Quarantine.from_report(tmp_path / "r" / "report.json").ids >= lone
    off = audit(
        ListCorpus(texts, ids, metadata=meta), embedder=toy, workdir=tmp_path / "o",
        source_key=None,
    )  # fmt: skip
    assert not lone - {"lone-near"} & {f.id for f in off.suspicious}
    assert off.stats["possible_victims"] == 1  # the one next to a group, without its source
    assert all(f.source is None for f in off.findings) and off.stats["sources"] == 0
    with pytest.warns(UserWarning, match="source_key='sorce' gave no chunk a source"):
        typo = audit(ListCorpus(texts, ids, metadata=meta), embedder=toy, source_key="sorce",
                     workdir=tmp_path / "t")  # fmt: skip
    assert typo.stats["sources"] == 0  # run as without sources, and said
    bare = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "b")
    assert [(f.id, f.score) for f in bare.findings] == [(f.id, f.score) for f in off.findings]
    one = [{"source": "uploads/everything.pdf"}] * len(texts)  # a single-source knowledge base
    single = audit(ListCorpus(texts, ids, metadata=one), embedder=toy, workdir=tmp_path / "1")
    assert [(f.id, f.score) for f in single.findings] == [(f.id, f.score) for f in bare.findings]


def test_a_blank_chunk_of_a_condemned_source_is_not_suspicious(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    """An empty page of the attacker's upload gets its source's support as a score, but a
    blank chunk is never suspicious: its finding says so, and it is not counted among the
    suspicious chunks nor its source's (it was, beside the reason 'never suspicious')."""
    texts, ids, meta, _, _ = _sourced_corpus()
    texts, ids = [*texts, "   "], [*ids, "empty-page"]
    meta = [*meta, {"source": "uploads/attack.pdf"}]
    report = audit(ListCorpus(texts, ids, metadata=meta), embedder=toy, workdir=tmp_path / "w")
    empty = {f.id: f for f in report.findings}["empty-page"]
    assert empty.score >= report.threshold and BLANK in empty.reasons  # the source's support
    assert not empty.suspicious
    assert report.stats["suspicious"] == len(report.suspicious)
    assert report.stats["suspect_sources"] == [
        {"source": "uploads/attack.pdf", "chunks": 16, "suspicious": 15, "on_own_evidence": 11}
    ]


def test_sources_feed_the_report_only_a_resumed_audit_reads_them_again(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    """Sources are not part of the work an audit resumes: with other metadata (or only some
    parts carrying any) the same folder reports the sources given now, nothing recomputed."""
    texts, ids, meta, planted, lone = _sourced_corpus()
    calls: list[int] = []

    def counting(batch: list[str]) -> np.ndarray:
        calls.append(len(batch))
        return bag_of_words(batch)

    embedder = CallableEmbedder(counting)
    work = tmp_path / "w"
    first = audit(ListCorpus(texts, ids, metadata=meta), embedder=embedder, workdir=work,
                  part_size=16)  # fmt: skip
    done = len(calls)
    # only the attacker's chunks say where they come from, under another key
    moved = [{"upload": "batch-7"} if "source" in m else {} for m in meta]
    again = audit(ListCorpus(texts, ids, metadata=moved), embedder=embedder, workdir=work,
                  part_size=16, source_key="upload")  # fmt: skip
    assert len(calls) == done  # nothing embedded again
    assert {f.id for f in again.suspicious} >= planted | lone
    assert again.stats["sources"] == 1 and {f.source for f in again.findings} == {"batch-7", None}
    assert {f.source for f in first.findings} > {"uploads/attack.pdf"}
    bare = audit(ListCorpus(texts, ids), embedder=embedder, workdir=work, part_size=16)
    assert len(calls) == done and bare.stats["sources"] == 0


def test_a_source_is_condemned_when_one_chunk_is_suspicious_on_the_others_evidence() -> None:
    """A source whose chunks are all suspicious is condemned as one with a clean chunk is:
    by the evidence of the others on one of them; one or two suspicious chunks never do."""
    from ragdefense.auditing.sources import SourceTally

    size = np.array([5, 5, 2, 3, 1, 100])
    bad = np.array([5, 3, 2, 3, 1, 0])
    tally = SourceTally(size, bad, np.zeros(6))
    assert tally.condemned(0.5).tolist() == [True, True, False, True, False, False]
    assert not tally.condemned(0).any()  # source evidence off
    # where 30% of the rest is suspicious, only the wholly suspicious source stands out
    assert SourceTally(size, bad, np.full(6, 0.3)).condemned(0.5).tolist() == [True] + [False] * 5


def test_source_support_is_a_sources_suspicious_share_above_the_rest() -> None:
    """A chunk's support is the suspicious share of its source's *other* chunks (two unseen
    honest ones counted: a lone or paired chunk never condemns its neighbour) above the
    suspicious share of every other source's chunks; where most chunks look suspicious, a source
    that does proves nothing."""
    from ragdefense.auditing.evidence import Evidence
    from ragdefense.auditing.sources import source_tally

    def support(source: list[int], suspicious: list[bool]) -> list[float]:
        n = len(source)
        evidence = Evidence(
            retrieved=np.zeros(n, dtype=np.int64), flagged={}, isolated=np.zeros(n),
            group_of=np.full(n, -1), groups=[], source=np.array(source),
            source_names=[str(s) for s in range(max(source) + 1)],
        )  # fmt: skip
        tally = source_tally(evidence, np.array(suspicious))
        assert tally is not None and evidence.source is not None
        return [float(x) for x in tally.support(evidence.source, np.array(suspicious))]

    source = [0, 0, 1, 1, 1, 2, -1]
    suspicious = [True, False, True, True, False, True, True]
    assert support(source, suspicious) == [0.0] * 7  # 5 of 7 suspicious: nothing stands out
    honest = support(source + [3] * 20, suspicious + [False] * 20)  # 20 honest chunks more
    rest0, rest1 = 4 / 25, 3 / 24  # the suspicious share outside sources 0 and 1
    assert honest[:7] == pytest.approx(
        [0, (1 / 3 - rest0) / (1 - rest0), (1 / 4 - rest1) / (1 - rest1), (1 / 4 - rest1) /
         (1 - rest1), (2 / 4 - rest1) / (1 - rest1), 0, 0]
    )  # fmt: skip
    assert honest[7:] == [0.0] * 20
    evidence = Evidence(np.zeros(1, dtype=np.int64), {}, np.zeros(1), np.full(1, -1), [])
    assert source_tally(evidence, np.array([True])) is None  # no sources


def test_sources_are_read_from_files_as_the_defenses_read_them(tmp_path: Path) -> None:
    """A JSONL record's other fields and its ``metadata`` object are its metadata; the source
    is read from it with the per-query defenses' rules (a web address counts per host)."""
    path = tmp_path / "kb.jsonl"
    records = [
        {"id": "a", "text": "one", "url": "https://www.who.int/news/1"},
        {"id": "b", "text": "two", "metadata": {"source": "uploads/q3.pdf"}, "url": "x"},
        {"id": "c", "text": "three"},
        {"id": "d", "text": "four", "metadata": '{"file_path": "notes.md"}'},  # as exported
        {"id": "e", "text": "five", "metadata": "not JSON"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    batch = next(FileCorpus(path).batches(10))
    assert batch.metadata == [
        {"url": "https://www.who.int/news/1"}, {"url": "x", "source": "uploads/q3.pdf"}, {},
        {"file_path": "notes.md"}, {},
    ]  # fmt: skip
    from ragdefense.provenance import metadata_source

    assert [metadata_source(m) for m in batch.metadata] == [
        "who.int", "uploads/q3.pdf", None, "notes.md", None
    ]  # fmt: skip


def test_an_unreachable_ray_cluster_is_named_at_once() -> None:
    """``ray.init`` waits on an address nothing answers without end: checked first."""
    import socket

    from ragdefense.auditing.engines import _reachable

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # closed again below: nothing listens there
    t0 = time.monotonic()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(ConnectionError, match="cannot reach the Ray cluster"):
            _reachable(address)
    assert time.monotonic() - t0 < 5
    for address in (None, "auto", "local"):
        _reachable(address)  # Ray's own forms: left to Ray


def test_in_a_component_larger_than_max_group_only_near_copies_are_groups(tmp_path: Path) -> None:
    """A near-duplicate component larger than ``max_group`` is a topic: within it only
    near-copies (cosine 0.95 or more) form groups, of any size. 35 near-copies joined by a looser
    edge to the honest passage they copy come out as one group of 35 without it (before, the
    whole component was a topic and nothing was a group, so a planted set of more than
    ``max_group`` escaped quarantine); a loose topic of 40 holding one pair of near-copies
    gives that pair, and no group of its looser articles."""
    rng = np.random.default_rng(3)
    dim = 64

    def unit(v: np.ndarray) -> np.ndarray:
        out: np.ndarray = v / np.linalg.norm(v, axis=-1, keepdims=True)
        return out

    planted, topic = unit(rng.normal(size=(2, dim)))
    copies = unit(planted + 0.05 * unit(rng.normal(size=(35, dim))))
    honest = unit(planted + 0.75 * _orthogonal(rng, planted))  # cosine 0.8 to the copies
    loose = unit(topic + 0.45 * unit(rng.normal(size=(40, dim))))  # pairwise cosine ~0.83
    loose[1] = unit(loose[0] + 0.1 * _orthogonal(rng, loose[0]))  # a pair of near-copies
    small = unit(unit(rng.normal(size=dim)) + 0.4 * unit(rng.normal(size=(3, dim))))
    vectors = np.vstack([unit(rng.normal(size=(300, dim))), copies, honest, loose, small])
    assert (vectors[300:335] @ honest).max() >= 0.8  # one component with the copies at 0.8
    ids = [f"b{i}" for i in range(300)] + [f"p{i}" for i in range(35)] + ["truth"]
    ids += [f"t{i}" for i in range(40)] + ["s0", "s1", "s2"]
    texts = [f"a stored chunk {i}" for i in ids]
    corpus = ListCorpus(texts, ids, None, vectors.astype(np.float32))

    def embed(batch: list[str]) -> np.ndarray:
        return np.vstack([np.random.default_rng(len(t)).normal(size=dim) for t in batch])

    def groups(folder: str, **scoring: Any) -> dict[str, Any]:
        report = audit(corpus, embedder=embed, workdir=tmp_path / folder,
                       scoring=Scoring(apart=0, **scoring))  # fmt: skip
        found = {f.id: f.group for f in report.findings}
        assert len(found) == len(ids)
        return found

    group = groups("a")
    assert {group[f"p{i}"]["id"] for i in range(35)} == {group["p0"]["id"]}  # one group ...
    assert group["p0"]["size"] == 35 and group["truth"] is None  # ... without the honest one
    assert group["t0"]["size"] == 2 and group["t1"] == group["t0"]  # the topic's near-copies
    assert all(group[f"t{i}"] is None for i in range(2, 40))  # and no group of its articles
    assert group["s0"]["size"] == 3  # a small component is a group at 0.8, as before
    # with a larger max_group nothing is cut: the honest passage is in the copies' group
    joined = groups("b", max_group=36)
    assert joined["truth"] is not None and joined["truth"]["size"] == 36
    # near-copies are a group however large, whatever the groups' own similarity
    assert groups("c", group_similarity=0.95)["p0"]["size"] == 35


def test_copies_the_default_leaves_out_are_no_flags(tmp_path: Path) -> None:
    """An honest part ingested twice: with a query log, the default leaves each text's later
    copy out of every context, which is no removal of that text. Only the planted sets are
    suspicious, and no honest text is quarantined."""
    texts, ids, planted = toy_corpus()
    again = [i for i, x in enumerate(ids) if x.startswith("b2-")][:6]
    corpus = ListCorpus(
        texts + [texts[i] for i in again], ids + [f"{ids[i]}-again" for i in again], None, None
    )
    queries = ["piano concert orchestra symphony violin", "orchestra symphony piano"]
    embed = CallableEmbedder(bag_of_words)
    report = audit(corpus, embedder=embed, queries=queries, workdir=tmp_path / "w")
    assert {f.id for f in report.suspicious} == planted
    guard = Quarantine.from_report(report)
    assert not any(guard.reason(Passage(texts[i])) for i in again)


def test_stored_vectors_of_another_model_are_named(toy: CallableEmbedder, tmp_path: Path) -> None:
    """A store embedded by another model of the audit's width was compared with the audit's
    probes without a word (nothing found); one embedded by the audit's model says nothing."""
    texts, ids, _ = toy_corpus()
    own = np.asarray(toy.embed(texts))
    rotation, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(own.shape[1],) * 2))
    other = ListCorpus(texts, ids, None, own @ rotation)
    with pytest.warns(UserWarning, match=r"do not look like the audit's .* pass embedder="):
        audit(other, embedder=toy, workdir=tmp_path / "o")
    # (review) said once, as a warning: the report, and a resumed run's, said nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed = audit(other, embedder=toy, workdir=tmp_path / "o")
    [said] = resumed.stats["cautions"]
    assert "do not look like" in said and f"**Caution**: {said}" in resumed.to_markdown()
    # the same model over text and metadata (LlamaIndex embeds a node's with its text)
    noted = np.asarray(toy.embed([f"title: a report of the library. {t}" for t in texts]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = audit(ListCorpus(texts, ids, None, own), embedder=toy, workdir=tmp_path / "s")
        audit(ListCorpus(texts, ids, None, noted), embedder=toy, workdir=tmp_path / "m")
    assert same.stats["cautions"] == [] and "**Caution**" not in same.to_markdown()


def test_a_small_clean_knowledge_base_is_reported_with_a_caution(tmp_path: Path) -> None:
    """The demo's 36 honest passages (three per topic, far-apart topics): two thirds of them
    flagged, with nothing to say the scores were not made for so few."""
    texts = [t for q in load_demo_kb() for t in q.benign]
    report = audit(texts, workdir=tmp_path / "w", progress=False)
    assert 5 * len(report.suspicious) > len(texts)
    assert "**Caution**" in report.to_markdown()


def test_an_audit_that_failed_on_its_input_does_not_hold_the_folder(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    """An audit refused for its input (an empty file, a duplicated id) recorded its parameters
    first: the corrected input was then refused as "an audit made with other parameters",
    though nothing had been read. An audit that had read its knowledge base still is."""
    texts, ids, _ = toy_corpus()
    kb, work = tmp_path / "kb.jsonl", tmp_path / "w"
    kb.write_text("")
    with pytest.raises(ValueError, match="empty"):
        audit(kb, embedder=toy, workdir=work)

    def lines(order: list[str]) -> str:
        return "".join(
            json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(ids, order, strict=True)
        )

    kb.write_text(lines(texts))
    with pytest.warns(UserWarning, match=r"stopped while reading .*\(0 chunk part"):
        assert audit(kb, embedder=toy, workdir=work).stats["chunks"] == len(texts)
    twice = tmp_path / "twice.jsonl"  # an id repeated at the end: refused after two parts
    twice.write_text(lines(texts) + json.dumps({"id": ids[0], "text": "again"}) + "\n")
    with pytest.raises(ValueError, match="same id"):
        audit(twice, embedder=toy, workdir=tmp_path / "w2", part_size=len(texts) // 2)
    twice.write_text(lines(texts))
    with pytest.warns(UserWarning, match=r"\(2 chunk part\(s\) written\).*\(knowledge_base\)"):
        audit(twice, embedder=toy, workdir=tmp_path / "w2", part_size=len(texts) // 2)
    other = tmp_path / "other.jsonl"
    other.write_text(lines(texts[::-1]))
    with pytest.raises(ValueError, match="other parameters"):
        audit(other, embedder=toy, workdir=work)  # a finished audit's folder stays its own


def test_an_empty_page_is_no_chunks_neighbour(minilm: object) -> None:
    """A blank chunk's zero row came back from the index at cosine 0 where a chunk had fewer
    neighbours than asked: it became the chunk's nearest (0 instead of none), and a logged
    question then read the honest chunk as written for it."""
    honest = "The Eiffel Tower is in Paris, France."
    log = ["Where is the Eiffel Tower?"]
    alone = audit([honest], embedder=minilm, queries=log)
    beside = audit(["", honest, "   "], embedder=minilm, queries=log)
    assert alone.stats["suspicious"] == beside.stats["suspicious"] == 0
    assert [f.score for f in beside.findings if f.text == honest] == [alone.findings[0].score]


def test_a_retriever_given_to_audit_is_told_to_pass_its_store(tmp_path: Path) -> None:
    """A LangChain retriever got the generic "cannot audit a VectorStoreRetriever: pass a
    .jsonl ..."; the adapter's own words, pass the store itself, were dropped."""
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.vectorstores import InMemoryVectorStore

    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=8))
    store.add_texts(["alpha beta gamma", "delta epsilon zeta"])
    with pytest.raises(TypeError, match=r"pass the vector store \(or index\) itself"):
        audit(store.as_retriever(), workdir=tmp_path / "w")


def test_the_cli_refuses_a_top_m_below_two_in_its_own_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--top-m 1`` printed the Python field's name and unrelated limits."""
    from ragdefense.cli import main

    kb = tmp_path / "kb.jsonl"
    kb.write_text('{"id": "a", "text": "one"}\n')
    with pytest.raises(SystemExit):
        main(["audit", str(kb), "--top-m", "1"])
    assert "argument --top-m: must be 2 or more, got 1" in capsys.readouterr().err
