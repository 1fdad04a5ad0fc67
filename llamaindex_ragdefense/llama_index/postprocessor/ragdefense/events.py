"""What the postprocessors tell LlamaIndex's instrumentation beside its rerank events: the
nodes a defense removed (:class:`DefenseRemovedEvent`), once per retrieval: a defended
retriever's fetch rounds report their last round's alone."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.events import BaseEvent

from ragdefense import DefenseResult
from ragdefense.integration.records import removed_report

__all__ = ["ROUNDS", "DefenseRemovedEvent", "announce", "held", "last_round"]

dispatcher = get_dispatcher(__name__)

#: the results of a defended retriever's fetch rounds, kept for it to report its last round's
#: alone (``None``: each reported as it comes)
ROUNDS: ContextVar[list[DefenseResult | None] | None] = ContextVar(
    "ragdefense_rounds", default=None
)


class DefenseRemovedEvent(BaseEvent):
    """Instrumentation event: what a defense removed from the retrieved nodes, and why."""

    defense: str = Field(description="the defense's name, e.g. 'RAGDefender'")
    query: str = Field(description="the query the nodes were retrieved for")
    removed: list[dict[str, Any]] = Field(
        description=(
            "one record per removed node: index, id, text, score, the reason, and whether it "
            "is a copy left out because its text stays in another node"
        )
    )
    estimates: dict[str, Any] = Field(description="the defense's estimates for this query")

    @classmethod
    def class_name(cls) -> str:
        return "DefenseRemovedEvent"


def held(result: DefenseResult | None) -> bool:
    """Whether ``result``'s removals are to be reported now (not kept for a retriever's last
    round, and any made)."""
    rounds = ROUNDS.get()
    if rounds is not None:
        rounds.append(result)
    return rounds is None and result is not None and bool(result.removed)


def announce(result: DefenseResult) -> None:
    """Send a :class:`DefenseRemovedEvent` for what ``result`` removed."""
    report = removed_report(result)
    dispatcher.event(
        DefenseRemovedEvent(
            defense=report["defense"],
            query=report["query"],
            removed=report["removed"],
            estimates=report["estimates"],
        )
    )


@contextmanager
def last_round() -> Iterator[None]:
    """A defended retriever's fetch rounds: inside, the postprocessors keep their results; on
    leaving (not by an error), the last round's removals are reported, once."""
    results: list[DefenseResult | None] = []
    token = ROUNDS.set(results)
    try:
        yield
    finally:
        ROUNDS.reset(token)
    if results and (last := results[-1]) is not None and last.removed:
        announce(last)
