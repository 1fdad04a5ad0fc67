"""The packaged all-MiniLM-L6-v2 (or any ragdefense embedder) as a LlamaIndex embedding."""

from __future__ import annotations

from typing import Any

from llama_index.core.embeddings import BaseEmbedding
from pydantic import PrivateAttr

from ragdefense import Embedder, as_embedder

__all__ = ["RagdefenseEmbedding"]


class RagdefenseEmbedding(BaseEmbedding):
    """Offline embeddings for LlamaIndex indices, backed by a ragdefense embedder
    (default: the packaged all-MiniLM-L6-v2; no model hub access needed)."""

    _embedder: Embedder = PrivateAttr()

    def __init__(self, embedder: Any = None, **kwargs: Any) -> None:
        kwargs.setdefault("model_name", "ragdefense/all-MiniLM-L6-v2")
        super().__init__(**kwargs)
        self._embedder = as_embedder(embedder)

    @classmethod
    def class_name(cls) -> str:
        return "RagdefenseEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return [float(x) for x in self._embedder.embed_query(query)]

    def _get_text_embedding(self, text: str) -> list[float]:
        return [float(x) for x in self._embedder.embed([text])[0]]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return [[float(x) for x in row] for row in self._embedder.embed(texts)]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)
