"""Chunks of one text. A knowledge base ingested more than once (under new ids) stores every text
as often: such copies are one chunk, no neighbours of each other. A text stored more often than
the knowledge base stores its texts as a rule is a set, as in the per-query defenses: planted
copies."""

from __future__ import annotations

import numpy as np

from .steps import merged_hits
from .workdir import Workdir, same_texts

__all__ = ["COPY", "copies_allowed", "one_chunk"]

#: the least cosine between two chunks of one text (alike up to float rounding; texts compared)
COPY = 0.9999
#: the chunks whose copies are counted for the rule (the first parts')
SAMPLE = 4096


def copies_allowed(wd: Workdir, chunk_parts: int, n_shards: int, reach: int) -> int:
    """How many copies of its text a chunk has as a rule: the median over the first parts'
    chunks (up to :data:`SAMPLE`; copies found among each one's ``reach`` nearest), at least
    one (a knowledge base ingested twice; an attacker planting exactly two copies of a text is
    left to the rest of the evidence)."""
    counts, start = [], 0
    for part in range(chunk_parts):
        s, p = merged_hits(wd, "chunks", part, n_shards, reach)
        me = np.arange(start, start + len(p))[:, None]
        counts.append(((p >= 0) & (p != me) & (s >= COPY)).sum(axis=1))
        start += len(p)
        if start >= SAMPLE:
            break
    return max(1, int(np.median(np.concatenate(counts)))) if start else 1


def one_chunk(
    wd: Workdir, start: int, s: np.ndarray, p: np.ndarray, others: np.ndarray, allowed: int
) -> np.ndarray:
    """Per chunk of a part (positions from ``start``) and neighbour (``p``, similarities ``s``,
    ``others``: not itself): whether the neighbour is a copy of its text that makes one chunk
    with it, the chunk having ``allowed`` copies or fewer (texts compared, not vectors alone)."""
    alike = others & (s >= COPY)
    copy: np.ndarray = alike & (alike.sum(axis=1) <= allowed)[:, None]
    at, to = np.nonzero(copy)
    copy[at, to] = same_texts(wd, start + at, p[at, to])
    return copy
