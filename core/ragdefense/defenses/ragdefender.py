"""RAGDefender (Kim, Lee, Koo, ACSAC 2025): a two-stage post-retrieval filter, no LLM, no training.

Stage 1 estimates how many retrieved passages are adversarial; Stage 2 flags the passages that
keep appearing in the most similar pairs. The algorithm is the paper's; the notes below say
where we depart from the authors' code.

Departures from the authors' package (``ragdefender`` 0.2.0), all deliberate:

* keyword-heavy test: tokens are matched case-insensitively (the authors' substring test against
  lower-cased terms never matches a capitalised word);
* concentration estimate: as in the paper (local mean AND local median above the global ones,
  self-similarity excluded), not the authors' OR / self-similarity / "flip" variant;
* ties in the Stage 2 score are broken by a passage's total similarity to the others, then by
  input position; pairs as similar as the last of the most similar pairs are taken too (copies
  tie exactly); copies of one text are passages of their own, as in the paper;
* ``task_type="auto"`` is implemented (the authors' package raises on it): :func:`choose_task_type`;
* fewer than ``min_passages`` passages, no spread at all (all identical), or a tie at the
  two-cluster cut (all equally far apart; scikit-learn splits them arbitrarily) give no
  estimate: nothing is removed, and the result says why;
* off-topic passages (:func:`off_topic`) and zero vectors are set aside before Stage 1 and
  kept: a passage unrelated to all the others (empty, about something else, with no direction)
  would be one side of the two-cluster split, and the vote would flag every on-topic passage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from math import comb
from typing import Any, Literal

import numpy as np
from scipy.cluster.hierarchy import linkage

from ..carried import carried_vectors, check_carried
from ..embedders import as_embedder, check_embeddings, check_query_embedding, embed_passages
from ..similarity import cosine_matrix, cut, unit_rows
from ..text import summed_tfidf, tokenize
from ..types import DefenseResult, Described, PassageLike, Verdict, check_query, to_passages
from .outliers import lazy_query_sim, off_topic
from .params import check_embedder, cosines, integers, reals

__all__ = [
    "RAGDefender",
    "Stage1Estimate",
    "choose_task_type",
    "estimate_by_clustering",
    "estimate_by_concentration",
    "identify_adversarial",
    "off_topic",
    "pair_frequency_scores",
]

TaskType = Literal["single_hop", "multi_hop", "auto"]
_TASK_TYPES = ("single_hop", "multi_hop", "auto")


@dataclass(frozen=True)
class Stage1Estimate:
    """Stage 1 output: the estimated number of adversarial passages and how it was reached."""

    n_adv: int
    method: str
    details: dict[str, Any] = field(default_factory=dict)


def estimate_by_clustering(
    embeddings: np.ndarray, tokens: Sequence[Sequence[str]], m: int = 5
) -> Stage1Estimate:
    """Single-hop Stage 1: Ward clustering into two groups + the TF-IDF keyword-heavy vote.

    The top ``m`` terms by summed TF-IDF over the passages are found; a passage is keyword-heavy
    when it contains more than half of them (case-insensitive token match). If more than half of
    the passages are keyword-heavy, the estimate is the larger cluster's size, else the smaller's.
    """
    n = len(tokens)
    unit = unit_rows(embeddings)
    labels = cut(linkage(unit, method="ward"), clusters=2)
    sizes = sorted(np.bincount(labels).tolist())
    vocab, scores = summed_tfidf(tokens)
    top = [vocab[j] for j in np.argsort(-scores, kind="stable")[:m]]
    top_set = set(top)
    n_heavy = sum(len(top_set.intersection(doc)) > len(top) / 2 for doc in tokens) if top else 0
    majority = n_heavy > n / 2
    # a tie at the cut (points coinciding, or equally far apart) gives one cluster: no estimate
    n_adv = 0 if len(sizes) < 2 else sizes[-1] if majority else sizes[0]
    return Stage1Estimate(
        n_adv=n_adv,
        method="clustering",
        details={
            "cluster_sizes": sizes,
            "top_terms": top,
            "keyword_heavy": n_heavy,
            "keyword_heavy_majority": majority,
        },
    )


def estimate_by_concentration(sim: np.ndarray) -> Stage1Estimate:
    """Multi-hop Stage 1: count passages whose local mean AND median similarity exceed the global.

    Local statistics are over a passage's similarities to the others; global ones over all
    pairs i < j."""
    n = sim.shape[0]
    off = ~np.eye(n, dtype=bool)
    local = sim[off].reshape(n, n - 1)
    local_mean = local.mean(axis=1)
    local_median = np.median(local, axis=1)
    pairs = sim[np.triu_indices(n, k=1)]
    g_mean, g_median = float(pairs.mean()), float(np.median(pairs))
    above = np.round([local_mean - g_mean, local_median - g_median], 12) > 0  # noise: a tie
    return Stage1Estimate(
        n_adv=int(above.all(axis=0).sum()),
        method="concentration",
        details={"global_mean": g_mean, "global_median": g_median},
    )


def pair_frequency_scores(
    sim: np.ndarray, n_adv: int, p: float = 2.0
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Stage 2 score: over the top ``max(1, C(n_adv, 2))`` most similar pairs (i < j), and any
    pair as similar as the last of them (an order-free cut), each passage of a pair gets
    ``sign(s)·|s|^p``. Returns the scores and the pairs used."""
    n = sim.shape[0]
    iu, ju = np.triu_indices(n, k=1)
    s = np.round(sim[iu, ju], 12)  # noise: a tie
    n_pairs = min(max(1, comb(n_adv, 2)), iu.size)
    order = np.argsort(-s, kind="stable")
    order = order[: np.count_nonzero(s >= s[order[n_pairs - 1]])] if n_pairs else order[:0]
    i, j = iu[order], ju[order]
    s = sim[i, j]
    w = np.sign(s) * np.abs(s) ** p
    f = np.bincount(i, weights=w, minlength=n) + np.bincount(j, weights=w, minlength=n)
    return f, list(zip(i.tolist(), j.tolist(), strict=True))


def identify_adversarial(
    sim: np.ndarray, n_adv: int, p: float = 2.0
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """Stage 2: rank passages by :func:`pair_frequency_scores`; the first ``n_adv`` are adversarial.

    Ties are broken by total similarity to the other passages (higher first), then by input
    position. Returns the ranking (passage indices, most suspicious first), the scores and the
    pairs used.
    """
    n = sim.shape[0]
    f, pairs = pair_frequency_scores(sim, n_adv, p)
    centrality = sim.sum(axis=1) - np.diag(sim)
    order = np.lexsort((np.arange(n), -np.round(centrality, 12), -np.round(f, 12)))  # noise: a tie
    return order, f, pairs


def choose_task_type(clustering: Stage1Estimate) -> Literal["single_hop", "multi_hop"]:
    """The ``auto`` rule: pick the Stage 1 estimator from the keyword-heavy vote.

    The concentration estimate compares each passage with the global mean and median
    similarity; when the suspicious passages are the majority they *are* the global statistics,
    and about half of them fall below it, so the estimate undercounts them. So when the
    keyword-heavy vote says the suspicious group is a majority, the clustering estimate (the
    larger cluster) is used. When the vote says it is a minority, the clustering estimate is the
    smaller cluster, which readily absorbs a dispersed benign passage (multi-hop evidence about
    another entity); there the concentration estimate, designed for dispersed benign passages,
    is used. No threshold is tuned.
    """
    return "single_hop" if clustering.details.get("keyword_heavy_majority") else "multi_hop"


class RAGDefender(Described):
    """RAGDefender post-retrieval filter.

    Args:
        embedder: Any embedder :func:`ragdefense.as_embedder` accepts; ``None`` for the packaged
            all-MiniLM-L6-v2. Passages that carry an embedding are not re-embedded.
        task_type: ``"single_hop"`` (clustering estimate), ``"multi_hop"`` (concentration
            estimate) or ``"auto"`` (chosen per query by :func:`choose_task_type`).
        p: Exponent of the Stage 2 pair score (paper default 2).
        m: Number of top TF-IDF terms in the keyword-heavy vote (paper default 5).
        min_passages: Below this many passages nothing is estimated and nothing removed.
        off_topic: Cosine below which passages count as unrelated: set aside before Stage 1
            and kept (:func:`off_topic`); ``None``: never.

    Examples:
        >>> defender = RAGDefender()                                  # doctest: +SKIP
        >>> result = defender.defend("who wrote Hamlet?", passages)   # doctest: +SKIP
        >>> result.kept, result.removed                               # doctest: +SKIP
    """

    name = "RAGDefender"
    #: pool for adapters that widen retrieval: k (pools twice as wide mix in other topics), at
    #: least 8 (attacks plant ~5 per target: a smaller pool may hold no benign passage)
    pool_factor = 1
    min_pool = 8
    uses_embeddings = lazy_query = True  # the passages'; the query's where one is off-topic

    def __init__(
        self,
        embedder: Any = None,
        *,
        task_type: TaskType = "auto",
        p: float = 2.0,
        m: int = 5,
        min_passages: int = 3,
        off_topic: float | None = 0.2,
    ) -> None:
        reals(("off_topic",), p=p, off_topic=off_topic)
        integers(m=m, min_passages=min_passages)
        embedder = check_embedder(embedder)
        if task_type not in _TASK_TYPES:
            raise ValueError(f"task_type must be one of {_TASK_TYPES}, got {task_type!r}")
        if not p > 0:
            raise ValueError(f"p must be > 0, got {p!r}")
        if m < 1:
            raise ValueError(f"m must be >= 1, got {m!r}")
        if min_passages < 2:
            raise ValueError("min_passages must be >= 2")
        self.embedder = embedder
        self.task_type: TaskType = task_type
        self.p, self.m, self.min_passages = p, int(m), int(min_passages)
        cosines(off_topic=off_topic)
        self.off_topic = off_topic

    def defend(
        self,
        query: str,
        passages: Sequence[PassageLike],
        *,
        task_type: TaskType | None = None,
    ) -> DefenseResult:
        """Filter ``passages`` retrieved for ``query``.

        Returns:
            A :class:`DefenseResult`: kept passages in input order, removed ones, each passage's
            Stage 2 score with the reason, and the Stage 1 estimate in ``estimates``.
        """
        query = check_query(query)
        items = to_passages(passages)
        if len(items) < self.min_passages:  # nothing to estimate: do not load or call the model
            carried_vectors(items)  # unused, still checked
            unused = np.zeros((len(items), 1))
            return self.defend_embeddings(query, items, unused, task_type=task_type)
        emb = embed_passages(items, self.embedder)

        def query_vector() -> Any:  # embedded only if an outlier candidate needs it
            check_carried(items, list(emb), self.embedder, as_embedder)  # as_embedder(): default
            return as_embedder(self.embedder).embed_query(query)

        return self._defend(query, items, emb, lazy_query_sim(query_vector, emb), task_type)

    def defend_embeddings(
        self,
        query: str,
        passages: Sequence[PassageLike],
        embeddings: Any = None,
        query_embedding: Any = None,
        *,
        task_type: TaskType | None = None,
    ) -> DefenseResult:
        """Like :meth:`defend`, with the passages' embeddings given (shape (n, d); ``None``:
        carried or embedded). ``query_embedding`` tells what is off-topic (:func:`off_topic`: a
        lone unrelated passage, or the side of two unrelated topics away from the query);
        without it no passage is set aside, and Stage 1 sees them all (pass it)."""
        query = check_query(query)
        items = to_passages(passages)
        if embeddings is None and query_embedding is None:
            return self.defend(query, items, task_type=task_type)
        rows = embed_passages(items, self.embedder) if embeddings is None else embeddings
        emb = check_embeddings(rows, len(items))
        if query_embedding is not None:  # given: it must be right, never silently skipped
            # an empty pool has no width to match (as every other defense takes it)
            query_embedding = check_query_embedding(
                query_embedding, emb.shape[1] if len(items) else None
            )
        given = lazy_query_sim(lambda: query_embedding, emb)
        return self._defend(query, items, emb, given, task_type)

    def _defend(
        self,
        query: str,
        items: list[Any],
        embeddings: np.ndarray,
        query_sim: Callable[[], np.ndarray | None],
        task_type: TaskType | None,
    ) -> DefenseResult:
        task = self.task_type if task_type is None else task_type  # "" is no task type
        if task not in _TASK_TYPES:
            raise ValueError(f"task_type must be one of {_TASK_TYPES}, got {task!r}")
        n = len(items)
        sim = cosine_matrix(embeddings)
        if n < self.min_passages:
            why = f"only {n} passage(s): too few to estimate (min_passages={self.min_passages})"
            return self._unchanged(query, items, why)
        flat = np.ptp(sim[np.triu_indices(n, k=1)]) < 1e-6 and sim[0, 1] > 1 - 1e-6
        if flat or not np.abs(embeddings).any():
            why = "identical in embedding space" if flat else "zero vectors, with no direction"
            return self._unchanged(query, items, f"all passages are {why}: no estimate possible")
        aside: dict[int, str] = {}
        if self.off_topic is not None:
            aside = off_topic(embeddings, sim, query_sim, self.off_topic, self.min_passages - 1)
        aside |= dict.fromkeys(np.flatnonzero(~embeddings.any(axis=1)).tolist(), "a zero vector")
        alive = [i for i in range(n) if i not in aside]
        if len(alive) < self.min_passages:
            why = f"{len(aside)} passage(s) set aside as off-topic: too few left to estimate"
            return self._unchanged(query, items, why, None, aside)
        est = None
        sub_emb, sub_sim = embeddings[alive], sim[np.ix_(alive, alive)]
        if task in ("single_hop", "auto"):
            tokens = [tokenize(items[i].text) for i in alive]
            est = estimate_by_clustering(sub_emb, tokens, self.m)
        chosen = choose_task_type(est) if est is not None and task == "auto" else task
        vote = est
        if chosen == "multi_hop":
            est = estimate_by_concentration(sub_sim)
        assert est is not None
        n_adv = min(est.n_adv, len(alive) - 1)  # the threat model keeps one benign passage
        estimates: dict[str, Any] = {"task_type": chosen, "n_adv": n_adv, "stage1": est.method}
        estimates |= est.details
        if task == "auto" and vote is not None:  # the vote that chose, beside the estimate used
            heavy, half = vote.details["keyword_heavy"], len(alive) / 2
            said = "majority" if heavy > half else "tie" if heavy == half else "minority"
            used = "clustering" if chosen == "single_hop" else "concentration"
            by = f"auto: keyword-heavy vote {said} -> {used} ({heavy} of {len(alive)})"
            estimates.update(keyword_heavy=heavy, task_type_by=by)
        if aside:
            estimates["off_topic"] = sorted(aside)
        if n_adv == 0:
            why = "Stage 1 estimated no adversarial passage"
            if len(est.details.get("cluster_sizes", [0, 0])) < 2:  # a tied cut: one cluster
                why += ": the two-cluster cut is tied (the passages are equally far apart)"
            return self._unchanged(query, items, why, estimates, aside)
        order, f, pairs = identify_adversarial(sub_sim, n_adv, self.p)
        back = np.asarray(alive)
        flagged = {int(back[i]) for i in order[:n_adv]}
        scores = np.zeros(n)
        scores[back] = f
        estimates["n_pairs"] = len(pairs)
        pairs = [(int(back[i]), int(back[j])) for i, j in pairs]
        ranking = np.concatenate([back[order], np.asarray(sorted(aside), dtype=int)])
        return self._result(query, items, scores, flagged, pairs, estimates, None, ranking, aside)

    def _unchanged(
        self,
        query: str,
        items: list[Any],
        why: str,
        estimates: dict[str, Any] | None = None,
        aside: dict[int, str] | None = None,
    ) -> DefenseResult:
        est = estimates if estimates is not None else {"n_adv": 0, "note": why}
        if aside and "off_topic" not in est:
            est = {**est, "off_topic": sorted(aside)}
        return self._result(query, items, np.zeros(len(items)), set(), [], est, why, None, aside)

    def _result(
        self,
        query: str,
        items: list[Any],
        f: np.ndarray,
        flagged: set[int],
        pairs: list[tuple[int, int]],
        estimates: dict[str, Any],
        note: str | None,
        order: np.ndarray | None = None,
        aside: dict[int, str] | None = None,
    ) -> DefenseResult:
        n = len(items)
        aside = aside or {}
        rank_of = {int(i): r for r, i in enumerate(order)} if order is not None else {}
        in_pairs = np.bincount(np.asarray(pairs, dtype=int).ravel(), minlength=n)
        verdicts = []
        kept_rank = 0
        for i, passage in enumerate(items):
            if i in aside:
                reason = f"kept: set aside before Stage 1 as off-topic ({aside[i]})"
            elif note is not None:
                reason = f"kept: {note}"
            elif i in flagged:
                reason = (
                    f"removed: score rank {rank_of[i] + 1} of {n}, within the top "
                    f"{len(flagged)} estimated adversarial; in {in_pairs[i]} of the "
                    f"{len(pairs)} most similar pairs"
                )
            elif in_pairs[i]:
                reason = (
                    f"kept: score rank {rank_of[i] + 1} of {n}, below the top {len(flagged)}; "
                    f"in {in_pairs[i]} of the {len(pairs)} most similar pairs"
                )
            else:
                reason = f"kept: in none of the {len(pairs)} most similar pairs"
            kept = i not in flagged
            rank, details = (kept_rank if kept else None), {"pairs": float(in_pairs[i])}
            verdicts.append(Verdict(i, passage, kept, float(f[i]), reason, rank, details))
            kept_rank += kept
        return DefenseResult(
            defense=self.name,
            query=query,
            verdicts=tuple(verdicts),
            score_name="pair_score",
            estimates=estimates,
        )
