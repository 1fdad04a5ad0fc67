"""Evidence from provenance: a claim repeated by one source, or a few, on nearly every one of
their documents, that no other source on the query's topic makes (Consensus's step 2b).

A planted answer has to be stated to work, so a campaign states it again and again: on every
page an attacker's site posts for the question, whatever the wording around it. Honest sources
that never state it, and outnumber the sources that do, are the evidence. The unit is the
*document* (a page of a site, a file), never the chunk: a long document repeats its own subject
in every chunk, and that is no campaign.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..text import tokenize
from .pool import Pool

__all__ = ["claim_terms", "repeated_claims"]

_PLURAL = re.compile(r"(?<=[^s])s$")


def claim_terms(text: str) -> set[str]:
    """The content words of ``text`` that can carry a claim: lower-cased tokens without stop
    words, a plural folded onto its singular (``butterflies``/``butterfly``), so that one
    answer written two ways is one term.

    Examples:
        >>> sorted(claim_terms("Butterflies fake death; a butterfly in 2023."))
        ['2023', 'butterfly', 'death', 'fake']
    """
    return {_singular(t) for t in tokenize(text)}


def _singular(token: str) -> str:
    if len(token) > 4 and token.endswith("ies"):
        return token[:-3] + "y"
    return _PLURAL.sub("", token) if len(token) > 3 else token


def repeated_claims(pool: Pool, query: str, min_documents: int = 3) -> None:
    """Mark the passages of the sources that repeat a claim alone.

    A term (:func:`claim_terms`, not the query's) is a repeated claim when every source on the
    query's topic that says it says it in all of its documents but one, in two or more of them,
    in ``min_documents`` or more in all; and the sources that never say it number two or more,
    and more than those that do. Sources holding a trusted passage are never judged. Every
    passage of a judged source on the query's topic goes (a source is one voice), and any other
    of its passages that says the claim.
    """
    _, _, trusted, removed, estimates = pool.unpacked()
    asked = claim_terms(query)
    topical = pool.topical
    own: dict[str, list[int]] = {}
    for i in topical:
        for s in pool.held[i]:  # a text copied onto several sites is each one's
            own.setdefault(s, []).append(i)
    if len(own) < 3:
        return  # a claim against one other source is a tie: nothing to count
    terms = {i: claim_terms(pool.items[i].text) - asked for i in topical}
    # per source: its documents, and the documents saying each term
    documents = {s: _documents(pool, s, idx) for s, idx in own.items()}
    saying: dict[str, dict[str, set[str | None]]] = {}
    for s, idx in own.items():
        for i in idx:
            for t in terms[i]:
                saying.setdefault(t, {}).setdefault(s, set()).update(pool.held[i][s])
    found: dict[str, list[str]] = {}
    for term in sorted(saying):
        by = saying[term]
        total = sum(len(d) for d in by.values())
        silent = len(own) - len(by)
        if total < min_documents or silent < max(2, len(by) + 1):
            continue
        if any(len(d) < max(2, len(documents[s]) - 1) for s, d in by.items()):
            continue  # a source saying it on one page, or not on nearly all of its pages
        if any(trusted[i] for s in by for i in own[s]):
            continue
        for s in by:
            found.setdefault(s, []).append(term)
    for s, claimed in found.items():
        # its passages on the topic, and those below the topic bar that still say the claim
        said = [i for i in range(len(pool.items)) if s in pool.held[i] and i not in removed]
        for i in said:
            if i in terms or claim_terms(pool.items[i].text) & set(claimed):
                removed[i] = (
                    f"repeats a claim alone: source {s!r} says {_listed(claimed)} on "
                    f"{_pages(saying, claimed[0], s)} of its {len(documents[s])} documents on "
                    f"the query's topic, which {len(own) - len(saying[claimed[0]])} other "
                    "sources never say"
                )
    if found:
        estimates["claims"] = {s: claimed for s, claimed in found.items()}


def _documents(pool: Pool, source: str, idx: Iterable[int]) -> set[str | None]:
    return set().union(*(pool.held[i][source] for i in idx))


def _pages(saying: dict[str, dict[str, set[str | None]]], term: str, source: str) -> int:
    return len(saying[term][source])


def _listed(terms: list[str], most: int = 3) -> str:
    shown = ", ".join(repr(t) for t in terms[:most])
    return shown + (f" and {len(terms) - most} more terms" if len(terms) > most else "")
