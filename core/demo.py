"""The main job: a poisoned knowledge base, retrieval with and without RAGDefender, side by side."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any, TextIO

import numpy as np

from .embedders import as_embedder
from .ragdefender import RAGDefender
from .types import Passage

__all__ = ["DemoQuestion", "load_demo_kb", "run_demo"]


@dataclass(frozen=True)
class DemoQuestion:
    """One question of the built-in poisoned knowledge base."""

    id: str
    question: str
    correct_answer: str
    incorrect_answer: str
    benign: list[str]
    poison: list[str]


def load_demo_kb() -> list[DemoQuestion]:
    """The small poisoned knowledge base that ships with the package (written by us, CC0)."""
    raw = json.loads(resources.files("ragdefense").joinpath("data/demo_kb.json").read_text("utf-8"))
    return [
        DemoQuestion(
            q["id"],
            q["question"],
            q["correct_answer"],
            q["incorrect_answer"],
            q["benign"],
            q["poison"],
        )
        for q in raw["questions"]
    ]


def _short(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def run_demo(k: int = 8, embedder: Any = None, out: TextIO | None = None) -> dict[str, int]:
    """Index the demo knowledge base, retrieve the top ``k`` for each question, defend, report.

    Returns the totals (retrieved poison, poison left in the defended context, benign lost).
    """

    def say(line: str = "") -> None:
        print(line, file=out, flush=True)

    t0 = time.perf_counter()
    kb = load_demo_kb()
    emb = as_embedder(embedder)
    corpus: list[tuple[str, str, bool]] = []  # (text, question id, is_poison)
    for q in kb:
        corpus += [(t, q.id, False) for t in q.benign] + [(t, q.id, True) for t in q.poison]
    vectors = emb.embed([t for t, _, _ in corpus])
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    say(
        f"Knowledge base: {len(corpus)} passages for {len(kb)} questions "
        f"({sum(p for *_, p in corpus)} of them poison). Retrieving the top {k} per question.\n"
    )
    defender = RAGDefender()
    totals = {
        "retrieved": 0,
        "poison_retrieved": 0,
        "poison_left": 0,
        "benign_lost": 0,
        "hijacked_before": 0,
        "hijacked_after": 0,
    }
    for q in kb:
        qv = emb.embed_query(q.question)
        top = np.argsort(-(unit @ (qv / np.linalg.norm(qv))), kind="stable")[:k]
        retrieved = [Passage(corpus[i][0], id=str(i), embedding=vectors[i]) for i in top]
        poison = {p.id for p in retrieved if corpus[int(p.id or 0)][2]}
        result = defender.defend(q.question, retrieved)
        kept_ids = {p.id for p in result.kept}
        left = poison & kept_ids
        lost = [p for p in result.removed if p.id not in poison]
        before = len(poison) > len(retrieved) / 2
        after = len(left) > len(result.kept) / 2
        say(f"Q: {q.question}   (answer: {q.correct_answer}; attacker's: {q.incorrect_answer})")
        marks = " ".join("P" if p.id in poison else "b" for p in retrieved)
        say(f"  no defense  : {len(retrieved)} passages, {len(poison)} poison   [{marks}]")
        est = result.estimates
        say(
            f"  RAGDefender : estimated {est.get('n_adv', 0)} adversarial "
            f"({est.get('stage1', est.get('note', ''))}); removed {len(poison) - len(left)} of "
            f"{len(poison)} poison, lost {len(lost)} benign -> context of {len(result.kept)}, "
            f"{len(left)} poison"
        )
        for p in lost:
            say(f"    benign lost   : {_short(p.text)}")
        for p in result.kept:
            if p.id in left:
                say(f"    poison kept   : {_short(p.text)}")
        totals["retrieved"] += len(retrieved)
        totals["poison_retrieved"] += len(poison)
        totals["poison_left"] += len(left)
        totals["benign_lost"] += len(lost)
        totals["hijacked_before"] += before
        totals["hijacked_after"] += after
        say()
    say("Totals")
    say(
        f"  poison passages in the context : {totals['poison_retrieved']} of "
        f"{totals['retrieved']} without defense -> {totals['poison_left']} with RAGDefender"
    )
    say(f"  benign passages lost           : {totals['benign_lost']}")
    say(
        f"  questions where poison is the majority of the context: "
        f"{totals['hijacked_before']} of {len(kb)} -> {totals['hijacked_after']} of {len(kb)}"
    )
    say(f"  time: {time.perf_counter() - t0:.1f} s (model load, embedding, retrieval, defense)")
    return totals
