"""What a red team found: each target's outcome in each pipeline."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["RedTeamReport", "TargetOutcome"]


@dataclass(frozen=True)
class TargetOutcome:
    """One target through one pipeline."""

    pipeline: str
    question: str
    wrong_answer: str
    retrieved: int
    poison_retrieved: int  # passages planted for this question in its context
    answer: str | None
    hijacked: bool  # a wrong answer stated; without one: most of it poison (injection: one)
    correct: bool | None  # the answer states the correct answer (None: unknown)
    other_poison: int = 0  # passages planted for the other targets (not this one's verdict)


@dataclass
class RedTeamReport:
    """What happened to every target in every pipeline."""

    attack: str
    n_poison: int
    outcomes: list[TargetOutcome] = field(default_factory=list)

    @property
    def pipelines(self) -> list[str]:
        """The pipelines run, in order."""
        return list(dict.fromkeys(o.pipeline for o in self.outcomes))

    def hijack_rate(self, pipeline: str) -> float:
        """Share of the targets hijacked in ``pipeline`` (one of :attr:`pipelines`, or a
        defense name as typed, ``"GRADA_peel"``; else ``KeyError``: a misspelt name must not
        read as "never hijacked")."""
        name = self._known(pipeline)
        sub = [o for o in self.outcomes if o.pipeline == name]
        return sum(o.hijacked for o in sub) / len(sub)

    def hijacked(self, pipeline: str) -> list[str]:
        """The questions hijacked in ``pipeline`` (named as for :meth:`hijack_rate`)."""
        name = self._known(pipeline)
        return [o.question for o in self.outcomes if o.pipeline == name and o.hijacked]

    def _known(self, pipeline: str) -> str:
        ran = self.pipelines
        if pipeline in ran:
            return pipeline
        from .defenses.registry import preset

        try:  # a defense's name as the user typed it: its column is the registry's name
            name = preset(pipeline).name
        except ValueError:
            name = None
        if name not in ran:
            raise KeyError(f"no pipeline {pipeline!r} in this report: it ran {ran}")
        return str(name)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "attack": self.attack,
            "n_poison": self.n_poison,
            "hijack_rate": {p: self.hijack_rate(p) for p in self.pipelines},
            "outcomes": [asdict(o) for o in self.outcomes],
        }

    def to_table(self, width: int = 60) -> str:
        """A Markdown table: one row per target, per pipeline poison retrieved and verdict."""
        names = self.pipelines
        head = "| question | " + " | ".join(names) + " |"
        lines = [head, "|---|" + "---|" * len(names)]
        for q in dict.fromkeys(o.question for o in self.outcomes):
            cells = []
            for name in names:
                o = next(x for x in self.outcomes if x.pipeline == name and x.question == q)
                verdict = "HIJACKED" if o.hijacked else "ok"
                others = f", {o.other_poison} for other questions" if o.other_poison else ""
                cells.append(f"{verdict} ({o.poison_retrieved}/{o.retrieved} poison{others})")
            shown = " ".join(q.split()).replace("|", "\\|")  # one table cell: no break, no bar
            short = shown if len(shown) <= width else shown[: width - 1] + "…"
            lines.append(f"| {short} | " + " | ".join(cells) + " |")
        lines.append(
            "| **hijacked** | " + " | ".join(f"**{self.hijack_rate(n):.0%}**" for n in names) + " |"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return (
            f"Red team: {self.attack}, up to {self.n_poison} poison passage(s) per question\n\n"
            + self.to_table()
        )
