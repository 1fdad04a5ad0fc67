"""Evidence from the words, without provenance: several passages quoting the query word for word
(Consensus's step 1b).

PoisonedRAG's black-box passages open with the question they target (``question + ". " +
text``, or hold it in a template): the quote is what makes a retriever rank them first, whatever
the retriever. Honest documents seldom hold a user's whole question word for word, and almost
never several different ones; three or more that do were written for it. The match is exact up
to case, punctuation and spacing: where the user words the question otherwise than the planted
passages, nothing is quoted and the other steps decide. Only a question of ``MIN_WORDS`` words or
more counts (honest passages hold a short phrase as a matter of course), copies of one text count
once, and so do passages sharing the words around the quote (overlapping chunks of one document:
a FAQ's question and its answer, cut twice).
"""

from __future__ import annotations

import re

from .pool import Pool

__all__ = ["MIN_WORDS", "quoting"]

#: fewest words a query needs for its quote to count
MIN_WORDS = 6
#: fewest distinct passages quoting the query that are evidence
QUOTES = 3
#: words on each side of a quote compared to tell two chunks of one text apart
_AROUND = 4
_WORD = re.compile(r"\w+")


def quoting(pool: Pool, query: str) -> None:
    """Remove the passages quoting ``query`` where :data:`QUOTES` or more distinct texts do and
    none of them is trusted (a trusted passage quoting it shows that honest ones do here)."""
    asked = _words(query)
    if len(asked) < MIN_WORDS:
        return
    found: list[int] = []
    contexts: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    for i, passage in enumerate(pool.items):
        around = _around(_words(passage.text), asked)
        if around is not None:
            found.append(i)
            contexts.append(around)
    if any(pool.trusted[i] for i in found) or _texts(contexts) < QUOTES:
        return
    removed = pool.removed
    for i in found:
        removed.setdefault(
            i,
            f"quotes the query word for word, as {len(found)} passages do (honest documents "
            "seldom hold a user's whole question: passages written for it)",
        )
    pool.estimates["quoting"] = found


def _words(text: str) -> list[str]:
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
    or after them, are one text cut into overlapping chunks."""
    seen: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    for before, after in contexts:
        same = any(
            (len(before) == _AROUND and before == b) or (len(after) == _AROUND and after == a)
            for b, a in seen
        )
        if not same:
            seen.append((before, after))
    return len(seen)
