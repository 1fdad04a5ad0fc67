"""What the postprocessors tell LlamaIndex's instrumentation beside its rerank events: the
nodes a defense removed (:class:`DefenseRemovedEvent`), once per retrieval: a defended
retriever's fetch rounds report their last round's alone."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.events import BaseEvent

from ragdefense import DefenseResult
from ragdefense.integration.records import removed_report
from ragdefense.integration.retrieval import last_removals, rounds_kept

__all__ = ["DefenseRemovedEvent", "announce", "last_round"]

dispatcher = get_dispatcher(__name__)


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
    with rounds_kept() as results:
        yield
    if (last := last_removals(results)) is not None:
        announce(last)
