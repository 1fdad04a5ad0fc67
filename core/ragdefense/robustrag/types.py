"""RobustRAG's vocabulary: the default prompts, what counts as an abstention, and the result
types (isolated responses, decoding steps, certificates, the answer with its report)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal

from ..text import is_abstention
from ..types import Passage

__all__ = [
    "IDK",
    "ISOLATED_PROMPT",
    "KEYWORD_PROMPT",
    "MULTIPLE_CHOICE_PROMPT",
    "NO_INFO",
    "NO_RETRIEVAL_PROMPT",
    "Attack",
    "Certificate",
    "DecodingStep",
    "IsolatedResponse",
    "RobustAnswer",
    "is_abstention",
]

# Default prompts, after the paper's templates (Appendix G), zero-shot.
ISOLATED_PROMPT = (
    "Context information is below.\n---------------------\n{context}\n---------------------\n"
    "Given the context information and not prior knowledge, answer the query with no more than "
    'ten words. If the context does not contain the answer, just say "I don\'t know".\n'
    "Query: {query}\nAnswer:"
)
KEYWORD_PROMPT = (
    "Word suggestion is below.\n---------------------\n{keywords}\n---------------------\n"
    "Given the word suggestion provided by experts, concisely answer the query.\n"
    "Query: {query}\nAnswer:"
)
MULTIPLE_CHOICE_PROMPT = (
    "Context information is below.\n---------------------\n{context}\n---------------------\n"
    "Given the context information and not prior knowledge, answer the query with the best "
    "candidate.\nQuery: {query}\nCandidates:\n{choices}\nE. No information found\n"
    "Output an answer from {letters} only when there is clear evidence. Otherwise, output "
    "'E. No information found' as the answer.\nAnswer:"
)
NO_RETRIEVAL_PROMPT = (
    "Answer the query with no more than ten words. If you do not know the answer confidently, "
    'just say "I don\'t know".\nQuery: {query}\nAnswer:'
)
IDK = "I don't know"
Attack = Literal["injection", "modification"]
NO_INFO = "E"


@dataclass(frozen=True)
class IsolatedResponse:
    """The LLM's answer from one passage alone."""

    index: int
    passage: Passage
    text: str | None
    abstained: bool
    error: str | None = None
    keywords: frozenset[str] = frozenset()
    choice: str | None = None  # majority vote: the chosen letter ("E" = no information)
    p_idk: float | None = None  # decoding: probability that the answer is "I don't know"


@dataclass(frozen=True)
class DecodingStep:
    """One token of secure decoding: the averaged top-2, their gap, and which token was used."""

    token: str
    source: Literal["retrieval", "no-retrieval"]
    top1: str
    p1: float
    top2: str
    p2: float

    @property
    def gap(self) -> float:
        """Averaged top-1 minus top-2 probability."""
        return self.p1 - self.p2


@dataclass(frozen=True)
class Certificate:
    """Whether the answer provably survives k' injected (or modified) passages, and why."""

    k_prime: int
    attack: Attack
    certified: bool
    reason: str
    possible_answers: tuple[str, ...] | None = None  # every answer the attacker can cause
    always_kept: tuple[str, ...] = ()  # keyword aggregation: keywords the attacker cannot drop
    undecided: tuple[str, ...] = ()  # keyword aggregation: keywords the attacker controls


@dataclass(frozen=True)
class RobustAnswer:
    """RobustRAG's answer and the report behind it."""

    query: str
    answer: str
    aggregation: Literal["keyword", "majority", "decoding"]
    responses: tuple[IsolatedResponse, ...]
    reason: str
    keyword_counts: dict[str, int] = field(default_factory=dict)
    threshold: float | None = None
    kept_keywords: tuple[str, ...] = ()
    votes: dict[str, int] = field(default_factory=dict)
    choice: str | None = None  # majority vote: the winning letter
    choices: tuple[str, ...] = ()  # majority vote: the candidates, in letter order
    steps: tuple[DecodingStep, ...] = ()  # decoding aggregation: one per generated token
    certificate: Certificate | None = None
    #: the aggregation's settings it was aggregated with (``certify`` refuses other settings)
    settings: Any = None
    #: the engine's own settings that decide an answer (``certify`` refuses other ones; the
    #: LLM itself is not compared: certify with the model that answered)
    engine: Mapping[str, Any] | None = None

    @property
    def abstentions(self) -> list[int]:
        """Indices of the passages whose isolated answer abstained (or failed)."""
        return [r.index for r in self.responses if r.abstained]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view: every field, each isolated response with its passage's id
        and text (keywords sorted), the aggregation's settings as a mapping."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "responses"}
        out["responses"] = [
            {**{f.name: getattr(r, f.name) for f in fields(r) if f.name != "passage"},
             "id": r.passage.id, "passage": r.passage.text}
            for r in self.responses
        ]  # fmt: skip
        return dict(_plain(out))

    def __str__(self) -> str:
        lines = [f"RobustRAG ({self.aggregation}): {self.answer!r}", f"  why: {self.reason}"]
        for r in self.responses:
            tag = "abstained" if r.abstained else (f"chose {r.choice}" if r.choice else "answered")
            text = r.error or r.text or ""
            if r.p_idk is not None:
                tag, text = (
                    ("dropped" if r.abstained else "kept"),
                    f"P(I don't know) = {r.p_idk:.3f}",
                )
            lines.append(f"  [{r.index}] {tag:10} {text[:70]}")
        if self.keyword_counts:
            top = sorted(self.keyword_counts.items(), key=lambda kv: (-kv[1], kv[0]))[:12]
            lines.append("  keyword counts: " + ", ".join(f"{k} ({c})" for k, c in top))
            lines.append(f"  threshold mu = {self.threshold:g}; kept: {list(self.kept_keywords)}")
        if self.votes:
            lines.append(f"  votes: {dict(self.votes)}")
        for st in self.steps:
            lines.append(
                f"  token {st.token!r:12} from {st.source:12} top-2 {st.top1!r} {st.p1:.3f} / "
                f"{st.top2!r} {st.p2:.3f} (gap {st.gap:.3f})"
            )
        if self.certificate is not None:
            c = self.certificate
            verdict = "CERTIFIED" if c.certified else "not certified"
            lines.append(f"  certificate (k'={c.k_prime}, {c.attack}): {verdict}: {c.reason}")
        return "\n".join(lines)


def _plain(value: Any) -> Any:
    """``value`` with dataclasses as mappings, sets sorted, tuples as lists, NaN as None."""
    if is_dataclass(value) and not isinstance(value, type):
        return _plain({f.name: getattr(value, f.name) for f in fields(value)})
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
