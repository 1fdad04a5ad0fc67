"""The packaged all-MiniLM-L6-v2 (or any ragdefense embedder) as a LlamaIndex embedding."""

from __future__ import annotations

import asyncio
import copy
import pickle
from typing import Any

from llama_index.core.embeddings import BaseEmbedding
from pydantic import PrivateAttr

from ragdefense import Embedder, as_embedder
from ragdefense.embedders import SentenceTransformerEmbedder, default_embedder

__all__ = ["PACKAGED", "RagdefenseEmbedding"]


#: the ``model_name`` of the packaged all-MiniLM-L6-v2, the one model rebuilt from JSON alone
PACKAGED = "ragdefense/all-MiniLM-L6-v2"
#: LlamaIndex's largest ``embed_batch_size``: every text in one call to the embedder
MAX_BATCH = 2048


class RagdefenseEmbedding(BaseEmbedding):
    """Offline embeddings for LlamaIndex indices, backed by a ragdefense embedder
    (default: the packaged all-MiniLM-L6-v2; no model hub access needed).

    Its ``model_name`` says which: the packaged model's name, or ``"custom: <type>"`` for
    another embedder. JSON holds no model, so only the packaged one is rebuilt from it; loading
    a custom one without ``embedder=`` is an error, never the packaged model in its place.
    LlamaIndex's batches reach the embedder whole (``embed_batch_size`` 2048 unless given):
    the embedder batches by its own size."""

    _embedder: Embedder = PrivateAttr()

    def __init__(self, embedder: Any = None, **kwargs: Any) -> None:
        wrapped = as_embedder(embedder)
        custom = f"custom: {type(embedder).__name__}"
        name = kwargs.setdefault("model_name", PACKAGED if _is_packaged(wrapped) else custom)
        # the embedder batches by its own batch size: LlamaIndex's default of 10 texts per call
        # split a defense's pool (and an index's nodes) into many model calls
        kwargs.setdefault("embed_batch_size", MAX_BATCH)
        if embedder is None and name != PACKAGED:
            raise ValueError(
                f"RagdefenseEmbedding {name!r} wraps a model its JSON does not hold: pass "
                "embedder= (loading a postprocessor: embed_model= to from_json / from_dict)"
            )
        super().__init__(**kwargs)
        self._embedder = wrapped

    @classmethod
    def class_name(cls) -> str:
        return "RagdefenseEmbedding"

    @property
    def ragdefense_embedder(self) -> Embedder | None:
        """The ragdefense embedder behind it, what :func:`ragdefense.as_embedder` takes from
        it (a defense given this model calls the embedder directly); ``None`` for a subclass,
        whose own methods may change what is embedded."""
        return self._embedder if type(self) is RagdefenseEmbedding else None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its embedder and its settings, or refused (LlamaIndex would drop the
        model silently); the process-wide default as the name alone, the loading process's
        own then (one model loaded there)."""
        picklable(self, "embedder", self._embedder)
        # from a copy: LlamaIndex removes what it cannot pickle from the object it pickles
        state = super(RagdefenseEmbedding, copy.copy(self)).__getstate__()
        private = dict(state.get("__pydantic_private__") or {})  # this object's own: copied
        if self._embedder is default_embedder():
            private.pop("_embedder", None)
        return {**state, "__pydantic_private__": private}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # LlamaIndex builds it from its fields: the default's
        given = (state.get("__pydantic_private__") or {}).get("_embedder")
        if given is not None:  # the embedder it was made with, not one of the same name
            self._embedder = given

    def _get_query_embedding(self, query: str) -> list[float]:
        return [float(x) for x in self._embedder.embed_query(query)]

    def _get_text_embedding(self, text: str) -> list[float]:
        return [float(x) for x in self._embedder.embed([text])[0]]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return [[float(x) for x in row] for row in self._embedder.embed(texts)]

    # the model runs in a worker thread: on the event loop it would stall every other request
    async def _aget_query_embedding(self, query: str) -> list[float]:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)


def _is_packaged(embedder: Embedder) -> bool:
    """Whether ``embedder`` is the packaged all-MiniLM-L6-v2."""
    return isinstance(embedder, SentenceTransformerEmbedder) and embedder.packaged


def picklable(owner: Any, name: str, value: Any) -> None:
    """Refuse to pickle ``owner`` without its ``name``: LlamaIndex's components drop what
    cannot be pickled with a log line, and the copy would run with another setting."""
    try:
        pickle.dumps(value)
    except Exception as exc:
        raise TypeError(
            f"{type(owner).__name__} cannot be pickled: its {name} ({value!r}) cannot ({exc}); "
            "give plain values (a set of sources, a function defined at module level), or "
            "build it again where it runs"
        ) from None
