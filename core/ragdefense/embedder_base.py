"""The :class:`Embedder` interface and its bounded caches (the models behind it, and how any
model is resolved to one: :mod:`ragdefense.embedders`, which exports it)."""

from __future__ import annotations

import copy
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .text import well_formed
from .vector_rows import EmbeddingError, as_rows, texts_of
from .vector_rows import keep as _keep
from .vector_rows import kept as _kept

__all__ = ["Embedder"]


class Embedder(ABC):
    """Turns texts into vectors, with a bounded LRU cache keyed by text. Subclasses implement
    :meth:`_embed` (and :meth:`_embed_query` for asymmetric models); callers use :meth:`embed`
    and :meth:`embed_query`, which deduplicate texts within a call, serve repeated texts from
    the cache, and validate the model's output.

    Args:
        cache_size: Number of text embeddings kept (0 disables the cache); the last
            :attr:`query_cache` queries are kept apart (none when 0).
    """

    #: queries kept: a vector store and the defense sharing this embedder embed a query once
    query_cache = 32

    def __init__(self, cache_size: int = 4096) -> None:
        count = not isinstance(cache_size, bool) and hasattr(cache_size, "__index__")
        if not count or cache_size < 0:
            raise ValueError(f"cache_size must be an int >= 0, got {cache_size!r}")
        self.cache_size = cache_size.__index__()
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.calls = 0  # model calls made (for tests and benchmarks)
        self.texts_embedded = 0  # texts sent to the model

    @abstractmethod
    def _embed(self, texts: list[str]) -> ArrayLike:
        """Embed ``texts`` with the underlying model: an array-like of shape (len(texts), d)."""

    def _embed_query(self, text: str) -> ArrayLike:
        """Embed a query; defaults to :meth:`_embed` (symmetric models)."""
        row: np.ndarray = as_rows(self._embed([text]), 1)[0]  # torch rows, as the passages'
        return row

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed passages: a float32 array of shape (len(texts), d)."""
        texts = texts_of(texts)
        cached, missing = self._cached(texts)
        fresh = self._keep_rows(missing, self._rows(self._embed, missing, "")) if missing else {}
        rows = [fresh[t] if t in fresh else cached[t] for t in texts]
        if len({r.shape for r in rows}) > 1:  # cached before the model changed in place
            raise EmbeddingError("the model's vectors changed width: call clear_cache()")
        return np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)

    def _cached(self, texts: Sequence[str]) -> tuple[dict[str, np.ndarray], list[str]]:
        """The kept rows of ``texts``, by text, and the distinct texts the model is asked for
        (looked up first: keeping the new ones may evict them)."""
        with self._lock:
            cached = {t: _kept(self._cache, t) for t in dict.fromkeys(texts) if t in self._cache}
        return cached, [t for t in dict.fromkeys(texts) if t not in cached]

    def _keep_rows(self, texts: list[str], rows: np.ndarray) -> dict[str, np.ndarray]:
        """``rows``, the model's for ``texts``, by text, each kept (a row, not its batch)."""
        fresh = dict(zip(texts, rows, strict=True))
        with self._lock:
            for text, row in fresh.items():
                _keep(self._cache, text, row.copy(), self.cache_size)
        return fresh

    def embed_query(self, text: str) -> np.ndarray:
        """Embed a query: a float32 vector. The last :attr:`query_cache` queries are kept apart
        from the passages (an asymmetric model embeds them otherwise): a store retrieving for a
        query and the defense checking its pool, given this one embedder, embed it once."""
        known = self._known_query(text)
        if known is not None:
            return known
        try:
            raw = self._embed_query(well_formed(text))
        except Exception as exc:
            raise EmbeddingError(f"embedding model failed on the query: {exc!r}") from exc
        return self.remember_query(text, raw)

    def _known_query(self, text: str) -> np.ndarray | None:
        """The kept vector of the query ``text``, or ``None``."""
        # None: no cache (cache_size=0), or a subclass that skipped Embedder.__init__
        kept = self.__dict__.get("_queries") if self.cache_size else None
        if kept is not None:
            with self._lock:
                if text in kept:
                    return np.array(_kept(kept, text))
        return None

    def remember_query(self, text: str, vector: ArrayLike) -> np.ndarray:
        """Keep ``vector``, computed elsewhere by this embedder's own model (a vector store
        searching with it), as the query embedding of ``text``, returned by :meth:`embed_query`
        without a model call (unless the cache is off); checked as the model's output is."""
        vec: np.ndarray = as_rows([vector], expected_rows=1)[0]  # checked as the passages' rows
        kept = self.__dict__.get("_queries") if self.cache_size else None
        if kept is not None:
            with self._lock:
                _keep(kept, text, vec.copy(), self.query_cache)
        return vec

    async def embed_ahead(
        self,
        texts: Sequence[str],
        aembed: Callable[[list[str]], Awaitable[Any]],
        query: str | None = None,
        aembed_query: Callable[[str], Awaitable[Any]] | None = None,
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The rows of ``texts`` and ``query``'s vector as :meth:`embed` and
        :meth:`embed_query` give them, those not cached asked of the model's own async API
        (``aembed``, ``aembed_query``: this embedder's model's) and kept: an async caller hands
        them to the defense it runs in a worker thread, where sync model calls would share the
        event loop's few threads with every request. ``(None, None)`` where a call fails (the
        defense's own calls ask again, and fail as the caller set); the query's ``None`` where
        it is neither kept nor asked (no ``query`` or ``aembed_query``)."""
        try:
            cached, missing = self._cached(texts)
            fresh: dict[str, np.ndarray] = {}
            if missing:
                asked = [well_formed(t) for t in missing]
                rows = as_rows(await aembed(asked), expected_rows=len(missing))
                self.calls += 1
                self.texts_embedded += len(missing)
                fresh = self._keep_rows(missing, rows)
            vector = None if query is None else self._known_query(query)
            if vector is None and query is not None and aembed_query is not None:
                vector = self.remember_query(query, await aembed_query(well_formed(query)))
            found = [fresh[t] if t in fresh else cached[t] for t in texts]
            return (np.stack(found) if found else None), vector
        except Exception:
            return None, None

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Embed many queries (an audit's probes), uncached: float32 rows, in one model call
        where the model embeds queries as passages or batches them (:meth:`_embed_queries`)."""
        return self._rows(self._embed_queries, texts_of(texts, "queries"), " on the queries")

    def _rows(self, embed: Callable[[list[str]], Any], texts: list[str], what: str) -> np.ndarray:
        """``embed(texts)`` as checked float32 rows (a failure is an :class:`EmbeddingError`
        saying ``what`` was embedded), counted in :attr:`calls` and :attr:`texts_embedded`."""
        try:  # a lone surrogate (half an emoji) as U+FFFD: tokenizers refuse it, and one
            # planted passage holding one failed every query retrieving it
            raw = embed([well_formed(t) for t in texts])
        except Exception as exc:
            raise EmbeddingError(f"embedding model failed{what}: {exc!r}") from exc
        self.calls += 1
        self.texts_embedded += len(texts)
        return as_rows(raw, expected_rows=len(texts))

    def _embed_queries(self, texts: list[str]) -> ArrayLike:
        """Queries in one call: :meth:`_embed`'s where queries are embedded as passages, else
        :meth:`_embed_query` one at a time (a subclass that can batch them says how)."""
        if type(self)._embed_query is Embedder._embed_query:
            return self._embed(texts)
        return [as_rows([self._embed_query(t)], 1)[0] for t in texts]  # as embed_query reads it

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its lock and cache (e.g. to send it to Ray workers)."""
        state = self.__dict__.copy()
        state["_lock"] = None
        state["_cache"] = OrderedDict()
        state["_queries"] = OrderedDict()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())
        self.__dict__.setdefault("_queries", OrderedDict())  # pickled before queries were kept

    def with_cache(self, cache_size: int) -> Embedder:
        """A copy using the same model, with an empty cache of ``cache_size`` texts of its own."""
        other = copy.copy(self)
        Embedder.__init__(other, cache_size)
        return other

    def clear_cache(self) -> None:
        """Forget all cached embeddings, the queries' too (after changing the model in place)."""
        with self._lock:
            self._cache.clear()
            self.__dict__.get("_queries", {}).clear()
