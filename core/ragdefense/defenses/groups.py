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
    others' by the most (the others counted in texts: a member's copy outside the cluster is of
    the group, not of the rest; a group's copies leave with it); stop when that is below
    ``margin`` or fewer than three passages are left. Near-duplicate *benign* passages
    (syndicated news) form tight groups too, but the retriever does not rank them above their
    neighbours; passages written for the query do.

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
        best = _lifted(labels, idx, query_sim, once)
        if best is None or best[0] < margin:
            break
        lift, members = best
        inner = pairs_among(sim, _once(members, once))  # one text repeated: cohesion 1
        cohesion = float(inner.mean()) if inner.size else 1.0
        groups.append(CoordinatedGroup(tuple(int(i) for i in members), cohesion, lift))
        alive[members if numbers is None else np.isin(numbers, numbers[members])] = False
    return groups


def _lifted(
    labels: np.ndarray, idx: np.ndarray, query_sim: np.ndarray, once: np.ndarray | None
) -> tuple[float, np.ndarray] | None:
    """The cluster (of two or more passages, not all of them) whose mean query similarity
    exceeds the other passages' by the most, with that excess. Float noise is a tie, and equal
    excesses go to the cluster holding the best-ranked passage (the order given)."""
    names, first, at, sizes = np.unique(
        labels, return_index=True, return_inverse=True, return_counts=True
    )
    lifts = np.full(len(names), -np.inf)
    some = (sizes >= 2) & (sizes < len(idx))
    if once is None:  # every text once: each cluster's sums at once, not a pass per cluster
        qs = query_sim[idx]
        inside = np.bincount(at, weights=qs, minlength=len(names))
        outside = (float(qs.sum()) - inside) / np.maximum(len(idx) - sizes, 1)
        lifts[some] = (inside / sizes - outside)[some]
    else:  # a pass per cluster, each text once among its passages and among the others
        for label in np.flatnonzero(some):
            member = at == label
            if sizes[label] < 3 and len(set(once[idx[member]])) < 2:
                continue  # one text stored twice
            inner, outer = _once(idx[member], once), _once(idx[~member], once)
            outer = outer[~np.isin(once[outer], once[inner])]  # a member's copy is no other
            if len(outer):  # else the cluster holds every text: ranked above nothing
                lifts[label] = float(query_sim[inner].mean() - query_sim[outer].mean())
    lifts = np.round(lifts, 12)
    if not lifts.max() > -np.inf:  # no cluster to weigh (or no number to weigh it by)
        return None
    best = int(np.lexsort((first, -lifts))[0])
    return float(lifts[best]), idx[at == best]


def _once(idx: np.ndarray, numbers: np.ndarray | None) -> np.ndarray:
    """``idx`` (ascending) with each text once, its first copy: a copy adds no weight to a
    mean (``numbers``: each passage's text number; ``None``: every text once already)."""
    if numbers is None:
        return idx
    first = np.unique(numbers[idx], return_index=True)[1]
    return np.sort(idx[first])
