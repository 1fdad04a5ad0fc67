"""A retriever that widens retrieval before a defense: ``defend(index)`` in one line.

A node postprocessor only sees what the retriever already gave it (LlamaIndex retrieves 2 nodes
by default): too few for a defense to compare. :class:`DefendedRetriever` asks the underlying
retriever for the pool the defense needs to return ``k`` (twice ``k`` and at least 8 for
Consensus, the default; twice ``k`` for GRADA; ``k`` and at least 8 for RAGDefender), runs the
defense on the pool, and returns the top ``k`` survivors.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.image_retriever import BaseImageRetriever
from llama_index.core.indices.base import BaseIndex
from llama_index.core.indices.list.retrievers import SummaryIndexEmbeddingRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.core.vector_stores.types import VectorStoreQueryMode

from ragdefense.integration.adapter import (
    configured,
    defense_embedder,
    named,
    plain_params,
    pooled,
    same_space,
)
from ragdefense.integration.retrieval import (
    check_request,
    checked_size,
    fetch_rounds,
    fetched_enough,
    first_fetch,
    pool_size,
    positive_int,
    wider,
)

from ._private import corpus_size, index_embed_model, merged_retriever, retriever_index
from .events import announce
from .postprocessors import DefensePostprocessor

__all__ = ["DefendedRetriever", "defend"]


def _top_k(retriever: BaseRetriever) -> int | None:
    """Its ``similarity_top_k`` (in hybrid mode its ``hybrid_top_k`` where set: what a hybrid
    store returns); an auto-merging retriever's, its vector retriever's (it returns that many
    or fewer, merged)."""
    inner = _merging(retriever)
    if inner is not None:
        return _top_k(inner)
    hybrid = positive_int(getattr(retriever, "_hybrid_top_k", None))
    if hybrid and _mode(retriever) == VectorStoreQueryMode.HYBRID:
        return hybrid
    return positive_int(getattr(retriever, _top_k_name(retriever), None))


def _top_k_name(retriever: BaseRetriever) -> str:
    """The attribute holding the nodes it returns: ``similarity_top_k``, or a summary index's
    embedding retriever's private ``_similarity_top_k`` (other retrievers' private one may
    count something else: a document summary index's counts documents)."""
    if isinstance(retriever, SummaryIndexEmbeddingRetriever):
        return "_similarity_top_k"
    return "similarity_top_k"


def _mode(retriever: BaseRetriever) -> Any:
    """A vector index retriever's query mode (``None`` for another retriever)."""
    return getattr(retriever, "_vector_store_query_mode", None)


def _merging(retriever: BaseRetriever) -> BaseRetriever | None:
    """The vector retriever of an auto-merging retriever (one with no ``similarity_top_k`` of
    its own), ``None`` for another."""
    inner = merged_retriever(retriever)
    return None if inner is None or hasattr(retriever, "similarity_top_k") else inner


def widened(retriever: BaseRetriever, fetch: int | None) -> tuple[BaseRetriever, bool]:
    """The retriever asked for ``fetch`` nodes, and whether it then returns ``fetch`` whenever
    the index holds that many: a copy with ``similarity_top_k`` raised (the caller's is never
    changed; a BM25 retriever's to its corpus at most); a fusion retriever's own retrievers
    raised too (they fetch its candidates). An MMR retriever is asked for the similarity pool
    (MMR would spread out the near-copies the defense must see together; the survivors come in
    similarity order). A hybrid retriever's ``hybrid_top_k`` and ``sparse_top_k``, where set,
    are raised with it. An auto-merging retriever's vector retriever is asked, and it may
    return fewer (merged into parents). One without ``similarity_top_k`` is used as it is."""
    if fetch is None or _top_k(retriever) is None:
        return retriever, False
    pool: Any = copy.copy(retriever)
    inner = _merging(retriever)
    if inner is not None:
        pool._vector_retriever = widened(inner, fetch)[0]
        return pool, False
    try:
        setattr(pool, _top_k_name(retriever), min(fetch, corpus_size(retriever) or fetch))
    except (AttributeError, TypeError, ValueError):  # a read-only size (a property, frozen)
        return retriever, False
    if _mode(retriever) == VectorStoreQueryMode.HYBRID:  # what it returns, and fuses from
        if positive_int(getattr(retriever, "_hybrid_top_k", None)):
            pool._hybrid_top_k = fetch
        if sparse := positive_int(getattr(retriever, "_sparse_top_k", None)):
            pool._sparse_top_k = max(sparse, fetch)
    honoured = True
    inner = getattr(retriever, "_retrievers", None)
    if isinstance(inner, list) and inner:
        found = [widened(r, fetch) for r in inner]
        pool._retrievers = [r for r, _ in found]
        honoured = all(ok for _, ok in found)
    if _mode(retriever) == VectorStoreQueryMode.MMR:
        pool._vector_store_query_mode = VectorStoreQueryMode.DEFAULT
        kwargs = getattr(retriever, "_kwargs", None)  # its MMR settings: a store may refuse them
        if isinstance(kwargs, dict):
            pool._kwargs = {k: v for k, v in kwargs.items() if not k.startswith("mmr_")}
    return pool, honoured


class DefendedRetriever(BaseRetriever):
    """Retrieves a pool with ``retriever``, applies ``postprocessor`` (a defense), returns ``k``.

    Args:
        retriever: The retriever to protect; one with a ``similarity_top_k`` (e.g.
            ``index.as_retriever()``) is asked for the pool by a copy with that value raised
            (the caller's retriever is never changed; see :func:`widened`). Others are used as
            they are.
        postprocessor: A :class:`DefensePostprocessor`.
        k: Nodes returned; ``None``: the retriever's own ``similarity_top_k`` (LlamaIndex's
            default 2), else all kept.
        fetch_k: Pool size asked of the retriever; ``None``: the defense's pool for ``k``
            (:func:`ragdefense.integration.retrieval.pool_size`: ``2 * k`` and at least 8 for
            Consensus, the default; ``2 * k`` for GRADA, at least 8 with its peel; ``k`` and at
            least 8 for RAGDefender),
            and at least the
            retriever's own ``similarity_top_k`` (a retriever set to fetch more is not
            narrowed: the defense sees what it would have returned).
        max_rounds: When the defense leaves fewer than ``k``, the pool doubles (up to this many
            rounds) while the retriever has more: the same policy as the LangChain adapter's.
            ``None``: as :func:`defend` fetches
            (:func:`ragdefense.integration.retrieval.fetch_rounds`): ``FETCH_ROUNDS`` for a
            ``k`` given, one fetch for the retriever's own (refilling would bring the context
            lower-ranked nodes), more for a :class:`~ragdefense.Quarantine` holding anything.
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        postprocessor: DefensePostprocessor,
        k: int | None = None,
        fetch_k: int | None = None,
        max_rounds: int | None = None,
    ) -> None:
        for name, value in (
            ("k", k),
            ("fetch_k", fetch_k),  # checked before use: "fetch_k or pool" would hide a 0
            ("max_rounds", max_rounds),
            ("retriever", retriever),
            ("postprocessor", postprocessor),
        ):
            _check_setting(name, value)
        self.retriever = retriever
        self.postprocessor = postprocessor
        self.k, self.fetch_k = k, fetch_k
        self.max_rounds = max_rounds
        super().__init__(callback_manager=getattr(retriever, "callback_manager", None))

    def __setattr__(self, name: str, value: Any) -> None:
        """The settings given to the constructor, set later, are checked as there (a size
        kept as a plain int, a NumPy one too)."""
        super().__setattr__(name, _check_setting(name, value))

    # k and fetch_k are read from the settings as they are at each call, as the LangChain
    # adapter's are: k, fetch_k, the retriever or the defense assigned later take effect
    @property
    def k(self) -> int | None:
        """Nodes returned: as given, else the retriever's own ``similarity_top_k``."""
        return self._plan()[2]

    @k.setter
    def k(self, value: int | None) -> None:
        self._k = value

    @property
    def fetch_k(self) -> int | None:
        """Pool asked of the retriever: as given, else the defense's pool for :attr:`k`, at
        least the retriever's own ``similarity_top_k`` (at most what a defense compares)."""
        return self._plan()[3]

    @fetch_k.setter
    def fetch_k(self, value: int | None) -> None:
        self._fetch_k = value

    @property
    def max_rounds(self) -> int:
        """Fetch rounds at most: as given, else as :func:`defend` fetches for :attr:`k`."""
        return self._max_rounds or fetch_rounds(self.postprocessor, self._k is not None)

    @max_rounds.setter
    def max_rounds(self, value: int | None) -> None:
        self._max_rounds = value

    def _plan(self) -> tuple[BaseRetriever, DefensePostprocessor, int | None, int | None]:
        """The retriever, the postprocessor, ``k`` and the pool as they are now: read once per
        call (settings assigned during a call take effect at the next)."""
        retriever, postprocessor = self.retriever, self.postprocessor
        store, index = postprocessor.vector_store, retriever_index(retriever)
        other = index.vector_store if isinstance(index, VectorStoreIndex) else store
        if store is not None and other is not store:
            # a retriever assigned since, over another store: that store's nodes numbered alike
            # would be judged by this one's vectors; they are embedded instead, by a copy made
            # once (its defense and embedding cache kept from call to call)
            made = self.__dict__.get("_unstored")
            if made is None or made[0] is not postprocessor or made[1] is not other:
                made = (
                    postprocessor,
                    other,
                    postprocessor.model_copy(update={"vector_store": None}),
                )
                self.__dict__["_unstored"] = made
            postprocessor = made[2]
        own = _top_k(retriever)
        k = self._k if self._k is not None else own
        fetch = self._fetch_k
        if not fetch and k:
            fetch = first_fetch(pool_size(postprocessor.core, k), own)
        return retriever, postprocessor, k, fetch

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        base, postprocessor, k, fetch = self._plan()
        fetch = fetch if _top_k(base) is not None else None  # one it cannot ask: as it is
        for _ in range(self.max_rounds):
            retriever, honoured = widened(base, fetch)
            pool = retriever.retrieve(query_bundle)
            with pooled(honoured, fetch) as results:  # the last round's: reported
                kept = postprocessor.postprocess_nodes(pool, query_bundle=query_bundle)
            if retriever is base or fetched_enough(k, fetch, len(pool), len(kept), honoured):
                break  # one left as it is (a read-only size) would give the same again
            fetch = wider(fetch)
        announce(results)
        return kept[:k] if k else kept

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        base, postprocessor, k, fetch = self._plan()
        fetch = fetch if _top_k(base) is not None else None
        query_bundle = await _embedded(base, query_bundle)
        for _ in range(self.max_rounds):
            retriever, honoured = widened(base, fetch)
            pool = await retriever.aretrieve(query_bundle)
            with pooled(honoured, fetch) as results:
                kept = await postprocessor.apostprocess_nodes(pool, query_bundle=query_bundle)
            if retriever is base or fetched_enough(k, fetch, len(pool), len(kept), honoured):
                break
            fetch = wider(fetch)
        announce(results)
        return kept[:k] if k else kept


async def _embedded(retriever: BaseRetriever, bundle: QueryBundle) -> QueryBundle:
    """A copy of ``bundle`` with the query's embedding, where ``retriever`` embeds the query
    (a vector index's): its sync path leaves the embedding in the bundle, for every round and
    the defense, but its async path in a bundle of its own, so that each round and the
    defense would embed the query again."""
    needs = getattr(retriever, "_needs_embedding", None)
    model = getattr(retriever, "_embed_model", None)
    if bundle.embedding is not None or model is None or not callable(needs) or not needs():
        return bundle
    if not bundle.embedding_strs:
        return bundle
    vector = await model.aget_agg_embedding_from_queries(bundle.embedding_strs)
    return dataclasses.replace(bundle, embedding=vector)


def _check_setting(name: str, value: Any) -> Any:
    """A :class:`DefendedRetriever` setting checked (other attributes pass), as it is kept."""
    if name in ("k", "fetch_k", "max_rounds"):  # as defend() reads them: NumPy ints too
        return checked_size(name, value)
    if name == "retriever" and not isinstance(value, BaseRetriever):
        raise TypeError(f"retriever must be a LlamaIndex BaseRetriever, got {type(value).__name__}")
    if name == "retriever" and isinstance(value, BaseImageRetriever):  # its image search
        raise TypeError(  # rewrites the query's vector with the image model's; images are cut
            f"defend() judges text: {type(value).__name__} also retrieves images; defend a "
            "retriever of the text nodes (a VectorStoreIndex over them) and query images apart"
        )
    if name == "postprocessor" and not isinstance(value, DefensePostprocessor):
        raise TypeError(
            "postprocessor must be a DefensePostprocessor (ConsensusPostprocessor, ...), got "
            f"{type(value).__name__}: another postprocessor goes in a query engine's "
            "node_postprocessors"
        )
    return value


def defend(
    retriever: BaseRetriever | BaseIndex[Any],
    defense: Any = None,
    *,
    k: int | None = None,
    fetch_k: int | None = None,
    embed_model: BaseEmbedding | None = None,
    fail_open: bool = False,
    **params: Any,
) -> DefendedRetriever:
    """Protect a retriever (or an index's default retriever) in one line:
    ``RetrieverQueryEngine.from_args(defend(index), llm=llm)``.

    Args:
        retriever: A LlamaIndex retriever, or an index (its ``as_retriever()``: a
            ``VectorStoreIndex``'s, whose vectors are reused, or any other's).
        defense: A name of :mod:`ragdefense.defenses.registry` (``None``: the default defense),
            a core defense object, or a :class:`DefensePostprocessor` (configured already:
            ``embed_model``, ``fail_open`` and ``params`` are then an error, and its callback
            manager is its own; one built here takes the retriever's).
        k: Nodes returned; ``None``: the retriever's own ``similarity_top_k`` (no second fetch
            when the defense removes some, but for a :class:`~ragdefense.Quarantine` holding
            anything), else all kept.
        fetch_k: Nodes the retriever is asked for (``None``: the defense's pool for ``k``, see
            :class:`DefendedRetriever`).
        embed_model: Embeddings for the defense; by default the index's own (vectors the index
            holds are reused, not recomputed), else the packaged all-MiniLM-L6-v2. Another
            model than the index's, or one given where the retriever's index is not known,
            embeds the retrieved nodes itself (one space for the query and the passages):
            vectors the nodes carry are not reused. With a defense object it is an error:
            give the object ``embedder=``.
        fail_open: Where the defense fails (a model that cannot load, a server down), pass
            the nodes (but those a quarantine holds) through with a warning instead of raising
            (the default: a defense that cannot run stops the query). A query it cannot use
            (:class:`ragdefense.QueryInputError`) raises either way.
        params: Parameters of the named defense (e.g. ``trusted=``); unknown ones, or any
            given with a defense object, are an error.

    The same parameters (``embed_model`` where it takes ``embeddings``; an index too) and fetch
    policy as the LangChain adapter's ``defend``.
    """
    if not isinstance(retriever, (BaseRetriever, BaseIndex)):
        inner = getattr(retriever, "retriever", None)  # a query engine's
        hint = "its .retriever" if isinstance(inner, BaseRetriever) else "index.as_retriever()"
        raise TypeError(
            f"defend() takes a retriever or an index, got {type(retriever).__name__}: pass {hint}"
        )
    sizes = check_request(defense, plain_params(params), k=k, fetch_k=fetch_k)
    k, fetch_k = sizes["k"], sizes["fetch_k"]
    index: Any = retriever
    if isinstance(retriever, BaseIndex):  # a summary or keyword index's too
        retriever = retriever.as_retriever()
    else:
        index = retriever_index(retriever)
    _check_setting("retriever", retriever)  # an image retriever is refused
    if isinstance(defense, DefensePostprocessor):
        given = [n for n, v in (("embed_model", embed_model), ("fail_open", fail_open)) if v]
        if params or given:
            raise TypeError(
                f"{', '.join([*given, *params])}: a postprocessor comes configured; set them on it"
            )
        post = defense
    else:
        store = index.vector_store if isinstance(index, VectorStoreIndex) else None
        # the model the nodes' vectors are in: the index's; a summary index's embedding
        # retriever's own (it puts its model's vectors on the nodes it returns)
        own = index_embed_model(index)
        if own is None and isinstance(retriever, SummaryIndexEmbeddingRetriever):
            own = index_embed_model(retriever)
        post = guard(defense, own, store, embed_model, fail_open, params)
        # its RERANKING events go where the retriever's go (Settings.callback_manager's, say)
        post.callback_manager = getattr(retriever, "callback_manager", post.callback_manager)
    # max_rounds left None: read per call, so a k (or postprocessor) assigned later fetches
    # as defend() would have with it
    return DefendedRetriever(retriever, post, k=k, fetch_k=fetch_k)


def guard(
    defense: Any,
    own: BaseEmbedding | None,
    store: Any,
    embed_model: BaseEmbedding | None = None,
    fail_open: bool = False,
    params: dict[str, Any] | None = None,
) -> DefensePostprocessor:
    """The postprocessor :func:`defend` runs ``defense`` with, over an index embedding with
    ``own`` (``None``: not known) in ``store``. The vectors the store holds, and those the
    nodes carry, are handed to the defense only where they are in its model's space: its model
    is the index's, or is the packaged MiniLM where the index's is too or is not known (the
    core checks them against it); otherwise the defense embeds the nodes' text. A defense
    object embeds with its own ``embedder`` (``embed_model`` with one is an error)."""
    configured(defense, embed_model, "embed_model")
    by_name = named(defense)
    model = (embed_model or own) if by_name else defense_embedder(defense)
    ours = same_space(model, own)
    return DefensePostprocessor(
        defense=defense,
        params=params or {},
        embed_model=model if by_name else None,
        fail_open=fail_open,
        vector_store=store if ours else None,
        node_embeddings=ours,
    )
