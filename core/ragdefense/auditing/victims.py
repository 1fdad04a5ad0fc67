"""The honest passages a planted set targets: a planted set copies the subject of the passage it
contradicts, so that passage lands in or next to the set's near-duplicate group and is flagged
with it. The report names it as the set's possible victim, for a reviewer to check before
removing it (a planted set of varied wording has members that look the same way, so the
verdict stays).
"""

from __future__ import annotations

import numpy as np

from .evidence import Evidence
from .workdir import Workdir, rows_at

__all__ = ["apart_in_groups", "apart_reason", "possible_victims", "targeted", "victim_reason"]


def possible_victims(
    wd: Workdir, evidence: Evidence, above: np.ndarray, condemned: np.ndarray, bar: float
) -> tuple[dict[int, str], dict[int, tuple[str, float, float]]]:
    """The chunks shown as possible victims of a planted set, :func:`targeted` and
    :func:`apart_in_groups` (``above``: scored past the threshold), none of a ``condemned``
    source: such a chunk is the attacker's, not an honest victim of its groups."""
    near = {i: g for i, g in targeted(evidence, above).items() if not condemned[i]}
    apart = apart_in_groups(wd, evidence, above, bar)
    return near, {i: found for i, found in apart.items() if not condemned[i]}


def targeted(evidence: Evidence, suspicious: np.ndarray) -> dict[int, str]:
    """Suspicious chunks in no near-duplicate group but next to a group most of whose members
    are suspicious, with that group's id: as often the honest passage a planted set targets (its
    victim) as a planted one, and shown so, never deleted on that evidence alone."""
    if evidence.near is None or not len(evidence.groups):
        return {}
    grouped = evidence.group_of >= 0
    planted_like = _mostly(evidence, suspicious, _sizes(evidence))
    out: dict[int, str] = {}
    for i in np.flatnonzero(suspicious & ~grouped):
        near = evidence.near[i][evidence.near[i] >= 0]
        hits = [g for g in evidence.group_of[near] if g >= 0 and planted_like[g]]
        if hits:
            out[int(i)] = evidence.groups[int(hits[0])]["id"]
    return out


def victim_reason(group: str | None) -> list[str]:
    """Why a chunk :func:`targeted` names may be an honest victim (none when it is not)."""
    if group is None:
        return []
    return [
        f"in no near-duplicate group, next to group {group} (most of it suspicious): it may be "
        "the honest passage that group targets; check it before removing it"
    ]


def apart_in_groups(
    wd: Workdir, evidence: Evidence, suspicious: np.ndarray, bar: float
) -> dict[int, tuple[str, float, float]]:
    """Per position: the suspicious member of a near-duplicate group of three or more, most of
    it suspicious, that the others agree with least, where they agree among themselves by
    ``bar`` (mean cosine) or more above their agreement with it: ``(group id, its mean cosine
    to the others, theirs among themselves)``. A planted set is written from one template or
    one prompt; the honest passage whose subject it copies joins its group without its
    wording. Reads the members' vectors only (``bar <= 0``: none)."""
    if bar <= 0 or not len(evidence.groups):
        return {}
    sizes = _sizes(evidence)
    chosen = set(np.flatnonzero((sizes >= 3) & _mostly(evidence, suspicious, sizes)).tolist())
    order = np.argsort(evidence.group_of, kind="stable")  # each group's members together
    bounds = np.searchsorted(evidence.group_of[order], np.arange(len(sizes) + 1))
    members = {g: order[bounds[g] : bounds[g + 1]] for g in sorted(chosen)}
    if not members:
        return {}
    every = np.sort(np.concatenate(list(members.values())))
    vectors = np.asarray(rows_at(wd, "chunks", wd.noted("part_sizes"), every), dtype=float)
    out: dict[int, tuple[str, float, float]] = {}
    for g, positions in members.items():
        unit = vectors[np.searchsorted(every, positions)]
        n = len(positions)
        summed = unit.sum(axis=0)  # sums of cosines, without the n x n matrix of a large group
        own = np.einsum("ij,ij->i", unit, unit)
        total = float(summed @ summed) - own.sum()
        to_others = (unit @ summed - own) / (n - 1)
        among = (total - 2 * to_others * (n - 1)) / ((n - 1) * (n - 2))
        k = int(np.argmax(among - to_others))
        if among[k] - to_others[k] >= bar and suspicious[positions[k]]:
            out[int(positions[k])] = (
                evidence.groups[g]["id"],
                float(to_others[k]),
                float(among[k]),
            )
    return out


def apart_reason(found: tuple[str, float, float] | None) -> list[str]:
    """Why :func:`apart_in_groups` named a chunk (none when it did not)."""
    if found is None:
        return []
    group, mine, theirs = found
    return [
        f"stands apart in group {group}: mean cosine {mine:.2f} to the others, who agree "
        f"{theirs:.2f} among themselves; it shares their subject, not their wording: it may be "
        "the honest passage that group targets; check it before removing it"
    ]


def _sizes(evidence: Evidence) -> np.ndarray:
    """Per group: how many members it has."""
    group_of = evidence.group_of
    return np.bincount(group_of[group_of >= 0], minlength=len(evidence.groups))


def _mostly(evidence: Evidence, suspicious: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per group of ``sizes`` members: whether at least half of them are suspicious."""
    group_of = evidence.group_of
    flagged = np.bincount(group_of[(group_of >= 0) & suspicious], minlength=len(sizes))
    out: np.ndarray = flagged * 2 >= np.maximum(sizes, 1)
    return out
