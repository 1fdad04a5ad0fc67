"""Quarantine: the chunks a knowledge-base audit flagged never reach a context, whatever the
per-query defense would decide about them.

The per-query defenses see one query's pool; an audit sees the whole knowledge base, and finds
planted *sets* (near-copies written for one question) even where they are the majority of what a
query retrieves, which no text-only rule over one pool can decide. :class:`Quarantine` removes
what the audit flagged before the wrapped defense runs, with the audit's evidence as its reason.

A passage is matched to a finding by its text (spacing, case and accents aside), never by its
id alone: a chunk stored again under a new id stays quarantined, while an honest chunk that
happens to carry a flagged chunk's id (a store numbering its documents another way, a chunk
replaced in place) does not; a reworded chunk is a new chunk, which the next audit and the
per-query defense judge.
A text flagged for its source alone, or one the report also lists as not suspicious (an honest
passage an attacker's upload copies), is matched by text *and* source: its honest copies stay.
Of a group of copies of one text, the defense judges one copy in the pool, a trusted one where
there is one, else the first (it may be an honest passage an attacker stored again); the
attacker's condemned source loses its copies. A passage the wrapped defense trusts
(``trusted=``) is never quarantined.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..provenance import AUTO, source_of
from ..types import (
    Defense,
    DefenseResult,
    Described,
    Passage,
    PassageLike,
    Verdict,
    check_embeddings,
    check_query,
    check_query_embedding,
    checked_result,
    defend_given,
    to_passages,
)
from .findings import (
    BLANK,
    STANDS_APART,
    check_held,
    copy_groups,
    digest,
    finding_source,
    number,
    read_report,
)
from .params import finite, said
from .renumber import copy_of, positions, renumbered
from .trusting import innermost_trust

__all__ = ["Quarantine"]


@dataclass(frozen=True, eq=False, repr=False)
class Quarantine(Described):
    """A defense that first removes the passages an audit flagged, then runs ``defense``.

    Build it from an audit: ``Quarantine.from_report("audit/report.json")``; use it wherever a
    defense goes (``defend(retriever, quarantine)`` in either framework).

    Attributes:
        defense: The per-query defense run on the passages left (any :class:`Defense`).
        ids: Ids of the quarantined chunks, as the audit named them (for reading: matching
            is by text).
        digests: SHA-256 of their texts (spacing normalised): what passages are matched by.
        reasons: The audit's evidence per chunk, by digest.
        sourced: ``(digest, source)`` of the chunks matched by text and source.
        source_key: How a passage's source is read (the audit's ``source_key``).
        once: Digests of texts the audit found stored as a group of copies: of a pool's copies
            of one, a trusted one, else the first, passes to the defense, the untrusted others
            are held (whatever the defense does with copies, it judges the text once).
        chunks: How many of the audited chunks it holds (their copies in one pool aside): how
            far a retriever widens its fetch to refill a context (0: counted from the sets).
    """

    defense: Defense
    ids: frozenset[str]
    digests: frozenset[str]
    reasons: Mapping[str, str]
    sourced: frozenset[tuple[str, str]] = frozenset()
    source_key: str | None = AUTO
    once: frozenset[str] = frozenset()
    chunks: int = 0

    @classmethod
    def from_report(
        cls,
        report: Any,
        defense: Any = None,
        *,
        min_score: float | None = None,
        grouped: bool = True,
        embedder: Any = None,
    ) -> Quarantine:
        """Quarantine the chunks ``report`` flags.

        Args:
            report: An :class:`~ragdefense.auditing.AuditReport`, its ``to_dict()``, the path of
                its ``report.json``, or the audit's working folder holding one.
            defense: The per-query defense for the rest: a name or an object, as
                :func:`ragdefense.defense` takes (``None``: the default).
            min_score: Quarantine the chunks scored at least this (``None``: the chunks the
                audit itself flagged, ``suspicious``), those of them ``grouped`` allows.
            grouped: Only chunks in one of the audit's near-duplicate groups (planted *sets*)
                or from a source the audit condemned (``stats["suspect_sources"]``: an upload
                or site most of whose chunks look planted). Any other flagged chunk is as often
                the honest passage a planted set sits next to (its victim) as a planted one, and
                is left to the per-query defense; ``False`` quarantines it too. A group's
                member the report names as standing apart from it (possibly the honest passage
                the group targets, for a person to check) is quarantined with its group: in a
                large planted set it is as often one of the set's own variants; but where that
                member comes from a source the audit did not condemn, and most of the group's
                other members from condemned sources, it is left to the per-query defense (the
                set is the attacker's upload; that member is as often the honest passage the
                set paraphrases). A possible
                victim the report does not count as suspicious (``victim_of``) is never
                quarantined, whatever its score; of a group whose members, all listed, hold one
                text, one copy in a pool is left to the defense (a trusted one, else the first:
                :attr:`once`).
            embedder: The embedding model of a ``defense`` given by name (anything
                :func:`ragdefense.as_embedder` takes): the store's, where its vectors reach the
                defense. A defense object comes with its own.

        Raises:
            ValueError: The report cannot be read, is not an audit's, or lists too few chunks
                for ``min_score`` (fewer than it scored, the last above ``min_score``).
        """
        from .registry import defense as front_door

        if min_score is not None and (
            isinstance(min_score, bool)
            or not isinstance(min_score, numbers.Real)
            or not finite(min_score)
        ):
            raise ValueError(f"min_score must be a finite number or None, got {said(min_score)}")
        findings, stats = read_report(report)
        suspect = stats.get("suspect_sources")
        condemned = {
            str(r["source"]) for r in suspect if isinstance(r, Mapping) and "source" in r
        } if isinstance(suspect, list) else set()  # fmt: skip
        scored = stats.get("chunks") if not isinstance(stats.get("chunks"), bool) else None
        if min_score is not None and isinstance(scored, int) and len(findings) < scored:
            listed = [number(n, f, "score", f.get("score"), False) for n, f in enumerate(findings)]
            floor = stats.get("listed_down_to")  # the top listing's last: members joined aside
            known = isinstance(floor, numbers.Real) and not isinstance(floor, bool)
            lowest = float(floor) if known else min(listed, default=None)
            if lowest is None or lowest >= min_score:
                raise ValueError(
                    f"the report lists {len(findings)} of the {scored} chunks it scored, all "
                    f"scored {min_score} or more: chunks above min_score={min_score} may be "
                    "missing; audit again with a larger report_top, or raise min_score"
                )
        chosen: list[tuple[Mapping[str, Any], float, str, bool]] = []
        cleared: set[str] = set()  # the texts the report also lists as not suspicious
        for n, f in enumerate(findings):  # each field checked where it decides something
            text, flagged = f.get("text"), f.get("suspicious")
            score = f.get("score", float("nan")) if min_score is None else f.get("score")
            if min_score is not None:
                flagged = number(n, f, "score", score, whole=False) >= min_score
            elif not isinstance(flagged, bool):
                raise ValueError(
                    f"finding {n} (id {f.get('id')!r}): its verdict 'suspicious' is {flagged!r},"
                    " not true or false (an audit report's findings come from ragdefense.audit)"
                )
            if not flagged or f.get("victim_of"):
                cleared.update([digest(text)] if isinstance(text, str) else [])
                continue
            group = f.get("group") or {}
            size = group.get("size", 0) if isinstance(group, Mapping) else None
            lone = number(n, f, "group size", size, True) < 2
            if lone and grouped and finding_source(f) not in condemned:
                continue
            if not isinstance(text, str):
                raise ValueError(f"finding {n} (id {f.get('id')!r}): its text is not a string")
            if digest(text) == BLANK:  # it would hold every passage without text (an image's)
                continue
            by_source = lone and finding_source(f) in condemned  # its honest copies stay
            chosen.append((f, number(n, f, "score", score, whole=False), text, by_source))
        copies, digests, sourced, once = copy_groups(findings), set(), set(), set()
        ids, reasons = set(), {}
        members: dict[Any, list[str | None]] = {}  # each group's listed members' sources
        for f in findings:
            if isinstance(f.get("group"), Mapping):
                members.setdefault(f["group"].get("id"), []).append(finding_source(f))
        for f, score, text, by_source in chosen:
            d, source = digest(text), finding_source(f)
            group_id = (f.get("group") or {}).get("id")
            apart = any(str(r).startswith(STANDS_APART) for r in f.get("reasons") or [])
            if not by_source and apart and source not in (None, *condemned):
                others = list(members.get(group_id, [])) if group_id is not None else []
                if source in others:
                    others.remove(source)  # the member itself
                if 2 * sum(o in condemned for o in others) > len(others) > 0:
                    continue  # the set is a condemned upload's; this member is not: the defense's
            if not by_source and group_id in copies:
                if source is not None and source in condemned:
                    sourced.add((d, source))  # an attacker's upload: its copies go
                    ids.add(str(f.get("id")))
                    reasons[d] = "quarantined: a copy the audit found in a condemned source"
                once.add(d)  # one copy is judged: it may be the truth an attacker stored again
                continue
            if not by_source and d not in cleared:
                digests.add(d)
            elif source is not None:  # the flagged copy's source only: others are honest
                sourced.add((d, source))
            else:
                continue
            why = "; ".join(str(r) for r in f.get("reasons") or []) or "flagged"
            why = (
                f"quarantined: the knowledge-base audit flagged it (score {score:.2f}; {why})"
                if min_score is None
                else f"quarantined: the knowledge-base audit scored it {score:.2f}, at least "
                f"min_score={min_score} ({why})"
            )
            ids.add(str(f.get("id")))
            reasons[d] = why
        key = stats.get("source_key", AUTO)
        key = key if key is None or isinstance(key, str) else AUTO
        guard = front_door(defense, embedder=embedder)
        sets = frozenset(ids), frozenset(digests), reasons, frozenset(sourced), key, frozenset(once)
        return cls(guard, *sets, chunks=len(chosen))

    def __post_init__(self) -> None:
        held = {*self.digests, *(text for text, _ in self.sourced)}
        check_held(self.defense, self.chunks, self.reasons, held)

    @property
    def size(self) -> int:
        """How many chunks it holds at most (:attr:`chunks`, or what its sets name)."""
        return max(self.chunks, len(self.ids), len(self.digests) + len(self.sourced))

    @property
    def embedder(self) -> Any:
        """The wrapped defense's embedding model (``None``: the packaged one, or none)."""
        return getattr(self.defense, "embedder", None)

    # the Defense contract: the wrapped defense's pool
    @property
    def name(self) -> str:
        return f"{self.defense.name} + quarantine"

    @property
    def pool_factor(self) -> int:
        return self.defense.pool_factor

    @property
    def min_pool(self) -> int:
        return self.defense.min_pool

    @property
    def min_passages(self) -> int:
        return self.defense.min_passages

    @property
    def uses_embeddings(self) -> bool:  # the wrapped defense's: adapters hand it their vectors
        return bool(getattr(self.defense, "uses_embeddings", False))

    def judged(self, passages: Sequence[PassageLike]) -> list[int]:
        """The positions of ``passages`` the wrapped defense judges (the others are held, here
        or by a quarantine inside): the ones an adapter asks a model to embed ahead."""
        rest = self._split(items := to_passages(passages))[1]
        if isinstance(self.defense, Quarantine):
            rest = [rest[i] for i in self.defense.judged([items[i] for i in rest])]
        return rest

    def reason(self, passage: Passage) -> str | None:
        """Why ``passage`` is quarantined (its text is a flagged chunk's, and its source too
        where that matters); ``None`` when not, or where the wrapped defense trusts it."""
        why = self._matched(passage, digest(passage.text))
        return None if why is None or innermost_trust(self.defense, Quarantine)(passage) else why

    def _matched(self, passage: Passage, text: str) -> str | None:
        """The reason a finding gives ``passage`` (digest ``text``), its trust aside."""
        source = source_of(passage, self.source_key) if self.sourced else None
        if text not in self.digests and (text, source) not in self.sourced:
            return None
        return self.reasons[text]

    def defend(self, query: str, passages: Sequence[PassageLike]) -> DefenseResult:
        """Remove the quarantined passages, then run the defense on the rest."""
        query, items = check_query(query), to_passages(passages)
        rest = (split := self._split(items))[1]
        with renumbered(rest):
            inner = self.defense.defend(query, [items[i] for i in rest]) if rest else None
        return self._merge(query, items, split, inner)

    def defend_embeddings(
        self,
        query: str,
        passages: Sequence[PassageLike],
        embeddings: Any = None,
        query_embedding: Any = None,
    ) -> DefenseResult:
        """:meth:`defend` with the passages' embeddings given (rows in passage order; ``None``:
        those the passages carry, the rest embedded by the wrapped defense)."""
        query, items = check_query(query), to_passages(passages)
        if embeddings is None and query_embedding is None:
            return self.defend(query, items)
        rows = None if embeddings is None else check_embeddings(embeddings, len(items))
        if query_embedding is not None:  # checked even where every passage is quarantined
            width = None if rows is None or not len(items) else rows.shape[1]
            check_query_embedding(query_embedding, width)
        rest, inner = (split := self._split(items))[1], None
        if rest:
            subset, given = [items[i] for i in rest], None if rows is None else rows[rest]
            with renumbered(rest):
                inner = defend_given(self.defense, query, subset, given, query_embedding)
        return self._merge(query, items, split, inner)

    def fallback(self, query: str, passages: Sequence[PassageLike]) -> DefenseResult:
        """What an adapter set to fail open passes on where the wrapped defense failed: every
        passage but the quarantined ones, unjudged (the audit's findings need no model)."""
        query, items = check_query(query), to_passages(passages)
        held, rest, stands = split = self._split(items)
        inner = getattr(self.defense, "fallback", None)
        if callable(inner) and rest:  # a quarantine inside: its findings apply too
            return self._merge(query, items, split, inner(query, [items[i] for i in rest]))
        why = "kept: not judged (the per-query defense failed; the quarantine alone applied)"
        verdicts = [
            Verdict(i, p, False, float("nan"), held[i], details={"copy": float(i in stands)})
            if i in held
            else Verdict(
                i, p, True, float("nan"), why, rank=rest.index(i), details={"checked": False}
            )
            for i, p in enumerate(items)
        ]
        estimates = {"quarantined": sorted(held), "note": "the per-query defense failed"}
        return DefenseResult(self.name, query, tuple(verdicts), "score", estimates)

    def _split(self, items: list[Passage]) -> tuple[dict[int, str], list[int], dict[int, int]]:
        """The quarantined positions with their reasons, the positions left, and each held
        copy's position with the position of the copy judged in its place. A passage whose
        trust cannot be read (the ``trusted=`` predicate fails on its metadata) is untrusted:
        raising would let one planted document fail every query that retrieves it."""
        held: dict[int, str] = {}
        # once's texts: (untrusted?, position); by text alone, whatever metadata each copy
        # shows (an attacker's uploads choose theirs: all reaching the defense, they would be
        # a coordinated group, and the honest copy would go with them)
        copies: dict[str, list[tuple[bool, int]]] = {}
        trust = innermost_trust(self.defense, Quarantine)  # unreadable: raises, as the defense
        for i, p in enumerate(items):
            d = digest(p.text)
            why = self._matched(p, d)
            if why is None and d not in self.once:
                continue
            try:  # the wrapped defense's trusted= predicate may fail on a planted passage's
                trusted = trust(p)  # metadata: untrusted then (held, never an error)
            except Exception:
                trusted = False
            if why is not None and not trusted:
                held[i] = why
            elif d in self.once:
                copies.setdefault(d, []).append((not trusted, i))
        stands: dict[int, int] = {}
        for found in copies.values():  # copies of one text: one is judged, a trusted one first
            stand = min(found)[1]
            for untrusted, i in found:
                if untrusted and i != stand:
                    held[i] = f"removed: a copy of passage {stand} (copies of it are in the audit)"
                    stands[i] = stand
        return held, [i for i in range(len(items)) if i not in held], stands

    def _merge(
        self,
        query: str,
        items: list[Passage],
        split: tuple[dict[int, str], list[int], dict[int, int]],
        inner: DefenseResult | None,
    ) -> DefenseResult:
        held, rest, stands = split
        verdicts: list[Verdict | None] = [None] * len(items)
        estimates: dict[str, Any] = {"quarantined": sorted(held)}
        if inner is not None:
            for v in checked_result(inner, len(rest), self.defense).verdicts:
                at = rest[v.index]
                verdicts[at] = replace(
                    v, index=at, passage=items[at], reason=copy_of(v.reason, rest)
                )
            inner_estimates = positions(inner.estimates, rest)
            held_inside = inner_estimates.pop("quarantined", [])  # a quarantine wrapped inside
            estimates.update(inner_estimates, quarantined=sorted([*held, *held_inside]))
        for i, why in held.items():  # a held copy's text stays where the copy judged for it is
            stand = verdicts[stands[i]] if i in stands else None
            copy = {"copy": float(stand is not None and stand.kept)}
            verdicts[i] = Verdict(i, items[i], False, float("nan"), why, details=copy)
        return DefenseResult(
            self.name,
            query,
            tuple(v for v in verdicts if v is not None),
            inner.score_name if inner is not None else "score",
            estimates,
            inner.reranked if inner is not None else False,
        )
