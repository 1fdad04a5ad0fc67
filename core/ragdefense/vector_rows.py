"""An embedding model's output as checked float32 rows, and the bounded caches an
:class:`~ragdefense.embedders.Embedder` keeps them in (most recent last)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

__all__ = ["EmbeddingError", "as_rows", "keep", "kept", "texts_of"]


class EmbeddingError(RuntimeError):
    """The embedding model failed or returned something unusable."""


def keep(cache: OrderedDict[str, np.ndarray], text: str, vec: np.ndarray, bound: int) -> None:
    """Remember ``vec`` for ``text`` as the most recent of at most ``bound`` (0: none)."""
    if bound:
        cache[text] = vec
        cache.move_to_end(text)
    while len(cache) > bound:
        cache.popitem(last=False)


def kept(cache: OrderedDict[str, np.ndarray], text: str) -> np.ndarray:
    """The vector remembered for ``text``, now the most recent."""
    cache.move_to_end(text)
    return cache[text]


def as_rows(raw: Any, expected_rows: int) -> np.ndarray:
    """The model's output as float32 rows, checked; a row of any finite magnitude keeps its
    direction (rescaled where float32 would lose it), as vectors passages carry do."""
    try:
        rows = np.asarray(numeric(raw))  # rows, each maybe a tensor
        kind = rows.dtype.kind
        arr = np.asarray(rows, dtype=np.float64) if kind in "iufO" else rows
    except (TypeError, ValueError, OverflowError, RuntimeError, AttributeError) as exc:
        why = f"embedding model returned a ragged or non-numeric result: {exc}"
        raise EmbeddingError(why) from exc
    if kind not in "iufO":  # digit strings, booleans, complex numbers: no vectors
        raise EmbeddingError(f"embedding model returned {rows.dtype} values, not real numbers")
    if arr.ndim != 2 or arr.shape[0] != expected_rows or arr.shape[1] == 0:
        why = f"embedding model returned shape {arr.shape}, expected ({expected_rows}, d)"
        raise EmbeddingError(why)
    if not np.isfinite(arr).all():
        raise EmbeddingError("embedding model returned NaN or infinite values")
    peak = np.abs(arr).max(axis=1, keepdims=True)
    scale = np.where((peak > 1e15) | ((peak > 0) & (peak < 1e-15)), peak, 1.0)
    return (arr / scale).astype(np.float32)


def _numpy(value: Any) -> Any:
    """A torch tensor (on a GPU, in bfloat16, needing grad) as NumPy reads it; else as it is."""
    return value.detach().cpu().double().numpy() if hasattr(value, "detach") else value


def numeric(value: Any) -> Any:
    """``value`` as NumPy reads it: a tensor, or a list or tuple of them (rows), converted; else
    as it is (``np.asarray`` fails on a tensor needing grad, and reads no bfloat16)."""
    return [_numpy(r) for r in value] if isinstance(value, (list, tuple)) else _numpy(value)


def texts_of(texts: Any, what: str = "texts") -> list[str]:
    """``texts`` as a list of strings: a ``TypeError`` for one string (its characters would be
    embedded one by one) or an item that is not a string, naming it."""
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"{what}: give a list of strings, not one string")
    out = list(texts)
    for i, text in enumerate(out):
        if not isinstance(text, str):
            raise TypeError(f"{what}: item {i} is a {type(text).__name__}, not a str")
    return out
