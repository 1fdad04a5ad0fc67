"""The one record type for a question with its answers, benign passages and poison
(:class:`QARecord`, what every benchmark loader returns), and the data that ships with the
package: the small poisoned demo knowledge base (written by us, CC0) and its loader."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..text import contains_answer

__all__ = ["QARecord", "demo_documents", "load_demo_kb"]


@dataclass(frozen=True)
class QARecord:
    """One question with its answers, benign passages and poison, whatever file it came from.

    Attributes:
        dataset: Where it came from (``"realtimeqa"``, ``"ragdefender/nq"``, ``"demo"``, ...).
        answers: Correct answer strings (the first is the canonical one).
        wrong_answer: The attacker's target answer.
        benign: Benign passages (gold passages, web results, the demo's benign passages).
        gold: Per benign passage: whether it is an answer (ground-truth) passage.
        poison: The dataset's poison texts (PoisonedRAG's ``adv_texts``, RealtimeQA's
            ``incorrect_context``), without the question prefix.
        wrong_alternatives: Other distinct wrong answers, when the data has them.
        choices, choice_answer: Multiple-choice candidates and the index of the right one.
        sources: Per benign passage: where it comes from (RealtimeQA: the result's link; the
            demo: a reference site), when the data says.
        poison_sources: Per poison passage: where it comes from (the demo: one upload).
    """

    dataset: str
    id: str
    question: str
    answers: tuple[str, ...]
    wrong_answer: str
    benign: tuple[str, ...] = ()
    gold: tuple[bool, ...] = ()
    poison: tuple[str, ...] = ()
    wrong_alternatives: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    choice_answer: str = ""
    sources: tuple[str, ...] = ()
    poison_sources: tuple[str, ...] = ()

    @property
    def correct_answer(self) -> str:
        """The canonical correct answer."""
        return self.answers[0] if self.answers else ""

    @property
    def incorrect_answer(self) -> str:
        """The attacker's answer (the data files' name for :attr:`wrong_answer`)."""
        return self.wrong_answer


def load_demo_kb() -> list[QARecord]:
    """The demo knowledge base: one :class:`QARecord` per question
    (dataset ``"demo"``; gold marks the benign passages that state the correct answer)."""
    raw = json.loads(resources.files(__name__).joinpath("demo_kb.json").read_text("utf-8"))
    return [
        QARecord(
            "demo",
            q["id"],
            q["question"],
            (q["correct_answer"],),
            q["incorrect_answer"],
            tuple(q["benign"]),
            tuple(contains_answer(t, [q["correct_answer"]]) for t in q["benign"]),
            tuple(q["poison"]),
            sources=tuple(q.get("sources", ())),
            poison_sources=(raw.get("poison_source", ""),) * len(q["poison"])
            if raw.get("poison_source")
            else (),
        )
        for q in raw["questions"]
    ]


def demo_documents() -> list[tuple[str, dict[str, Any]]]:
    """The demo knowledge base as a loader would hand it to a store: ``(text, metadata)`` with
    ``metadata = {"q": question id, "poison": bool, "source": where it comes from}`` (benign
    passages from reference sites, the planted ones from one upload), benign first."""
    kb = load_demo_kb()
    return [
        (text, {"q": q.id, "poison": False, "source": src})
        for q in kb
        for text, src in zip(q.benign, q.sources, strict=True)
    ] + [
        (text, {"q": q.id, "poison": True, "source": src})
        for q in kb
        for text, src in zip(q.poison, q.poison_sources, strict=True)
    ]
