"""Oracle tests: the hand-written similarity code equals the libraries it replaces."""

from __future__ import annotations

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
