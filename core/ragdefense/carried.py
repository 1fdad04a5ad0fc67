"""Embeddings passages carry (a vector store's): each checked, all of one size, and the
default model's where that model embeds beside them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .similarity import unit_rows
from .types import DefenseInputError, Passage
from .vector_rows import numeric

__all__ = ["carried_vector", "carried_vectors", "check_carried"]


def carried_vector(i: int, embedding: Any) -> np.ndarray:
    """The embedding passage ``i`` carries, as a finite float32 vector, else
    :class:`DefenseInputError` naming the passage."""
    try:
        raw = np.asarray(numeric(embedding))
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
        raise DefenseInputError(f"passage {i}: embedding is not numeric ({exc})") from exc
    if raw.ndim != 1 or raw.size == 0 or raw.dtype.kind not in "iufO":
        raise DefenseInputError(
            f"passage {i}: embedding must be a 1-D vector of real numbers, got shape "
            f"{raw.shape} and dtype {raw.dtype}"
        )
    try:
        wide = raw.astype(np.float64)
    except OverflowError as exc:
        raise DefenseInputError(f"passage {i}: embedding holds a number beyond float64") from exc
    except (TypeError, ValueError) as exc:
        raise DefenseInputError(f"passage {i}: embedding is not numeric ({exc})") from exc
    if not np.isfinite(wide).all():
        raise DefenseInputError(
            f"passage {i}: embedding contains NaN or infinite values (or numbers beyond float64)"
        )
    peak = np.abs(wide).max()
    if peak > 1e15 or 0 < peak < 1e-15:  # float32 (its norms' squares) would lose it: the
        wide = wide / peak  # direction is what is compared, kept whatever the magnitude
    return wide.astype(np.float32)


def carried_vectors(passages: Sequence[Passage]) -> list[np.ndarray | None]:
    """The embeddings ``passages`` carry (``None`` where one carries none), each checked by
    :func:`carried_vector` and all of one size, else :class:`DefenseInputError` naming the
    passage: also where the defense has too few passages to use them."""
    vecs = [
        None if p.embedding is None else carried_vector(i, p.embedding)
        for i, p in enumerate(passages)
    ]
    sized = [(i, v.shape[0]) for i, v in enumerate(vecs) if v is not None]
    for i, dim in sized:
        if dim != sized[0][1]:
            raise DefenseInputError(
                f"passage {i} carries an embedding of {dim} numbers, passage {sized[0][0]} "
                f"one of {sized[0][1]}"
            )
    return vecs


def check_carried(
    passages: Sequence[Passage], vecs: list[Any], embedder: Any, default: Any, given: bool = False
) -> None:
    """Where the default model (no ``embedder``; ``default()``) embeds beside embeddings passages
    carry (the query, or the passages carrying none), the carried ones must be its: another
    model's, of the same size, would compare meaninglessly. The three longest carried texts
    are checked (a store may have embedded them with their metadata: the longer, the less that
    moves them), and most must agree; another model's vector stands near orthogonal.
    ``given``: ``vecs`` are embeddings given beside the passages (``embeddings=``), one each.
    ``default`` (a function giving the default model) is called only where there is something
    to check: with an ``embedder`` never, so the default model is not built."""
    carried = [
        j for j, p in enumerate(passages) if (given or p.embedding is not None) and vecs[j].any()
    ]
    if embedder is not None or not carried:
        return
    longest = sorted(carried, key=lambda j: -len(passages[j].text))[:3]
    own = np.asarray(default().embed([passages[j].text for j in longest]), np.float64)
    theirs = [np.asarray(vecs[j], dtype=np.float64) for j in longest]
    if all(t.shape == own.shape[1:] for t in theirs):
        cos = np.einsum("ij,ij->i", unit_rows(own), unit_rows(np.asarray(theirs)))
        if np.median(cos) >= 0.2:
            return
    held = "is given" if given else "carries"
    raise DefenseInputError(
        f"passage {longest[0]} {held} an embedding of another model than the default embedder "
        "(the packaged all-MiniLM-L6-v2, which embeds the query and the passages carrying none): "
        "give the defense the model that made it (embedder=; in the adapters embeddings= or "
        "embed_model=), or the query's embedding by it (defend_embeddings(query_embedding=))"
    )
