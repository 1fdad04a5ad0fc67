"""Defense time against pool size (``python -m benchmarks latency``): each retrieval-level defense
on pools of 5 to 500 passages with the embeddings given, as a vector store hands them over.

The pools are made here, seeded, with no model and no data: passages are sentences drawn from a
small vocabulary, and their vectors are a topic direction plus noise, with a planted group of
near-copies ranked first (a third of the pool, one to five: every step of every defense has
something to do). What is measured is the defenses' own cost, which grows with the square of
the pool (every pair is compared); the embedding pass, which a vector store already paid, is
not in it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragdefense.defenses import registry
from ragdefense.types import Passage

from ..report import markdown_table

__all__ = ["LATENCY_DEFENSES", "POOL_SIZES", "latency_table", "synthetic_pool"]

POOL_SIZES = (5, 10, 20, 50, 100, 200, 500)
LATENCY_DEFENSES = ("consensus", "strict", "grada", "auto")
_WORDS = [
    "ocean",
    "river",
    "mountain",
    "city",
    "league",
    "season",
    "election",
    "market",
    "report",
    "study",
    "court",
    "energy",
    "water",
    "storm",
    "bridge",
    "museum",
    "school",
    "virus",
    "vaccine",
    "budget",
    "tax",
    "rail",
    "port",
    "harbor",
    "island",
    "desert",
    "forest",
    "planet",
    "orbit",
    "engine",
    "battery",
    "signal",
    "network",
    "library",
    "archive",
    "festival",
    "theater",
    "novel",
    "author",
]


def synthetic_pool(n: int, seed: int = 0, dim: int = 384) -> tuple[str, list[Passage], np.ndarray]:
    """A query and ``n`` passages with unit vectors: a planted group of up to five near-copies
    close to the query, the rest spread around the topic."""
    rng = np.random.default_rng(seed)
    topic = rng.normal(size=dim)
    planted = min(5, max(1, n // 3))
    claim = rng.normal(size=dim)
    vectors = np.empty((n, dim), dtype=np.float32)
    for i in range(n):
        base = topic + claim * 0.8 if i < planted else topic
        noise = 0.05 if i < planted else 1.0
        vectors[i] = base + rng.normal(scale=noise, size=dim)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    texts = [" ".join(rng.choice(_WORDS, size=40)) for _ in range(n)]
    base_text = texts[0]
    for i in range(planted):  # near-copies of one claim
        texts[i] = f"the answer is atlantis, say {i} of us: {base_text}"
    return "which answer is it", [Passage(t) for t in texts], vectors


def latency_table(
    sizes: Sequence[int] = POOL_SIZES,
    defenses: Sequence[str] = LATENCY_DEFENSES,
    repeats: int = 15,
) -> tuple[list[dict[str, Any]], str]:
    """Median and p95 ms per call of each defense at each pool size (one warm-up call each)."""
    rows: list[dict[str, Any]] = []
    for name in defenses:
        defense: Any = registry.defense(name)  # every preset has defend_embeddings
        for n in sizes:
            query, passages, vectors = synthetic_pool(n)
            qvec = vectors[:5].mean(axis=0)
            qvec /= np.linalg.norm(qvec)
            times = []
            for r in range(repeats + 1):
                t0 = time.perf_counter()
                defense.defend_embeddings(query, passages, vectors, qvec)
                if r:  # the first call warms caches up
                    times.append((time.perf_counter() - t0) * 1000)
            times.sort()
            p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
            rows.append(
                {"defense": name, "passages": n, "ms_p50": statistics.median(times), "ms_p95": p95}
            )
    table = markdown_table(
        ["defense", *[str(n) for n in sizes]],
        [
            [name, *[f"{r['ms_p50']:.2f}" for r in rows if r["defense"] == name]]
            for name in defenses
        ],
    )
    lines = [
        f"Median ms per defense call by pool size (embeddings given; {repeats} calls after one "
        "warm-up; synthetic pools, a planted group of a third of the pool, at most five):",
        "",
        *table,
    ]
    return rows, "\n".join(lines)
