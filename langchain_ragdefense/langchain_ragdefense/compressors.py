"""``BaseDocumentCompressor`` per core defense, for ``ContextualCompressionRetriever``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManager, CallbackManager, Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.embeddings import Embeddings
from langchain_core.runnables.config import (
    ensure_config,
    get_async_callback_manager_for_config,
    get_callback_manager_for_config,
)
from langchain_core.vectorstores import VectorStore
from pydantic import ConfigDict, Field, PrivateAttr, field_validator

from ragdefense import Defense, DefenseResult, LangChainEmbedder, Passage
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
    report_now,
    same_space,
)
from ragdefense.integration.records import (
    UNCHECKED,
    check_items,
    removed_report,
    tagged_metadata,
    verdict_metadata,
)
from ragdefense.integration.retrieval import asked_ahead

from .vectors import stored_vectors

#: vectors asked ahead by the async path: the passages' rows and the query's (``None``: not)
Ahead = tuple[Any, Any]

__all__ = [
    "EVENT_NAME",
    "AutoDefenseCompressor",
    "ConsensusCompressor",
    "DefenseCompressor",
    "GRADACompressor",
    "RAGDefenderCompressor",
]

#: name of the custom callback event that reports removed documents
EVENT_NAME = "ragdefense_removed"


def _tag(doc: Document, record: dict[str, Any]) -> Document:
    """A copy of ``doc`` with ``record`` under the namespaced metadata key."""
    return doc.model_copy(update={"metadata": tagged_metadata(doc.metadata, record)})


class DefenseCompressor(BaseDocumentCompressor):
    """Applies a core defense to retrieved documents; returns copies with the verdict in
    ``metadata["ragdefense"]``: ``defense``, ``kept``, ``score``, ``score_name``, ``rank``,
    ``reason`` and the defense's own details (a value already there is kept as ``previous``).
    Removed documents are reported through the callback system as the custom event
    ``"ragdefense_removed"``.

    Attributes:
        defense: A name of :mod:`ragdefense.defenses.registry` (``"ragdefender"``, ``"grada"``,
            ``"grada-peel"``, ``"auto"``, ...) or a core defense object.
        params: The named defense's parameters (e.g. ``{"trusted": {"docs.example.org"}}``);
            an object comes configured.
        embeddings: The LangChain ``Embeddings`` a named defense uses (e.g. the vector
            store's); ``None``: the store's where ``vectorstore`` is given, else the packaged
            all-MiniLM-L6-v2. With a defense object it is an error: the object embeds with its
            own ``embedder`` (give it ``embedder=``).
        fail_open: On a defense error, pass the documents through with a warning instead of
            raising :class:`ragdefense.DefenseFailed`. A query it cannot use (not a string, or
            embedded by another model than the documents: :class:`ragdefense.QueryInputError`)
            raises either way.
        vectorstore: The store the documents come from: the vectors it holds for them are
            used instead of embedding them again
            (:func:`langchain_ragdefense.vectors.stored_vectors`) where the defense's model is
            the store's own (a named defense without ``embeddings`` then embeds the query with
            it), or the packaged default where the store's model is it too or is not known (the
            core checks the vectors are its). A defense with
            another model, given as ``embeddings`` or as a defense object's ``embedder``,
            embeds the query and the documents with it: one space for both.
            ``defend(retriever)`` sets it.
    """

    model_config = ConfigDict(
        arbitrary_types_allowed=True, extra="forbid", validate_assignment=True
    )

    defense: Any = DEFAULT_DEFENSE
    params: dict[str, Any] = Field(default_factory=dict)
    embeddings: Embeddings | None = None
    fail_open: bool = False
    vectorstore: VectorStore | None = None
    _core: AdapterCore = PrivateAttr(default_factory=AdapterCore)

    @field_validator("params", mode="after")
    @classmethod
    def _plain(cls, params: dict[str, Any]) -> dict[str, Any]:
        return plain_params(params)

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
        configured(self.defense, self.embeddings, "embeddings")
        params = adapter_params(self, DefenseCompressor)
        self._core = AdapterCore.claim(self._core, self)
        # the store's vectors are its model's: the query must be embedded by the same one
        embeddings = self.embeddings or getattr(self.vectorstore, "embeddings", None)
        return self._core.get(self.defense, params, embeddings, LangChainEmbedder)

    def _store_space(self) -> bool:
        """Whether the store's vectors are in the space the defense embeds in: its model is
        the store's own (a named defense's ``embeddings``, ``None`` meaning the store's; a
        defense object's ``embedder``), or the packaged default where the store's model is
        it too or is not known (the core checks the vectors against it). Another model's
        vectors would be compared with the query in another space, silently where the sizes
        agree."""
        own = getattr(self.vectorstore, "embeddings", None)
        model = (self.embeddings or own) if named(self.defense) else defense_embedder(self.defense)
        return same_space(model, own)

    def _run(
        self, documents: Sequence[Document], query: str, ahead: Ahead = (None, None)
    ) -> DefenseResult | None:
        """The defense on ``documents``, with the store's vectors where they are the defense's,
        or those asked ``ahead`` (the passages' rows, the query's vector) by the async path."""
        documents = check_items(documents, Document, "LangChain Document")
        store = self.vectorstore
        vectors: list[Any] = [None] * len(documents) if ahead[0] is None else list(ahead[0])
        if store is not None and documents and self._store_space():
            vectors = stored_vectors(store, documents)
        passages = [
            Passage(d.page_content, id=d.id, metadata=d.metadata, embedding=v)
            for d, v in zip(documents, vectors, strict=True)
        ]
        return self._core.run(self.core, query, passages, self.fail_open, TOO_FEW, ahead[1])

    @staticmethod
    def _output(documents: Sequence[Document], result: DefenseResult | None) -> list[Document]:
        if result is None:  # nothing to check, or failed open
            note = UNCHECKED if documents else {}
            return [_tag(d, note) for d in documents]
        return [
            _tag(documents[i], verdict_metadata(result, result.verdicts[i]))
            for i in result.kept_indices
        ]

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """Filter or rerank ``documents`` for ``query`` with the core defense; what it removed
        goes to ``callbacks`` (else the run it is called in) as a ``ragdefense_removed`` event."""
        result = self._run(documents, query)
        if report_now(result):
            announce(result, callbacks)
        return self._output(documents, result)

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """Async :meth:`compress_documents` (the CPU-bound defense and the copies of the
        documents it passes on are made in a worker thread; its event is sent from here)."""
        ahead = await self._aembedded(documents, query)
        result, out = await asyncio.to_thread(self._judged, documents, query, ahead)
        if report_now(result):
            await aannounce(result, callbacks)
        return out

    async def _aembedded(self, documents: Sequence[Document], query: str) -> Ahead:
        """The vectors the defense would ask its model for, asked through the model's own async
        API where it has one (a hosted model; :meth:`ragdefense.Embedder.embed_ahead`), where
        the defense will embed them: not from the store, not fewer than it judges."""
        if not isinstance(query, str) or not isinstance(documents, list | tuple):
            return None, None  # refused by the defense's own checks, in the worker thread
        core = self.core
        embedder: Any = getattr(core, "embedder", None)
        model: Any = getattr(embedder, "embeddings", None)
        if (
            not getattr(core, "uses_embeddings", False)
            or type(embedder) is not LangChainEmbedder
            or type(model).aembed_documents is Embeddings.aembed_documents  # a thread's too
            or (self.vectorstore is not None and self._store_space())  # the store's vectors
            or not query.strip()
        ):
            return None, None
        docs = [d if isinstance(d, Document) else Document("") for d in documents]
        passages = [Passage(d.page_content, metadata=d.metadata) for d in docs]
        return await asked_ahead(
            core,
            embedder,
            passages,
            [False] * len(passages),
            model.aembed_documents,
            query,
            model.aembed_query,
        )

    def _judged(
        self, documents: Sequence[Document], query: str, ahead: Ahead = (None, None)
    ) -> tuple[DefenseResult | None, list[Document]]:
        result = self._run(documents, query, ahead)
        return result, self._output(documents, result)


def announce(result: DefenseResult, callbacks: Callbacks | None) -> None:
    """Send ``result``'s removals as a ``ragdefense_removed`` event: to ``callbacks`` (a run's
    handlers under its id, or a list of handlers), else to the run it is called in, if any."""
    manager = (
        CallbackManager.configure(callbacks)
        if callbacks
        else get_callback_manager_for_config(ensure_config())
    )
    if callbacks or manager.parent_run_id is not None:
        manager.on_custom_event(EVENT_NAME, removed_report(result), manager.parent_run_id)


async def aannounce(result: DefenseResult, callbacks: Callbacks | None) -> None:
    """Async :func:`announce`."""
    manager = (
        AsyncCallbackManager.configure(callbacks)
        if callbacks
        else get_async_callback_manager_for_config(ensure_config())
    )
    if callbacks or manager.parent_run_id is not None:
        await manager.on_custom_event(EVENT_NAME, removed_report(result), manager.parent_run_id)


#: how to give a compressor enough documents (in the small-pool warning)
TOO_FEW = (
    "Ask the base retriever for more, e.g. vector_store.as_retriever(search_kwargs={'k': 10}), "
    "or use defend(retriever), which fetches the pool the defense needs and returns k."
)


def _field(defense: str, name: str) -> Any:
    """A per-defense class's field: the core's default and description (a test holds the
    declared types to the core's)."""
    p = defense_field(defense, name)
    return Field(default=p.default, description=p.description)


def _fixed(name: str) -> Any:
    return Field(default=name, frozen=True, description="the core defense")


class ConsensusCompressor(DefenseCompressor):
    """:class:`ragdefense.Consensus` (the default) as a document compressor; its fields are the
    core's parameters (``trusted``: sources, e.g. ``{"who.int"}``, or a predicate on a
    document's metadata)."""

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


class RAGDefenderCompressor(DefenseCompressor):
    """RAGDefender as a document compressor (see :class:`ragdefense.RAGDefender`); its fields
    are the core's parameters."""

    defense: Literal["ragdefender"] = _fixed("ragdefender")
    task_type: Literal["single_hop", "multi_hop", "auto"] = _field("ragdefender", "task_type")
    p: float = _field("ragdefender", "p")
    m: int = _field("ragdefender", "m")
    min_passages: int = _field("ragdefender", "min_passages")
    off_topic: float | None = _field("ragdefender", "off_topic")


class GRADACompressor(DefenseCompressor):
    """GRADA as a document compressor: keeps the top ``n`` after graph reranking (``None``: half
    of the documents given, the paper's M = 2n); its fields are the core's parameters."""

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


class AutoDefenseCompressor(DefenseCompressor):
    """:class:`ragdefense.AutoDefense` as a document compressor; its fields are the core's
    parameters."""

    defense: Literal["auto"] = _fixed("auto")
    n: int | None = _field("auto", "n")
    peel_tightness: float = _field("auto", "peel_tightness")
    peel_margin: float = _field("auto", "peel_margin")
    absorb: float | None = _field("auto", "absorb")
    majority_tightness: float | None = _field("auto", "majority_tightness")
    peel: bool = _field("auto", "peel")
