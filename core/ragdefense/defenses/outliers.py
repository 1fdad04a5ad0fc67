"""Off-topic passages: set aside before a defense compares the retrieved passages.

A defense that splits the retrieved set in two (RAGDefender's Stage 1) assumes every passage is
about the query. An empty or one-word passage, or a document about something else (a wide
retrieval pool reaches other topics), is then one side of the split on its own, and the
on-topic passages, poison and benign alike, become "the larger cluster".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.cluster.hierarchy import linkage

from ..similarity import cosine_to, cut, unit_rows

__all__ = ["lazy_query_sim", "off_topic"]


def off_topic(
    embeddings: np.ndarray,
    sim: np.ndarray,
    query_sim: Callable[[], np.ndarray | None],
    threshold: float = 0.2,
    keep: int = 2,
) -> dict[int, str]:
    """The passages to set aside before Stage 1 as unrelated to the rest: index -> why.

    Repeatedly, on the passages still in: any passage whose cosine to every other one is below
    ``threshold`` and whose query similarity is ``threshold`` below the median is set aside
    (empty, one-word, unrelated passages); then, if the Ward split in
    two leaves two sides with no pair across them at or above ``threshold`` (two unrelated
    topics), the side less similar to the query is set aside, provided its mean query
    similarity is at least ``threshold`` below the other side's (``query_sim()`` gives the
    passages' query similarities, or ``None`` when there is no query embedding: then nothing
    is set aside). Never leaves fewer than ``keep`` passages.
    """
    alive = list(range(len(sim)))
    aside: dict[int, str] = {}
    while len(alive) > keep:
        sub = sim[np.ix_(alive, alive)] - 2 * np.eye(len(alive))
        lone = [alive[j] for j in np.flatnonzero(sub.max(axis=1) < threshold)]
        if lone:  # and off the query, not merely apart from the rest
            q = query_sim()
            if q is None:
                break
            bar = float(np.median(q[alive])) - threshold
            lone = [i for i in lone if q[i] <= bar]
        if lone and len(alive) - len(lone) >= keep:
            aside |= dict.fromkeys(lone, f"cosine to every other passage below {threshold}")
            alive = [i for i in alive if i not in lone]
            continue
        labels = cut(linkage(unit_rows(embeddings[alive]), method="ward"), clusters=2)
        sides = [[alive[j] for j in np.flatnonzero(labels == c)] for c in (0, 1)]
        if min(map(len, sides)) == 0 or sim[np.ix_(sides[0], sides[1])].max() >= threshold:
            break
        q = query_sim()
        if q is None:
            break
        low, high = sorted(sides, key=lambda side: float(q[side].mean()))
        if float(q[high].mean() - q[low].mean()) < threshold or len(high) < keep:
            break
        aside |= dict.fromkeys(
            low,
            f"in a group of {len(low)} unrelated to the other passages (no cosine across >= "
            f"{threshold}) and less similar to the query by {threshold} or more",
        )
        alive = [i for i in alive if i not in low]
    return aside


def lazy_query_sim(
    query_vector: Callable[[], Any], embeddings: np.ndarray
) -> Callable[[], np.ndarray | None]:
    """A function giving the passages' query similarities, asking ``query_vector()`` for the
    query's embedding on its first call only; ``None`` when there is none, it fails, or it lands
    in another space than ``embeddings`` (the step is a refinement: it must never make a
    defense fail that worked without it)."""
    memo: list[np.ndarray | None] = []

    def query_sim() -> np.ndarray | None:
        if not memo:
            try:
                raw = query_vector()
                q = None if raw is None else np.asarray(raw, dtype=float)
            except Exception:
                q = None
            same_space = q is not None and q.shape == embeddings[0].shape
            memo.append(cosine_to(embeddings, q) if q is not None and same_space else None)
        return memo[0]

    return query_sim
