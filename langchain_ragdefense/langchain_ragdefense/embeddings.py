"""The packaged all-MiniLM-L6-v2 (or any ragdefense embedder) as a LangChain ``Embeddings``."""

from __future__ import annotations

from typing import Any

from langchain_core.embeddings import Embeddings

from ragdefense import Embedder, as_embedder
from ragdefense.embedders import default_embedder

__all__ = ["RagdefenseEmbeddings"]


class RagdefenseEmbeddings(Embeddings):
    """Offline embeddings for LangChain vector stores, backed by a ragdefense embedder.

    Args:
        embedder: Anything :func:`ragdefense.as_embedder` accepts; ``None`` for the packaged
            all-MiniLM-L6-v2 (no model hub access needed).
    """

    def __init__(self, embedder: Any = None) -> None:
        self.embedder = as_embedder(embedder)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (and deep-copied) with its embedder; the process-wide default as a mark:
        the loading process's own then (one model loaded there, one cache)."""
        default = self.embedder is default_embedder()
        return self.__dict__ | {"embedder": None} if default else dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.embedder = self.embedder or default_embedder()

    @property
    def ragdefense_embedder(self) -> Embedder | None:
        """The ragdefense embedder behind it, what :func:`ragdefense.as_embedder` takes from
        it (a defense given this model calls the embedder directly); ``None`` for a subclass,
        whose own methods may change what is embedded."""
        return self.embedder if type(self) is RagdefenseEmbeddings else None

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents."""
        return [[float(x) for x in row] for row in self.embedder.embed(texts)]

    def embed_query(self, text: str) -> list[float]:
        """Embed a query."""
        return [float(x) for x in self.embedder.embed_query(text)]
