"""Evidence from the words: several documents quoting the user's question word for word
(Consensus's step 1b).

PoisonedRAG's black-box passages open with the question they target (``question + ". " +
text``, or hold it in a template): the quote is what makes a retriever rank them first, whatever
the retriever. Honest documents seldom hold a user's whole question, and seldom several
independent ones; three or more that do were written for it. The match is exact up to case,
accents, punctuation, spacing and invisible characters: where the user words the question
otherwise than the planted passages, nothing is quoted and the other steps decide.

What keeps honest passages out of it: only a question counts (it ends with ``?``, or, without
it, opens with a question word, not "how to ...", and is no title; :data:`MIN_WORDS` words or
more: a name, a title or an error message is quoted by honest passages as a matter of course;
English question words only, so other languages' questions count only with ``?``); documents
count, not chunks: passages of one document (by provenance,
:func:`~ragdefense.provenance.document_of`, where two other sources speak on the topic, so that
the one-voice step can judge the document's source) are one,
and so are passages sharing the words around the quote (copies, one document cut into
overlapping chunks, one heading above several pages), so provenance never counts more than the
words do (one uploaded file quoting the question is one quote: the one-voice step judges it); a
trusted passage quoting it, or every passage on the topic quoting it, shows that honest passages
do here. What it cannot tell: honest documents that hold the question each in their own words
around it (a help centre's answer page, index and related-articles boxes; a Q&A site's or a
forum's pages on a popular question), asked in those words, go (``Consensus(quotes=False)``).
"""

from __future__ import annotations

import re
import unicodedata
from itertools import islice
from typing import Any

from .pool import Pool

__all__ = ["MIN_WORDS", "QUOTES", "quoting"]

#: fewest words a question needs for its quote to count (counted both between spaces and as
#: words: "U.S." is not two words, nor "?" one)
MIN_WORDS = 6
#: fewest quoting documents that are evidence (passages of one document, by provenance or by
#: the words around the quote, count once)
QUOTES = 3
#: words on each side of a quote compared to tell two chunks of one text apart
_AROUND = 4
_WORD = re.compile(r"\w+")
#: the words a question opens with (one that does not end with "?"); not "may" or "will",
#: which open names and dates as often ("May 2023 ...", "Will Smith ...")
_ASKING = frozenset(
    {
        "who", "whom", "whose", "what", "which", "when", "where", "why", "how", "is", "are",
        "was", "were", "do", "does", "did", "can", "could", "should", "would", "has", "have",
    }
)  # fmt: skip
#: the characters no reader sees: accents split off by NFKD, joiners, variation selectors
_UNSEEN = frozenset({"Mn", "Me", "Cf"})


def quoting(pool: Pool, query: str) -> None:
    """Remove the passages quoting ``query`` where :data:`QUOTES` or more documents do, none of
    them trusted, and some passage on the query's topic does not."""
    asked = _words(query)
    if not _question(query, asked):
        return
    quote = _quote(asked)
    found, contexts = [], []
    for i, passage in enumerate(pool.items):
        around = _around(_seen(passage.text), quote)
        if around is not None:
            found.append(i)
            contexts.append(around)
    if any(pool.trusted[i] for i in found) or set(pool.topical) <= set(found):
        return
    # provenance joins a source's passages only where the one-voice step can judge that source
    # (two other sources speak on the topic): a single-source knowledge base, or one source
    # against one, is read as text alone, as in every other step
    alive = [pool.held[i] for i in pool.topical if i not in pool.removed]

    def judged(source: str) -> bool:
        return len({t for held in alive if source not in held for t in held}) >= 2

    documents = [
        {(s, d) for s, docs in pool.held[i].items() if judged(s) for d in docs} for i in found
    ]
    independent = _documents(contexts, documents)
    if independent < QUOTES:
        return
    for i in found:
        pool.removed.setdefault(
            i,
            f"quotes the question word for word, as {independent} documents do (chunks of one "
            "document, or sharing the words around the quote, count once): honest documents "
            "seldom hold a user's whole question",
        )
    pool.estimates["quoting"] = found


def _question(query: str, asked: list[str]) -> bool:
    """Whether ``query`` is a question of :data:`MIN_WORDS` words or more: it ends with "?", or
    opens with a question word not followed by "to" ("how to ...") and is no title (most of its
    words capitalised: "Do Androids Dream of Electric Sheep")."""
    words = query.split()
    if min(len(words), len(asked)) < MIN_WORDS:
        return False
    if query.rstrip().endswith("?"):
        return True
    capitalised = sum(w[:1].isupper() for w in words)
    return asked[0] in _ASKING and asked[1] != "to" and 2 * capitalised <= len(words)


def _seen(text: str) -> str:
    """``text`` without case, accents or invisible characters (what a reader of the passage
    does not see either)."""
    if not text.isascii():
        text = unicodedata.normalize("NFKD", text)
        unseen = [ord(ch) for ch in set(text) if unicodedata.category(ch) in _UNSEEN]
        text = text.translate(dict.fromkeys(unseen)) if unseen else text
    return text.casefold()


def _words(text: str) -> list[str]:
    """The words of ``text`` as :func:`_seen` reads it."""
    return _WORD.findall(_seen(text))


def _quote(asked: list[str]) -> re.Pattern[str]:
    """A pattern matching the words ``asked`` in a row in a :func:`_seen` text: each a whole
    word (what :data:`_WORD` finds), anything but words between them."""
    return re.compile(r"(?<!\w)" + r"\W+".join(map(re.escape, asked)) + r"(?!\w)")


def _around(seen: str, quote: re.Pattern[str]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The :data:`_AROUND` words before and after the first quote in ``seen`` (``None``:
    none)."""
    match = quote.search(seen)
    if match is None:
        return None
    before = _WORD.findall(seen, 0, match.start())[-_AROUND:]
    after = [m.group() for m in islice(_WORD.finditer(seen, match.end()), _AROUND)]
    return tuple(before), tuple(after)


def _documents(
    contexts: list[tuple[tuple[str, ...], tuple[str, ...]]], documents: list[set[tuple[str, Any]]]
) -> int:
    """How many documents quote: passages of one document (by provenance) are one, and so are
    quotes with the same :data:`_AROUND` words before them, or after them (one text cut into
    overlapping chunks, or one heading above several pages), and, in turn, whatever shares
    either with them. Provenance only ever joins passages: it never counts more documents than
    the words do."""
    parent = list(range(len(contexts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[Any, ...], int] = {}
    for i, (before, after) in enumerate(contexts):
        keys: list[tuple[Any, ...]] = [("document", d) for d in documents[i]]
        keys += [(side, words) for side, words in (("before", before), ("after", after))
                 if len(words) == _AROUND]  # fmt: skip
        for key in keys:
            j = first.setdefault(key, i)
            parent[root(i)] = root(j)
    return len({root(i) for i in range(len(contexts))})
