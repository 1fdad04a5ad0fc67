"""Evidence from the words: several documents quoting the user's question word for word
(Consensus's step 1b).

PoisonedRAG's black-box passages open with the question they target (``question + ". " +
text``, or hold it in a template): the quote is what makes a retriever rank them first, whatever
the retriever. Honest documents seldom hold a user's whole question, and seldom several
independent ones; three or more that do were written for it. The match is exact up to case,
accents, punctuation, spacing and invisible characters: where the user words the question
otherwise than the planted passages, nothing is quoted and the other steps decide.

What keeps honest passages out of it: only a question counts (it ends with ``?`` or opens with a
question word, and has :data:`MIN_WORDS` words or more: a name, a title or an error message is
quoted by honest passages as a matter of course); documents count, not chunks (with provenance,
:func:`~ragdefense.provenance.document_of`; without it, copies of one text count once, and so do
passages sharing the words around the quote, one document cut into overlapping chunks); a
trusted passage quoting it, or every passage on the topic quoting it, shows that honest passages
do here. What it cannot tell: a help centre whose answer page, index and related-articles boxes
all hold the question (three documents), asked in those words, loses them
(``Consensus(quotes=False)``).
"""

from __future__ import annotations

import re
import unicodedata

from .pool import Pool

__all__ = ["MIN_WORDS", "QUOTES", "quoting"]

#: fewest words (separated by spaces) a question needs for its quote to count
MIN_WORDS = 6
#: fewest quoting documents (texts, without provenance) that are evidence
QUOTES = 3
#: words on each side of a quote compared to tell two chunks of one text apart
_AROUND = 4
_WORD = re.compile(r"\w+")
#: the words a question opens with (one that does not end with "?")
_ASKING = frozenset(
    {
        "who", "whom", "whose", "what", "which", "when", "where", "why", "how", "is", "are",
        "was", "were", "am", "do", "does", "did", "can", "could", "should", "would", "will",
        "shall", "may", "might", "must", "has", "have", "had",
    }
)  # fmt: skip


def quoting(pool: Pool, query: str) -> None:
    """Remove the passages quoting ``query`` where :data:`QUOTES` or more documents do, none of
    them trusted, and some passage on the query's topic does not."""
    asked = _words(query)
    if not _question(query, asked):
        return
    found, contexts = [], []
    for i, passage in enumerate(pool.items):
        around = _around(_words(passage.text), asked)
        if around is not None:
            found.append(i)
            contexts.append(around)
    if any(pool.trusted[i] for i in found) or set(pool.topical) <= set(found):
        return
    documents = {(s, d) for i in found for s, docs in pool.held[i].items() for d in docs}
    unsourced = [c for i, c in zip(found, contexts, strict=True) if not pool.held[i]]
    independent = len(documents) + _texts(unsourced)
    if independent < QUOTES:
        return
    for i in found:
        pool.removed.setdefault(
            i,
            f"quotes the question word for word, as {independent} documents do (texts, "
            "without provenance): honest documents seldom hold a user's whole question",
        )
    pool.estimates["quoting"] = found


def _question(query: str, asked: list[str]) -> bool:
    """Whether ``query`` is a question of :data:`MIN_WORDS` words or more."""
    if len(query.split()) < MIN_WORDS or not asked:
        return False
    return query.rstrip().endswith("?") or asked[0] in _ASKING


def _words(text: str) -> list[str]:
    """The words of ``text`` without case, accents or invisible characters (what a reader of
    the passage does not see either)."""
    if not text.isascii():
        text = "".join(
            ch
            for ch in unicodedata.normalize("NFKD", text)
            if not unicodedata.combining(ch) and unicodedata.category(ch) != "Cf"
        )
    return _WORD.findall(text.casefold())


def _around(words: list[str], asked: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The words before and after the first quote of ``asked`` in ``words`` (``None``: none)."""
    n = len(asked)
    first = asked[0]
    for start in (i for i, w in enumerate(words) if w == first):
        if words[start : start + n] == asked:
            before = tuple(words[max(0, start - _AROUND) : start])
            return before, tuple(words[start + n : start + n + _AROUND])
    return None


def _texts(contexts: list[tuple[tuple[str, ...], tuple[str, ...]]]) -> int:
    """How many different texts quote: quotes with the same :data:`_AROUND` words before them,
    or after them, are one text cut into overlapping chunks (and so, in turn, is whatever
    shares those words with either)."""
    parent = list(range(len(contexts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[int, tuple[str, ...]], int] = {}
    for i, (before, after) in enumerate(contexts):
        for side, words in ((0, before), (1, after)):
            if len(words) == _AROUND:
                j = first.setdefault((side, words), i)
                parent[root(i)] = root(j)
    return len({root(i) for i in range(len(contexts))})
