"""Flat clusters from a SciPy linkage, without ``fcluster``'s per-call validation (which costs
more than the clustering itself on the 3-31 passages a defense sees)."""

from __future__ import annotations

import numpy as np


def cut(
    tree: np.ndarray, *, height: float | None = None, clusters: int | None = None
) -> np.ndarray:
    """Cluster labels (0..k-1) of the leaves of the monotone linkage ``tree`` (average, ward),
    cut at ``height`` (merges at distance <= height applied, as ``fcluster(criterion=
    "distance")``) or into ``clusters`` groups (as ``criterion="maxclust"``)."""
    n = len(tree) + 1
    if height is not None:
        merges = int(np.count_nonzero(tree[:, 2] <= height))
    elif clusters is not None:  # the lowest cut leaving at most that many (ties merge together)
        merges = n - min(max(clusters, 1), n)
        if merges:
            merges = int(np.count_nonzero(tree[:, 2] <= tree[merges - 1, 2]))
    else:
        raise ValueError("give height or clusters")
    members: dict[int, list[int]] = {i: [i] for i in range(n)}
    for j in range(merges):
        members[n + j] = members.pop(int(tree[j, 0])) + members.pop(int(tree[j, 1]))
    labels = np.empty(n, dtype=int)
    for label, idx in enumerate(sorted(members.values())):
        labels[idx] = label
    return labels
