"""Labelled retrieval cases: a question's retrieved passages, which of them are poison and which
carry the answer, with their embeddings. What ``ragdefense demo`` runs on the built-in
knowledge base, and what the benchmark harness (``benchmarks/``, not shipped) builds from the
shared data."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .data import QARecord
from .embedders import as_embedder
from .similarity import cosine_to
from .text import contains_answer
from .types import Passage

__all__ = ["Case", "demo_cases"]


@dataclass
class Case:
    """One benchmark query: passages with ground-truth labels, ordered by query similarity."""

    dataset: str
    setting: str
    qid: str
    question: str
    passages: list[Passage]
    is_poison: list[bool]
    is_gold: list[bool]
    query_sim: np.ndarray
    k: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def embeddings(self) -> np.ndarray:
        """The (M, d) embeddings the passages carry."""
        return np.stack([np.asarray(p.embedding) for p in self.passages])


def demo_cases(
    embedder: Any = None,
    k: int = 8,
    poisoned: bool = True,
    *,
    sources: bool = False,
    reworded: bool = False,
) -> list[Case]:
    """The built-in poisoned knowledge base as benchmark cases: each question retrieves its top
    ``k`` from the whole knowledge base (by embedding similarity; ``poisoned=False``: with its
    poison taken out, clean retrieval); ``is_gold`` marks benign passages that contain the
    correct answer. ``sources``: passages carry ``metadata["source"]`` (benign: reference sites;
    poison: one upload); ``reworded``: the poison without the question in front of it."""
    from ragdefense.data import load_demo_kb

    emb = as_embedder(embedder)
    kb = load_demo_kb()

    def planted(q: QARecord, text: str) -> str:
        return text.removeprefix(q.question).strip() if reworded else text

    corpus = [
        (t, q, False, s)
        for q in kb
        for t, s in zip(q.benign, _pad(q.sources, q.benign), strict=True)
    ]
    if poisoned:
        corpus += [
            (planted(q, t), q, True, s)
            for q in kb
            for t, s in zip(q.poison, _pad(q.poison_sources, q.poison), strict=True)
        ]
    vecs = emb.embed([t for t, _, _, _ in corpus])
    cases = []
    for q in kb:
        qv = emb.embed_query(q.question)
        sims = cosine_to(vecs, qv)
        top = np.argsort(-sims, kind="stable")[:k]
        meta = [{"source": corpus[i][3]} if sources and corpus[i][3] else {} for i in top]
        cases.append(
            Case(
                dataset="demo",
                setting=f"top-{k}" if poisoned else f"clean top-{k}",
                qid=q.id,
                question=q.question,
                passages=[
                    Passage(corpus[i][0], id=str(i), metadata=m, embedding=vecs[i])
                    for i, m in zip(top, meta, strict=True)
                ],
                is_poison=[corpus[i][2] for i in top],
                is_gold=[
                    not corpus[i][2] and contains_answer(corpus[i][0], q.answers) for i in top
                ],
                query_sim=sims[top],
                k=k,
                extra={"query_embedding": qv},
            )
        )
    return cases


def _pad(sources: Sequence[str], texts: Sequence[str]) -> list[str]:
    """``sources`` with one entry per text (``""`` where the data names none)."""
    return [*sources, *[""] * (len(texts) - len(sources))][: len(texts)]
