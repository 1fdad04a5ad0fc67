"""The default's verdicts do not hang on how the pool is handed over: the order of the passages
(beyond which copy of a text stands for it) and copies of them (a pool ingested twice). Found
by an independent metamorphic review: which restating passages went with a group, and which of
two equally supported passages the support vote dropped, followed the input order; copies
counted toward ``min_pool`` and ``min_passages``, so a pool ingested twice was judged where it
was not once."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragdefense import Consensus, Passage


def _removed(result: Any, texts: list[str]) -> list[str]:
    """The texts removed on evidence (a copy left out beside the copy standing for it is not)."""
    return sorted({texts[v.index] for v in result.verdicts if not v.kept and not v.details["copy"]})


def _unit(qs: float, direction: np.ndarray) -> np.ndarray:
    d = direction / np.linalg.norm(direction)
    return np.r_[qs, np.sqrt(1 - qs**2) * d]


def test_passages_restating_a_group_go_by_rank_not_by_input_order() -> None:
    """A pair G1 / G2 lifted above the rest; A, B and C restate it (A most, at the higher query
    similarity), and the cap of half the pool leaves room for two of them. The two best
    ranked go whatever the order; C, first in the input, took A's place."""
    e, q = np.eye(6), np.r_[1.0, np.zeros(6)]
    turn = [np.cos(a) * e[1] + np.sin(a) * e[2] for a in (0, 2 * np.pi / 3, 4 * np.pi / 3)]
    half = np.pi / 6
    rows = [
        _unit(0.96, np.cos(half) * e[0] + np.sin(half) * e[5]),
        _unit(0.96, np.cos(half) * e[0] - np.sin(half) * e[5]),
        _unit(0.955, -0.3 * e[0] + np.sqrt(0.91) * turn[0]),
        _unit(0.95, -0.4 * e[0] + np.sqrt(0.84) * turn[1]),
        _unit(0.945, -0.5 * e[0] + np.sqrt(0.75) * turn[2]),
        _unit(0.2, e[3]),
        _unit(0.2, e[4]),
        _unit(0.2, e[3] + e[4] - e[5]),
    ]
    texts = ["G1", "G2", "A", "B", "C", "F1", "F2", "F3"]
    seen = set()
    for order in ([0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 4, 3, 2, 5, 6, 7], [7, 4, 6, 3, 5, 2, 1, 0]):
        emb = np.array([rows[i] for i in order])
        result = Consensus().defend_embeddings("q", [texts[i] for i in order], emb, q)
        seen.add(tuple(_removed(result, [texts[i] for i in order])))
    assert seen == {("A", "B", "G1", "G2")}


def test_copies_do_not_lift_a_pool_to_min_passages() -> None:
    """Two distinct passages are too few for the text alone (``min_passages=3``), and a copy of
    either made the pool of three judged. Copies count once now: without trust nothing is
    removed from any of the three pools; with one passage trusted, the other is compared
    with it (step 3) in every one of them alike, and contradicting it, goes."""
    trusted = Passage(
        "Trusted answer.",
        metadata={"source": "https://kb.example/a", "trusted": True},
        embedding=np.array([0.5, 0.75**0.5, 0.0]),
    )
    other = Passage(
        "Other answer.",
        metadata={"source": "https://web.example/b"},
        embedding=np.array([0.9, 0.0, 0.19**0.5]),
    )
    q = np.array([1.0, 0.0, 0.0])
    pools = ([trusted, other], [trusted, other, other], [trusted, trusted, other])
    for trust, expected in ((None, []), (lambda m: m.get("trusted", False), ["Other answer."])):
        d = Consensus(trusted=trust)
        for pool in pools:
            result = d.defend_embeddings("which answer?", pool, query_embedding=q)
            assert _removed(result, [p.text for p in pool]) == expected, (trust, pool)
            if not expected:
                assert "2 distinct passage(s): nothing to compare" in result.estimates["note"]
            else:
                assert "contradicts the trusted" in result.verdicts[pool.index(other)].reason


def test_below_min_passages_only_the_trust_step_acts() -> None:
    """Under a raised ``min_passages``, a pool of three distinct passages holding a trusted
    one is judged by trust alone: two planted near-copies lifted above it are no coordinated
    group there (the whole pipeline ran), and with ``anchor=None`` nothing is removed."""

    def unit(*v: float) -> np.ndarray:
        return np.array(v) / np.linalg.norm(v)

    planted = [
        Passage("Planted one.", embedding=unit(0.95, 0.3, 0.05, 0, 0)),
        Passage("Planted two.", embedding=unit(0.95, 0.3, 0.0, 0.05, 0)),
    ]
    answer = Passage(
        "Trusted answer.", metadata={"trusted": True}, embedding=unit(0.6, 0, 0, 0, 0.8)
    )
    q = np.array([1.0, 0, 0, 0, 0])
    trust = lambda m: m.get("trusted", False)  # noqa: E731
    for anchor in (0.05, None):
        d = Consensus(trusted=trust, min_passages=5, anchor=anchor)
        result = d.defend_embeddings("which?", [answer, *planted], query_embedding=q)
        assert "groups" not in result.estimates
        assert all("coordinated group" not in v.reason for v in result.verdicts)
        if anchor is None:
            assert result.removed == []
    # the support vote's note names the floor that stopped it: min_passages here, not min_pool
    raised = Consensus(trusted=trust, min_passages=12).defend_embeddings(
        "which?", [answer, *planted], query_embedding=q
    )
    assert raised.estimates["support"] == "skipped: 3 distinct texts, under min_passages=12"
    judged = Consensus(trusted=trust).defend_embeddings(
        "which?", [answer, *planted], query_embedding=q
    )
    assert "groups" in judged.estimates  # at the default floor the group is evidence


@pytest.mark.slow
@pytest.mark.data
def test_verdicts_do_not_follow_the_input_order_or_copies(data_dir: Path, minilm: Any) -> None:
    """RealtimeQA pools with PoisonedRAG passages, and MS MARCO's one answer among planted
    passages: the removed texts are the same shuffled, and with the pool ingested twice."""
    from benchmarks.cases import attack_passages, provenance_case
    from benchmarks.datasets import load_qa

    rng = random.Random(0)
    records = load_qa(data_dir, "realtimeqa", 12)
    checked = 0
    for r in records:
        case = provenance_case(
            r, attack_passages(r, "poisonedrag", 5), minilm, benign_top=20, k=5, m=10
        )["plain"]
        texts = [p.text for p in case.passages]
        q = case.extra["query_embedding"]
        first = _removed(Consensus().defend_embeddings(r.question, case.passages, None, q), texts)
        for _ in range(3):
            order = rng.sample(range(len(texts)), len(texts))
            pool = [case.passages[i] for i in order]
            got = Consensus().defend_embeddings(r.question, pool, None, q)
            assert _removed(got, [texts[i] for i in order]) == first, (r.question, order)
        twice = Consensus().defend_embeddings(r.question, case.passages * 2, None, q)
        assert _removed(twice, texts * 2) == first
        checked += 1
    assert checked == len(records) > 0
    marco = load_qa(data_dir, "ragdefender/msmarco", None)
    r = next(x for x in marco if x.question == "what day is groundhog's day?")
    from ragdefense.attacks import poisonedrag

    pool = [r.benign[0], *poisonedrag(r.question, r.poison[:5])]
    once = Consensus(embedder=minilm).defend(r.question, pool)
    twice = Consensus(embedder=minilm).defend(r.question, pool + pool)
    assert 0 in once.kept_indices and 0 in twice.kept_indices  # the answer stays
