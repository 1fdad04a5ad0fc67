"""``BaseNodePostprocessor`` per core defense:
``node_postprocessors=[RAGDefenderPostprocessor()]``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from ragdefense import DefenseResult, LlamaIndexEmbedder, Passage
from ragdefense.integration import (
    METADATA_KEY,
    Defense,
    make_defense,
    removed_report,
    run_defense,
    verdict_metadata,
)

__all__ = [
    "DefensePostprocessor",
    "DefenseRemovedEvent",
    "GRADAPostprocessor",
    "RAGDefenderPostprocessor",
]

dispatcher = get_dispatcher(__name__)


class DefenseRemovedEvent(BaseEvent):
    """Instrumentation event: what a defense removed from the retrieved nodes, and why."""

    defense: str
    query: str
    removed: list[dict[str, Any]]
    estimates: dict[str, Any]

    @classmethod
    def class_name(cls) -> str:
        return "DefenseRemovedEvent"


def _tag(nws: NodeWithScore, record: dict[str, Any], score: float | None) -> NodeWithScore:
    """A copy of the node with ``record`` in its metadata, hidden from the LLM and embedder."""
    node = nws.node
    update: dict[str, Any] = {"metadata": {**node.metadata, METADATA_KEY: record}}
    for attr in ("excluded_llm_metadata_keys", "excluded_embed_metadata_keys"):
        keys = list(getattr(node, attr, []) or [])
        update[attr] = keys if METADATA_KEY in keys else [*keys, METADATA_KEY]
    return NodeWithScore(node=node.model_copy(update=update), score=score)


class DefensePostprocessor(BaseNodePostprocessor):
    """Applies a core defense to retrieved nodes; returns copies with the verdict in
    ``metadata["ragdefense"]`` (excluded from what the LLM sees). Embeddings already on the
    nodes are reused; otherwise ``embed_model`` (e.g. the index's), else the packaged MiniLM.
    A :class:`DefenseRemovedEvent` reports what was removed.
    """

    defense: Any = Field(
        default="ragdefender", description="'ragdefender', 'grada', 'auto' or an object"
    )
    embed_model: BaseEmbedding | None = Field(default=None, description="embeddings to use")
    fail_open: bool = Field(default=False, description="pass nodes through if the defense fails")
    _core: Defense | None = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        return "DefensePostprocessor"

    def _params(self) -> dict[str, Any]:
        return {}

    @property
    def core(self) -> Defense:
        """The core defense (built on first use)."""
        if self._core is None:
            embedder = LlamaIndexEmbedder(self.embed_model) if self.embed_model else None
            self._core = make_defense(self.defense, embedder, **self._params())
        return self._core

    def _run(self, nodes: list[NodeWithScore], query: str) -> DefenseResult | None:
        passages = [
            Passage(
                n.node.get_content(metadata_mode=MetadataMode.NONE),
                id=n.node.node_id,
                score=n.score,
                metadata=n.node.metadata,
                embedding=n.node.embedding,
            )
            for n in nodes
        ]
        return run_defense(self.core, query, passages, self.fail_open)

    def _output(
        self, nodes: list[NodeWithScore], result: DefenseResult | None
    ) -> list[NodeWithScore]:
        if result is None:
            return [_tag(n, {"checked": False}, n.score) for n in nodes]
        if result.removed:
            report = removed_report(result)
            dispatcher.event(
                DefenseRemovedEvent(
                    defense=report["defense"],
                    query=report["query"],
                    removed=report["removed"],
                    estimates=report["estimates"],
                )
            )
        rerank = result.score_name == "pagerank"
        out = []
        for i in result.kept_indices:
            v = result.verdicts[i]
            out.append(
                _tag(nodes[i], verdict_metadata(result, v), v.score if rerank else nodes[i].score)
            )
        return out

    @staticmethod
    def _query(query_bundle: QueryBundle | None) -> str:
        if query_bundle is None:
            raise ValueError("a defense needs the query: call with query_bundle / query_str")
        return query_bundle.query_str

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if not nodes:
            return []
        return self._output(nodes, self._run(nodes, self._query(query_bundle)))

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if not nodes:
            return []
        result = await asyncio.to_thread(self._run, nodes, self._query(query_bundle))
        return self._output(nodes, result)


class RAGDefenderPostprocessor(DefensePostprocessor):
    """RAGDefender as a node postprocessor (see :class:`ragdefense.RAGDefender`)."""

    defense: Any = Field(default="ragdefender", frozen=True)
    task_type: Literal["single_hop", "multi_hop", "auto"] = Field(default="auto")
    p: float = Field(default=2.0)
    m: int = Field(default=5)

    @classmethod
    def class_name(cls) -> str:
        return "RAGDefenderPostprocessor"

    def _params(self) -> dict[str, Any]:
        return {"task_type": self.task_type, "p": self.p, "m": self.m}


class GRADAPostprocessor(DefensePostprocessor):
    """GRADA as a node postprocessor: reranks and keeps the top ``n`` (``None``: half), the
    node score becoming its PageRank score."""

    defense: Any = Field(default="grada", frozen=True)
    similarity: Literal["hrsim", "bm25", "ebd"] = Field(default="hrsim")
    alpha: float = Field(default=0.4)
    n: int | None = Field(default=None)
    peel: bool = Field(
        default=False, description="Remove coordinated groups before the graph (GRADA peel)."
    )

    @classmethod
    def class_name(cls) -> str:
        return "GRADAPostprocessor"

    def _params(self) -> dict[str, Any]:
        return {"similarity": self.similarity, "alpha": self.alpha, "n": self.n, "peel": self.peel}
