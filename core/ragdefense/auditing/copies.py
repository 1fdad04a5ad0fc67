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
#: about how many chunks the rule is read from (whole parts, spread over the knowledge base)
SAMPLE = 4096


def copies_allowed(wd: Workdir, chunk_parts: int, n_shards: int, reach: int) -> int:
    """How many copies of its text the knowledge base holds as a rule: the median, over the
    distinct texts of parts spread evenly over it (about :data:`SAMPLE` chunks; copies found
    among each one's ``reach`` nearest), of each text's copies; at least one (a knowledge base
    ingested twice). One vote per text, from everywhere: an attacker's many copies of a few
    texts, or copies stored first, do not set the rule."""
    sizes = [int(n) for n in wd.noted("part_sizes")[:chunk_parts]]
    if not sizes or not sum(sizes):
        return 1
    starts = np.cumsum([0, *sizes])
    wanted = min(len(sizes), -(-SAMPLE * len(sizes) // sum(sizes)))  # parts for SAMPLE chunks
    counts = []
    for part in np.unique(np.linspace(0, len(sizes) - 1, wanted).round().astype(int)):
        s, p = merged_hits(wd, "chunks", int(part), n_shards, reach)
        me = np.arange(starts[part], starts[part] + len(p))[:, None]
        alike = (p >= 0) & (p != me) & (s >= COPY)
        first = ~(alike & (p < me)).any(axis=1)  # a text's first copy votes for it
        counts.append(alike.sum(axis=1)[first])
    found = np.concatenate(counts)
    return max(1, int(np.median(found))) if found.size else 1


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
