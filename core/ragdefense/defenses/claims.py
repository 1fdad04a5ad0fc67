"""Evidence from provenance: a claim repeated by one source, or a few, on nearly every one of
their documents, that no other source on the query's topic makes (Consensus's step 2b).

A planted answer has to be stated to work, so a campaign states it again and again: on every
page an attacker's site posts for the question, whatever the wording around it. Honest sources
that never mention it, and outnumber the sources that do, are the evidence. The unit is the
*document* (a page of a site, a file), never the chunk: a long document repeats its own subject
in every chunk, and that is no campaign. A term counts as stated only in a sentence that also
uses the query's words (an answer is stated about the question's subject; a byline, a dateline
or another language's function words are not), and a site's own name is never its claim.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ..text import split_sentences, tokenize
from .pool import Pool

__all__ = ["claim_terms", "repeated_claims", "stated_terms"]

_PLURAL = re.compile(r"(?<=[^s])s$")
_PARTS = re.compile(r"[^\W_]+")
#: a number with a decimal point or separators (its unit, glued on or not, is a word of its own)
_NUMBER = re.compile(r"(?<![\d.,])\d+(?:[.,]\d+)+")
#: thousands separated by commas: 15,691 is 15691 (a decimal comma, 3,5, is left as written)
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def claim_terms(text: str) -> set[str]:
    """The content words of ``text`` that can carry a claim: lower-cased tokens without stop
    words, a plural folded onto its singular (``butterflies``/``butterfly``), so that one
    answer written two ways is one term. A number with a decimal point or separators is one
    term (the tokenizer alone reads ``3.28084`` and ``5.28084`` as the same ``28084``), its
    unit another; thousands separated by commas are dropped (``15,691`` is ``15691``).

    Examples:
        >>> sorted(claim_terms("Butterflies fake death; a butterfly in 2023."))
        ['2023', 'butterfly', 'death', 'fake']
        >>> sorted(claim_terms("A meter is 3.28084ft, not 5.28084 ft; 1,200 mg."))
        ['1200', '3.28084', '5.28084', 'ft', 'meter', 'mg']
    """
    numbers = {_number(n) for n in _NUMBER.findall(text)}  # 3.28084 and 5.28084 are two answers
    return numbers | {_fold(t) for t in tokenize(_NUMBER.sub(" ", text))}


def _number(written: str) -> str:
    return written.replace(",", "") if _THOUSANDS.fullmatch(written) else written


def _fold(token: str) -> str:
    """:func:`_singular`, kept for words (not for long tokens: a corpus can hold any)."""
    return (_singular if len(token) <= 64 else _singular.__wrapped__)(token)


@lru_cache(maxsize=65536)
def _singular(token: str) -> str:
    if len(token) > 4 and token.endswith("ies"):
        return token[:-3] + "y"
    return _PLURAL.sub("", token) if len(token) > 3 else token


def stated_terms(text: str, asked: set[str]) -> set[str]:
    """The :func:`claim_terms` of the sentences of ``text`` that use a word of the query
    (``asked``), the query's own words left out."""
    return _read(text, asked)[1]


def _read(text: str, asked: set[str]) -> tuple[set[str], set[str]]:
    """The terms ``text`` mentions and those it states (:func:`stated_terms`), the query's
    left out, in one pass over its sentences (a sentence break is white space, so the
    sentences' terms are the text's)."""
    mentioned: set[str] = set()
    stated: set[str] = set()
    for sentence in split_sentences(text) or [text]:
        terms = claim_terms(sentence)
        mentioned |= terms
        if terms & asked:
            stated |= terms
    return mentioned - asked, stated - asked


#: fewest sources on the query's topic that never mention a term for it to be a lone claim:
#: two sources that happen not to use a word a third uses on every page say little
MIN_SILENT = 3


def repeated_claims(pool: Pool, query: str, min_documents: int = 3) -> None:
    """Mark the passages of the sources that repeat a claim alone.

    A term is a repeated claim when every source on the query's topic that mentions it states
    it (:func:`stated_terms`) in all of its documents but one, in two or more of them, in
    ``min_documents`` or more in all; when the sources that never mention it number
    :data:`MIN_SILENT` or more, and more than those that do; when no trusted passage on the
    query's topic mentions it; and when it is not part of a speaking source's own name. The
    judged sources' passages on the query's topic go (a source is one voice), and their other
    passages stating the claim; never a trusted passage, nor a text that a source not judged
    holds too.
    """
    _, _, trusted, removed, estimates = pool.unpacked()
    asked = claim_terms(query)
    topical = pool.topical
    own: dict[str, list[int]] = {}
    for i in topical:
        for s in pool.held[i]:  # a text copied onto several sites is each one's
            own.setdefault(s, []).append(i)
    if len(own) < MIN_SILENT + 1 or not asked:
        return
    read = {i: _read(pool.items[i].text, asked) for i in topical}
    mentioned = {i: terms for i, (terms, _) in read.items()}
    stated = {i: terms for i, (_, terms) in read.items()}
    untrustworthy = set().union(*(mentioned[i] for i in topical if trusted[i]))
    documents = {s: set().union(*(pool.held[i][s] for i in idx)) for s, idx in own.items()}
    # per term: the sources mentioning it, with the documents of each that state it
    saying: dict[str, dict[str, set[str | None]]] = {}
    for s, idx in own.items():
        for i in idx:
            for t in mentioned[i]:
                saying.setdefault(t, {}).setdefault(s, set())
            for t in stated[i]:
                saying[t][s].update(pool.held[i][s])
    names = {s: _name_parts(s) for s in own}
    found: dict[str, list[str]] = {}
    for term in sorted(set(saying) - untrustworthy):
        by = saying[term]
        silent = len(own) - len(by)
        if sum(len(d) for d in by.values()) < min_documents or silent < max(
            MIN_SILENT, len(by) + 1
        ):
            continue
        if any(len(d) < max(2, len(documents[s]) - 1) for s, d in by.items()):
            continue  # a source stating it on one page, or not on nearly all of its pages
        if any(term in names[s] for s in by):
            continue  # a site naming itself (a dateline, a byline) states nothing
        for s in by:
            found.setdefault(s, []).append(term)
    for s, claimed in found.items():
        for i, held in enumerate(pool.held):
            if s not in held or i in removed or trusted[i] or set(held) - set(found):
                continue  # another source, already gone, trusted, or also held by a voice
            if i in stated or stated_terms(pool.items[i].text, asked) & set(claimed):
                first, written = claimed[0], _written(pool.items[i].text, claimed)
                removed[i] = (
                    f"repeats a claim alone: source {s!r} states {_listed(written)} on "
                    f"{len(saying[first][s])} of its {len(documents[s])} documents on the "
                    f"query's topic, which {len(own) - len(saying[first])} other sources "
                    "never mention"
                )
    if found:
        estimates["claims"] = found


def _name_parts(source: str) -> set[str]:
    """The words of a source's name (``reuters.com``: ``reuter``, ``com``)."""
    return {_fold(p) for p in _PARTS.findall(source.lower())}


def _written(text: str, terms: list[str]) -> list[str]:
    """``terms`` as ``text`` writes them, lower-cased (``marxopolis``, not the folded
    ``marxopoli``), where it does."""
    spelled = {_fold(t): t for t in reversed(tokenize(text))}  # the first spelling
    return [spelled.get(t, t) for t in terms]


def _listed(terms: list[str], most: int = 3) -> str:
    shown = ", ".join(repr(t) for t in terms[:most])
    return shown + (f" and {len(terms) - most} more terms" if len(terms) > most else "")
