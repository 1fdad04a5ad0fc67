"""What an adapter writes and checks: the items it is handed, the namespaced metadata on the
copies it returns, and the report of what was removed (for tracing events)."""

from __future__ import annotations

import copy
from collections.abc import ItemsView, Iterator, Mapping, Sequence, ValuesView
from typing import Any

from ..shown import jsonable
from ..types import DefenseInputError, DefenseResult, Verdict

__all__ = [
    "METADATA_KEY",
    "UNCHECKED",
    "check_items",
    "copied",
    "removed_report",
    "tagged_metadata",
    "verdict_metadata",
]

#: the metadata key under which adapters record the defense's verdict on each returned copy
METADATA_KEY = "ragdefense"
#: the record of an item passed through unchecked: the defense failed and ``fail_open`` let
#: it through (the fields a checked item's record has too, so that reading them never fails)
UNCHECKED = {
    "checked": False,
    "kept": True,
    "reason": "not checked: the defense failed, and fail_open passed the items through",
}


def tagged_metadata(
    metadata: Mapping[str, Any] | None, record: Mapping[str, Any]
) -> dict[str, Any]:
    """A deep copy of a document's ``metadata`` with ``record`` under :data:`METADATA_KEY`. A
    value already there (a user's own, or an earlier defense's) is kept, as
    ``record["previous"]``: nothing is overwritten, and nothing returned shares state with the
    caller's document, except a value that cannot be copied at all (a lock, a generator, an
    open file), which is carried as the very object, as the undefended retriever would."""
    given = {} if metadata is None else dict(metadata)  # None: a document built unvalidated
    out = {key: copied(value) for key, value in given.items()}
    mine = dict(record)
    if METADATA_KEY in out:
        mine["previous"] = out[METADATA_KEY]
    out[METADATA_KEY] = mine
    return out


class CopiedOnRead(dict[str, Any]):
    """A copy of ``metadata`` (a ``dict``) whose values are deep-copied (:func:`copied`) when
    first read: a user's function (a ``trusted=`` predicate) cannot change the caller's
    metadata through it, and one that reads a key of a large record copies that key alone.
    What it writes stays in it."""

    __slots__ = ("_copied",)

    def __init__(self, metadata: Mapping[str, Any]) -> None:
        super().__init__(metadata)
        self._copied: set[Any] = set()

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)
        if key not in self._copied:
            self._copied.add(key)
            value = copied(value)
            super().__setitem__(key, value)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        self._copied.add(key)
        super().__setitem__(key, value)

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default  # noqa: SIM401 - dict.get skips the copy

    def __iter__(self) -> Iterator[Any]:
        # overridden, CPython copies the dict (dict(m), {**m}, m | {}) through __getitem__
        return iter(list(dict.keys(self)))

    def items(self) -> ItemsView[Any, Any]:  # type: ignore[override]
        return ItemsView(self)

    def values(self) -> ValuesView[Any]:  # type: ignore[override]
        return ValuesView(self)

    def popitem(self) -> tuple[Any, Any]:
        key = next(reversed(list(dict.keys(self))))
        return key, self.pop(key)

    def __reduce__(self) -> Any:
        return (dict, (self.copy(),))

    def pop(self, key: Any, *default: Any) -> Any:
        if key in self:
            self[key]  # copied before it is handed over
        return super().pop(key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        self[key] = default
        return default

    def copy(self) -> dict[str, Any]:
        return {key: self[key] for key in self}


def copied(value: Any) -> Any:
    """A deep copy of ``value``, or ``value`` itself where it cannot be copied (a lock, a
    generator, a client): one such value never fails the rest."""
    try:
        return copy.deepcopy(value)
    except Exception:  # not copyable (TypeError for locks and generators, copy.Error, ...)
        return value


def check_items(items: Any, kind: type, what: str) -> list[Any]:
    """``items`` as a list when it is a sequence of ``kind``; otherwise a clear
    :class:`~ragdefense.DefenseInputError` naming ``what`` was expected."""
    if items is None or isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise DefenseInputError(f"expected a list of {what}, got {type(items).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            raise DefenseInputError(f"item {i}: expected {what}, got {type(item).__name__}")
    return list(items)


_SAID: set[str] = set()


def verdict_metadata(result: DefenseResult, verdict: Verdict) -> dict[str, Any]:
    """The per-document record written under :data:`METADATA_KEY`."""
    return {
        "defense": result.defense,
        "checked": True,  # beside fail_open's UNCHECKED: one test reads both
        "kept": verdict.kept,
        "score": jsonable(verdict.score),  # NaN (not scored) as None: stores and JSON take it
        "score_name": result.score_name,
        "rank": verdict.rank,
        "reason": verdict.reason,
        **{k: jsonable(v) for k, v in verdict.details.items()},
    }  # a fallback's unjudged verdicts say "checked": False in their details


def removed_report(result: DefenseResult) -> dict[str, Any]:
    """A compact, JSON-friendly report of what was removed and why (for tracing events); a
    copy left out only because its text stays in another passage says ``"copy": True``."""
    return {
        "defense": result.defense,
        "query": result.query,
        "kept": len(result.kept),
        "removed": [
            {
                "index": v.index,
                "id": v.passage.id,
                "text": v.passage.text[:200],
                "score": jsonable(v.score),
                "reason": v.reason,
                "copy": bool(v.details.get("copy")),
            }
            for v in result.verdicts
            if not v.kept
        ],
        "estimates": {k: jsonable(v) for k, v in result.estimates.items()},
    }
