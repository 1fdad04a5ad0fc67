"""Argument types and the usage error shared by the ``ragdefense`` command's modules."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

__all__ = [
    "UsageError",
    "called",
    "counts",
    "import_object",
    "non_negative",
    "positive",
    "require_embeddings",
    "resolve",
    "two_or_more",
]


class UsageError(ValueError):
    """A bad argument: reported as one line naming the fix, exit code 2, before any work."""


def require_embeddings(what: str) -> None:
    """The packaged embedder's packages, checked before any work (``UsageError`` naming the
    install command): found missing at the first embedding, the work before it is wasted."""
    from .offline import packaged_installed

    try:
        packaged_installed()
    except ImportError as exc:
        raise UsageError(f"{what}: {exc}") from None


def positive(text: str) -> int:
    """An integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def two_or_more(text: str) -> int:
    """An integer >= 2 (a count of passages a defense compares)."""
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be 2 or more, got {text}")
    return value


def non_negative(text: str) -> int:
    """An integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def counts(text: str) -> list[int]:
    """A comma-separated list of counts (0 or more)."""
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,3,5, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected counts of 0 or more like 1,3,5, got {text!r}")
    return values


def resolve(spec: str, what: str) -> Any:
    """The object named by ``module:attribute`` (a dotted attribute path) on the command line:
    a module in the current folder is found (a console script's path holds only its own
    folder), searched after the installed packages, which a local file never shadows."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return import_object(spec)
    except ValueError as exc:
        raise UsageError(f"{what} {exc}") from None


def called(factory: Any, label: str, no_arguments: str | None = None) -> Any:
    """What ``factory`` (a class or function named on the command line) returns, called with no
    arguments; the user's own code failing in one line naming ``label``, and where
    ``no_arguments`` is given, a ``TypeError`` (it needs arguments) with that advice."""
    try:
        return factory()
    except TypeError as exc:
        if no_arguments is None:
            raise UsageError(f"{label}: calling it raised TypeError: {exc}") from None
        raise UsageError(
            f"{label}: calling it with no arguments failed ({exc}); {no_arguments}"
        ) from None
    except Exception as exc:
        raise UsageError(f"{label}: calling it raised {type(exc).__name__}: {exc}") from None


def import_object(spec: str) -> Any:
    """The object named by ``"module:attribute"`` (the attribute may be dotted); ``ValueError``
    saying why when it cannot be imported."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{spec!r}: expected module:attribute")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{spec!r}: cannot import it ({exc})") from None
    except TypeError as exc:  # "./kb:store" asks for a relative import; else the module's own
        if module.startswith(".") or any(c in module for c in "/\\"):
            raise ValueError(f"{spec!r}: name a module (kb:store), not a path") from None
        raise ValueError(f"{spec!r}: cannot import it (TypeError: {exc})") from exc
    except Exception as exc:  # the module's own failure while it loads (its code, its syntax)
        raise ValueError(f"{spec!r}: importing it failed ({type(exc).__name__}: {exc})") from exc
    return obj
