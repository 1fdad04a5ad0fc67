"""Constructor parameters checked where they are given: a wrong type fails at construction,
naming the parameter, never later inside numpy."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np

from ..carried import carried_vectors
from ..embedders import as_embedder, check_embeddings, check_query_embedding
from ..types import Passage

__all__ = [
    "check_embedder",
    "cosines",
    "differences",
    "finite",
    "flags",
    "integers",
    "reals",
    "said",
]


def reals(optional: Collection[str] = (), **values: Any) -> None:
    """Each of ``values`` a finite real number (those named in ``optional`` may be None)."""
    for label, value in values.items():
        if value is None and label in optional:
            continue
        if isinstance(value, bool) or not isinstance(value, Real) or not finite(value):
            kind = "a finite number or None" if label in optional else "a finite number"
            raise TypeError(f"{label} must be {kind}, got {said(value)}")


def said(value: Any) -> str:
    """``repr(value)``, but an int past the float range by its size (its digits can be more
    than Python prints)."""
    if isinstance(value, Integral) and not isinstance(value, bool) and not finite(value):
        digits = int(int(value).bit_length() * math.log10(2))
        return f"an int past the float range (about {digits} digits)"
    return repr(value)


def finite(value: Real) -> bool:
    """Whether ``value`` is a finite float (an int past the float range is not: it would
    raise ``OverflowError`` wherever it meets a float)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def integers(optional: Collection[str] = (), **values: Any) -> None:
    """Each of ``values`` a whole number (``4.0`` from a config file too; the caller stores
    ``int(value)``); those named in ``optional`` may be None."""
    for label, value in values.items():
        if value is None and label in optional:
            continue
        whole = isinstance(value, Integral) or (
            isinstance(value, Real) and finite(value) and float(value).is_integer()
        )
        if isinstance(value, bool) or not whole:
            kind = "an int or None" if label in optional else "an int"
            raise TypeError(f"{label} must be {kind}, got {value!r}")


def flags(**values: Any) -> None:
    """Each of ``values`` a bool (a string such as "no" would read as true)."""
    for label, value in values.items():
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{label} must be True or False, got {value!r}")


def cosines(**values: Any) -> None:
    """Each of ``values`` (``None``: not set) a cosine similarity, in [-1, 1]."""
    for label, value in values.items():
        if value is not None and not -1 <= value <= 1:
            raise ValueError(f"{label} is a cosine similarity in [-1, 1], got {value}")


def differences(**values: Any) -> None:
    """Each of ``values`` (``None``: not set) a difference of cosines, in [0, 2]."""
    for label, value in values.items():
        if value is not None and not 0 <= value <= 2:
            raise ValueError(f"{label} is a difference of cosines in [0, 2], got {value}")


def check_embedder(embedder: Any) -> Any:
    """``embedder`` wrapped by :func:`~ragdefense.embedders.as_embedder` (``None`` stays
    ``None``: the default model; nothing is loaded). A defense keeps the wrapper, so that its
    embedding cache serves every call."""
    return None if embedder is None else as_embedder(embedder)


def check_given(embeddings: Any, query_embedding: Any, passages: Sequence[Passage]) -> None:
    """Embeddings given (``embeddings``, one row per passage, or those the passages carry) and a
    query embedding, to a defense that has too few passages to use them, are checked all the
    same: bad input fails whatever the pool's size."""
    n, dim = len(passages), None
    if embeddings is not None:
        arr = check_embeddings(embeddings, n)
        dim = arr.shape[1] if n else None
    else:
        vecs = carried_vectors(passages)
        if n and all(v is not None for v in vecs):
            dim = vecs[0].shape[0]  # type: ignore[union-attr]
    if query_embedding is not None:
        check_query_embedding(query_embedding, dim)
