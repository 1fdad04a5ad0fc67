"""What an adapter writes and checks: the items it is handed, the namespaced metadata on the
copies it returns, and the report of what was removed (for tracing events)."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
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


class CopiedOnRead(Mapping[str, Any]):
    """A read-only view of ``metadata`` whose values are copied (:func:`copied`) as they are
    read: a user's function (a ``trusted=`` predicate) cannot change the caller's metadata, and
    one that reads a key of a large record copies that key alone."""

    def __init__(self, metadata: Mapping[str, Any]) -> None:
        self._given = metadata
        self._read: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._read:
            self._read[key] = copied(self._given[key])
        return self._read[key]

    def __contains__(self, key: object) -> bool:  # a test of a key copies nothing
        return key in self._given

    def __iter__(self) -> Iterator[str]:
        return iter(self._given)

    def __len__(self) -> int:
        return len(self._given)


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
