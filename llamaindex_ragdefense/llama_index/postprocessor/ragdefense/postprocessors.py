"""``BaseNodePostprocessor`` per core defense:
``node_postprocessors=[RAGDefenderPostprocessor()]``.
"""

from __future__ import annotations

import asyncio
import copy
import warnings
from typing import Any, Literal

from llama_index.core.bridge.pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    SerializeAsAny,
    field_validator,
)
from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.embeddings.loading import load_embed_model
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from ragdefense import Defense, DefenseResult, EmbeddingError, LlamaIndexEmbedder
from ragdefense.defenses.registry import DEFAULT_DEFENSE
from ragdefense.integration.adapter import (
    AdapterCore,
    TrustedField,
    adapter_params,
    checked_set,
    configured,
    defense_embedder,
    defense_field,
    named,
    plain_params,
    plain_value,
)
from ragdefense.integration.records import (
    UNCHECKED,
    check_items,
    verdict_metadata,
)
from ragdefense.integration.retrieval import asked_ahead
from ragdefense.vector_rows import as_rows

from .embeddings import RagdefenseEmbedding, picklable
from .events import DefenseRemovedEvent, dispatcher, reranking
from .nodes import node_passage, query_text, tagged
from .vectors import stored_vectors

__all__ = [
    "AutoDefensePostprocessor",
    "ConsensusPostprocessor",
    "DefensePostprocessor",
    "DefenseRemovedEvent",
    "GRADAPostprocessor",
    "RAGDefenderPostprocessor",
]


#: how to give a postprocessor enough nodes (in the small-pool warning; LlamaIndex retrieves 2)
TOO_FEW = (
    "A postprocessor cannot widen retrieval: retrieve more nodes, e.g. "
    "index.as_query_engine(similarity_top_k=10, node_postprocessors=[...])."
)


class DefensePostprocessor(BaseNodePostprocessor):
    """Applies a core defense to retrieved nodes; returns copies with the verdict in
    ``metadata["ragdefense"]`` (excluded from what the LLM sees). Embeddings already on the
    nodes are reused (``node_embeddings``: they must be ``embed_model``'s); otherwise
    ``embed_model`` (e.g. the index's), else the packaged MiniLM. Nodes of one text that the
    LLM is shown differently (their metadata, their image) are not copies of one another.
    A defense object comes configured: ``embed_model`` with one is an error (give the object
    ``embedder=``).
    Emits the standard rerank start / end instrumentation events (and the callback manager's
    ``RERANKING`` event), and a :class:`DefenseRemovedEvent` for what was removed.
    Serializes (``to_json`` / ``from_json``) when ``defense`` is a name and ``params`` plain
    values; ``vector_store`` is not serialized. An unknown keyword is an error (a misspelt or
    misplaced setting, e.g. ``trusted=`` here rather than on :class:`ConsensusPostprocessor`
    or in ``params``, would otherwise be dropped).
    """

    model_config = ConfigDict(
        arbitrary_types_allowed=True, extra="forbid", validate_assignment=True
    )

    defense: Any = Field(
        default=DEFAULT_DEFENSE,
        description="a name of ragdefense.defenses.registry ('ragdefender', 'grada', "
        "'grada-peel', 'auto', ...) or a core defense object",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="the named defense's parameters (e.g. {'trusted': ['docs.example.org']}); "
        "an object comes configured",
    )
    embed_model: SerializeAsAny[BaseEmbedding] | None = Field(
        default=None, description="embeddings to use"
    )
    fail_open: bool = Field(default=False, description="pass nodes through if the defense fails")
    node_embeddings: bool = Field(
        default=True,
        description="reuse the embeddings the nodes carry (node.embedding): they must be "
        "embed_model's (with no embed_model, the packaged MiniLM's, which the core checks); "
        "False: the nodes' own vectors are not read (they are another model's): the vectors "
        "vector_store holds are, where given, and the defense embeds the rest",
    )
    vector_store: Any = Field(
        default=None,
        exclude=True,
        repr=False,  # a store's repr can hold every vector
        description="the store the nodes come from (e.g. index.vector_store): the vectors it "
        "holds are used for nodes that arrive without an embedding, instead of embedding them; "
        "give embed_model= the index's model with it (the query must be embedded in the "
        "store's space); the query's vector the retriever computed is reused where the query "
        "bundle carries it (sync retrieval; LlamaIndex's async retriever does not pass it on, "
        "so the defense embeds the query again there: defend() reuses it in both); the "
        "default store holds no texts, so a node whose text was replaced after retrieval (a "
        "sentence window's) is judged by its stored vector there: leave vector_store unset "
        "after such a postprocessor (Chroma's texts are checked: a replaced one is embedded)",
    )
    _core: AdapterCore = PrivateAttr(default_factory=AdapterCore)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with every setting, or refused (LlamaIndex would drop a setting it cannot
        pickle, a ``trusted=`` predicate or the ``embed_model`` say, and the copy would trust
        nothing, or embed with another model). A ``vector_store`` that cannot be pickled is
        left out of the copy (its nodes are then embedded again); nothing is taken from this
        object (LlamaIndex removes what it drops from the object it pickles)."""
        for name in set(type(self).model_fields) - set(BaseNodePostprocessor.model_fields):
            if name != "vector_store":
                picklable(self, name, getattr(self, name))
        return super(DefensePostprocessor, copy.copy(self)).__getstate__()

    @classmethod
    def class_name(cls) -> str:
        return cls.__name__

    def to_json(self, **kwargs: Any) -> str:
        """The settings as JSON: ``defense`` a name, ``params`` and fields plain values (an
        object or a function, such as a ``trusted`` predicate, is refused, saying so)."""
        try:
            return super().to_json(**kwargs)
        except TypeError as exc:
            raise TypeError(
                f"{type(self).__name__} serializes with defense= a name and plain values, not "
                f"objects or functions ({exc}): give the defense by name and trusted= as a set"
            ) from exc

    @field_validator("params", mode="after")
    @classmethod
    def _plain(cls, params: dict[str, Any]) -> dict[str, Any]:
        return plain_params(params)

    @field_validator("embed_model", mode="before")
    @classmethod
    def _loaded(cls, value: Any) -> Any:
        """An embedding model as ``to_dict`` wrote it, loaded back (``from_json``): ours and
        the ones LlamaIndex can load by name; for another, pass ``embed_model=`` to
        ``from_json`` / ``from_dict`` (never a different model silently)."""
        if not isinstance(value, dict):
            return value
        if value.get("class_name") == RagdefenseEmbedding.class_name():
            return RagdefenseEmbedding.from_dict(value)
        try:
            return load_embed_model(value)
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f"cannot rebuild the embedding model {value.get('class_name')!r} from its JSON "
                f"({exc}): pass embed_model= to from_json / from_dict"
            ) from None

    def model_post_init(self, context: Any, /) -> None:
        """Build the core defense now, so that bad parameters fail at construction."""
        super().model_post_init(context)
        _ = self.core

    def __setattr__(self, name: str, value: Any) -> None:
        """A field set later is checked as at construction (the core defense built again); a
        value it refuses is undone."""
        checked_set(self, name, value, super().__setattr__, lambda: self.core)

    @property
    def core(self) -> Defense:
        """The core defense for the current fields (built again when one changes; it keeps its
        embedding cache across queries)."""
        configured(self.defense, self.embed_model, "embed_model")
        params = adapter_params(self, DefensePostprocessor)
        self._core = AdapterCore.claim(self._core, self)
        return self._core.get(self.defense, params, self.embed_model, LlamaIndexEmbedder)

    def _run(
        self, nodes: list[NodeWithScore], query: str, query_embedding: Any = None, ahead: Any = None
    ) -> DefenseResult | None:
        vectors: list[Any] = [n.node.embedding if self.node_embeddings else None for n in nodes]
        if ahead is not None:  # asked by the async path for the nodes carrying none
            vectors = [a if v is None else v for v, a in zip(vectors, ahead, strict=True)]
        missing = [i for i, v in enumerate(vectors) if v is None]
        if missing and self.vector_store is not None:
            found = stored_vectors(
                self.vector_store,
                [nodes[i].node.node_id for i in missing],
                [nodes[i].node.get_content(MetadataMode.NONE) for i in missing],
            )
            for i, v in zip(missing, found, strict=True):
                vectors[i] = v
        passages = [node_passage(n, v) for n, v in zip(nodes, vectors, strict=True)]
        return self._core.run(self.core, query, passages, self.fail_open, TOO_FEW, query_embedding)

    async def _aembedded(
        self, nodes: list[NodeWithScore], query: str, vector: Any
    ) -> tuple[Any, Any]:
        """The vectors the defense would ask a hosted model for (one per node, ``None`` where
        it carries its own; the query's), asked through its own batch async API
        (:meth:`ragdefense.Embedder.embed_ahead`), where the defense will embed them: no store
        gives them, not fewer than it judges; ``(None, vector)`` elsewhere."""
        embedder: Any = getattr(self.core, "embedder", None)
        model: Any = getattr(embedder, "embed_model", None)
        if (
            not getattr(self.core, "uses_embeddings", False)
            or type(embedder) is not LlamaIndexEmbedder
            or type(model)._aget_text_embeddings is BaseEmbedding._aget_text_embeddings
            or self.vector_store is not None
            or not query.strip()
        ):
            return None, vector
        carried = [self.node_embeddings and n.node.embedding is not None for n in nodes]
        ask = model.aget_query_embedding if vector is None else None  # not in the bundle
        rows, asked = await asked_ahead(
            self.core,
            embedder,
            [node_passage(n, None) for n in nodes],
            carried,
            model.aget_text_embedding_batch,
            query,
            ask,
        )
        return rows, vector if asked is None else asked

    def _judged(
        self, nodes: list[NodeWithScore], query: str, vector: Any, ahead: Any = None
    ) -> tuple[DefenseResult | None, list[NodeWithScore]]:
        """The defense's result and the nodes it passes on (copies with its verdicts)."""
        result = self._run(nodes, query, vector, ahead)
        if result is None:
            return None, [tagged(n, UNCHECKED, n.score) for n in nodes]
        return result, [
            tagged(
                nodes[i],
                verdict_metadata(result, result.verdicts[i]),
                result.verdicts[i].score if result.reranked else nodes[i].score,
            )
            for i in result.kept_indices
        ]

    def _name(self) -> str:
        return self.core.name

    def _query_vector(self, bundle: QueryBundle | None) -> Any:
        """The vector the retriever computed for the query (LlamaIndex leaves it in the
        bundle), where it is the defense's: ``vector_store`` given (that field's contract: the
        defense's model is the store's), a defense built here by name on ``embed_model`` or an
        object embedding with a LlamaIndex model as it is, and a vector of the query's own text
        (not of a hypothetical answer, HyDE) or a query given as its vector alone. Else
        ``None``: the defense embeds the query."""
        if bundle is None or bundle.embedding is None or self.vector_store is None:
            if bundle is not None and bundle.embedding is not None and not bundle.embedding_strs:
                warnings.warn(  # without the store, the vector may be another model's
                    "the query is given as its vector alone, which only vector_store= says is "
                    "the defense's model's: give vector_store= or the query's text; the blank "
                    "query judges nothing and every node is kept",
                    UserWarning,
                    stacklevel=4,
                )
            return None
        if named(self.defense):
            model: Any = self.embed_model
        else:  # a LlamaIndex model the defense wraps plainly (no query text of its own)
            model = defense_embedder(self.defense)
            model = model.embed_model if type(model) is LlamaIndexEmbedder else model
        if not isinstance(model, BaseEmbedding) or bundle.embedding_strs not in (
            [bundle.query_str],
            [],  # a query given as its vector alone
        ):
            return None
        try:  # checked as the model's output is (any finite magnitude keeps its direction)
            return as_rows([bundle.embedding], expected_rows=1)[0]
        except EmbeddingError:  # the model's fault: the defense asks it, failing as set
            return None

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        nodes = check_items(nodes, NodeWithScore, "LlamaIndex NodeWithScore")
        if not nodes:
            return []
        query = query_text(query_bundle)
        with reranking(self.callback_manager, self._name(), nodes, query_bundle, query) as end:
            result, out = self._judged(nodes, query, self._query_vector(query_bundle))
            end(result, out)
        return out

    @dispatcher.span  # LlamaIndex spans the sync method alone: a tracer sees this one too
    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        nodes = check_items(nodes, NodeWithScore, "LlamaIndex NodeWithScore")
        if not nodes:
            return []
        query = query_text(query_bundle)
        events = reranking(self.callback_manager, self._name(), nodes, query_bundle, query)
        with events as end:  # sent from here, not from the worker thread the defense runs in
            ahead, vector = await self._aembedded(nodes, query, self._query_vector(query_bundle))
            result, out = await asyncio.to_thread(self._judged, nodes, query, vector, ahead)
            end(result, out)
        return out


def _field(defense: str, name: str) -> Any:
    """A per-defense class's field: the core's default and description (a test holds the
    declared types to the core's)."""
    p = defense_field(defense, name)
    return Field(default=p.default, description=p.description)


def _fixed(name: str) -> Any:
    return Field(default=name, frozen=True, description="the core defense")


class ConsensusPostprocessor(DefensePostprocessor):
    """:class:`ragdefense.Consensus` (the default) as a node postprocessor; its fields are the
    core's parameters (``trusted``: sources, e.g. ``{"who.int"}``, or a predicate on a node's
    metadata)."""

    defense: Literal["consensus"] = _fixed("consensus")
    tightness: float = _field("consensus", "tightness")
    margin: float = _field("consensus", "margin")
    min_group: int = _field("consensus", "min_group")
    absorb: float | None = _field("consensus", "absorb")
    voice: float | None = _field("consensus", "voice")
    claims: bool = _field("consensus", "claims")
    quotes: bool = _field("consensus", "quotes")
    keep_copies: bool = _field("consensus", "keep_copies")
    source_key: str | None = _field("consensus", "source_key")
    trusted: TrustedField = _field("consensus", "trusted")
    anchor: float | None = _field("consensus", "anchor")
    support: bool = _field("consensus", "support")
    min_passages: int = _field("consensus", "min_passages")

    @field_validator("trusted", mode="before")
    @classmethod
    def _sorted(cls, trusted: Any) -> Any:
        return plain_value(trusted)


class RAGDefenderPostprocessor(DefensePostprocessor):
    """RAGDefender as a node postprocessor (see :class:`ragdefense.RAGDefender`); its fields are
    the core's parameters."""

    defense: Literal["ragdefender"] = _fixed("ragdefender")
    task_type: Literal["single_hop", "multi_hop", "auto"] = _field("ragdefender", "task_type")
    p: float = _field("ragdefender", "p")
    m: int = _field("ragdefender", "m")
    min_passages: int = _field("ragdefender", "min_passages")
    off_topic: float | None = _field("ragdefender", "off_topic")


class GRADAPostprocessor(DefensePostprocessor):
    """GRADA as a node postprocessor: reranks and keeps the top ``n`` (``None``: half), the
    node score becoming its PageRank score; its fields are the core's parameters."""

    defense: Literal["grada"] = _fixed("grada")
    similarity: Literal["hrsim", "bm25", "ebd"] = _field("grada", "similarity")
    hrsim_base: Literal["bm25", "ebd"] = _field("grada", "hrsim_base")
    alpha: float = _field("grada", "alpha")
    n: int | None = _field("grada", "n")
    damping: float = _field("grada", "damping")
    tol: float = _field("grada", "tol")
    max_iter: int = _field("grada", "max_iter")
    peel: bool = _field("grada", "peel")
    peel_tightness: float = _field("grada", "peel_tightness")
    peel_margin: float = _field("grada", "peel_margin")


class AutoDefensePostprocessor(DefensePostprocessor):
    """:class:`ragdefense.AutoDefense` as a node postprocessor; its fields are the core's
    parameters. Where it reranks with GRADA, as :class:`GRADAPostprocessor` does, a node's
    score becomes its PageRank score (a later ``SimilarityPostprocessor`` cutoff reads that)."""

    defense: Literal["auto"] = _fixed("auto")
    n: int | None = _field("auto", "n")
    peel_tightness: float = _field("auto", "peel_tightness")
    peel_margin: float = _field("auto", "peel_margin")
    absorb: float | None = _field("auto", "absorb")
    majority_tightness: float | None = _field("auto", "majority_tightness")
    peel: bool = _field("auto", "peel")
