"""Similarities between passages, and what is computed from them: cosine, BM25 (pairwise and
to the query), weighted PageRank, and cutting a hierarchical clustering into flat clusters.

Small and vectorised for the 3-40 passages a defense sees; each equals its library counterpart
(tests compare them: ``networkx.pagerank``, ``scipy``'s ``fcluster``, ``bm25s``).

BM25 ``(a -> b)`` scores text ``a`` as the query against text ``b`` as the document: with the
standard formula (Robertson & Zaragoza 2009), summed over the distinct terms of ``a``::

    idf(t) * tf(t, b) * (k1 + 1) / (tf(t, b) + k1 * (1 - b_ + b_ * len(b) / avgdl))

Two choices of the collection that ``idf`` and ``avgdl`` come from:

* ``corpus="retrieved"`` (default): the retrieved passages themselves;
  ``idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))``. Terms every passage shares weigh little.
* ``corpus="pair"``: each document alone (the GRADA authors' one-document ``bm25s`` index):
  ``idf = ln(4/3)`` for every term and no length normalisation.

Tokens: lower-cased words of two or more characters, English stop words removed
(:func:`ragdefense.text.tokenize`). A term counts once however often the query text ``a``
repeats it, where ``bm25s`` adds it once per repeat: for a query text without repeated terms,
with ``corpus="retrieved"``, the scores equal ``bm25s``' ``method="lucene"`` scores times
``(k1 + 1)`` (a constant factor; tested), and a text repeating its words is scored lower here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from math import isfinite, log
from numbers import Real
from typing import Any, Literal

import numpy as np

from .text import DENSE_CELLS, term_cells, tokenize

__all__ = ["BM25", "cosine_matrix", "cosine_to", "cut", "pagerank", "pairs_among", "unit_rows"]


def cosine_to(emb: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``emb`` to the vector ``q`` (a zero row: 0)."""
    emb = np.asarray(emb)
    kind = emb.dtype.type if np.issubdtype(emb.dtype, np.floating) else np.float64
    query = unit_rows(np.reshape(q, (1, -1)))[0]
    out: np.ndarray = unit_rows(emb, kind) @ query.astype(kind)
    return out


#: a row norm outside this range may have overflowed or underflowed on the way
_SAFE_NORMS = (1e-150, 1e150)


def unit_rows(emb: np.ndarray, dtype: type = np.float64) -> np.ndarray:
    """The rows of ``emb`` scaled to unit length, as ``dtype`` (zero rows, and rows holding NaN
    or infinite values, come out zero). A finite row whose norm overflows or vanishes (values
    near the float range's ends) is divided by its largest magnitude first: it keeps its
    direction."""
    emb = np.asarray(emb)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        norms = np.linalg.norm(emb, axis=1, keepdims=True)
    zeros: np.ndarray = np.zeros(np.shape(emb), dtype=dtype)
    low, high = _SAFE_NORMS
    size = norms[:, 0].astype(np.float64)
    odd = ~((size >= low) & (size <= high))  # NaN, inf, 0 or near the float range's ends
    out: np.ndarray = np.divide(emb, norms, out=zeros, where=(norms > 0) & ~odd[:, None])
    if odd.any():
        rows = np.asarray(emb[odd], dtype=np.float64)
        finite = np.isfinite(rows).all(axis=1, keepdims=True)
        peak = np.max(np.abs(np.where(finite, rows, 0.0)), axis=1, keepdims=True)
        scaled = np.divide(rows, peak, out=np.zeros_like(rows), where=finite & (peak > 0))
        length = np.linalg.norm(scaled, axis=1, keepdims=True)
        out[odd] = np.divide(scaled, length, out=np.zeros_like(scaled), where=length > 0)
    return out


def cosine_matrix(emb: np.ndarray) -> np.ndarray:
    """Pairwise cosine similarities of the rows of ``emb`` (a zero row has similarity 0).

    Examples:
        >>> import numpy as np
        >>> cosine_matrix(np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])).round(3).tolist()
        [[1.0, 0.707, 0.0], [0.707, 1.0, 0.0], [0.0, 0.0, 0.0]]
    """
    unit = unit_rows(emb)
    sim: np.ndarray = unit @ unit.T
    clipped: np.ndarray = np.clip(sim, -1.0, 1.0)
    return clipped


def pairs_among(sim: np.ndarray, idx: Sequence[int] | np.ndarray) -> np.ndarray:
    """The similarities of every pair among the rows ``idx`` of the square matrix ``sim``
    (each pair once; empty for fewer than two)."""
    at = np.asarray(idx, dtype=np.intp)
    return np.asarray(sim[np.ix_(at, at)][np.triu_indices(len(at), 1)])


def pagerank(
    weights: np.ndarray, damping: float = 0.85, tol: float = 1e-6, max_iter: int = 100
) -> tuple[np.ndarray, int, bool]:
    """Weighted PageRank by power iteration, as ``networkx.pagerank`` (uniform start and
    teleport, dangling nodes spread uniformly, stop when the L1 change < n * tol).

    Returns the scores (summing to 1), the iterations run and whether it converged.
    """
    n = weights.shape[0]
    if n == 0:
        return np.zeros(0), 0, True
    w = np.where(np.eye(n, dtype=bool), 0.0, np.maximum(weights, 0.0))
    out = w.sum(axis=1)
    dangling = out == 0
    p = np.divide(w, out[:, None], out=np.zeros_like(w), where=~dangling[:, None])
    x = np.full(n, 1.0 / n)
    for it in range(1, max_iter + 1):
        prev = x
        x = damping * (prev @ p + prev[dangling].sum() / n) + (1.0 - damping) / n
        if np.abs(x - prev).sum() < n * tol:
            return x, it, True
    return x, max_iter, False


def cut(
    tree: np.ndarray, *, height: float | None = None, clusters: int | None = None
) -> np.ndarray:
    """Cluster labels (0..k-1) of the leaves of the monotone linkage ``tree`` (average, ward),
    cut at ``height`` (merges at distance <= height applied, as ``fcluster(criterion=
    "distance")``) or into ``clusters`` groups (as ``criterion="maxclust"``)."""
    n = len(tree) + 1
    if height is not None:
        merges = int(np.count_nonzero(tree[:, 2] <= height))
    elif clusters is not None:  # the lowest cut leaving at most that many (ties merge together,
        merges = n - min(max(clusters, 1), n)  # heights equal but for float32 rounding: the
        if merges:  # same points in another order must not split where these did not)
            h = tree[merges - 1, 2]
            merges = int(np.count_nonzero(tree[:, 2] <= h + 1e-6 * max(1.0, abs(h))))
    else:
        raise ValueError("give height or clusters")
    members: dict[int, list[int]] = {i: [i] for i in range(n)}
    for j in range(merges):
        members[n + j] = members.pop(int(tree[j, 0])) + members.pop(int(tree[j, 1]))
    labels = np.empty(n, dtype=int)
    for label, idx in enumerate(sorted(members.values())):
        labels[idx] = label
    return labels


@dataclass(frozen=True)
class BM25:
    """BM25 scorer for small collections (a retrieved set).

    Args:
        k1: Term-frequency saturation (default 1.5, as ``bm25s``).
        b: Length normalisation (default 0.75).
        corpus: Where idf and the average length come from: ``"retrieved"`` or ``"pair"``.
    """

    k1: float = 1.5
    b: float = 0.75
    corpus: Literal["retrieved", "pair"] = "retrieved"

    def __post_init__(self) -> None:
        for label, value in (("k1", self.k1), ("b", self.b)):
            try:
                number = float(value) if isinstance(value, Real) else float("nan")
            except OverflowError:
                number = float("inf")
            if isinstance(value, bool) or not isfinite(number):
                raise TypeError(f"{label} must be a finite number, got {value!r}")
            object.__setattr__(self, label, number)  # a float: numpy computes with it
        if not 0 <= self.k1 <= 1e6 or not 0 <= self.b <= 1:
            raise ValueError(f"need 0 <= k1 <= 1e6 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")
        if self.corpus not in ("retrieved", "pair"):
            raise ValueError(f"corpus must be 'retrieved' or 'pair', got {self.corpus!r}")

    def matrices(
        self, texts: Sequence[str], query: str | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Directed scores ``S[i, j] = BM25(text_i -> text_j)`` (zero diagonal), and, if a query
        is given, ``q[i] = BM25(query -> text_i)``."""
        docs = [Counter(tokenize(t)) for t in texts]
        q_terms = set(tokenize(query)) if query is not None else set()
        vocab = sorted(set().union(*docs, q_terms)) if docs else []
        n = len(docs)
        if not vocab:
            return np.zeros((n, n)), (np.zeros(n) if query is not None else None)
        col = {t: j for j, t in enumerate(vocab)}
        rows, cols, tf = term_cells(docs, col)  # the (passage, term) pairs present, counted
        length = np.bincount(rows, weights=tf, minlength=n)
        if self.corpus == "retrieved":
            df = np.bincount(cols, minlength=len(vocab))
            idf = np.log1p((n - df + 0.5) / (df + 0.5))
            avgdl = max(float(length.mean()), 1e-12)
            norm = self.k1 * (1 - self.b + self.b * length / avgdl)
        else:
            idf = np.full(len(vocab), log(4 / 3))
            norm = np.full(n, self.k1)
        # W[j, t]: term t's score in doc j (0 where absent: with k1 = 0 that is 0 / 0)
        w = idf[cols] * tf * (self.k1 + 1) / (tf + norm[rows])
        weight = _matrix(rows, cols, w, (n, len(vocab)))
        present = _matrix(rows, cols, np.ones(len(rows)), (n, len(vocab)))
        product = present @ weight.T  # S[i, j] = sum over distinct terms of i
        scores = product.toarray() if hasattr(product, "toarray") else product
        np.fill_diagonal(scores, 0.0)
        q_scores = None
        if query is not None:
            q_vec = np.zeros(len(vocab))
            q_vec[[col[t] for t in q_terms]] = 1.0
            q_scores = np.asarray(weight @ q_vec)
        return scores, q_scores

    def pairwise(self, texts: Sequence[str]) -> np.ndarray:
        """Symmetrised scores ``0.5 * (BM25(i -> j) + BM25(j -> i))``, zero diagonal."""
        s, _ = self.matrices(texts)
        sym: np.ndarray = 0.5 * (s + s.T)
        return sym


def _matrix(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, shape: tuple[int, int]) -> Any:
    """The matrix with ``values`` at (``rows``, ``cols``), zero elsewhere: dense up to
    :data:`~ragdefense.text.DENSE_CELLS` cells, else a SciPy CSR matrix (the same sums)."""
    if shape[0] * shape[1] <= DENSE_CELLS:
        dense = np.zeros(shape)
        dense[rows, cols] = values
        return dense
    from scipy import sparse

    return sparse.csr_matrix((values, (rows, cols)), shape=shape)
