"""How results and defenses are shown: values as JSON holds them, numbers as tables print
them, a defense as the parameters it was made with."""

from __future__ import annotations

import inspect
import math
import reprlib
import threading
import unicodedata
from collections.abc import Collection, Mapping
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = ["Described", "described", "jsonable", "number_text", "plain_id", "printable"]

#: a parameter's value in a repr: cut where long, but a small object's own repr whole
_SHORT = reprlib.Repr()
_SHORT.maxother, _SHORT.maxstring = 100, 60


def number_text(value: Any) -> str:
    """A score or estimate as a table shows it (four significant digits)."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def printable(text: str) -> str:
    """``text`` safe to print: control and format characters (an ESC that would drive the
    terminal, a carriage return that would hide the line, bidi overrides) and line separators
    written as escapes (a planted passage's text reaches tables and reports)."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if _hidden(ch) else ch for ch in text
    )


def _hidden(ch: str) -> bool:
    category = unicodedata.category(ch)
    return category[0] == "C" or category in ("Zl", "Zp")


def plain_id(value: Any) -> Any:
    """A passage's id as JSON holds it: a string or number as it is, another (a UUID) as its
    string."""
    value = jsonable(value)
    return value if value is None or isinstance(value, (str, int, float)) else str(value)


def jsonable(value: Any) -> Any:
    """``value`` as JSON holds it: NumPy values as Python's, a NaN or infinity as ``None``."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())  # its NaN too
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


class Described:
    """Shown as ``Class(parameter=value, ...)``: the constructor's parameters that differ from
    their defaults, a long collection by its size (as scikit-learn shows an estimator)."""

    def __repr__(self) -> str:
        return described(self)


def described(obj: Any) -> str:
    """``Class(parameter=value, ...)``: the parameters of ``obj``'s constructor that it holds
    under their own names (a property's as its ``_name`` holds it, so that a lazy one is shown
    as given, not loaded) and that differ from what the class makes of their defaults; a
    collection of more than five items by its size (a quarantine's thousands of ids)."""
    kind: Any = type(obj)
    shown, plain = [], _made_plain(kind)
    for name, param in inspect.signature(type(obj).__init__).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        lazy = isinstance(getattr(kind, name, None), property) and hasattr(obj, f"_{name}")
        held = f"_{name}" if lazy else name  # a property's value as given, never loaded
        value: Any = getattr(obj, held, param.empty)
        default = getattr(plain, held, param.default)  # what the class makes of the default
        try:
            if value is param.empty or value is default or bool(value == default):
                continue
        except (TypeError, ValueError):  # an array compared: not a default
            pass
        many = isinstance(value, Collection) and not isinstance(value, (str, bytes))
        text = f"<{len(value)} items>" if many and len(value) > 5 else _SHORT.repr(value)
        shown.append(f"{name}={text}")
    return f"{type(obj).__name__}({', '.join(shown)})"


@lru_cache(maxsize=64)
def _made_plain(cls: type) -> Any:
    """An instance of ``cls`` made with every default (``None`` where it needs arguments, or
    where its constructor shows the instance it is making): a default the constructor fills
    in (``GRADA(bm25=None)`` holds ``BM25()``) is no setting."""
    building = _BUILDING.__dict__.setdefault("classes", set())
    if cls in building:  # made again from its own constructor (a repr of self)
        return None
    building.add(cls)
    try:
        return cls()
    except Exception:
        return None
    finally:
        building.discard(cls)


#: the classes whose default instance this thread is making
_BUILDING = threading.local()
