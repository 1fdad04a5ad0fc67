"""GRADA (Zheng et al.): graph-based reranking against poisoned retrieval, no LLM.

The M retrieved passages are the nodes of a weighted undirected graph; edge weights are
passage-passage similarities, optionally penalised by each end's similarity to the query (HRSIM).
Weighted PageRank scores the nodes; the top ``n`` are kept (the paper retrieves M = 2n).
Poison passages mimic the query and each other but not the benign passages: HRSIM cuts exactly
those edges, so the poison loses the mass its mutual similarity would otherwise give it.

Departures from the authors' code: ties are broken by retrieval rank (theirs: by passage text);
the BM25 collection defaults to the retrieved set (theirs: one-document indices), and a term a
passage repeats counts once as a query term, see :mod:`ragdefense.similarity`; with BM25,
HRSIM's query similarity is BM25(query -> passage), the query scored as the query, where the
passage-passage term is symmetrised; PageRank is a vectorised power iteration equal to
``networkx.pagerank``.

Beyond the paper, ``peel=True`` first removes *coordinated groups* (:func:`coordinated_groups`):
passages nearly identical to each other that the retriever also ranks above the rest. GRADA
assumes the poison is a minority of the graph; a few coordinated poison passages in a small
retrieved set are enough to make it central. Peeling them before the graph keeps GRADA's
behaviour where it works (one poison passage, clean retrieval) and covers the case where it does
not (several coordinated poison passages); the benchmark pages show the effect.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from ..embedders import passage_and_query_embeddings
from ..similarity import BM25, cosine_matrix, cosine_to, pagerank
from ..types import (
    DefenseResult,
    Described,
    PassageLike,
    Verdict,
    check_query,
    to_passages,
)
from .groups import CoordinatedGroup, coordinated_groups
from .params import check_embedder, check_given, differences, flags, integers, reals
from .pool import COPY_REASON, distinct

__all__ = ["GRADA", "CoordinatedGroup", "coordinated_groups", "pagerank"]

Similarity = Literal["hrsim", "bm25", "ebd"]


class GRADA(Described):
    """GRADA graph reranker.

    Copies of one text (a page stored twice) count once, beyond the paper: the graph holds the
    first copy, and the others are left out beside it (between two copies the edge is a
    text's similarity to itself, the heaviest of the graph: a passage stored twice would
    support itself into the top n). ``n=None`` halves the distinct texts. Copies are equal
    texts up to spacing, case and accents: a copy reworded or repunctuated is a passage of its
    own, near the heaviest edge still (a planted set of variants is what ``peel=True`` is for).

    Args:
        similarity: Edge weights: ``"hrsim"`` (default, the paper's best: similarity minus
            ``alpha`` times both ends' query similarity, clipped at 0), ``"bm25"`` (symmetrised
            pairwise BM25) or ``"ebd"`` (embedding cosine).
        hrsim_base: Base similarity of ``"hrsim"``: ``"bm25"`` (default, as the paper) or
            ``"ebd"``.
        alpha: HRSIM penalty coefficient (paper: 0.4).
        n: Passages kept; ``None`` keeps half the distinct texts (the paper retrieves M = 2n
            and keeps n).
        damping: PageRank damping factor (``networkx``'s default).
        tol: PageRank convergence tolerance (``networkx``'s default).
        max_iter: Most PageRank iterations (``networkx``'s default).
        bm25: The :class:`~ragdefense.similarity.BM25` scorer (k1, b, collection).
        embedder: Used only by the embedding variants and the peel; anything
            :func:`ragdefense.as_embedder` accepts (``None``: the packaged all-MiniLM-L6-v2).
        peel: Remove coordinated groups (:func:`coordinated_groups`, on embedding cosine)
            before building the graph; the top ``n`` are then taken from the rest. Off by
            default: GRADA as published.
        peel_tightness: The peel's ``tightness`` (:func:`coordinated_groups`).
        peel_margin: The peel's ``margin`` (:func:`coordinated_groups`).

    Examples:
        The default graph (HRSIM over BM25) reads the texts alone: no embedding model. The
        passage written for the query mimics it, so HRSIM cuts its edges and it ranks last.

        >>> passages = [
        ...     "Who wrote Hamlet? Hamlet was written by Christopher Marlowe.",
        ...     "Hamlet is a tragedy by William Shakespeare.",
        ...     "Shakespeare wrote Hamlet around 1600.",
        ...     "The First Folio of Shakespeare's plays includes Hamlet.",
        ... ]
        >>> result = GRADA(n=2).defend("Who wrote Hamlet?", passages)
        >>> result.kept_indices  # reranked: best first
        [1, 3]
        >>> [v.index for v in sorted(result.verdicts, key=lambda v: -v.score)]  # PageRank
        [1, 3, 2, 0]
    """

    name = "GRADA"
    #: retrieval pool per passage returned, for the adapters that widen retrieval (M = 2n)
    pool_factor = 2
    min_passages = 1

    _min_pool: int | None = None  # assigned: it stands whatever the peel

    @property
    def min_pool(self) -> int:
        """A reranker ranks any pool, from a single passage (0); the peel needs a pool that
        holds a planted set whole beside the honest passages, as AutoDefense's (8)."""
        return self._min_pool if self._min_pool is not None else 8 if self.peel else 0

    @min_pool.setter
    def min_pool(self, value: int) -> None:
        self._min_pool = value

    def __init__(
        self,
        embedder: Any = None,
        *,
        similarity: Similarity = "hrsim",
        hrsim_base: Literal["bm25", "ebd"] = "bm25",
        alpha: float = 0.4,
        n: int | None = None,
        damping: float = 0.85,
        tol: float = 1e-6,
        max_iter: int = 100,
        bm25: BM25 | None = None,
        peel: bool = False,
        peel_tightness: float = 0.9,
        peel_margin: float = 0.02,
    ) -> None:
        if bm25 is not None and not isinstance(bm25, BM25):
            raise TypeError(f"bm25 must be a ragdefense.similarity.BM25 or None, got {bm25!r}")
        if similarity not in ("hrsim", "bm25", "ebd"):
            raise ValueError(f"similarity must be 'hrsim', 'bm25' or 'ebd', got {similarity!r}")
        if hrsim_base not in ("bm25", "ebd"):
            raise ValueError(f"hrsim_base must be 'bm25' or 'ebd', got {hrsim_base!r}")
        reals(alpha=alpha, damping=damping, tol=tol)
        reals(peel_tightness=peel_tightness, peel_margin=peel_margin)
        integers(("n",), n=n, max_iter=max_iter)
        flags(peel=peel)
        embedder = check_embedder(embedder)
        if tol <= 0 or max_iter < 1:
            raise ValueError(f"tol must be > 0 and max_iter >= 1, got {tol} and {max_iter}")
        differences(peel_margin=peel_margin)
        if n is not None and n < 1:
            raise ValueError(f"n must be >= 1 (or None for half the distinct texts), got {n}")
        if not 0 < damping < 1:
            raise ValueError(f"damping must be in (0, 1), got {damping}")
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if not -1 <= peel_tightness <= 1:
            raise ValueError(f"peel_tightness must be in [-1, 1], got {peel_tightness}")
        self.similarity: Similarity = similarity
        self.hrsim_base = hrsim_base
        self.alpha = alpha
        self.n = None if n is None else int(n)
        self.damping = damping
        self.tol = tol
        self.max_iter = int(max_iter)
        self.bm25 = bm25 or BM25()
        self.embedder = embedder
        self.peel = peel
        self.peel_tightness = peel_tightness
        self.peel_margin = peel_margin

    @property
    def uses_embeddings(self) -> bool:
        """Whether this configuration needs passage (and query) embeddings."""
        return self.peel or self._graph_on_embeddings

    @property
    def _graph_on_embeddings(self) -> bool:
        return self.similarity == "ebd" or (self.similarity == "hrsim" and self.hrsim_base == "ebd")

    def defend(self, query: str, passages: Sequence[PassageLike]) -> DefenseResult:
        """Rerank ``passages`` retrieved for ``query``; keep the top ``n``.

        Returns:
            A :class:`DefenseResult`: kept passages in reranked order, each passage's PageRank
            score, query similarity and graph degree, and the reason for its decision.
        """
        return self.defend_embeddings(query, passages)  # embeds what it needs, once

    def defend_embeddings(
        self,
        query: str,
        passages: Sequence[PassageLike],
        embeddings: Any = None,
        query_embedding: Any = None,
        exclude: Mapping[int, str] | None = None,
    ) -> DefenseResult:
        """Like :meth:`defend`, with the embeddings given (needed by the embedding variants).

        ``exclude`` maps passage indices to a reason: those passages are removed before the
        graph is built, as the peel's groups are (how :class:`~ragdefense.AutoDefense` hands
        over the groups it found). The published algorithm (graph, propagation, top n), kept in
        one piece so that it reads as the paper does.
        """
        query = check_query(query)
        items = to_passages(passages)
        m = len(items)
        if exclude is not None and not isinstance(exclude, Mapping):
            raise TypeError(f"exclude must map indices to reasons, got {type(exclude).__name__}")
        peeled = dict(exclude or {})
        if any(not isinstance(why, str) or not why.strip() for why in peeled.values()):
            raise ValueError("exclude's reasons must be words a person reads, not blank")
        whole = all(not isinstance(i, bool) and hasattr(i, "__index__") for i in peeled)
        peeled = {i.__index__(): why for i, why in peeled.items()} if whole else peeled
        if not whole or any(not 0 <= i < m for i in peeled):
            raise ValueError(f"exclude has indices outside 0..{m - 1}: {sorted(peeled, key=repr)}")
        _, copy_of = distinct(items, embeddings)  # a copy would support its own text
        copies = {c: first for first, later in copy_of.items() for c in later}
        keep = (m - len(copies)) // 2 if self.n is None else self.n
        keep = min(max(keep, 1), m)
        if m < 2:
            check_given(embeddings, query_embedding, items)  # unused, still checked
            return self._result(
                query,
                items,
                np.full(m, 1.0),
                np.full(m, np.nan),  # never measured
                np.zeros((m, m)),
                keep,
                {"note": "fewer than 2 passages: nothing to rerank"},
                peeled,
            )
        emb = q_emb = None
        if self.uses_embeddings:  # resolved once, for the peel and the graph
            emb, q_emb = passage_and_query_embeddings(
                query, items, self.embedder, embeddings, query_embedding
            )
        else:
            check_given(embeddings, query_embedding, items)  # unused here, still checked
        if self.peel:
            assert emb is not None and q_emb is not None
            rest = [i for i in range(m) if i not in peeled]
            groups = coordinated_groups(
                cosine_matrix(emb[rest]),
                cosine_to(emb[rest], q_emb),
                self.peel_tightness,
                self.peel_margin,
                [copies.get(i, i) for i in rest],  # equal for copies of one text
            )
            for g, group in enumerate(groups, start=1):
                for i in (rest[j] for j in group.indices):
                    peeled[i] = (
                        f"coordinated group {g} of {len(group.indices)} passages, peeled before "
                        f"the graph (mean cosine {group.cohesion:.3f} within it; query "
                        f"similarity {group.query_margin:+.3f} above the rest)"
                    )
        left = {i: t for i, t in copies.items() if i not in peeled and t not in peeled}
        peeled |= {i: peeled[t] for i, t in copies.items() if t in peeled and i not in peeled}
        rest = [i for i in range(m) if i not in peeled and i not in left]
        weights = np.zeros((m, m))
        q_sim = np.full(m, np.nan)  # measured on the graph's passages only
        scores = np.zeros(m)
        iterations, converged = 0, True
        if len(rest) > 1:
            sub_emb = None if emb is None else emb[rest]
            w, q = self._weights(query, [items[i] for i in rest], sub_emb, q_emb)
            s, iterations, converged = pagerank(w, self.damping, self.tol, self.max_iter)
            weights[np.ix_(rest, rest)], q_sim[rest], scores[rest] = w, q, s
        else:
            scores[rest] = 1.0
        estimates: dict[str, Any] = {
            "similarity": self.similarity
            + (f"/{self.hrsim_base}" if self.similarity == "hrsim" else ""),
            "M": m,
            "n": min(keep, len(rest)),
            "edges": int(np.count_nonzero(np.triu(weights, 1))),
            "iterations": iterations,
            "converged": converged,
        }
        if self.peel or peeled:
            estimates["peeled"] = sorted(peeled)
        if copies:  # as Consensus says them: each first copy, and its later copies
            estimates["copies"] = copy_of
        if len(rest) > 1 and not (weights > 0).any():
            estimates["note"] = "no positive edge: uniform scores, retrieval order kept"
        return self._result(
            query, items, scores, q_sim, weights, min(keep, len(rest)), estimates, peeled, left
        )

    def _weights(
        self, query: str, items: list[Any], embeddings: Any, query_embedding: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        m = len(items)
        if self._graph_on_embeddings:
            emb, q = passage_and_query_embeddings(
                query, items, self.embedder, embeddings, query_embedding
            )
            sim = cosine_matrix(np.vstack([emb, q]))
            base, q_sim = sim[:m, :m], sim[:m, m]
        else:
            s, q_scores = self.bm25.matrices([p.text for p in items], query)
            assert q_scores is not None  # a query was given
            base, q_sim = 0.5 * (s + s.T), q_scores
        if self.similarity == "hrsim":
            base = base - self.alpha * (q_sim[:, None] + q_sim[None, :])
        w = np.maximum(base, 0.0)
        np.fill_diagonal(w, 0.0)
        return w, q_sim

    def _result(
        self,
        query: str,
        items: list[Any],
        scores: np.ndarray,
        q_sim: np.ndarray,
        weights: np.ndarray,
        keep: int,
        estimates: dict[str, Any],
        peeled: dict[int, str] | None = None,
        copies: dict[int, int] | None = None,
    ) -> DefenseResult:
        m = len(items)
        peeled, copies = peeled or {}, copies or {}
        # higher score first; equal scores (to 1e-12) keep retrieval order
        order = np.lexsort((np.arange(m), -np.round(scores, 12)))
        rank = np.empty(m, dtype=int)
        rank[order] = np.arange(m)
        degree = (weights > 0).sum(axis=1)
        strength = weights.sum(axis=1)
        uniform = "note" in estimates
        verdicts = []
        keeps = [bool(rank[i] < keep) and i not in peeled and i not in copies for i in range(m)]
        # a copy is left out beside its kept first copy, or goes with a first copy ranked out
        standing = {i for i, t in copies.items() if keeps[t]}
        at, ranked = np.round(scores, 12), [i for i in order if i not in peeled and i not in copies]
        tie = 0 < keep < len(ranked) and at[ranked[keep - 1]] == at[ranked[keep]]
        for i, passage in enumerate(items):
            kept = keeps[i]
            where = f"rank {rank[i] + 1} of {m} (was {i + 1})"
            if i in standing:
                why = COPY_REASON.format(copies[i])
            elif i in copies:
                why = f"a copy of passage {copies[i]}, removed with it: below the top {keep}"
            elif i in peeled:
                why = peeled[i]
            elif uniform:
                why = f"{estimates['note']}; {where}"
            else:
                measured = "" if np.isnan(q_sim[i]) else f", query sim {q_sim[i]:.3f}"
                why = f"PageRank {scores[i]:.4f}, {where}; {degree[i]} edge(s){measured}"
                if tie and at[i] == at[ranked[keep]]:  # the cut falls inside a tie
                    why += "; tied at the cut, retrieval order decided"
            verdicts.append(
                Verdict(
                    index=i,
                    passage=passage,
                    kept=kept,
                    score=float(scores[i]),
                    reason=(
                        "kept: "
                        if kept
                        else "removed: "
                        if i in peeled or i in copies
                        else f"removed: below the top {keep}; "
                    )
                    + why,
                    rank=int(rank[i]) if kept else None,
                    details={
                        "query_sim": float(q_sim[i]),
                        "degree": float(degree[i]),
                        "strength": float(strength[i]),
                        "copy": float(i in standing),
                    },
                )
            )
        return DefenseResult(
            defense=self.name,
            query=query,
            verdicts=tuple(verdicts),
            score_name="pagerank",
            estimates=estimates,
            reranked=True,
        )
