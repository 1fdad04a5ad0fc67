"""Embedders: one small interface, adapters for the common model types, a bounded cache.

Every defense takes ``embedder=`` as any of: an :class:`Embedder`, a sentence-transformers model
(or its path), a LangChain ``Embeddings``, a LlamaIndex ``BaseEmbedding``, or a callable
``list[str] -> array (n, d)``. ``None``: the packaged all-MiniLM-L6-v2, loaded offline, once.
"""

from __future__ import annotations

import copy
import os
import threading
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .offline import load_sentence_transformer, model_folder, packaged_installed
from .passage_vectors import embed_passages, passage_and_query_embeddings
from .similarity import cosine_matrix, cosine_to
from .types import check_embeddings, check_query_embedding
from .vector_rows import EmbeddingError, as_rows, texts_of
from .vector_rows import keep as _keep
from .vector_rows import kept as _kept

__all__ = [
    "CallableEmbedder",
    "Embedder",
    "EmbeddingError",
    "LangChainEmbedder",
    "LlamaIndexEmbedder",
    "SentenceTransformerEmbedder",
    "as_embedder",
    "check_embeddings",
    "check_query_embedding",
    "cosine_matrix",
    "cosine_to",
    "default_embedder",
    "embed_passages",
    "passage_and_query_embeddings",
]


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
        if cache_size < 0:
            raise ValueError("cache_size must be >= 0")
        self.cache_size = cache_size
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
        with self._lock:  # looked up first: remembering new ones below may evict them
            cached = {t: _kept(self._cache, t) for t in dict.fromkeys(texts) if t in self._cache}
        missing = [t for t in dict.fromkeys(texts) if t not in cached]
        fresh: dict[str, np.ndarray] = {}
        if missing:
            fresh = dict(zip(missing, self._rows(self._embed, missing, ""), strict=True))
        with self._lock:
            for t, v in fresh.items():
                _keep(self._cache, t, v.copy(), self.cache_size)  # a row, not its batch
        rows = [fresh[t] if t in fresh else cached[t] for t in texts]
        if len({r.shape for r in rows}) > 1:  # cached before the model changed in place
            raise EmbeddingError("the model's vectors changed width: call clear_cache()")
        return np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        """Embed a query: a float32 vector. The last :attr:`query_cache` queries are kept apart
        from the passages (an asymmetric model embeds them otherwise): a store retrieving for a
        query and the defense checking its pool, given this one embedder, embed it once."""
        # None: no cache (cache_size=0), or a subclass that skipped Embedder.__init__
        kept = self.__dict__.get("_queries") if self.cache_size else None
        if kept is not None:
            with self._lock:
                if text in kept:
                    return np.array(_kept(kept, text))
        try:
            raw = self._embed_query(text)
        except Exception as exc:
            raise EmbeddingError(f"embedding model failed on the query: {exc!r}") from exc
        return self.remember_query(text, raw)

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

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Embed many queries (an audit's probes), uncached: float32 rows, in one model call
        where the model embeds queries as passages or batches them (:meth:`_embed_queries`)."""
        return self._rows(self._embed_queries, texts_of(texts, "queries"), " on the queries")

    def _rows(self, embed: Callable[[list[str]], Any], texts: list[str], what: str) -> np.ndarray:
        """``embed(texts)`` as checked float32 rows (a failure is an :class:`EmbeddingError`
        saying ``what`` was embedded), counted in :attr:`calls` and :attr:`texts_embedded`."""
        try:
            raw = embed(texts)
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
        return [as_rows(self._embed_query(t), 1)[0] for t in texts]

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


class CallableEmbedder(Embedder):
    """Wraps a plain function ``list[str] -> array (n, d)``; ``query_fn`` for asymmetric models."""

    def __init__(
        self,
        fn: Callable[[list[str]], ArrayLike],
        query_fn: Callable[[str], ArrayLike] | None = None,
        cache_size: int = 4096,
    ) -> None:
        super().__init__(cache_size)
        self.fn = fn
        self.query_fn = query_fn

    def _embed(self, texts: list[str]) -> ArrayLike:
        return self.fn(texts)

    def _embed_query(self, text: str) -> ArrayLike:
        if self.query_fn is not None:
            return self.query_fn(text)
        return super()._embed_query(text)

    def _embed_queries(self, texts: list[str]) -> ArrayLike:  # one call where queries are
        return self.fn(texts) if self.query_fn is None else super()._embed_queries(texts)


class SentenceTransformerEmbedder(Embedder):
    """A sentence-transformers model, given as an object or as a path (loaded lazily, offline).
    It reads each text up to the model's window (the packaged MiniLM's: 256 word pieces): what
    a text says past it does not change its vector, so chunk documents within it.

    Args:
        model: A ``SentenceTransformer``, a local path, or ``None`` for the packaged
            all-MiniLM-L6-v2.
        batch_size: Encoding batch size.
        device: Torch device used when loading from a path; ``None`` picks a GPU when one is
            present (as sentence-transformers does), else the CPU.
    """

    def __init__(
        self,
        model: Any = None,
        batch_size: int = 64,
        device: str | None = None,
        cache_size: int = 4096,
    ) -> None:
        super().__init__(cache_size)
        model = os.fspath(model) if isinstance(model, os.PathLike) else model  # a folder's Path
        self._model = model if not isinstance(model, (str, type(None))) else None
        self._path = model_folder(model) if isinstance(model, str) else None
        #: whether this is the packaged all-MiniLM-L6-v2 (given neither a model nor a path)
        self.packaged = model is None and packaged_installed()  # else the install command
        self.batch_size = batch_size
        self.device = device
        self._load_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without locks, cache and a model it can load again where used (the packaged
        one, or one given as a path)."""
        reload = self.packaged or self._path is not None
        return super().__getstate__() | {"_load_lock": None} | ({"_model": None} if reload else {})

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state | {"_load_lock": threading.Lock()})

    def with_cache(self, cache_size: int) -> Embedder:
        """A copy using the same model (loaded now, once for both: a copy goes through the
        pickled state, which leaves a loadable model out), with a cache of its own."""
        model, other = self.model, super().with_cache(cache_size)
        other.__dict__.update(_model=model, _load_lock=threading.Lock())
        return other

    @property
    def model(self) -> Any:
        """The underlying ``SentenceTransformer`` (loaded on first use)."""
        if self._model is None:
            with self._load_lock:
                if self._model is None:
                    self._model = load_sentence_transformer(self._path, self.device)
        return self._model

    def _embed(self, texts: list[str]) -> ArrayLike:
        return self._encode("encode_document", texts)

    def _embed_query(self, text: str) -> ArrayLike:
        row: np.ndarray = self._encode("encode_query", [text])[0]
        return row

    def _embed_queries(self, texts: list[str]) -> ArrayLike:
        return self._encode("encode_query", texts)

    def _encode(self, side: str, texts: list[str]) -> np.ndarray:
        """The model's ``encode_query`` / ``encode_document`` (sentence-transformers 5: a model
        with query and document prompts applies each to its side), else ``encode``."""
        encode = getattr(self.model, side, None) or self.model.encode
        return encode(  # type: ignore[no-any-return]
            texts, batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False
        )


class LangChainEmbedder(Embedder):
    """A LangChain ``Embeddings`` (``embed_documents`` / ``embed_query``)."""

    def __init__(self, embeddings: Any, cache_size: int = 4096) -> None:
        super().__init__(cache_size)
        self.embeddings = embeddings

    def _embed(self, texts: list[str]) -> ArrayLike:
        return self.embeddings.embed_documents(texts)  # type: ignore[no-any-return]

    def _embed_query(self, text: str) -> ArrayLike:
        return self.embeddings.embed_query(text)  # type: ignore[no-any-return]


class LlamaIndexEmbedder(Embedder):
    """A LlamaIndex ``BaseEmbedding`` (``get_text_embedding_batch`` / ``get_query_embedding``)."""

    def __init__(self, embed_model: Any, cache_size: int = 4096) -> None:
        super().__init__(cache_size)
        self.embed_model = embed_model

    def _embed(self, texts: list[str]) -> ArrayLike:
        return self.embed_model.get_text_embedding_batch(texts)  # type: ignore[no-any-return]

    def _embed_query(self, text: str) -> ArrayLike:
        return self.embed_model.get_query_embedding(text)  # type: ignore[no-any-return]


def default_embedder() -> SentenceTransformerEmbedder:
    """The process-wide default: packaged all-MiniLM-L6-v2, loaded on first use (one instance,
    whichever thread asks first)."""
    global _DEFAULT
    with _WRAPPERS_LOCK:
        made = _DEFAULT = _DEFAULT or SentenceTransformerEmbedder()
    return made


def as_embedder(obj: Any = None) -> Embedder:
    """Wrap any supported embedding model into an :class:`Embedder` (``None``: the default; a
    string: a sentence-transformers model's name or path). A model gets the same wrapper while
    one is in use (a defense keeps its model's), and one embedding cache while it lives; the
    table keeps neither the model nor a wrapper alive: a model nothing uses is freed."""
    if obj is None:
        return default_embedder()
    if isinstance(obj, Embedder):
        return obj
    with _WRAPPERS_LOCK:  # wrapping loads nothing: once per model, whichever thread asks
        entry = _WRAPPERS.get(id(obj))
        entry = entry if entry is not None and entry[0]() is obj else None
        if entry is not None and (known := entry[1]()) is not None:
            return known
        wrapper = _wrap(obj)
        try:
            ref = weakref.ref(obj)
        except TypeError:  # not weak-referenceable: no reuse
            return wrapper
        if entry is not None:  # an earlier wrapper's cache (vectors, not the model) serves on
            wrapper._cache, wrapper._queries, wrapper._lock = entry[2]
        for key in [k for k, (r, *_) in _WRAPPERS.items() if r() is None]:
            del _WRAPPERS[key]
        cache = (wrapper._cache, wrapper._queries, wrapper._lock)
        _WRAPPERS[id(obj)] = (ref, weakref.ref(wrapper), cache)
    return wrapper


# model id -> (weak references to the model and its wrapper, the wrapper's cache); the default
_WRAPPERS: dict[int, tuple[weakref.ref[Any], weakref.ref[Embedder], tuple[Any, Any, Any]]] = {}
_WRAPPERS_LOCK = threading.Lock()
_DEFAULT: SentenceTransformerEmbedder | None = None


def _wrap(obj: Any) -> Embedder:
    if hasattr(obj, "embed_documents") and hasattr(obj, "embed_query"):
        return LangChainEmbedder(obj)
    if hasattr(obj, "get_text_embedding_batch"):
        return LlamaIndexEmbedder(obj)
    if isinstance(obj, (str, os.PathLike)) or hasattr(obj, "encode"):  # a path, or the model
        return SentenceTransformerEmbedder(obj)
    if callable(obj):
        return CallableEmbedder(obj)
    raise TypeError(
        f"cannot use {type(obj).__name__} as an embedder: pass a sentence-transformers model, "
        "a LangChain Embeddings, a LlamaIndex BaseEmbedding, a callable, or an Embedder"
    )
