"""Constructor parameters checked where they are given: a wrong type fails at construction,
naming the parameter, never later inside numpy."""

from __future__ import annotations

from collections.abc import Collection
from numbers import Integral, Real
from typing import Any

from ..embedders import as_embedder

__all__ = ["check_embedder", "integers", "reals"]


def reals(optional: Collection[str] = (), **values: Any) -> None:
    """Each of ``values`` a real number, not NaN (those named in ``optional`` may be None)."""
    for label, value in values.items():
        if value is None and label in optional:
            continue
        if isinstance(value, bool) or not isinstance(value, Real) or value != value:
            kind = "a number or None" if label in optional else "a number"
            raise TypeError(f"{label} must be {kind}, got {value!r}")


def integers(optional: Collection[str] = (), **values: Any) -> None:
    """Each of ``values`` an integer (those named in ``optional`` may be None)."""
    for label, value in values.items():
        if value is None and label in optional:
            continue
        if isinstance(value, bool) or not isinstance(value, Integral):
            kind = "an int or None" if label in optional else "an int"
            raise TypeError(f"{label} must be {kind}, got {value!r}")


def check_embedder(embedder: Any) -> None:
    """``embedder`` is ``None`` or something :func:`~ragdefense.embedders.as_embedder` wraps
    (nothing is loaded)."""
    if embedder is not None:
        as_embedder(embedder)
