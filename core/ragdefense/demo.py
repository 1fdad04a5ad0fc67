"""The main job: a poisoned knowledge base, retrieval with and without the default defense, with
and without the sources the documents carry, side by side."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

from .cases import Case, demo_cases
from .data import QARecord, load_demo_kb
from .defenses import registry
from .defenses.registry import DEFAULT_DEFENSE
from .types import DefenseResult

__all__ = ["run_demo"]

#: the two wordings of the planted passages the demo shows
ATTACKS = {
    "poisonedrag": "PoisonedRAG: every planted passage starts with the question",
    "reworded": "the same passages without the question in front: one on-topic majority, "
    "which text alone cannot tell from the truth",
}


def _defended(defense: Any, case: Case) -> DefenseResult:
    result: DefenseResult = defense.defend(case.question, case.passages)  # vectors carried
    return result


def run_demo(
    k: int = 8, embedder: Any = None, out: TextIO | None = None
) -> dict[tuple[str, str], dict[str, int]]:
    """Index the demo knowledge base, retrieve the top ``k`` per question, defend with the
    default (:data:`~ragdefense.defenses.registry.DEFAULT_DEFENSE`) reading the text alone,
    then reading the documents' sources too; report the context (the top ``k // 2`` kept).

    Returns the totals per (attack, defense): planted passages in the contexts, benign
    passages removed, questions whose context is mostly planted.
    """

    def say(line: str = "") -> None:
        print(line, file=out, flush=True)

    t0 = time.perf_counter()
    kb = load_demo_kb()
    k = min(k, sum(len(q.benign) + len(q.poison) for q in kb))  # no more than it holds
    context = max(1, k // 2)
    _introduce(kb, k, context, say)
    default = registry.defense(DEFAULT_DEFENSE, embedder=embedder)
    if k < default.min_pool:  # what defend() would never fetch: say so, not only show it
        say(
            f"Note: {k} passages is less than the pool of {default.min_pool} the default "
            "filters from, the least defend() fetches: in so few a planted majority passes, "
            "and some steps do not run.\n"
        )
    rows = {"no defense": None, "default, text only": default, "default + sources": default}
    totals: dict[tuple[str, str], dict[str, int]] = {}
    for attack, title in ATTACKS.items():
        reworded = attack == "reworded"
        plain = demo_cases(embedder, k, reworded=reworded)
        with_sources = demo_cases(embedder, k, sources=True, reworded=reworded)
        say(f"== {title}")
        for label in rows:
            totals[(attack, label)] = dict.fromkeys(
                ("planted", "context", "benign_removed", "hijacked"), 0
            )
        for q, case, sourced in zip(kb, plain, with_sources, strict=True):
            say(f"Q: {q.question}   (answer: {q.correct_answer}; attacker's: {q.incorrect_answer})")
            for label, defense in rows.items():
                given = sourced if label.endswith("sources") else case
                result = None if defense is None else _defended(defense, given)
                line = _tally(case, result, context, totals[(attack, label)])
                say(f"  {label:18}: {line}")
                for v in [] if result is None else result.verdicts:
                    if not v.kept and not case.is_poison[v.index]:  # what it cost, and why
                        say(f"  {'':18}  benign {v.reason}")
        say()
    _summarize(totals, context, len(kb), say)
    say(f"time: {time.perf_counter() - t0:.1f} s (model load, embedding, retrieval, defense)")
    return totals


def _introduce(kb: list[QARecord], k: int, context: int, say: Callable[[str], None]) -> None:
    n_benign = sum(len(q.benign) for q in kb)
    n_poison = sum(len(q.poison) for q in kb)
    upload = next((q.poison_sources[0] for q in kb if q.poison_sources), "one upload")
    say(
        f"Knowledge base: {n_benign + n_poison} passages for {len(kb)} questions: {n_benign} from "
        f"three reference sites, {n_poison} planted by an attacker, all in one upload "
        f"({upload}). Each question retrieves its top {k}; the context is the top {context} "
        f"passages the defense leaves (fewer where it leaves fewer of the {k}). P: a planted "
        "passage, b: a benign one; hijacked: most of the context planted.\n"
    )


def _tally(case: Case, result: DefenseResult | None, context: int, t: dict[str, int]) -> str:
    """Add one question's context to the totals ``t``; the line that shows it."""
    kept = list(range(len(case.passages))) if result is None else result.kept_indices
    ctx = sorted(kept)[:context]
    planted = sum(case.is_poison[i] for i in ctx)
    removed = [] if result is None else result.removed_indices
    benign_removed = sum(not case.is_poison[i] for i in removed)
    t["planted"] += planted
    t["context"] += len(ctx)
    t["benign_removed"] += benign_removed
    t["hijacked"] += planted > len(ctx) / 2
    marks = " ".join("P" if case.is_poison[i] else "b" for i in ctx)
    said = (
        ""
        if result is None
        else f"removed {len(removed) - benign_removed} planted, {benign_removed} benign; "
    )
    return f"{said}context [{marks}]"


def _summarize(
    totals: dict[tuple[str, str], dict[str, int]],
    context: int,
    n_questions: int,
    say: Callable[[str], None],
) -> None:
    say(f"Totals (context of {context} per question, {n_questions} questions)")
    say(
        f"  {'wording':12} {'defense':18} {'planted in context':>20} {'benign removed':>15} "
        f"{'hijacked':>9}"
    )
    for (attack, label), t in totals.items():
        say(
            f"  {attack:12} {label:18} {t['planted']:>14} of {t['context']:<3} "
            f"{t['benign_removed']:>15} {t['hijacked']:>6} of {n_questions}"
        )
    say(
        "\nThe default, text only, removes coordinated groups ranked above the rest, and "
        "passages quoting the question word for word where three documents or more do: the "
        "question written in front of each planted passage gives them away (a question of six "
        "words or more: 'Who painted the Mona Lisa?' is left to the groups). Reworded, they read "
        "as one on-topic majority, which text alone cannot tell from the truth. With the "
        "documents' sources (LangChain metadata['source'], LlamaIndex file_path / file_name / "
        "url / ref_doc_id), one upload whose passages agree with each other more than with the "
        "other sources is one voice, however many passages it holds; the planted passages it "
        "does not tie together stay."
    )
