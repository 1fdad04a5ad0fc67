"""What a red team attacks: the target questions with the attacker's answers, and the JSON file
that lists them (:mod:`ragdefense.redteam` runs the attack)."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .text import normalize

__all__ = ["AttackTarget", "load_targets"]


@dataclass(frozen=True)
class AttackTarget:
    """A question the attacker wants answered with ``wrong_answer``.

    Args:
        question: The target question.
        wrong_answer: The attacker's answer.
        correct_answer: Optional, for the report.
        poison: Passages asserting the wrong answer (e.g. PoisonedRAG's ``adv_texts``); when
            empty they are written from templates.
        alternatives: More wrong answers, for the ``multi-answer`` attack.
    """

    question: str
    wrong_answer: str
    correct_answer: str | None = None
    poison: tuple[str, ...] = ()
    alternatives: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.question, str) or not self.question.strip():
            raise ValueError("an attack target needs a non-empty question")
        if not isinstance(self.wrong_answer, str) or not self.wrong_answer.strip():
            raise ValueError(f"target {self.question!r} needs a non-empty wrong_answer")
        if self.correct_answer is not None and not isinstance(self.correct_answer, str):
            raise ValueError(
                f"target {self.question!r}: correct_answer must be a string or None, got "
                f"{type(self.correct_answer).__name__}"
            )
        for name in ("poison", "alternatives"):
            value = getattr(self, name)
            try:  # None: none given; a set in a fixed order
                found = (
                    ()
                    if value is None
                    else tuple(sorted(value) if isinstance(value, set | frozenset) else value)
                )
            except TypeError:
                found = (0,)  # not iterable: refused below
            if isinstance(value, str | bytes) or not all(isinstance(t, str) for t in found):
                raise ValueError(
                    f"target {self.question!r}: {name} must be a sequence of strings (one "
                    f"passage is {name}=(text,))"
                )
            object.__setattr__(self, name, tuple(str(t) for t in found))
        taken = {normalize(self.wrong_answer): "the wrong answer"}
        taken |= {normalize(self.correct_answer): "the correct one"} if self.correct_answer else {}
        if self.correct_answer and normalize(self.correct_answer) == normalize(self.wrong_answer):
            raise ValueError(f"target {self.question!r}: the wrong answer is the correct one")
        for alternative in self.alternatives:
            if normalize(alternative) in taken:  # it would plant the truth, or one answer twice
                raise ValueError(
                    f"target {self.question!r}: the alternative {alternative!r} is "
                    f"{taken[normalize(alternative)]}: give other wrong answers"
                )
        unique: dict[str, str] = {}
        for alternative in self.alternatives:  # each answer once, as first written, in order
            unique.setdefault(normalize(alternative), alternative)
        object.__setattr__(self, "alternatives", tuple(unique.values()))


def load_targets(path: str | Path) -> list[AttackTarget]:
    """Targets from a JSON list of ``{"question", "wrong_answer", "correct_answer"?, "poison"?,
    "alternatives"?}`` (PoisonedRAG's field names ``incorrect answer`` / ``correct answer`` /
    ``adv_texts`` are accepted too, and its id -> record object). Every field is checked
    against that schema, and a field spelled nearly as one of them is refused (it would be
    lost); other fields are ignored. Errors name the file, the record and the field."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{p}: cannot read targets ({exc})") from exc
    except RecursionError:
        raise ValueError(f"{p}: JSON nested too deeply to be a targets file") from None
    if isinstance(raw, dict):
        if not any(isinstance(v, dict) for v in raw.values()) and "question" in raw:
            raise ValueError(f"{p}: holds one target, not a list of them: write it as [{{...}}]")
        raw = list(raw.values())
    if not isinstance(raw, list):
        raise ValueError(f"{p}: expected a list of targets, got {type(raw).__name__}")
    out = []
    for i, rec in enumerate(raw):
        if not isinstance(rec, dict):
            raise ValueError(f"{p}: record {i} is not an object")

        where = f"{p}: record {i}"
        for name in sorted(set(rec) - _FIELDS, key=str):  # a misspelling would be lost
            near = difflib.get_close_matches(str(name), _FIELDS - {"id"}, n=1, cutoff=0.8)
            if near:  # other fields (a dataset's own bookkeeping) are left alone
                raise ValueError(f"{where} has unknown field {name!r} (did you mean {near[0]!r}?)")
        try:
            target = AttackTarget(
                _field(where, rec, "question", required=True),
                _field(where, rec, "wrong_answer", "incorrect answer", required=True),
                _field(where, rec, "correct_answer", "correct answer"),
                _field(where, rec, "poison", "adv_texts", many=True),
                _field(where, rec, "alternatives", many=True),
            )
        except ValueError as exc:  # the target's own checks (empty question, ...)
            if str(exc).startswith(where):
                raise
            raise ValueError(f"{where}: {exc}") from None
        out.append(target)
    return out


#: the fields a targets-file record holds (PoisonedRAG's names and its ``id`` too)
_FIELDS = frozenset(
    {"question", "wrong_answer", "correct_answer", "poison", "alternatives", "id"}
    | {"incorrect answer", "correct answer", "adv_texts"}
)


def _field(
    where: str, rec: dict[str, Any], *names: str, required: bool = False, many: bool = False
) -> Any:
    """A targets-file field (the first of ``names`` present): a string, or with ``many`` a list
    of strings; ``ValueError`` naming ``where`` and the field otherwise."""
    name = next((n for n in names if n in rec), names[0])
    value = rec.get(name)
    if value is None:
        if required:
            raise ValueError(f"{where} has no field {names[0]!r}")
        return () if many else None
    if many:
        if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
            kind = type(value).__name__
            raise ValueError(f"{where} field {name!r} must be a list of strings, got {kind}")
        return tuple(value)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{where} field {name!r} must be a string, got {type(value).__name__}")
    return str(value)
