"""Coordinated groups (:func:`coordinated_groups`): passages nearly identical to each other
that the retriever ranks above the rest, the evidence GRADA's peel, AutoDefense and Consensus
share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.cluster.hierarchy import linkage
from scipy.spatial.distance import squareform

from ..similarity import cut, pairs_among

__all__ = ["CoordinatedGroup", "coordinated_groups"]


@dataclass(frozen=True)
class CoordinatedGroup:
    """A group removed by :func:`coordinated_groups`: its passage indices, the mean cosine
    similarity within it, and how much its mean query similarity exceeds the other passages'."""

    indices: tuple[int, ...]
    cohesion: float
    query_margin: float


def coordinated_groups(
    sim: np.ndarray,
    query_sim: np.ndarray,
    tightness: float = 0.9,
    margin: float = 0.02,
    texts: Sequence[int] | None = None,
) -> list[CoordinatedGroup]:
    """Peel coordinated groups off a retrieved set, most query-elevated first.

    Repeatedly: cluster the passages still in (average linkage on cosine similarity, merged
    while the average similarity is >= ``tightness``); among the clusters of two or more
    passages that are not all of them, take the one whose mean query similarity exceeds the
    others' by the most; stop when that is below ``margin`` or fewer than three passages are
    left. Near-duplicate *benign* passages (syndicated news) form tight groups too, but the
    retriever does not rank them above their neighbours; passages written for the query do.

    Args:
        sim: (M, M) cosine similarities between the passages.
        query_sim: (M,) cosine similarity of each passage to the query.
        tightness: Least average cosine within a group (clusters merge while at or above it).
        margin: Least excess of a group's mean query similarity over the other passages'.
        texts: One number per passage, equal for copies of one text: two copies of one text
            are no group (a page ingested twice), three or more are (a passage repeated).
    """
    m = len(query_sim)
    alive = np.ones(m, dtype=bool)
    groups: list[CoordinatedGroup] = []
    numbers = None if texts is None else np.asarray(texts)
    while alive.sum() >= 3:
        idx = np.flatnonzero(alive)
        # each text once among the passages left (the usual case): no copy to leave out
        once = None if numbers is None or len(np.unique(numbers[idx])) == len(idx) else numbers
        dist = np.clip(1.0 - sim[np.ix_(idx, idx)], 0.0, None)
        np.fill_diagonal(dist, np.inf)
        if dist.min() > 1 - tightness:  # no pair close enough: the first merge would be above it
            break
        np.fill_diagonal(dist, 0.0)
        labels = cut(
            linkage(squareform(dist, checks=False), method="average"), height=1 - tightness
        )
        best: tuple[float, np.ndarray] | None = None
        for label in np.unique(labels):
            member = labels == label
            if member.sum() < 2 or member.all():
                continue
            if once is not None and member.sum() < 3 and len(set(once[idx[member]])) < 2:
                continue  # one text stored twice
            inside, outside = _once(idx[member], once), _once(idx[~member], once)
            lift = float(query_sim[inside].mean() - query_sim[outside].mean())
            if best is None or lift > best[0]:
                best = (lift, idx[member])
        if best is None or best[0] < margin:
            break
        lift, members = best
        inner = pairs_among(sim, _once(members, once))  # one text repeated: cohesion 1
        cohesion = float(inner.mean()) if inner.size else 1.0
        groups.append(CoordinatedGroup(tuple(int(i) for i in members), cohesion, lift))
        alive[members] = False
    return groups


def _once(idx: np.ndarray, numbers: np.ndarray | None) -> np.ndarray:
    """``idx`` (ascending) with each text once, its first copy: a copy adds no weight to a
    mean (``numbers``: each passage's text number; ``None``: every text once already)."""
    if numbers is None:
        return idx
    first = np.unique(numbers[idx], return_index=True)[1]
    return np.sort(idx[first])
