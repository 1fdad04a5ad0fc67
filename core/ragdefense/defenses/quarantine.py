"""Quarantine: the chunks a knowledge-base audit flagged never reach a context, whatever the
per-query defense would decide about them.

The per-query defenses see one query's pool; an audit sees the whole knowledge base, and finds
planted *sets* (near-copies written for one question, far closer to each other than to anything
else) even where they are the majority of what a query retrieves, the case no text-only rule over
one pool can decide. :class:`Quarantine` carries the audit's findings to answer time: a passage
the audit flagged is removed before the wrapped defense runs, with the audit's evidence as its
reason, and the defense decides about the rest as usual.

A passage is matched to a finding by its text (spacing aside), never by its id alone: a chunk
stored again under a new id stays quarantined, while an honest chunk that happens to carry a
flagged chunk's id (a store numbering its documents another way, a chunk replaced in place)
does not; a reworded chunk is a new chunk, which the next audit and the per-query defense judge.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..types import (
    Defense,
    DefenseInputError,
    DefenseResult,
    Passage,
    PassageLike,
    Verdict,
    check_embeddings,
    to_passages,
)

__all__ = ["Quarantine"]


def _digest(text: str) -> str:
    """SHA-256 of ``text`` with its spacing, Unicode form and invisible format characters
    (zero-width spaces, joiners) normalised: a store may strip, rewrap or re-encode it, and an
    attacker's copy must not escape by a character no reader sees."""
    said = unicodedata.normalize("NFKC", text)
    said = " ".join("".join(c for c in said if unicodedata.category(c) != "Cf").split())
    return hashlib.sha256(said.encode("utf-8", errors="surrogatepass")).hexdigest()


def _findings(report: Any) -> tuple[list[Mapping[str, Any]], set[str], int | None]:
    """The findings (as mappings) of an AuditReport, its ``to_dict()``, a ``report.json`` or the
    audit's folder holding one; the sources it condemned (``suspect_sources``); and how many
    chunks it scored (``None``: not said)."""
    if isinstance(report, (str, os.PathLike)):
        path = Path(report)
        path = path / "report.json" if path.is_dir() else path
        if path.suffix.lower() in (".csv", ".parquet", ".md", ".png"):
            raise ValueError(
                f"{str(path)!r} is a view of an audit report: give its report.json (or the "
                "audit's folder), which holds every finding with its group and the stats"
            )
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read the audit report {str(path)!r}: {exc}") from exc
    if hasattr(report, "to_dict"):
        report = report.to_dict()
    if not isinstance(report, Mapping) or not isinstance(report.get("findings"), list):
        raise ValueError("not an audit report: expected its 'findings' (ragdefense.audit)")
    stats = report.get("stats")
    suspect = stats.get("suspect_sources") if isinstance(stats, Mapping) else None
    sources = {str(r["source"]) for r in suspect or [] if isinstance(r, Mapping) and "source" in r}
    chunks = stats.get("chunks") if isinstance(stats, Mapping) else None
    scored = chunks if isinstance(chunks, int) and not isinstance(chunks, bool) else None
    return [f for f in report["findings"] if isinstance(f, Mapping)], sources, scored


@contextmanager
def _renumbered(rest: list[int]) -> Iterator[None]:
    """The wrapped defense sees the passages left, renumbered: an input error it raises names
    the caller's position of the passage, as the caller numbered them."""
    try:
        yield
    except DefenseInputError as exc:

        def caller(match: re.Match[str]) -> str:
            i = int(match.group(1))
            return f"passage {rest[i] if i < len(rest) else i}"

        raise DefenseInputError(_PASSAGE.sub(caller, str(exc))) from exc


_PASSAGE = re.compile(r"\bpassage (\d+)")


def _number(n: int, finding: Mapping[str, Any], what: str, value: Any, whole: bool) -> float:
    """A finding's ``what`` as a number, else ``ValueError`` naming the finding: a report from
    another version, or edited by hand, must not quarantine the wrong passages."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or (whole and not float(value).is_integer()):
        kind = "a whole number" if whole else "a number"
        raise ValueError(
            f"finding {n} (id {finding.get('id')!r}): its {what} is {value!r}, not {kind}"
            " (an audit report's findings come from ragdefense.audit)"
        )
    return float(value)


@dataclass(frozen=True, eq=False)
class Quarantine:
    """A defense that first removes the passages an audit flagged, then runs ``defense``.

    Build it from an audit: ``Quarantine.from_report("audit/report.json")``; use it wherever a
    defense goes (``defend(retriever, quarantine)`` in either framework).

    Attributes:
        defense: The per-query defense run on the passages left (any :class:`Defense`).
        ids: Ids of the quarantined chunks, as the audit named them (for reading: matching
            is by text).
        digests: SHA-256 of their texts (spacing normalised): what passages are matched by.
        reasons: The audit's evidence per chunk, by digest.
    """

    defense: Defense
    ids: frozenset[str]
    digests: frozenset[str]
    reasons: Mapping[str, str]

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
                large planted set it is as often one of the set's own variants. A possible
                victim the report does not count as suspicious (``victim_of``) is never
                quarantined, whatever its score.
            embedder: The embedding model of a ``defense`` given by name (anything
                :func:`ragdefense.as_embedder` takes): the store's, where its vectors reach the
                defense. A defense object comes with its own.

        Raises:
            ValueError: The report cannot be read, is not an audit's, or lists too few chunks
                for ``min_score`` (fewer than it scored, the last above ``min_score``).
        """
        from .registry import defense as front_door

        findings, condemned, scored = _findings(report)
        if min_score is not None and scored is not None and len(findings) < scored:
            listed = [_number(n, f, "score", f.get("score"), False) for n, f in enumerate(findings)]
            if not listed or min(listed) >= min_score:
                raise ValueError(
                    f"the report lists {len(findings)} of the {scored} chunks it scored, all "
                    f"scored {min_score} or more: chunks above min_score={min_score} may be "
                    "missing; audit again with a larger report_top, or raise min_score"
                )
        chosen: list[tuple[Mapping[str, Any], float, str]] = []
        for n, f in enumerate(findings):  # each field checked where it decides something
            score = f.get("score", float("nan"))
            if min_score is None:
                flagged = f.get("suspicious")
                if not isinstance(flagged, bool):
                    raise ValueError(
                        f"finding {n} (id {f.get('id')!r}): its verdict 'suspicious' is "
                        f"{flagged!r}, not true or false (an audit report's findings come from "
                        "ragdefense.audit)"
                    )
            else:
                flagged = _number(n, f, "score", score, whole=False) >= min_score
            if not flagged or f.get("victim_of"):
                continue
            group = f.get("group") or {}
            size = group.get("size", 0) if isinstance(group, Mapping) else None
            source = f.get("source")
            condemned_source = isinstance(source, str) and source in condemned
            if grouped and not condemned_source and _number(n, f, "group size", size, True) < 2:
                continue
            text = f.get("text")
            if not isinstance(text, str):
                raise ValueError(f"finding {n} (id {f.get('id')!r}): its text is not a string")
            chosen.append((f, _number(n, f, "score", score, whole=False), text))
        reasons: dict[str, str] = {}
        for f, score, text in chosen:
            why = "; ".join(str(r) for r in f.get("reasons", [])) or "flagged"
            reason = f"quarantined: the knowledge-base audit flagged it (score {score:.2f}; {why})"
            reasons[_digest(text)] = reason
        return cls(
            front_door(defense, embedder=embedder),
            frozenset(str(f.get("id")) for f, _, _ in chosen),
            frozenset(_digest(text) for _, _, text in chosen),
            reasons,
        )

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

    def reason(self, passage: Passage) -> str | None:
        """Why ``passage`` is quarantined (its text is a flagged chunk's); ``None`` when not."""
        digest = _digest(passage.text)
        return self.reasons[digest] if digest in self.digests else None

    def defend(self, query: str, passages: Sequence[PassageLike]) -> DefenseResult:
        """Remove the quarantined passages, then run the defense on the rest."""
        items = to_passages(passages)
        held, rest = self._split(items)
        with _renumbered(rest):
            inner = self.defense.defend(query, [items[i] for i in rest]) if rest else None
        return self._merge(query, items, held, rest, inner)

    def defend_embeddings(
        self,
        query: str,
        passages: Sequence[PassageLike],
        embeddings: Any = None,
        query_embedding: Any = None,
    ) -> DefenseResult:
        """:meth:`defend` with the passages' embeddings given (rows in passage order; ``None``:
        those the passages carry, the rest embedded by the wrapped defense)."""
        items = to_passages(passages)
        if embeddings is None and query_embedding is None:
            return self.defend(query, items)
        rows = None if embeddings is None else check_embeddings(embeddings, len(items))
        held, rest = self._split(items)
        inner = None
        if rest:
            run = getattr(self.defense, "defend_embeddings", None)
            subset = [items[i] for i in rest]
            with _renumbered(rest):
                inner = (
                    run(query, subset, None if rows is None else rows[rest], query_embedding)
                    if callable(run)
                    else self.defense.defend(query, subset)
                )
        return self._merge(query, items, held, rest, inner)

    def fallback(self, query: str, passages: Sequence[PassageLike]) -> DefenseResult:
        """What an adapter set to fail open passes on where the wrapped defense failed: every
        passage but the quarantined ones, unjudged (the audit's findings need no model)."""
        items = to_passages(passages)
        held, rest = self._split(items)
        why = "kept: not judged (the per-query defense failed; the quarantine alone applied)"
        verdicts = [
            Verdict(i, p, False, float("nan"), held[i])
            if i in held
            else Verdict(i, p, True, float("nan"), why, rank=rest.index(i))
            for i, p in enumerate(items)
        ]
        estimates = {"quarantined": sorted(held), "note": "the per-query defense failed"}
        return DefenseResult(self.name, query, tuple(verdicts), "score", estimates)

    def _split(self, items: list[Passage]) -> tuple[dict[int, str], list[int]]:
        """The quarantined positions with their reasons, and the positions left."""
        held = {i: why for i, p in enumerate(items) if (why := self.reason(p)) is not None}
        return held, [i for i in range(len(items)) if i not in held]

    def _merge(
        self,
        query: str,
        items: list[Passage],
        held: dict[int, str],
        rest: list[int],
        inner: DefenseResult | None,
    ) -> DefenseResult:
        verdicts: list[Verdict | None] = [None] * len(items)
        for i, why in held.items():
            verdicts[i] = Verdict(i, items[i], False, float("nan"), why)
        estimates: dict[str, Any] = {"quarantined": sorted(held)}
        if inner is not None:
            for v in inner.verdicts:
                at = rest[v.index]
                verdicts[at] = replace(
                    v, index=at, passage=items[at], reason=_copy_of(v.reason, rest)
                )
            estimates.update(_positions(inner.estimates, rest))
        return DefenseResult(
            self.name,
            query,
            tuple(v for v in verdicts if v is not None),
            inner.score_name if inner is not None else "score",
            estimates,
            inner.reranked if inner is not None else False,
        )


#: the estimates that hold passage positions (a list of them; groups: lists; copies: a mapping;
#: AutoDefense's ``evidence`` holds some too)
_POSITIONS = (
    "unsupported",
    "unsupported_apart",
    "contradicting",
    "quoting",
    "trusted",
    "peeled",
    "off_topic",
    "ragdefender_flagged",
    "not_absorbed",
)


def _positions(estimates: Mapping[str, Any], rest: list[int]) -> dict[str, Any]:
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
    if isinstance(out.get("evidence"), Mapping):
        out["evidence"] = _positions(out["evidence"], rest)
    return out


def _copy_of(reason: str, rest: list[int]) -> str:
    """``reason`` with the passage a copy follows (Consensus's reasons for copies open with
    "removed: a copy of passage N") as its input position (nothing after that opening is read:
    a source may hold any words), and so GRADA's retrieval rank ("rank R of M (was N)",
    1-based)."""
    found = re.match(r"removed: a copy of passage (\d+)", reason)
    if found is not None and int(found[1]) < len(rest):
        start, end = found.span(1)
        return reason[:start] + str(rest[int(found[1])]) + reason[end:]
    found = re.search(r"\brank \d+ of \d+ \(was (\d+)\)", reason)
    if found is not None and 0 < int(found[1]) <= len(rest):
        start, end = found.span(1)
        return reason[:start] + str(rest[int(found[1]) - 1] + 1) + reason[end:]
    return reason
