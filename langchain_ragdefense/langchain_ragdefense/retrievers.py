"""A ``BaseRetriever`` that applies any defense to any retriever, and ``defend(...)``."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import patch_config
from langchain_core.vectorstores import VectorStoreRetriever
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ragdefense import LangChainEmbedder
from ragdefense.integration.adapter import configured, named, plain_params, pooled, removals
from ragdefense.integration.retrieval import (
    FETCH_ROUNDS,
    check_request,
    checked_size,
    fetch_rounds,
    fetched_enough,
    first_fetch,
    pool_size,
    positive_int,
    wider,
)
from ragdefense.types import check_query

from ._nesting import (
    _compressed,
    _ensemble,
    _retriever_k,
    _size_field,
    _store_and_model,
    _unions,
    _wrapped,
)
from .compressors import DefenseCompressor, aannounce, announce
from .vectors import by_vector, remembered, searches_by_vector

__all__ = ["DefendedRetriever", "defend"]

#: the config of the ``invoke`` in progress: ``BaseRetriever.invoke`` hands
#: ``_get_relevant_documents`` a run manager only, and the base retriever must run under the
#: caller's config (its ``configurable``: a per-user filter; limits, tags, metadata)
_CALLER_CONFIG: ContextVar[RunnableConfig | None] = ContextVar("ragdefense_config", default=None)


class DefendedRetriever(BaseRetriever):
    """Retrieves with ``base_retriever``, then applies ``compressor`` (a defense). The base
    retriever runs under the caller's config (its ``configurable``, e.g. a per-user filter;
    tags, metadata, limits), with this run's callbacks.

    Attributes:
        base_retriever: The retriever to protect.
        compressor: A :class:`DefenseCompressor` (or any ``BaseDocumentCompressor``).
        k: Documents returned (``invoke(query, k=...)`` overrides it; ``k=None`` there: all
            kept); ``None``: at most what the base retriever returns by default (as
            :func:`defend`'s), all kept where that is not known.
        fetch_k: Documents first asked of the base retriever (how: :func:`widened`); by default the
            defense's pool for ``k`` (:func:`ragdefense.integration.retrieval.pool_size`:
            twice ``k`` and at least 8 for Consensus, the default; twice ``k`` for GRADA, as its
            M = 2n, and at least 8 with its peel; ``k`` and at least 8 for RAGDefender, which
            filters the retrieved set), and at least what the base retriever returns by default
            (one set to fetch more is not narrowed: the defense judges what it would have
            returned). When the defense leaves fewer than ``k``, the fetch doubles (up to
            ``max_rounds`` rounds) while the base retriever has more (the same policy as the
            LlamaIndex adapter's).
        max_rounds: Fetch rounds at most; ``None``: as :func:`defend` fetches
            (:func:`ragdefense.integration.retrieval.fetch_rounds`): ``FETCH_ROUNDS`` for a
            ``k`` given, one fetch for the base retriever's own (refilling would bring the
            context lower-ranked documents), more for a :class:`~ragdefense.Quarantine`
            holding anything; there, a ``k`` given per call (``invoke(query, k=4)``) gets at
            least ``FETCH_ROUNDS``: the caller asked for that many documents.
    """

    model_config = ConfigDict(
        arbitrary_types_allowed=True, extra="forbid", validate_assignment=True
    )

    base_retriever: BaseRetriever
    compressor: BaseDocumentCompressor
    k: int | None = Field(default=None, ge=1)
    fetch_k: int | None = Field(default=None, ge=1)
    max_rounds: int | None = Field(default=None, ge=1)

    @field_validator("k", "fetch_k", "max_rounds", mode="before")
    @classmethod
    def _size(cls, value: Any, info: ValidationInfo) -> int | None:
        """As :func:`defend` reads sizes: NumPy ints too, never ``True`` or ``2.0``."""
        return checked_size(str(info.field_name), value)

    def invoke(
        self, input: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[Document]:
        """Retrieve, then defend (the base retriever runs under ``config``)."""
        token = _CALLER_CONFIG.set(config)
        try:
            return super().invoke(input, config, **kwargs)
        finally:
            _CALLER_CONFIG.reset(token)

    async def ainvoke(
        self, input: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[Document]:
        """Async :meth:`invoke`."""
        token = _CALLER_CONFIG.set(config)
        try:
            return await super().ainvoke(input, config, **kwargs)
        finally:
            _CALLER_CONFIG.reset(token)

    def _plan(self, kwargs: dict[str, Any]) -> tuple[int | None, int | None, int, dict[str, Any]]:
        asked = "k" in kwargs
        rounds = self.max_rounds  # as set: at most that many, a k asked per call too
        if rounds is None:  # as defend() fetches: once for the retriever's own k, unless a
            # quarantine holds chunks (then as many as it needs)
            rounds = fetch_rounds(self.compressor, asked or self.k is not None)
            rounds = max(rounds, FETCH_ROUNDS) if asked else rounds
        k = checked_size("k", kwargs.pop("k", self.k), "(or None for all kept)")
        ours = self.compressor if isinstance(self.compressor, DefenseCompressor) else None
        core = ours.core if ours is not None else None
        fetch = self.fetch_k
        own = _retriever_k(self.base_retriever)
        # no more than the retriever alone would return (a multi-query retriever returns the
        # union of its queries' results: all it keeps, the pool sized for the retriever it asks)
        if k is None and not asked and own and not _unions(self.base_retriever):
            k = own
        # all kept (k None) is still judged on the defense's pool for the retriever's own k
        base_k = k or own
        if base_k and not fetch:  # another compressor: GRADA's M = 2n
            fetch = first_fetch(pool_size(core, base_k) if core is not None else 2 * base_k, own)
        return k, fetch, rounds, kwargs

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        check_query(query)  # before the store's model embeds it (its own error, unclear)
        k, fetch, rounds, extra = self._plan(kwargs)
        child = run_manager.get_child()
        config = patch_config(_CALLER_CONFIG.get(), callbacks=child)
        before: int | None = None  # what the round before fetched
        once = _embedded_once(self.compressor)
        vector = None
        for _ in range(rounds):
            base, args, honoured = widened(self.base_retriever, fetch, extra)
            if once is not None and searches_by_vector(base, once.embeddings):
                if vector is None:  # the store's model, once for the search and the defense
                    vector = remembered(once, query, once.embeddings.embed_query(query))
                base = by_vector(base, vector)
            docs = base.invoke(query, config, **(args | extra))
            with pooled(honoured, fetch) as results:  # the last round's: reported
                kept = list(self.compressor.compress_documents(docs, query, callbacks=child))
            if fetched_enough(k, fetch, len(docs), len(kept), honoured, before):
                break
            # asked as it is (no size setting to raise): the same count again: it ignores k
            blind = base is self.base_retriever and not honoured and set(args) == {"k"}
            fetch, before = wider(fetch), (len(docs) if blind else None)
        for result in removals(results):
            announce(result, child)
        return kept[:k] if k else kept

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        check_query(query)  # before the store's model embeds it (its own error, unclear)
        k, fetch, rounds, extra = self._plan(kwargs)
        child = run_manager.get_child()
        config = patch_config(_CALLER_CONFIG.get(), callbacks=child)
        before: int | None = None  # what the round before fetched
        once = _embedded_once(self.compressor)
        vector = None
        for _ in range(rounds):
            base, args, honoured = widened(self.base_retriever, fetch, extra)
            if once is not None and searches_by_vector(base, once.embeddings):
                if vector is None:
                    raw = await once.embeddings.aembed_query(query)
                    vector = remembered(once, query, raw)
                base = by_vector(base, vector)
            docs = await base.ainvoke(query, config, **(args | extra))
            with pooled(honoured, fetch) as results:
                squeezed = self.compressor.acompress_documents(docs, query, callbacks=child)
                kept = list(await squeezed)
            if fetched_enough(k, fetch, len(docs), len(kept), honoured, before):
                break
            blind = base is self.base_retriever and not honoured and set(args) == {"k"}
            fetch, before = wider(fetch), (len(docs) if blind else None)
        for result in removals(results):
            await aannounce(result, child)
        return kept[:k] if k else kept


def _embedded_once(compressor: BaseDocumentCompressor) -> LangChainEmbedder | None:
    """The defense's embedder where it embeds the query with the very ``Embeddings`` object of
    the store its compressor reads (what ``defend(store.as_retriever())`` sets up): the query
    vector the store's search needs is then the defense's, and one model call serves both
    (:func:`~langchain_ragdefense.vectors.by_vector`); ``None`` otherwise (each embeds the
    query itself)."""
    if not isinstance(compressor, DefenseCompressor) or compressor.vectorstore is None:
        return None
    embeddings = getattr(compressor.vectorstore, "embeddings", None)
    embedder = getattr(compressor.core, "embedder", None)
    if not isinstance(embedder, LangChainEmbedder) or embeddings is None:
        return None
    plain = type(embedder)._embed_query is LangChainEmbedder._embed_query  # no prefix of its own
    return embedder if plain and embedder.embeddings is embeddings else None


def widened(
    retriever: BaseRetriever, fetch: int | None, call: dict[str, Any] | None = None
) -> tuple[BaseRetriever, dict[str, Any], bool]:
    """How to ask ``retriever`` for ``fetch`` documents: the retriever to call (a copy when a
    setting must change; the caller's is never changed), the arguments to call it with, and
    whether it then returns ``fetch`` whenever its store holds that many.

    A vector store retriever takes ``k`` per call; with ``search_type="mmr"`` it is asked for MMR
    over the pool (``k = fetch_k = fetch``: the similarity top ``fetch`` in MMR's order; FAISS with
    a ``filter`` draws from twice as many), as MMR over a wider candidate set would spread out the
    near-copies the defense must see together. A retriever with its own ``k`` setting (BM25, TF-IDF,
    most custom ones; or ``top_k``, ``top_k_results``) drops a ``k`` passed per call: a copy with
    that setting raised is asked. One with ``search_kwargs`` (a parent-document retriever) is asked
    for more chunks, but may return fewer documents. An ensemble or merger of retrievers (hybrid
    search: BM25 beside a vector store) is a copy whose every retriever is asked for ``fetch`` so;
    it returns ``fetch`` when one of them does; a query rewriter is a copy whose retriever is asked
    so. A ``ContextualCompressionRetriever`` is a copy whose base retriever is asked so (never for
    fewer than it fetches by default: its reranker reranks as many candidates as it would have) and
    whose reranker (a compressor with ``top_n``) keeps the pool; another compressor may keep fewer.
    FAISS with a ``filter`` (in its ``search_kwargs`` or among the arguments of this ``call``) is
    asked for more candidates (:func:`_filtered_faiss`). Any other gets ``k`` and may ignore it."""
    if fetch is None:
        return retriever, {}, False
    if isinstance(retriever, VectorStoreRetriever):
        filtered = "filter" in retriever.search_kwargs or "filter" in (call or {})
        if filtered and type(retriever.vectorstore).__name__ == "FAISS":
            return _filtered_faiss(retriever, fetch)
        if retriever.search_type == "mmr":
            search = retriever.search_kwargs | {"k": fetch, "fetch_k": fetch}
            return retriever.model_copy(update={"search_kwargs": search}), {}, True
        return retriever, {"k": fetch}, True
    base = _compressed(retriever)
    if base is not None:  # a compression pipeline: its base asked (it passes call arguments
        # on), a reranker's top_n raised to the pool; what the compressor keeps is unpromised
        # its base is never narrowed: a reranker set to rerank more candidates still does
        inner, args, _ = widened(base, max(fetch, _retriever_k(base) or 0), call)
        update: dict[str, Any] = {"base_retriever": inner}
        compressor = getattr(retriever, "base_compressor", None)
        if isinstance(compressor, BaseModel) and positive_int(getattr(compressor, "top_n", None)):
            update["base_compressor"] = compressor.model_copy(update={"top_n": fetch})
        return retriever.model_copy(update=update), args, False
    asker = _wrapped(retriever)
    if asker is not None:  # a query rewriter: it passes no argument on; each query asks fetch
        settled, honoured = _settled(asker, fetch)
        return retriever.model_copy(update={"retriever": settled}), {}, honoured
    children = _ensemble(retriever)
    if children:
        asked = [_settled(child, fetch) for child in children]
        copy = retriever.model_copy(update={"retrievers": [child for child, _ in asked]})
        return copy, {}, any(honoured for _, honoured in asked)
    if (field := _size_field(retriever)) is not None:  # k, top_k, top_k_results
        return retriever.model_copy(update={field: fetch}), {}, True
    search_kwargs = getattr(retriever, "search_kwargs", None)
    if isinstance(retriever, BaseModel) and isinstance(search_kwargs, dict):
        search = search_kwargs | {"k": fetch}
        return retriever.model_copy(update={"search_kwargs": search}), {}, False
    return retriever, {"k": fetch}, False


def _filtered_faiss(
    retriever: VectorStoreRetriever, fetch: int
) -> tuple[BaseRetriever, dict[str, Any], bool]:
    """FAISS with a ``filter`` searches ``fetch_k`` candidates, then filters them: it returns
    fewer than asked while it holds more. It is asked for ``fetch`` with candidates in the
    user's proportion (FAISS's default 20 for 4), and every vector of an index of up to
    :data:`EVERY_CANDIDATE` (then what it returns is all the filter lets through), MMR as the
    similarity pool over the filter (the survivors in similarity order)."""
    kwargs = retriever.search_kwargs
    own = positive_int(kwargs.get("fetch_k")) or 20
    wide = max(own, -(-own * fetch // (positive_int(kwargs.get("k")) or 4)))
    total = getattr(getattr(retriever.vectorstore, "index", None), "ntotal", None)
    total = total if isinstance(total, int) else EVERY_CANDIDATE + 1
    every = total <= EVERY_CANDIDATE
    if retriever.search_type == "mmr":
        similar = {k: v for k, v in kwargs.items() if k != "lambda_mult"}
        update = {"search_type": "similarity", "search_kwargs": similar}
        retriever = retriever.model_copy(update=update)
    return retriever, {"k": fetch, "fetch_k": max(wide, total) if every else wide}, every


#: the largest FAISS index whose every vector a filtered search takes as a candidate (a flat
#: search, and the filter run over each candidate's document: cheap at that size)
EVERY_CANDIDATE = 10_000


def _settled(child: Any, fetch: int) -> tuple[Any, bool]:
    """``child`` of an ensemble asked for ``fetch`` with no argument per call (an ensemble
    passes none on): the retriever to hold, and whether it returns ``fetch``."""
    if not isinstance(child, BaseRetriever):
        return child, False  # any runnable: used as it is
    base, args, honoured = widened(child, fetch)
    if not args:
        return base, honoured
    if isinstance(base, VectorStoreRetriever):
        return base.model_copy(update={"search_kwargs": base.search_kwargs | args}), honoured
    return child, False


def defend(
    retriever: BaseRetriever,
    defense: Any = None,
    *,
    k: int | None = None,
    fetch_k: int | None = None,
    embeddings: Embeddings | None = None,
    fail_open: bool = False,
    **params: Any,
) -> DefendedRetriever:
    """Wrap ``retriever`` with a defense, in one line: ``retriever = defend(retriever)``.

    Args:
        retriever: Any LangChain retriever (``store.as_retriever()``, an ensemble, ...).
        defense: A name of :mod:`ragdefense.defenses.registry` (``None``: its
            ``DEFAULT_DEFENSE``; ``"ragdefender"``, ``"grada"``, ...), a core defense object,
            or a ``BaseDocumentCompressor`` (configured already: ``embeddings``,
            ``fail_open`` and ``params`` are then an error).
        k: Documents returned; ``None``: at most as many as ``retriever`` returns by default (a
            vector store retriever's ``search_kwargs["k"]``, 4 unless set; an ensemble's, the
            sum of its retrievers'; a compression retriever's, its base's at most its
            reranker's ``top_n``; no second fetch when the defense removes some, unless
            ``invoke(query, k=...)`` asks for a ``k`` or the defense is a
            :class:`~ragdefense.Quarantine` holding anything), else all kept. The survivors are
            cut to ``k``.
        fetch_k: Documents the base retriever is asked for (``None``: the defense's pool for
            ``k``, see :class:`DefendedRetriever`).
        embeddings: Embeddings for the defense; by default the vector store's own when the
            retriever searches one (found inside a compression, multi-query or ensemble
            retriever too: the model its stores share; no second model; with an InMemory, Chroma
            or FAISS store's own
            similarity search, one call of it embeds the query for the search and the
            defense), else the packaged all-MiniLM-L6-v2. Vectors
            the store already holds for the retrieved documents are used as they are, unless
            ``embeddings`` is another model than the store's (the defense then embeds the
            retrieved documents with it: one space for the query and the passages). With a
            defense object it is an error: give the object ``embedder=`` (an object with
            another model than the store's embeds the documents itself, the same way).
        fail_open: Where the defense fails (a model that cannot load, a server down), pass
            the documents (but those a quarantine holds) through with a warning instead of
            raising (the default: a defense that cannot run stops the chain). A query it
            cannot use (:class:`ragdefense.QueryInputError`) raises either way.
        params: Parameters of the named defense (e.g. ``task_type=``, ``similarity=``,
            ``trusted=``); unknown ones, or any given with a defense object, are an error.

    The same parameters (``embeddings`` where it takes ``embed_model``) and fetch policy as the
    LlamaIndex adapter's ``defend``.
    """
    if not isinstance(retriever, BaseRetriever):
        hint = (
            "store.as_retriever(...)"
            if hasattr(retriever, "as_retriever")
            else "the retriever itself, then configure what defend() returns (its .with_config, "
            ".configurable_fields(base_retriever=...))"
        )
        raise TypeError(f"defend() takes a retriever, got {type(retriever).__name__}: pass {hint}")
    sizes = check_request(defense, plain_params(params), k=k, fetch_k=fetch_k)
    k, fetch_k = sizes["k"], sizes["fetch_k"]
    store, model = _store_and_model(retriever)
    compressor: BaseDocumentCompressor
    if isinstance(defense, BaseDocumentCompressor):
        given = [n for n, v in (("embeddings", embeddings), ("fail_open", fail_open)) if v]
        if params or given:
            raise TypeError(
                f"{', '.join([*given, *params])}: a compressor comes configured; set them on it"
            )
        compressor = defense
    else:
        configured(defense, embeddings, "embeddings")  # an object embeds with its own embedder
        own = model if named(defense) else None
        compressor = DefenseCompressor(
            defense=defense,
            params=params,
            embeddings=embeddings or own,
            fail_open=fail_open,
            vectorstore=store,  # its vectors are read only in the defense's own model's space
        )
    # k and max_rounds as given (None: read at each call, as the base retriever's own k and
    # one fetch for it): a k set later, or a base swapped through configurable_fields, counts
    return DefendedRetriever(base_retriever=retriever, compressor=compressor, k=k, fetch_k=fetch_k)
