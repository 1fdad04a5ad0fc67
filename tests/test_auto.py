from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.runner import resolve_defense
from ragdefense import AutoDefense, DefenseInputError, DefenseResult, Embedder, Verdict
from ragdefense import defense as make_defense
from ragdefense.types import to_passages

from .test_grada import BENIGN, POISON, Q


class Flags:
    """A scripted stand-in for RAGDefender: flags the given indices (unit tests of the regime
    decision; the real RAGDefender runs in the other tests)."""

    name = "RAGDefender"

    def __init__(self, flagged: set[int]) -> None:
        self.flagged = flagged

    def defend_embeddings(
        self, query: str, passages: Sequence[Any], emb: Any, q_emb: Any = None
    ) -> DefenseResult:
        verdicts = tuple(
            Verdict(i, p, i not in self.flagged, float(i in self.flagged), "scripted")
            for i, p in enumerate(to_passages(passages))
        )
        return DefenseResult("RAGDefender", query, verdicts, "pair_score", {"n_adv": 0})


def unit(*rows: Sequence[float]) -> np.ndarray:
    a = np.asarray(rows, dtype=float)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def axis(i: int, dim: int = 12) -> np.ndarray:
    v = np.zeros(dim)
    v[i] = 1.0
    return v


QV = axis(0)  # the query


def mix(q: float, other: np.ndarray) -> np.ndarray:
    """A passage with query cosine ``q`` whose remaining direction is ``other``."""
    return q * QV + np.sqrt(1 - q * q) * other


# three near-identical passages ranked above five unrelated ones
GROUP = [mix(0.8, axis(1) + 0.01 * axis(2 + j)) for j in range(3)]
SPREAD = [mix(0.5, axis(5 + j)) for j in range(5)]
TEXTS = [f"passage {i}" for i in range(8)]


def run(emb: list[np.ndarray], flagged: set[int], **params: Any) -> DefenseResult:
    auto = AutoDefense(**params)
    auto.ragdefender = Flags(flagged)  # type: ignore[assignment]
    return auto.defend_embeddings(Q, [f"passage {i}" for i in range(len(emb))], unit(*emb), QV)


def test_coordinated_group_above_the_rest_is_removed_before_grada() -> None:
    r = run(GROUP + SPREAD, flagged=set())
    assert r.estimates["regime"] == "coordinated groups"
    assert r.estimates["decided_by"] == "GRADA" and r.estimates["evidence"]["groups"] == [[0, 1, 2]]
    assert not set(r.kept_indices) & {0, 1, 2} and len(r.kept) == 4  # GRADA keeps M // 2
    assert all(
        r.verdicts[i].reason.startswith("removed: coordinated group 1 of 3") for i in (0, 1, 2)
    )
    assert r.defense == "AutoDefense" and r.score_name == "GRADA: pagerank"


def test_flagged_passages_close_to_the_group_go_with_it() -> None:
    near = mix(0.7, (axis(1) + axis(4)) / np.sqrt(2))  # cosine ~0.86 with the group: not in it
    emb = [*GROUP, near, *SPREAD]
    alone = run(emb, flagged=set())  # not flagged: left to GRADA
    assert alone.estimates["evidence"]["groups"] == [[0, 1, 2]]
    assert "PageRank" in alone.verdicts[3].reason
    r = run(emb, flagged={3})
    assert not r.verdicts[3].kept
    assert r.verdicts[3].reason.startswith("removed: flagged by RAGDefender and close to")
    # ... unless a passage left over ranks above the group: then the flags are not trusted
    top = mix(0.95, axis(11))
    r = run([*emb, top], flagged={3})
    assert r.verdicts[3].kept and r.estimates["evidence"]["not_absorbed"] == [3]
    assert run(emb, flagged={3}, absorb=None).verdicts[3].kept


def test_tight_flagged_majority_not_ranked_above_is_trusted() -> None:
    majority = [mix(0.5, axis(1) + 0.02 * axis(2 + j)) for j in range(5)]  # as relevant as the rest
    emb = majority + SPREAD[:2]
    r = run(emb, flagged={0, 1, 2, 3, 4})
    assert r.estimates["regime"] == "poisoned majority" and r.kept_indices == [5, 6]
    assert r.estimates["evidence"]["flagged_least_cosine"] > 0.99
    assert r.score_name == "RAGDefender: pair_score"
    # flags on passages that are not alike: a minority at most, GRADA decides
    loose = run(SPREAD + majority[:2], flagged={0, 1, 2, 3})
    assert loose.estimates["regime"] == "minority" and loose.estimates["decided_by"] == "GRADA"
    assert "not tight" in loose.estimates["why"]
    # the switches of the ablation
    assert run(emb, {0, 1, 2, 3, 4}, majority_tightness=None).estimates["regime"] == "minority"
    assert run(GROUP + SPREAD, set(), peel=False).estimates["regime"] == "minority"


def test_few_passages_bad_input_and_names() -> None:
    r = AutoDefense().defend(Q, ["only one"])
    assert r.estimates["regime"] == "too few passages" and r.kept_indices == [0]
    with pytest.raises(DefenseInputError, match="shape"):
        AutoDefense().defend_embeddings(Q, TEXTS, np.ones((3, 4)), QV)
    with pytest.raises(DefenseInputError, match="query embedding size"):
        AutoDefense().defend_embeddings(Q, TEXTS, unit(*GROUP, *SPREAD), np.ones(3))
    with pytest.raises(ValueError, match="absorb"):
        AutoDefense(absorb=2.0)
    assert isinstance(make_defense("auto", majority_tightness=0.9), AutoDefense)
    assert callable(resolve_defense("auto"))


@pytest.mark.slow
def test_with_the_real_model_and_ragdefender(minilm: Embedder) -> None:
    passages = POISON + BENIGN
    before = list(passages)
    r = AutoDefense(embedder=minilm).defend(Q, passages)
    assert passages == before
    assert r.estimates["regime"] == "coordinated groups"
    assert r.kept_indices and not set(r.kept_indices) & {0, 1, 2}
    assert "ragdefender_flagged" in r.estimates["evidence"]
    assert "regime=coordinated groups" in str(r)


@pytest.mark.slow
@pytest.mark.data
def test_auto_benchmark_smoke(data_dir: Path, minilm: Embedder) -> None:
    from benchmarks import auto_table

    if not (data_dir / "realtimeqa").is_dir():
        pytest.skip("no realtimeqa data")
    rows, table = auto_table(data_dir, datasets=["nq"], ratios=[1], n_poison=[3], limit=20)
    by = {(r["dataset"], r["defense"]): r for r in rows}
    auto = "**auto**"
    # the minority regime: as good as the peel, far better than RAGDefender and GRADA
    assert by[("realtimeqa", auto)]["poison_share"] < by[("realtimeqa", "grada")]["poison_share"]
    assert (
        by[("realtimeqa", auto)]["poison_share"] < by[("realtimeqa", "ragdefender")]["poison_share"]
    )
    # the poisoned majority: far better than GRADA, with or without the peel
    assert by[("nq", auto)]["poison_share"] < by[("nq", "groups only (grada-peel)")]["poison_share"]
    assert "auto misses" in table and "tight majority only" in table


def test_a_page_stored_twice_is_no_coordinated_majority_nor_group() -> None:
    """RAGDefender flags two copies of one text as its most similar pair (its design), and
    AutoDefense read their cosine of 1 as a tight majority of 2 out of 9; and a copy of the
    top passage lifted a pair past the peel's margin (counted twice in the mean)."""
    rng = np.random.default_rng(0)
    emb = np.c_[np.full(8, 2.0), rng.normal(size=(8, 15))]
    q = np.r_[1.0, np.zeros(15)]
    texts = [
        f"passage {w} about topic 0"
        for w in ["alpha", "bravo", "charlie", "delta", "echo", "fox", "golf", "hotel"]
    ]
    order = [*range(8), 1]  # passage 1 stored twice
    once = AutoDefense().defend_embeddings("question?", texts, emb, q)
    twice = AutoDefense().defend_embeddings("question?", [texts[i] for i in order], emb[order], q)
    assert once.estimates["regime"] == twice.estimates["regime"] == "minority"

    def unit(qs: float, k: int) -> np.ndarray:
        v = np.zeros(9)
        v[0], v[k] = qs, np.sqrt(1 - qs**2)
        return v

    emb9 = np.array([unit(0.94, 1), unit(0.87, 1)] + [unit(0.89, k) for k in range(2, 8)])
    pages = [
        f"{w} page."
        for w in ["Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel"]
    ]
    for order in (list(range(8)), [*range(8), 0]):  # Alpha and Bravo lifted by 0.015 only
        r = AutoDefense().defend_embeddings(
            "q?", [pages[i] for i in order], emb9[order], np.eye(9)[0]
        )
        assert "groups" not in r.estimates.get("evidence", {}), order


@pytest.mark.parametrize(("copies", "regime"), [(2, "minority"), (3, "poisoned majority")])
def test_one_text_flagged_three_times_is_a_majority_twice_is_not(copies: int, regime: str) -> None:
    """Tightness is read on distinct texts: two copies of a page flagged are one text, no
    group; three or more are a passage repeated, as step 1 reads them (the injection family's
    identical planted copies), and RAGDefender's verdicts stand."""
    rng = np.random.default_rng(0)
    emb = np.c_[np.full(8, 2.0), rng.normal(size=(8, 15))]
    texts = [f"passage {w} about topic 0" for w in ["a", "b", "c", "d", "e", "f", "g", "h"]]
    order = [*range(8), *[1] * (copies - 1)]
    flagged = [1, *range(8, 8 + copies - 1)]

    class Flags:  # RAGDefender's flags: exactly the copies
        def defend_embeddings(self, query: str, items: Sequence[Any], *args: Any) -> DefenseResult:
            given = to_passages(items)
            verdicts = tuple(
                Verdict(i, p, i not in flagged, 0.0, "kept" if i not in flagged else "removed")
                for i, p in enumerate(given)
            )
            return DefenseResult("RAGDefender", query, verdicts, "score")

    auto = AutoDefense(peel=False)
    auto.ragdefender = Flags()  # type: ignore[assignment]
    r = auto.defend_embeddings(
        "q?", [texts[i] for i in order], emb[order], np.r_[1.0, np.zeros(15)]
    )
    assert r.estimates["regime"] == regime
