"""Majority vote over isolated multiple-choice answers, and its certificate: the benign leader
survives k' injected (k' rewritten) passages when it leads the runner-up by more than k' (2k')."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from ..llm.base import Generation
from ..types import Passage
from .checks import check_templates
from .flow import Flow, Progress, Prompts, Runtime, failures_note
from .types import (
    IDK,
    MULTIPLE_CHOICE_PROMPT,
    NO_INFO,
    Attack,
    Certificate,
    IsolatedResponse,
    RobustAnswer,
)

__all__ = ["MajorityVote", "check_choices"]

#: the letter an answer opens with, after markdown and an "Answer:" / "The answer is" prefix:
#: followed by a closing mark, a comma or nothing ("B.", "(b)", "**B**", "B, a city"), or,
#: upper-case, by a space ("B is correct"), but for the article: "A" followed by a word in
#: lower case is none ("A good guess would be B."; so is "A pacific", where a candidate is
#: written in lower case) unless that word is a copula, which no article precedes ("A is
#: correct", as "B is correct"); a letter the copula denies ("B is not correct", "A is wrong")
#: is none
_DENIED = r"(?!\s+(?:is|was|seems|appears)(?:n't|\s+not\b|\s+(?:incorrect|wrong|false)\b))"
_CHOICE = re.compile(
    r"^[\W_]*(?:(?:the\s+)?(?:correct\s+|best\s+|final\s+)?"
    r"(?:answer|option|choice|candidate)\s*(?:is\b)?[\W_]*)?"
    rf"(?:([A-Ea-e])(?=[\.\):\]*_,]|[\W_]*$)|(?-i:([B-E])(?=\s){_DENIED})"
    rf"|(?-i:(A)(?=\s(?!\s*[a-z])|\s+(?:is|was|seems|appears|would\s+be)\b){_DENIED}))",
    re.IGNORECASE,
)


#: a second letter joined to the first ("B or C", "(B) and (C)", "B/C", "A, B, C"): a hedge,
#: no vote. The second letter is one as :data:`_CHOICE` reads a letter: followed by a closing
#: mark or a separator that no letter follows ("C)", "C,", but not "e.g."), by nothing, or,
#: upper-case, by a space, but for the article ("B, a city in France" votes B)
_HEDGE = re.compile(
    r"[\W_]*(?:or|and|/|,|&)[\W_]*"
    r"(?:[A-Ea-e](?=[\.\):\]*_,;/&]+(?![A-Za-z])|[\W_]*$)"
    r"|(?-i:[B-E])(?=\s)|(?-i:A)(?=\s(?!\s*[a-z])|\s+(?:is|was|seems|appears|would\s+be)\b))",
    re.IGNORECASE,
)


def _choice(text: str) -> str | None:
    """The letter an isolated multiple-choice answer opens with, ``None`` for none or for a
    hedge between two letters ("B or C"). A letter later in the answer is never read:
    "Vitamin C" or "plan B" there would be votes."""
    said = unicodedata.normalize("NFKC", text).strip()
    m = _CHOICE.match(said)
    if m is None or _HEDGE.match(said, m.end()):
        return None
    return next(g for g in m.groups() if g).upper()


def check_choices(choices: Sequence[str] | None, aggregation: str = "majority") -> list[str]:
    """The choices as strings, or ``ValueError`` unless there are 2 to 4, in an order (a
    list or tuple: a set's order, and so each choice's letter, changes from run to run), for
    the ``aggregation`` that takes them."""
    if aggregation != "majority":
        raise ValueError(f"choices are for aggregation='majority', not {aggregation}")
    if not isinstance(choices, Sequence) or isinstance(choices, str):
        got = type(choices).__name__
        raise ValueError(f"majority vote needs 2 to 4 choices in a list or tuple, got a {got}")
    if not 2 <= len(choices) <= 4:
        raise ValueError("majority vote needs 2 to 4 choices (letters A-D; E = no information)")
    return [str(c) for c in choices]


@dataclass(frozen=True)
class MajorityVote:
    """Majority vote over isolated multiple-choice answers and its settings:
    ``RobustRAG(llm, aggregation=MajorityVote())``, then ``answer(query, passages,
    choices=[...])``.

    Args:
        choice_prompt: The isolated prompt (``{context}``, ``{query}``, ``{choices}``,
            ``{letters}``); checked here.
    """

    choice_prompt: str = MULTIPLE_CHOICE_PROMPT

    name: ClassVar[Literal["majority"]] = "majority"
    local: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_templates(choice_prompt=self.choice_prompt)

    def bind(self, run: Runtime) -> _Majority:
        """The algorithm with these settings, for one call of the engine."""
        return _Majority(self, run)


class _Majority:
    """Majority vote for one call: its settings and the engine's :class:`Runtime`."""

    def __init__(self, cfg: MajorityVote, run: Runtime) -> None:
        self.cfg, self.run = cfg, run

    def prompts(
        self, query: str, passages: Sequence[Passage], choices: Sequence[str] | None
    ) -> list[str]:
        """One multiple-choice prompt per passage."""
        choices = check_choices(choices)
        letters = _letters(len(choices))
        listing = "\n".join(f"{letter}. {c}" for letter, c in zip(letters, choices, strict=True))
        said = ", ".join(letters[:-1]) + f", or {letters[-1]}"
        return [
            self.cfg.choice_prompt.format(
                context=self.run.context(p), query=query, choices=listing, letters=said
            )
            for p in passages
        ]

    def answer(
        self, query: str, items: Sequence[Passage], choices: Sequence[str] | None
    ) -> Flow[RobustAnswer]:
        gens = yield Prompts(self.prompts(query, items, choices), "isolated")
        offered = tuple(check_choices(choices))
        responses = self.responses(items, gens, len(offered))
        note = failures_note(responses)
        votes = Counter(r.choice for r in responses if r.choice and r.choice != NO_INFO)
        if not votes:
            why = "every isolated answer abstained (no information found)" + note
            return RobustAnswer(query, IDK, "majority", responses, why, choices=offered)
        said = [r.choice for r in responses]  # a tie: the best-ranked passage's vote wins
        ranked = sorted(votes.items(), key=lambda kv: (-kv[1], said.index(kv[0])))
        winner, count = ranked[0]
        runner = ranked[1][1] if len(ranked) > 1 else 0
        tie = ", a tie: the best-ranked passage's vote" if runner == count else ""
        why = f"{winner} has {count} of {sum(votes.values())} votes (runner-up {runner}{tie})"
        why += note
        text = f"{winner}. {offered[ord(winner) - ord('A')]}"
        return RobustAnswer(
            query,
            text,
            "majority",
            responses,
            why,
            votes=dict(votes),
            choice=winner,
            choices=offered,
        )

    @staticmethod
    def responses(
        items: Sequence[Passage], gens: Sequence[Generation], n_choices: int
    ) -> tuple[IsolatedResponse, ...]:
        """Each answer's letter; a letter no candidate has ("I don't know" reads as "I") is
        no vote: an abstention, as "E. No information found" is."""
        offered = set(_letters(n_choices))
        out = []
        for i, (p, g) in enumerate(zip(items, gens, strict=True)):
            if not g.ok:
                out.append(IsolatedResponse(i, p, None, True, error=g.error))
                continue
            found = _choice(g.text or "")
            letter = found if found in offered else NO_INFO
            out.append(IsolatedResponse(i, p, g.text, letter == NO_INFO, choice=letter))
        return tuple(out)

    def certificate(
        self,
        result: RobustAnswer,
        k_prime: int,
        attack: Attack,
        golds: list[str],
        progress: Progress | None = None,
    ) -> Flow[Certificate]:
        yield from ()
        k = len(result.responses)
        benign = result.responses[: k - k_prime] if attack == "injection" else result.responses
        votes = Counter(r.choice for r in benign if r.choice and r.choice != NO_INFO)
        ranked = sorted(votes.items(), key=lambda kv: (-kv[1], kv[0]))
        if not ranked:
            return Certificate(k_prime, attack, False, "no benign vote: the attacker decides")
        winner, a = ranked[0]
        b = ranked[1][1] if len(ranked) > 1 else 0
        need = k_prime if attack == "injection" else 2 * k_prime
        ok = a - b > need
        why = f"{winner} leads {a} to {b} among the benign votes; the attacker can move {need}"
        golds = [_letter(g, result.choices) for g in golds]
        if ok and golds and winner not in golds:
            ok, why = False, why + f", but the certified winner {winner} is not the gold answer"
        elif ok and winner != result.choice:
            ok, why = False, why + f", but it differs from the answer {result.answer}"
        return Certificate(k_prime, attack, ok, why, (winner,) if a - b > need else None)

    def calls_needed(self, result: RobustAnswer, k_prime: int, attack: Attack) -> int:
        """Certifying a vote asks the LLM nothing."""
        return 0


def _letter(gold: str, choices: Sequence[str]) -> str:
    """A gold answer as its letter: given as the letter (``B``, ``B.``, ``(B)``; an offered
    letter is always read as one, even where a candidate's text is a letter too), the
    candidate's text or both (``"A. Pacific"``), case and spacing aside; anything else as it
    is."""
    said = " ".join(gold.split()).casefold()
    letters = _letters(len(choices))
    if said.strip("().: ").upper() in letters:  # "B", "B.", "(B)", "B)"
        return said.strip("().: ").upper()
    for letter, choice in zip(letters, choices, strict=True):
        text = " ".join(choice.split()).casefold()
        if said in (text, f"{letter.casefold()}. {text}"):
            return letter
    return gold.strip()


def _letters(n: int) -> list[str]:
    """The letters of ``n`` candidates: A, B, ..."""
    return [chr(ord("A") + i) for i in range(n)]
