"""Evidence from provenance: a claim repeated by one source, or a few, on nearly every one of
their documents, that no other source on the query's topic makes (Consensus's step 2b).

A planted answer has to be stated to work, so a campaign states it again and again: on every
page an attacker's site posts for the question, whatever the wording around it. Honest sources
that never mention it, and outnumber the sources that do, are the evidence; with ``trusted=``,
a trusted source that never mentions it, where a site says it on most of its pages, is (the
trusted side wins a conflict, as everywhere in Consensus). The unit is the
*document* (a page of a site, a file), never the chunk: a long document repeats its own subject
in every chunk, and that is no campaign. A term counts as stated only in a sentence that also
uses the query's words (an answer is stated about the question's subject; a byline, a dateline
or another language's function words are not), and a site's own name is never its claim.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..text import split_sentences, tokenize
from .pool import Pool

__all__ = ["claim_terms", "repeated_claims", "stated_terms", "without_boilerplate"]

_PLURAL = re.compile(r"(?<=[^s])s$")
_PARTS = re.compile(r"[^\W_]+")
_NUMBER = re.compile(r"(?<![\w.,])\d+(?:[.,]\d+)+(?![\w]|[.,]\d)")


def claim_terms(text: str) -> set[str]:
    """The content words of ``text`` that can carry a claim: lower-cased tokens without stop
    words, a plural folded onto its singular (``butterflies``/``butterfly``), so that one
    answer written two ways is one term; a number with a decimal point or thousands separator
    is one term (two answers that differ before the point stay two; ``15,691`` is ``15691``).

    Examples:
        >>> sorted(claim_terms("Butterflies fake death; a butterfly in 2023."))
        ['2023', 'butterfly', 'death', 'fake']
        >>> sorted(claim_terms("A meter is 3.28084 feet, not 5.28084."))
        ['3.28084', '5.28084', 'feet', 'meter']
    """
    # 3.28084 and 5.28084 are two answers, not 28084; 15,691 is 15691
    numbers = {n.replace(",", "") for n in _NUMBER.findall(text)}
    return numbers | {_singular(t) for t in tokenize(_NUMBER.sub(" ", text))}


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
    :data:`MIN_SILENT` or more, and more than those that do; when no trusted passage mentions
    it; and when it is not part of a speaking source's own name. Where a source holding a
    trusted passage on the topic is among the silent ones, trust wins a tie: the silent sources
    need only be as many as those stating it, and a statement counts only outside the words
    all of a source's texts begin and end with (:func:`without_boilerplate`: with one witness
    against one site, a site's header or footer would otherwise be its claim). The judged
    sources' passages on the query's topic go (a source is one voice), and their other
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
    # sources holding a trusted passage on the topic: where one is silent, trust wins a tie
    vouched = {s for s, idx in own.items() if any(trusted[i] for i in idx)}
    if len(own) < (2 if vouched else MIN_SILENT + 1) or not asked:
        return
    read = {i: _read(pool.items[i].text, asked) for i in topical}
    mentioned = {i: terms for i, (terms, _) in read.items()}
    stated = {i: terms for i, (_, terms) in read.items()}
    untrustworthy = set().union(*(mentioned[i] for i in topical if trusted[i]))
    documents = {s: set().union(*(pool.held[i][s] for i in idx)) for s, idx in own.items()}
    saying = _saying(pool, own, mentioned, lambda at: stated[at[1]])
    bare: dict[str, dict[str, set[str | None]]] = {}  # read on first need: few terms get there

    def repeated(by: dict[str, set[str | None]]) -> bool:
        """Stated by every source mentioning it on all of its documents but one, two or more,
        in ``min_documents`` or more in all."""
        return sum(len(d) for d in by.values()) >= min_documents and all(
            len(d) >= max(2, len(documents[s]) - 1) for s, d in by.items()
        )

    names = {s: _name_parts(s) for s in own}
    found: dict[str, list[str]] = {}
    against_trust: set[str] = set()  # terms judged on a trusted source's silence
    for term in sorted(set(saying) - untrustworthy):
        by = saying[term]
        silent = len(own) - len(by)
        if silent >= max(MIN_SILENT, len(by) + 1) and repeated(by):
            pass
        elif vouched - set(by) and silent >= len(by) and repeated(by):
            if not bare:  # what a page states without its boilerplate is part of what it states
                bare = _saying(pool, own, mentioned, _bare(pool, own, stated, asked).__getitem__)
            if not repeated(bare[term]):
                continue
            against_trust.add(term)
        else:
            continue
        if any(term in names[s] for s in by):
            continue  # a site naming itself (a dateline, a byline) states nothing
        for s in by:
            found.setdefault(s, []).append(term)
    for s, claimed in found.items():
        for i, held in enumerate(pool.held):
            if s not in held or i in removed or trusted[i] or set(held) - set(found):
                continue  # another source, already gone, trusted, or also held by a voice
            if i in stated or stated_terms(pool.items[i].text, asked) & set(claimed):
                first = claimed[0]
                told, trust = (bare, ", trusted ones among them")
                if first not in against_trust:
                    told, trust = saying, ""
                removed[i] = (
                    f"repeats a claim alone: source {s!r} states {_listed(claimed)} on "
                    f"{len(told[first][s])} of its {len(documents[s])} documents on the "
                    f"query's topic, which {len(own) - len(told[first])} other sources "
                    f"never mention{trust}"
                )
    if found:
        estimates["claims"] = found


def _saying(
    pool: Pool,
    own: dict[str, list[int]],
    mentioned: dict[int, set[str]],
    stated: Callable[[tuple[str, int]], set[str]],
) -> dict[str, dict[str, set[str | None]]]:
    """Per term: the sources mentioning it, each with its documents that state it (``stated``:
    the terms source ``s``'s passage ``i`` states, given ``(s, i)``)."""
    out: dict[str, dict[str, set[str | None]]] = {}
    for s, idx in own.items():
        for i in idx:
            for t in mentioned[i]:
                out.setdefault(t, {}).setdefault(s, set())
            for t in stated((s, i)):
                out[t][s].update(pool.held[i][s])
    return out


def _bare(
    pool: Pool, own: dict[str, list[int]], stated: dict[int, set[str]], asked: set[str]
) -> dict[tuple[str, int], set[str]]:
    """Per source and passage: the terms it states outside its source's boilerplate."""
    out: dict[tuple[str, int], set[str]] = {}
    for s, idx in own.items():
        texts = without_boilerplate([pool.items[i].text for i in idx])
        for i, text in zip(idx, texts, strict=True):
            out[s, i] = stated[i] if text is None else _read(text, asked)[1]
    return out


def without_boilerplate(texts: list[str]) -> list[str | None]:
    """``texts`` (one source's) without the words all of the distinct ones begin with and end
    with: a site's header, its section title, its footer, said on every page and so on every
    planted one too, is not what a page states. ``None`` for a text left as it is (a source
    with one distinct text has no boilerplate to tell).

    Examples:
        >>> without_boilerplate(["Wiki, Time off: use the calendar.", "Wiki, Time off: ask."])
        ['use the calendar.', 'ask.']
    """
    words = [t.split() for t in texts]
    if len({tuple(w) for w in words}) < 2:
        return [None] * len(texts)
    shortest = min(len(w) for w in words)
    head = 0
    while head < shortest and len({w[head] for w in words}) == 1:
        head += 1
    tail = 0
    while head + tail < shortest and len({w[-1 - tail] for w in words}) == 1:
        tail += 1
    if head == tail == 0:
        return [None] * len(texts)
    return [" ".join(w[head : len(w) - tail]) for w in words]


def _name_parts(source: str) -> set[str]:
    """The words of a source's name (``reuters.com``: ``reuter``, ``com``)."""
    return {_singular(p) for p in _PARTS.findall(source.lower())}


def _listed(terms: list[str], most: int = 3) -> str:
    shown = ", ".join(repr(t) for t in terms[:most])
    return shown + (f" and {len(terms) - most} more terms" if len(terms) > most else "")
