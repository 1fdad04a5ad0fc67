"""Oracle tests: the hand-written similarity code equals the libraries it replaces."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist

from ragdefense.similarity import BM25, cut
from ragdefense.text import ENGLISH_STOP_WORDS, tokenize

TEXTS = [
    "Paris is the capital of France and its largest city.",
    "The capital of France is Paris, on the Seine.",
    "Berlin is the capital of Germany.",
    "Lyon is a large city in France, known for food food food.",
    "Mount Everest is the highest mountain on Earth.",
]


def test_stop_words_equal_scikit_learn() -> None:
    sklearn_text = pytest.importorskip("sklearn.feature_extraction.text")
    assert sklearn_text.ENGLISH_STOP_WORDS == ENGLISH_STOP_WORDS


@pytest.mark.parametrize("query", [*TEXTS[:3], "capital city of France"])
def test_bm25_equals_bm25s_lucene_times_k1_plus_1(query: str) -> None:
    bm25s = pytest.importorskip("bm25s")
    scorer = BM25(k1=1.5, b=0.75)
    _, ours = scorer.matrices(TEXTS, query)
    assert ours is not None
    index = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    index.index([tokenize(t) for t in TEXTS], show_progress=False)
    theirs = index.get_scores(sorted(set(tokenize(query))))
    np.testing.assert_allclose(ours, theirs * (1.5 + 1), rtol=1e-5)


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("method", ["average", "ward"])
def test_cut_equals_fcluster(seed: int, method: str) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 32))
    points = rng.normal(size=(n, 4))
    if seed % 4 == 0:  # ties: repeated points
        points[n // 2 :] = points[: n - n // 2]
    tree = linkage(pdist(points, "cosine"), method=method)
    for height in np.quantile(tree[:, 2], [0.0, 0.3, 0.7, 1.0]):
        _same_partition(cut(tree, height=height), fcluster(tree, height, "distance"))
    for k in (1, 2, 3, n):
        _same_partition(cut(tree, clusters=k), fcluster(tree, k, "maxclust"))


def _same_partition(a: np.ndarray, b: np.ndarray) -> None:
    """Equal as partitions (label numbering may differ)."""
    pairs = set(zip(a.tolist(), b.tolist(), strict=True))
    assert len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def test_a_term_the_query_text_repeats_counts_once() -> None:
    """The documented departure from ``bm25s``: "food food food lyon" scores against a
    document as "food lyon" does (bm25s adds "food" three times)."""
    from ragdefense.similarity import BM25

    docs = ["lyon food market", "paris museum", "food lyon food"]
    for corpus in ("retrieved", "pair"):
        bm25 = BM25(corpus=corpus)  # type: ignore[arg-type]
        repeated = bm25.matrices(docs, query="food food food lyon")[1]
        once = bm25.matrices(docs, query="food lyon")[1]
        assert repeated is not None and once is not None and repeated[0] > 0
        np.testing.assert_allclose(repeated, once)
        assert bm25.matrices(docs)[0][2, 0] == pytest.approx(once[0])  # and as a passage


def test_a_tie_at_the_two_cluster_cut_gives_no_estimate() -> None:
    """Five passages all equally far apart: no two-cluster split is better than another, so
    RAGDefender estimates nothing (scikit-learn would split them arbitrarily)."""
    from ragdefense import RAGDefender

    gram = np.full((5, 5), 0.5) + 0.5 * np.eye(5)
    vectors = np.linalg.cholesky(gram)
    texts = [f"capital France {c}" for c in ("Paris", "Lyon", "Nice", "Lille", "Metz")]
    result = RAGDefender(task_type="single_hop").defend_embeddings("capital?", texts, vectors)
    assert result.removed_indices == [] and result.estimates["n_adv"] == 0


def test_a_tie_at_the_cut_is_a_tie_in_any_order_and_says_so() -> None:
    """Equal merge heights differing by rounding split in some input orders and not in others
    (4 of 24 orders of four equidistant rotated vectors removed two passages); and the result
    said only "no adversarial passage", never that the cut was tied."""
    import itertools

    from ragdefense import RAGDefender

    rotation, _ = np.linalg.qr(np.random.default_rng(5).normal(size=(16, 16)))
    vectors = rotation[:4]  # four points equally far apart, in float noise
    texts = ["capital france marseille", "capital france strasbourg", "capital france toulouse",
             "paris heart france"]  # fmt: skip
    defense = RAGDefender(task_type="single_hop")
    orders = itertools.permutations(range(4))
    for dtype, order in itertools.product((np.float64, np.float32), list(orders)):
        chosen = list(order)  # float32: an embedder's own rounding, wider than float64's
        given = vectors[chosen].astype(dtype)
        result = defense.defend_embeddings("q", [texts[i] for i in chosen], given)
        assert result.removed_indices == [], (dtype, order)
        assert all("the two-cluster cut is tied" in v.reason for v in result.verdicts)


def test_bm25_over_many_long_passages_is_computed_sparse_with_the_same_scores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """BM25 held passages x vocabulary dense matrices: hundreds of long passages (GRADA at
    ``MAX_PASSAGES``) took gigabytes and seconds. Past ``DENSE_CELLS`` they are sparse."""
    from ragdefense import similarity

    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(400)]
    texts = [" ".join(rng.choice(words, int(rng.integers(5, 60)))) for _ in range(40)]
    query = " ".join(rng.choice(words, 6))
    made: list[object] = []
    real = similarity._matrix

    def spy(*args: Any) -> Any:
        made.append(real(*args))
        return made[-1]

    for bm25 in (BM25(), BM25(k1=0.0), BM25(corpus="pair")):
        dense = bm25.matrices(texts, query)
        monkeypatch.setattr(similarity, "DENSE_CELLS", 0)
        monkeypatch.setattr(similarity, "_matrix", spy)
        sparse = bm25.matrices(texts, query)
        monkeypatch.undo()
        assert made and all(hasattr(m, "toarray") for m in made)  # the sparse path ran
        made.clear()
        assert isinstance(sparse[0], np.ndarray) and isinstance(sparse[1], np.ndarray)
        np.testing.assert_allclose(sparse[0], dense[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(sparse[1], dense[1], rtol=1e-12, atol=1e-12)
