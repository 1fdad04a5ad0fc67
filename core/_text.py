"""Small, fast text utilities shared by the defenses (tokenizer, summed TF-IDF)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import numpy as np
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

# scikit-learn's default token pattern: words of two or more word characters (Unicode-aware).
_TOKEN = re.compile(r"(?u)\b\w\w+\b")


def tokenize(text: str, stop_words: frozenset[str] = ENGLISH_STOP_WORDS) -> list[str]:
    """Lower-cased tokens of ``text`` without stop words (scikit-learn's tokenization)."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in stop_words]


def summed_tfidf(docs: Sequence[Sequence[str]]) -> tuple[list[str], np.ndarray]:
    """Vocabulary (sorted) and the TF-IDF of each term summed over the documents.

    Same numbers as ``TfidfVectorizer(stop_words="english").fit_transform(texts).sum(axis=0)``
    with its defaults (raw counts, smoothed idf ``ln((1+n)/(1+df)) + 1``, l2-normalised rows),
    without its per-call overhead.
    """
    counts = [Counter(d) for d in docs]
    vocab = sorted(set().union(*counts)) if counts else []
    if not vocab:
        return [], np.zeros(0)
    col = {t: j for j, t in enumerate(vocab)}
    tf = np.zeros((len(docs), len(vocab)))
    for i, c in enumerate(counts):
        for t, k in c.items():
            tf[i, col[t]] = k
    df = (tf > 0).sum(axis=0)
    idf = np.log((1 + len(docs)) / (1 + df)) + 1.0
    w = tf * idf
    norms = np.linalg.norm(w, axis=1, keepdims=True)
    w = np.divide(w, norms, out=np.zeros_like(w), where=norms > 0)
    return vocab, w.sum(axis=0)
