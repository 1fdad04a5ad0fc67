"""The passages a wrapped defense saw (those a quarantine left), renumbered back: its verdicts,
estimates, reasons and errors in the caller's positions."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..types import DefenseInputError, QueryInputError

__all__ = ["copy_of", "positions", "renumbered"]


@contextmanager
def renumbered(rest: list[int]) -> Iterator[None]:
    """The wrapped defense sees the passages left, renumbered: an input error it raises names
    the caller's position of the passage, as the caller numbered them."""
    try:
        yield
    except DefenseInputError as exc:

        def caller(match: re.Match[str]) -> str:
            i = int(match.group(1))
            return f"passage {rest[i] if i < len(rest) else i}"

        # a query's error stays one (an adapter failing open still raises it: no passage is at
        # fault)
        kind = QueryInputError if isinstance(exc, QueryInputError) else DefenseInputError
        raise kind(_PASSAGE.sub(caller, str(exc))) from exc


_PASSAGE = re.compile(r"\bpassage (\d+)")


#: the estimates that hold passage positions (a list of them; groups: lists; copies: a mapping;
#: AutoDefense's ``evidence`` holds some too)
_POSITIONS = (
    "quarantined",
    "unsupported",
    "unsupported_apart",
    "contradicting",
    "quoting",
    "trusted",
    "peeled",
    "off_topic",
    "ragdefender_flagged",
    "not_absorbed",
    "zero_vectors",
)


def positions(estimates: Mapping[str, Any], rest: list[int]) -> dict[str, Any]:
    """The inner defense's ``estimates`` with its positions (among the passages left after the
    quarantine) as input positions."""
    out = dict(estimates)
    for key in _POSITIONS:
        if isinstance(out.get(key), list):
            out[key] = [rest[i] for i in out[key]]
    if isinstance(out.get("groups"), list):
        out["groups"] = [[rest[i] for i in g] for g in out["groups"]]
    if isinstance(out.get("copies"), dict):
        out["copies"] = {rest[i]: [rest[c] for c in cs] for i, cs in out["copies"].items()}
    if isinstance(out.get("trust_unread"), dict):  # position -> why, the why naming it too
        out["trust_unread"] = {
            rest[i]: _PASSAGE.sub(f"passage {rest[i]}", why, count=1)
            for i, why in out["trust_unread"].items()
        }
    if isinstance(out.get("evidence"), Mapping):
        out["evidence"] = positions(out["evidence"], rest)
    return out


#: GRADA's rank in its reasons: after its PageRank (before any parenthesis: another
#: defense's reason quoting a source has one first), or at the end after a note of its own
_RANK = re.compile(r"[^(]*PageRank [\d.]+, rank \d{1,9} of \d{1,9} \(was (\d{1,9})\)")
_NOTED_RANK = re.compile(r"; rank \d{1,9} of \d{1,9} \(was (\d{1,9})\)\Z")


def copy_of(reason: str, rest: list[int]) -> str:
    """``reason`` with the passage a copy follows (Consensus's reasons for copies open with
    "removed: a copy of passage N") as its input position (nothing after that opening is read:
    a source may hold any words), and so GRADA's retrieval rank ("rank R of M (was N)",
    1-based, where GRADA writes it: a source quoting it is left as it is)."""
    found = re.match(r"removed: a copy of passage (\d+)", reason)
    if found is not None and int(found[1]) < len(rest):
        start, end = found.span(1)
        return reason[:start] + str(rest[int(found[1])]) + reason[end:]
    found = _RANK.match(reason) or _NOTED_RANK.search(reason)  # GRADA's, never a source's
    if found is not None and 0 < int(found[1]) <= len(rest):
        start, end = found.span(1)
        return reason[:start] + str(rest[int(found[1]) - 1] + 1) + reason[end:]
    return reason
