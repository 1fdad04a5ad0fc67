"""What the postprocessors and retrievers tell LlamaIndex's instrumentation a defense removed:
:class:`DefenseRemovedEvent`, sent by :func:`announce`."""

from __future__ import annotations

from typing import Any

from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.events import BaseEvent

from ragdefense import DefenseResult
from ragdefense.integration.adapter import removals
from ragdefense.integration.records import removed_report

__all__ = ["DefenseRemovedEvent", "announce"]

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


def announce(results: list[DefenseResult | None]) -> None:
    """Send a :class:`DefenseRemovedEvent` for each of ``results`` that removed anything."""
    for result in removals(results):
        report = removed_report(result)
        dispatcher.event(
            DefenseRemovedEvent(
                defense=report["defense"],
                query=report["query"],
                removed=report["removed"],
                estimates=report["estimates"],
            )
        )
