"""Shared fixtures: a tiny deterministic embedder for fast unit tests, the real MiniLM, the data."""

from __future__ import annotations

import asyncio
import os
import re
import zlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragdefense import CallableEmbedder, default_embedder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")  # Chroma: no telemetry calls

_WORD = re.compile(r"\w+")


def bag_of_words(texts: list[str], dim: int = 256) -> np.ndarray:
    """Hashed bag of words: texts sharing words are similar; deterministic across runs."""
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in _WORD.findall(text.lower()):
            out[i, zlib.crc32(word.encode()) % dim] += 1.0
    return out


class Hosted:
    """Hosted-style embedding models over :func:`bag_of_words` (LangChain's and LlamaIndex's,
    each with an async API of its own) that count what they are asked: the passages' texts,
    the queries, and the calls through their async API."""

    def __init__(self) -> None:
        from langchain_core.embeddings import Embeddings
        from llama_index.core.embeddings import BaseEmbedding

        passages: list[str] = []
        queries: list[str] = []
        apis: list[str] = []
        self.passages, self.queries, self.apis = passages, queries, apis

        def vec(text: str) -> list[float]:
            return [float(x) for x in bag_of_words([text])[0]]

        class LangChain(Embeddings):
            def embed_documents(self, texts: list[str]) -> list[list[float]]:
                passages.extend(texts)
                return [vec(t) for t in texts]

            def embed_query(self, text: str) -> list[float]:
                queries.append(text)
                return vec(text)

            async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
                apis.append("documents")
                return self.embed_documents(texts)

        class LlamaIndex(BaseEmbedding):
            def _get_query_embedding(self, query: str) -> list[float]:
                queries.append(query)
                return vec(query)

            async def _aget_query_embedding(self, query: str) -> list[float]:
                return self._get_query_embedding(query)

            def _get_text_embedding(self, text: str) -> list[float]:
                passages.append(text)
                return vec(text)

            async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
                apis.append("texts")
                return [self._get_text_embedding(t) for t in texts]

        self.langchain, self.llamaindex = LangChain, LlamaIndex

    def clear(self) -> None:
        for kept in (self.passages, self.queries, self.apis):
            kept.clear()


def scattered(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` passage embeddings on one topic with no structure, and the query's (the topic):
    no coordinated group, no voice, no veto to find, so the words alone are the evidence."""
    rng = np.random.default_rng(seed)
    topic = rng.normal(size=32)
    emb = topic + 1.0 * rng.normal(size=(n, 32))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    return emb, topic / np.linalg.norm(topic)


@pytest.fixture
def toy_embedder() -> CallableEmbedder:
    return CallableEmbedder(bag_of_words)


@pytest.fixture
def no_faiss() -> Iterator[None]:
    """While active, ``import faiss`` fails: the numpy fallbacks run."""
    import builtins

    real_import = builtins.__import__

    def refuse(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "faiss":
            raise ImportError("no faiss here")
        return real_import(name, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(builtins, "__import__", refuse)
        yield


@pytest.fixture(scope="session")
def minilm() -> object:
    """The packaged all-MiniLM-L6-v2, loaded once for the session."""
    emb = default_embedder()
    emb.model  # noqa: B018 - load now, so tests time nothing but their own work
    return emb


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared benchmark data ($RAGDEFENSE_DATA or ../shared/data); skip when absent."""
    candidates = [os.environ.get("RAGDEFENSE_DATA"), Path(__file__).parents[2] / "shared" / "data"]
    for c in candidates:
        if c and (Path(c) / "ragdefender").is_dir():
            return Path(c)
    pytest.skip("benchmark data not available (set RAGDEFENSE_DATA)")


@pytest.fixture(scope="session")
def nlp() -> object:
    """The spaCy pipeline of keyword aggregation (the user's en_core_web_sm or the packaged one)."""
    from ragdefense.robustrag.keywords import load_spacy

    return load_spacy()


def cancel_once_started(work: Callable[[], Awaitable[Any]], steps: Sequence[Any]) -> None:
    """Run ``work()`` as a task and cancel it once ``steps`` holds a step (its worker has
    started), expecting its ``CancelledError``; returns once the worker threads it left are
    done (``asyncio.run`` waits for them), so ``steps`` then says how far they went."""

    async def cancelled_midway() -> None:
        task = asyncio.ensure_future(work())
        while not steps:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled_midway())
