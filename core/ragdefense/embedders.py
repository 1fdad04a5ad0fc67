"""Embedders: one small interface, adapters for the common model types, a bounded cache.

Every defense takes ``embedder=`` as any of: an :class:`Embedder`, a sentence-transformers model
(or its path), a LangChain ``Embeddings``, a LlamaIndex ``BaseEmbedding``, or a callable
``list[str] -> array (n, d)``. ``None``: the packaged all-MiniLM-L6-v2, loaded offline, once.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from . import types as _types
from .carried import carried_vectors, check_carried
from .embedder_base import Embedder
from .offline import load_sentence_transformer, model_folder, packaged_installed
from .similarity import cosine_matrix, cosine_to
from .types import DefenseInputError, Passage, check_embeddings, check_query_embedding
from .vector_rows import EmbeddingError

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
            all-MiniLM-L6-v2 (its hub name, ``sentence-transformers/all-MiniLM-L6-v2``, is
            that model too where it is installed and no folder of that name is there).
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
        #: whether this is the packaged all-MiniLM-L6-v2 (given no model, or its hub name)
        self.packaged = self._model is None and self._path is None and packaged_installed()
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
        other.__dict__["_model"] = model  # its own load lock: from __setstate__
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
    string: a sentence-transformers model's name or path; an adapter's embeddings object, its
    ``ragdefense_embedder``). A model gets the same wrapper while one is in use (a defense keeps
    its model's), and one embedding cache while it lives; the table keeps neither the model nor
    a wrapper alive: a model nothing uses is freed."""
    if obj is None:
        return default_embedder()
    if isinstance(obj, Embedder):
        return obj
    inner = getattr(obj, "ragdefense_embedder", None)  # our own adapters' model: not twice
    if isinstance(inner, Embedder):
        return inner
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


def embed_passages(passages: Sequence[_types.PassageLike], embedder: Any = None) -> np.ndarray:
    """Embeddings of ``passages``: carried ones as is, the rest in one call to the embedder.

    The embedder is only resolved (and the default model only loaded) if some passage carries
    no embedding. Beside carried embeddings, the default model must be the one that made them.

    Raises:
        DefenseInputError: a carried embedding is not a finite 1-D vector of the common size,
            or not the default model's where that model embeds the others.
        EmbeddingError: the embedding model failed.
    """
    passages = _types.to_passages(passages)  # what every defense accepts, checked alike
    if not passages:
        return np.zeros((0, 0), dtype=np.float32)
    vecs = carried_vectors(passages)
    todo = [i for i, v in enumerate(vecs) if v is None]
    if not todo:
        return np.stack(vecs)  # type: ignore[arg-type]
    computed = iter(as_embedder(embedder).embed([passages[i].text for i in todo]))
    full = [next(computed) if v is None else v for v in vecs]
    carried = [i for i, v in enumerate(vecs) if v is not None]
    if carried:
        check_carried(passages, full, embedder, default_embedder)
        i, j = carried[0], todo[0]
        if full[i].shape != full[j].shape:
            raise DefenseInputError(
                f"passage {i} carries an embedding of {full[i].shape[0]} numbers, the embedder "
                f"gives passage {j} one of {full[j].shape[0]}: give one model's embeddings"
            )
    return np.stack(full)


def passage_and_query_embeddings(
    query: str,
    passages: Sequence[Passage],
    embedder: Any = None,
    embeddings: Any = None,
    query_embedding: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The passages' (M, d) and the query's (d,) embeddings: the given ones checked, the
    missing ones computed with ``embedder`` (see :func:`embed_passages`; a path loaded once)."""
    embedder = as_embedder(embedder) if isinstance(embedder, (str, os.PathLike)) else embedder
    if carried := embeddings is None:
        embeddings = embed_passages(passages, embedder)
    emb = check_embeddings(embeddings, len(passages))
    fix = ""
    if query_embedding is None:
        # given beside the passages, or all carried (else checked in embed_passages): the
        # default model must have made them where it embeds the query
        if not carried or all(p.embedding is not None for p in passages):
            check_carried(passages, list(emb), embedder, default_embedder, not carried)
        query_embedding = as_embedder(embedder).embed_query(query)
        fix = ": pass query_embedding= by the passages' model, or that model as embedder="
        if carried and any(p.embedding is None for p in passages):  # this model made them
            fix = ": the embedding model gives the query another size than the passages"
    return emb, check_query_embedding(query_embedding, emb.shape[1], fix)
