"""What the postprocessors and retrievers tell LlamaIndex's instrumentation and callbacks: the
rerank events around a defense (:func:`reranking`) and what it removed
(:class:`DefenseRemovedEvent`, sent by :func:`announce`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from llama_index.core.bridge.pydantic import Field
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.schema import NodeWithScore, QueryBundle

from ragdefense import DefenseResult
from ragdefense.integration.adapter import removals, report_now
from ragdefense.integration.records import removed_report

__all__ = ["DefenseRemovedEvent", "announce", "reranking"]

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


@contextmanager
def reranking(
    manager: CallbackManager,
    name: str,
    nodes: list[NodeWithScore],
    bundle: QueryBundle | None,
    query: str,
) -> Iterator[Callable[[DefenseResult | None, list[NodeWithScore]], None]]:
    """LlamaIndex's rerank events around the defense ``name`` (instrumentation, and the
    callback ``manager``'s ``RERANKING`` event); ``end(result, out)`` reports what it removed
    and ends them, where the caller is (an async call cancelled reports nothing)."""
    dispatcher.event(ReRankStartEvent(query=bundle, nodes=nodes, top_n=len(nodes), model_name=name))
    payload: dict[str, Any] = {
        EventPayload.NODES: nodes,
        EventPayload.MODEL_NAME: name,
        EventPayload.QUERY_STR: query,
        EventPayload.TOP_K: len(nodes),
    }
    with manager.event(CBEventType.RERANKING, payload=payload) as event:

        def end(result: DefenseResult | None, out: list[NodeWithScore]) -> None:
            if report_now(result):
                announce([result])
            event.on_end(payload={EventPayload.NODES: out})
            dispatcher.event(ReRankEndEvent(nodes=out))

        yield end
