"""The honest passages a planted set targets: a planted set copies the subject of the passage it
contradicts, so that passage lands in or next to the set's near-duplicate group and is flagged
with it. Where it lacks most of the words the set's members share (a set is written from one
template or one prompt, around one planted answer; the honest passage shares only the subject),
the report names it the set's possible victim and does not count it as suspicious. Where the
vectors alone set it apart, the report names it for a reviewer to check and the verdict stays
(a planted set of varied wording has members that look the same way).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..defenses.claims import claim_terms
from ..defenses.findings import STANDS_APART
from .evidence import Evidence, Scoring
from .workdir import Workdir, locate, part_starts, part_texts, rows_at

__all__ = [
    "MIN_SHARED",
    "PossibleVictims",
    "apart_in_groups",
    "apart_reason",
    "like_reason",
    "like_their_group",
    "possible_victims",
    "targeted",
    "unlike_their_group",
    "victim_reason",
]


@dataclass(frozen=True)
class PossibleVictims:
    """Per position: the suspects next to a mostly suspicious group (``near``: its id), the
    members standing apart in one (``apart``: :func:`apart_in_groups`), and the possible
    victims not counted as suspicious (``unlike``: :func:`unlike_their_group`)."""

    near: dict[int, str]
    apart: dict[int, tuple[str, float, float]]
    unlike: dict[int, tuple[str, int, int]]

    def reasons(self, i: int) -> list[str]:
        """Why position ``i`` may be a victim, in words (none when it is not)."""
        if i in self.unlike:
            return unlike_reason(self.unlike[i])
        return victim_reason(self.near.get(i)) + apart_reason(self.apart.get(i))

    def counts(self) -> dict[str, int]:
        """The report's counts: chunks shown as possible victims, and those not counted as
        suspicious."""
        named = self.near.keys() | self.apart.keys() | self.unlike.keys()
        return {"possible_victims": len(named), "victims": len(self.unlike)}

    def cleared(self, n: int) -> np.ndarray:
        """Per position of ``n``: whether it is a possible victim not counted as suspicious."""
        out = np.zeros(n, dtype=bool)
        out[list(self.unlike)] = True
        return out


def possible_victims(
    wd: Workdir, evidence: Evidence, above: np.ndarray, condemned: np.ndarray, scoring: Scoring
) -> PossibleVictims:
    """The chunks shown as possible victims of a planted set (``above``: scored past the
    threshold), none of a ``condemned`` source: such a chunk is the attacker's, not an honest
    victim of its groups; nor, for :func:`unlike_their_group`, one whose targeting (closer to a
    logged question than to any other chunk) is evidence of its own, unless the group's members
    are closest to that same question (the one passage answering the question a set was
    written for is closest to it too)."""
    near = {i: g for i, g in targeted(evidence, above).items() if not condemned[i]}
    apart = apart_in_groups(wd, evidence, above, scoring.apart)
    own = condemned.copy()
    unlike = unlike_their_group(wd, evidence, above, near, scoring.victim_share)
    if evidence.targeting is not None and scoring.target_threshold > 0:
        # targeting is evidence of its own, but for the set's own question: the one passage
        # answering the logged question a set was written for is closest to it too
        own |= (evidence.targeting >= scoring.target_threshold) & ~_asked_alike(evidence, unlike)
    return PossibleVictims(
        near,
        {i: found for i, found in apart.items() if not condemned[i]},
        {i: found for i, found in unlike.items() if not own[i]},
    )


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
    if bar <= 0:
        return {}
    members = _suspect_groups(evidence, suspicious)
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
        f"{STANDS_APART} {group}: mean cosine {mine:.2f} to the others, who agree "
        f"{theirs:.2f} among themselves; it shares their subject, not their wording: it may be "
        "the honest passage that group targets; check it before removing it"
    ]


#: the fewest words a group's other members must share for a suspect lacking most of them to
#: be named its victim (lacking one or two words is no evidence of another wording)
MIN_SHARED = 3


def unlike_their_group(
    wd: Workdir, evidence: Evidence, suspicious: np.ndarray, near: dict[int, str], share: float
) -> dict[int, tuple[str, int, int]]:
    """Per position: the suspect in a group of three or more, or next to one (``near``, from
    :func:`targeted`), that holds fewer than ``share`` of the words more than half of the
    group's *other* members hold (at least :data:`MIN_SHARED`; the content words of
    :func:`~ragdefense.defenses.claims.claim_terms`): ``(group id, those words it holds, those
    words)``. A planted set's members share its template's or prompt's words and its planted
    answer; the honest passage it targets shares the subject only. Only in a group more than
    half of whose members are suspects holding that share of its words (a set), and only where
    the chunks named, in the group and next to it together, are fewer than those members: a
    set written without shared wording is never cleared, and what this names is always
    outnumbered by the members that share the set's words. Reads the texts of those groups and
    suspects only (``share <= 0``: none)."""
    if share <= 0:
        return {}
    groups = {g: ms.tolist() for g, ms in _suspect_groups(evidence, suspicious).items()}
    if not groups:
        return {}
    ids = {g["id"]: n for n, g in enumerate(evidence.groups)}
    outside: dict[int, list[int]] = {}  # per chosen group: the suspects next to it
    for i, name in near.items():
        if ids[name] in groups:
            outside.setdefault(ids[name], []).append(i)
    every = {m for ms in [*groups.values(), *outside.values()] for m in ms}
    words = _words(wd, sorted(every))
    out: dict[int, tuple[str, int, int]] = {}
    for g, members in groups.items():
        tally = Counter(w for m in members for w in words[m])
        n, found = len(members), dict[int, tuple[int, int]]()
        common = sum(2 * c > n - 1 for c in tally.values())  # held by most of n - 1 others
        for i in members:  # without its own words, the tally is the n - 1 others'
            held = sum(2 * (tally[w] - 1) > n - 1 for w in words[i])
            lacked = common - sum(2 * tally[w] > n - 1 for w in words[i])
            found[i] = (held, held + lacked)
        alike = sum(
            suspicious[i] and t >= MIN_SHARED and h >= share * t for i, (h, t) in found.items()
        )
        if 2 * alike <= n:
            continue  # no set: half the group or more shares no wording
        shared = {w for w, c in tally.items() if 2 * c > n}  # for a suspect outside: n others
        found.update({i: (len(shared & words[i]), len(shared)) for i in outside.get(g, [])})
        named = {
            i: (evidence.groups[g]["id"], held, total)
            for i, (held, total) in found.items()
            if suspicious[i] and total >= MIN_SHARED and held < share * total
        }
        if len(named) < alike:  # inside and beside it, fewer than the members sharing its words
            out.update(named)
    return out


def like_their_group(
    wd: Workdir,
    evidence: Evidence,
    suspicious: np.ndarray,
    eligible: np.ndarray,
    share: float = 0.8,
) -> dict[int, tuple[str, int]]:
    """Per position: the ``eligible`` member (a possible victim is not) of a group of three or
    more, at least half of it suspects, that is no suspect itself and holds every word more
    than ``share`` of those suspects hold (at least :data:`MIN_SHARED`: their planted answer and
    wording): ``(group id, those words)``. A planted set's last member scored under the
    threshold reaches the contexts alone where the rest is quarantined; the honest passage the
    set targets lacks its planted answer. Reads the texts of those groups only."""
    groups = {g: ms.tolist() for g, ms in _suspect_groups(evidence, suspicious).items()}
    words = _words(wd, sorted({m for ms in groups.values() for m in ms}))
    out: dict[int, tuple[str, int]] = {}
    for g, members in groups.items():
        suspects = [m for m in members if suspicious[m]]
        tally = Counter(w for m in suspects for w in words[m])
        claim = {w for w, c in tally.items() if c > share * len(suspects)}
        if len(claim) >= MIN_SHARED:
            name = evidence.groups[g]["id"]
            out.update({m: (name, len(claim)) for m in members
                        if eligible[m] and not suspicious[m] and claim <= words[m]})  # fmt: skip
    return out


def like_reason(found: tuple[str, int]) -> list[str]:
    """Why :func:`like_their_group` named a chunk."""
    group, shared = found
    return [
        f"holds every one of the {shared} words most of the suspects of group {group} share "
        "(their claim, its planted answer among them): counted with them"
    ]


def unlike_reason(found: tuple[str, int, int]) -> list[str]:
    """Why :func:`unlike_their_group` named a chunk."""
    group, held, shared = found
    return [
        f"a possible victim of group {group}, not counted as suspicious: it holds {held} of the "
        f"{shared} words most of the group's other members share; it shares their subject, not "
        "their wording or their claim, as the honest passage a planted set targets does"
    ]


def _words(wd: Workdir, positions: list[int]) -> dict[int, set[str]]:
    """The :func:`~ragdefense.defenses.claims.claim_terms` of the chunks at ``positions``."""
    starts = part_starts(wd.noted("part_sizes"))
    out = {}
    for i in positions:
        part, offset = locate(starts, i)
        out[i] = claim_terms(part_texts(wd, part)["texts"][offset])
    return out


def _suspect_groups(evidence: Evidence, suspicious: np.ndarray) -> dict[int, np.ndarray]:
    """Per group of three or more, at least half of it ``suspicious``: its members' positions,
    in order (groups by number)."""
    if not len(evidence.groups):
        return {}
    sizes = _sizes(evidence)
    chosen = np.flatnonzero((sizes >= 3) & _mostly(evidence, suspicious, sizes)).tolist()
    order = np.argsort(evidence.group_of, kind="stable")  # each group's members together
    bounds = np.searchsorted(evidence.group_of[order], np.arange(len(sizes) + 1))
    return {g: order[bounds[g] : bounds[g + 1]] for g in chosen}


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


def _asked_alike(evidence: Evidence, unlike: dict[int, tuple[str, int, int]]) -> np.ndarray:
    """Per position: whether a chunk :func:`unlike_their_group` names is closest to the logged
    question most of that group's members are closest to."""
    out = np.zeros(len(evidence.group_of), dtype=bool)
    asked = evidence.closest_probe
    if asked is None:
        return out
    ids = {g["id"]: n for n, g in enumerate(evidence.groups)}
    for i, (group, _, _) in unlike.items():
        members = np.flatnonzero(evidence.group_of == ids[group])
        members = members[members != i]
        if (
            asked[i] >= 0
            and len(members)
            and 2 * int((asked[members] == asked[i]).sum()) > len(members)
        ):
            out[i] = True
    return out
