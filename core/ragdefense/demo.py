"""The main job: a poisoned knowledge base, retrieval with and without RAGDefender, side by side."""

from __future__ import annotations

import time
from typing import Any, TextIO

from .bench.cases import demo_cases
from .data import QARecord, load_demo_kb
from .defenses.ragdefender import RAGDefender

__all__ = ["DemoQuestion", "load_demo_kb", "run_demo"]

#: the demo's questions are :class:`~ragdefense.data.QARecord` (earlier name)
DemoQuestion = QARecord


def _short(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def run_demo(k: int = 8, embedder: Any = None, out: TextIO | None = None) -> dict[str, int]:
    """Index the demo knowledge base, retrieve the top ``k`` for each question, defend, report.

    Returns the totals (retrieved poison, poison left in the defended context, benign lost).
    """

    def say(line: str = "") -> None:
        print(line, file=out, flush=True)

    # the same retrieval as `ragdefense bench demo`
    t0 = time.perf_counter()
    kb = load_demo_kb()
    n_benign = sum(len(q.benign) for q in kb)
    n_poison = sum(len(q.poison) for q in kb)
    say(
        f"Knowledge base: {n_benign + n_poison} passages for {len(kb)} questions "
        f"({n_poison} of them poison). Retrieving the top {k} per question.\n"
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
    for q, case in zip(kb, demo_cases(embedder, k), strict=True):
        retrieved = case.passages
        poison = {p.id for p, bad in zip(retrieved, case.is_poison, strict=True) if bad}
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
