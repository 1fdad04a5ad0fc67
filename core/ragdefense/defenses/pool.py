"""The retrieved pool as Consensus reads it: copies of one passage counted once, and the
passages on the query's topic (a small store's pool reaches other topics); and the verdicts
Consensus returns for it."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from ..text import tokenize
from ..types import DefenseResult, Verdict

__all__ = [
    "COPY_REASON",
    "Pool",
    "apart_from",
    "consensus_result",
    "copy_numbers",
    "distinct",
    "map_back",
    "marked_scripts",
    "on_topic",
    "one_of_each",
    "plain_text",
    "text_numbers",
]


def on_topic(qs: np.ndarray) -> list[int]:
    """The passages at least half as similar to the query as the best one: a small store's
    other topics fall below (the best is always on it, negative cosines too)."""
    best = float(qs.max())
    bar = min(0.5 * best, best)
    return [i for i in range(len(qs)) if qs[i] >= bar]


def distinct(items: list[Any], given: Any = None) -> tuple[list[int], dict[int, list[int]]]:
    """The first of each set of copies (the same text up to spacing, case, accents and Unicode
    form: what an uncased embedder ignores too), and each first one's later copies. Texts that
    differ otherwise are never copies, even where their embeddings coincide: an embedder reads
    a window of each text, and what follows it may differ. Passages without text that carry
    embeddings (an image's node), or are ``given`` them (rows in passage order), are copies
    only where their embeddings are equal; passages shown to the generator differently
    (``Passage.shown``: metadata it reads beside the text) never are."""
    keep: list[int] = []
    copy_of: dict[int, list[int]] = {}
    seen: dict[str, int] = {}
    for i, passage in enumerate(items):
        text = plain_text(passage.text)
        if not text and (given is not None or passage.embedding is not None):
            try:
                row = passage.embedding if given is None else given[i]
                vector = np.asarray(row, dtype=np.float64)
                text = "\0embedding " + vector.tobytes().hex()
            except (TypeError, ValueError, IndexError, KeyError, OverflowError):
                text = f"\0passage {i}"  # checked, and refused, with the embeddings
        if passage.shown is not None:
            text += "\0shown " + passage.shown
        first = seen.get(text)
        if first is None:
            keep.append(i)
            seen[text] = i
        else:
            copy_of.setdefault(first, []).append(i)
    return keep, copy_of


def copy_numbers(items: list[Any], given: Any = None) -> list[int]:
    """One number per passage, that of the first copy of its text (:func:`distinct`)."""
    _, copy_of = distinct(items, given)
    out = list(range(len(items)))
    for first, copies in copy_of.items():
        for c in copies:
            out[c] = first
    return out


def text_numbers(items: list[Any]) -> list[int]:
    """One number per passage, that of the first passage with its text (up to spacing, case,
    accents and Unicode form) however each is shown (``Passage.shown``); a passage without
    text has its own."""
    first: dict[str, int] = {}
    return [first.setdefault(t, i) if (t := plain_text(p.text)) else i for i, p in enumerate(items)]


#: the reason a copy is left out for (its text stays once, in the passage standing for it);
#: its verdict's ``details["copy"]`` is 1, and it takes the place of the set's first copy
COPY_REASON = "a copy of passage {}, which stands for it: the context holds each text once"


def one_of_each(
    copy_of: dict[int, list[int]],
    trusted: list[bool],
    sources: list[str | None],
    removed: dict[int, str],
    judged: frozenset[str] = frozenset(),
) -> dict[int, int]:
    """For each set of copies of a passage not ``removed``, every copy but the one standing for
    the text, each mapped to that one: a copy tells the generator nothing the other does not,
    and ten copies of one planted text would fill ten slots of the context. The copy standing
    for the text is chosen in this order: trusted; not of a source step 2 ``judged``; of the
    source that lost fewest passages (an attacker's copy of an honest page is not the one
    cited, where the honest page's source lost less; only where the pool holds two sources or
    more, so that one source reads as no source); the first. A removed passage's copies go
    with it (:func:`map_back`)."""
    known = set(sources) - {None}
    lost = Counter(sources[i] for i in removed) if len(known) > 1 else Counter()
    lost[None] = 0
    out: dict[int, int] = {}
    for first, copies in copy_of.items():
        if first in removed:
            continue
        members = [first, *copies]
        stand = min(
            members, key=lambda i: (not trusted[i], sources[i] in judged, lost[sources[i]], i)
        )
        out.update({i: stand for i in members if i != stand})
    return out


#: the combining diacritical marks (accents) that Unicode decomposition splits off letters
_ACCENTS = re.compile("[\u0300-\u036f]")


def plain_text(text: str) -> str:
    """``text`` with spacing, case, accents and Unicode form left out (but a superscript or
    subscript digit or sign, which :func:`marked_scripts` keeps apart: ``10⁵`` is not
    ``105``). Kept for texts a store returns query after query."""
    return (_plain if len(text) <= _CACHED else _plain.__wrapped__)(text)


#: the longest text whose plain form is kept (a passage; a whole document is read anew)
_CACHED = 8192


@lru_cache(maxsize=4096)
def _plain(text: str) -> str:
    if not text.isascii():  # ASCII has no accents or other forms
        text = _ACCENTS.sub("", unicodedata.normalize("NFKD", marked_scripts(text)))
    return " ".join(text.casefold().split())


def marked_scripts(text: str) -> str:
    """``text`` with each superscript or subscript digit or sign written as ``^`` or ``_``
    and its plain form (``10⁵``: ``10^5``, ``H₂O``: ``H_2O``), so that a compatibility
    normalisation after it (NFKC, NFKD) does not make another number of it; a superscript
    letter (``™``, ``ⁿ``) folds as before."""
    if text.isascii() or not _SCRIPT.search(text):  # the common case, at regex speed
        return text
    return text.translate(_MARKED)


def _script_marks() -> dict[str, str]:
    marks = {}
    for c in "¹²³" + "".join(map(chr, range(0x2070, 0x2090))):  # where Unicode has them
        tag = unicodedata.decomposition(c).partition(" ")[0]
        plain = unicodedata.normalize("NFKD", c)
        if tag in ("<super>", "<sub>") and plain in _DIGITS_AND_SIGNS:
            marks[c] = ("^" if tag == "<super>" else "_") + plain
    return marks


_DIGITS_AND_SIGNS = frozenset("0123456789+-=()\u2212")
_MARKED = str.maketrans(_script_marks())
_SCRIPT = re.compile(f"[{''.join(map(chr, _MARKED))}]")


def map_back(
    removed: dict[int, str],
    keep: list[int],
    copy_of: dict[int, list[int]],
    estimates: dict[str, Any],
) -> dict[int, str]:
    """Removals found among the distinct passages, as input positions (copies follow their
    first); index lists in ``estimates`` mapped the same way."""
    out: dict[int, str] = {}
    for k, why in removed.items():
        first = keep[k]
        out[first] = why
        for c in copy_of.get(first, []):
            out[c] = f"a copy of passage {first}, removed with it: {why}"
    for key in ("groups", "unsupported", "contradicting", "quoting"):
        if key in estimates:
            value = estimates[key]
            estimates[key] = (
                [[keep[i] for i in g] for g in value]
                if key == "groups"
                else [keep[i] for i in value]
            )
    if "unsupported_apart" in estimates:  # spared passages: their copies are spared with them
        spared = [keep[i] for i in estimates["unsupported_apart"]]
        estimates["unsupported_apart"] = sorted(
            spared + [c for i in spared for c in copy_of.get(i, [])]
        )
    return out


@dataclass
class Pool:
    """The distinct passages being judged (copies counted once), and what the steps found."""

    items: list[Any]
    sim: np.ndarray
    qs: np.ndarray
    sources: list[str | None]
    trusted: list[bool]
    #: per passage: the sources holding its text, with the documents of each that hold it
    #: (:func:`~ragdefense.defenses.voices.holders`)
    held: list[dict[str, frozenset[str | None]]]
    removed: dict[int, str] = field(default_factory=dict)
    estimates: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def topical(self) -> list[int]:
        """The passages on the query's topic (:func:`~.pool.on_topic`), computed once."""
        return on_topic(self.qs)

    @cached_property
    def aside(self) -> dict[int, str]:
        """The passages support cannot judge, with why: about something else (less than half as
        similar to the query as the best one: a small store's other topics), or without a term
        (an image's node) for the others' words to support."""
        topical = set(self.topical)
        return {
            i: "another topic" if i not in topical else "no terms"
            for i, p in enumerate(self.items)
            if i not in topical or not tokenize(p.text)
        }

    def unpacked(self) -> tuple[np.ndarray, np.ndarray, list[bool], dict[int, str], dict[str, Any]]:
        """What most steps read: similarities, query similarities, trust, and the two results
        they add to (shared, not copied)."""
        return self.sim, self.qs, self.trusted, self.removed, self.estimates


def consensus_result(
    defense: str,
    query: str,
    items: list[Any],
    qs: np.ndarray,
    sources: list[str | None],
    trusted: list[bool],
    removed: dict[int, str],
    estimates: dict[str, Any],
    left_out: dict[int, int] | None = None,
) -> DefenseResult:
    """Consensus's verdicts: each passage kept or removed with why, its source and trust; a
    copy ``left_out`` (mapped to the copy standing for its text) is removed for that, and the
    one standing for it takes the rank of the set's first copy."""
    left_out = left_out or {}
    removed = removed | {i: COPY_REASON.format(stand) for i, stand in left_out.items()}
    note = estimates.get("note")
    apart = set(estimates.get("unsupported_apart", ()))
    zero = set(estimates.get("zero_vectors", ()))
    place = {i: i for i in range(len(items))}
    for copy, stand in left_out.items():
        place[stand] = min(place[stand], copy)
    kept_order = sorted((i for i in place if i not in removed), key=place.__getitem__)
    ranks = {i: r for r, i in enumerate(kept_order)}
    verdicts = []
    for i, passage in enumerate(items):
        kept = i not in removed
        src = f" (source {sources[i]!r}{', trusted' if trusted[i] else ''})" if sources[i] else ""
        if not kept:
            reason = f"removed: {removed[i]}"
        elif trusted[i]:
            reason = "kept: trusted"
        elif note:
            reason = f"kept: {note}"
        elif i in zero:
            reason = "kept: its embedding is the zero vector: no direction to judge it by"
        elif i in apart:
            reason = (
                "kept: ranked high by query similarity and low by the others' support, but it "
                "shares no subject with them (mean cosine below min_agreement), so their "
                "silence is no evidence against it"
            )
        else:
            reason = "kept: no evidence of a coordinated attack"
        verdicts.append(
            Verdict(
                index=i,
                passage=passage,
                kept=kept,
                score=float(qs[i]),
                reason=reason + src,
                rank=ranks.get(i),
                details={"trusted": float(trusted[i]), "copy": float(i in left_out)},
            )
        )
    return DefenseResult(
        defense=defense,
        query=query,
        verdicts=tuple(verdicts),
        score_name="query_sim",
        estimates=estimates,
    )


def apart_from(sim: np.ndarray, i: int, left: list[int], bar: float) -> bool:
    """Whether passage ``i`` shares no subject with the other passages in ``left`` (mean cosine
    to them below ``bar``): their silence about it is then no evidence against it."""
    others = [j for j in left if j != i]
    return float(sim[i, others].mean()) < bar
