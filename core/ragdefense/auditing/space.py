"""Stored vectors the audit can use: finite, with a direction (:func:`check_stored`), and in the
space of the model the audit embeds its probes with (:func:`check_space`): a store embedded by
another model of the same width gives vectors the audit would compare with its probes silently
(no planted passage found, no word said)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ..similarity import unit_rows

__all__ = [
    "SAMPLE",
    "check_space",
    "check_spread",
    "check_stored",
    "one_width",
    "other_width",
    "stored_rows",
]

#: chunks embedded again to compare with their stored vectors
SAMPLE = 8


def check_space(batch: Any, embedder: Any) -> str | None:
    """Warn where ``embedder`` does not reproduce a batch's stored vectors from its texts (a
    sample of the first distinct non-blank ones): a stored vector should be nearer its own
    text embedded again than the sample's other texts, as it is under one model (also where
    the store embedded metadata with the text), and is for about one text in the sample under
    another. A warning, not an error: vectors made on purpose (synthetic, or of texts the
    chunks do not hold) may be audited too: the warning is returned (for the report to say it
    on every run, a resumed one too), ``None`` where the vectors look like the embedder's."""
    texts, vectors = batch.texts, batch.vectors
    first: dict[str, int] = {}  # distinct texts: a copy's vector is as near as its own
    for i, text in enumerate(texts):
        if len(first) == SAMPLE:
            break
        if text.strip():
            first.setdefault(text, i)
    if not len(texts):
        return None
    picked = list(first.values()) or [0]  # one text at least: the width is checked anyway
    stored = unit_rows(np.asarray(vectors, dtype=np.float64)[picked])
    again = unit_rows(np.asarray(embedder.embed([texts[i] for i in picked]), dtype=np.float64))
    if again.shape != stored.shape:  # named before anything is written, not after a read
        raise other_width(stored.shape[1], again.shape[1])
    if len(picked) < 3:  # too few to tell a match from chance
        return None
    own = int((np.argmax(stored @ again.T, axis=1) == np.arange(len(picked))).sum())
    if 2 * own >= len(picked):
        return None
    said = (
        f"the stored vectors do not look like the audit's embedding model's: of {len(picked)} "
        f"chunks embedded again, {own} are nearest their own stored vector, and the probes "
        "are compared with them: pass embedder= (--embedder), the model the knowledge base "
        "was embedded with"
    )
    warnings.warn(said, UserWarning, stacklevel=5)
    return said


def check_spread(rows: np.ndarray, texts: Sequence[str]) -> np.ndarray:
    """``rows`` (unit vectors of ``texts``), refused where three or more distinct texts all got
    one vector: a broken embedding model (a stub, a constant), under which every chunk is every
    other's neighbour and the audit would report nothing, a clean knowledge base in its eyes."""
    distinct = {t for t in texts if t.strip()}
    spread = rows[[n for n, t in enumerate(texts) if t.strip()]]
    if len(distinct) >= 3 and len(spread) and np.ptp(spread, axis=0).max() < 1e-6:
        raise ValueError(
            f"the embedding model gave one vector to {len(distinct)} different texts: it "
            "cannot tell them apart (a stub or a broken model?); give the model the knowledge "
            "base was embedded with"
        )
    return rows


def other_width(stored: int, embedded: int) -> ValueError:
    """The error for stored vectors of ``stored`` dimensions where the audit's embedder gives
    ``embedded``: the model the knowledge base was embedded with is another."""
    return ValueError(
        f"the stored vectors have {stored} dimensions, the embedder's {embedded}: pass "
        "embedder= (--embedder), the model the knowledge base was embedded with"
    )


#: a stored vector of another width than the first's (a chunk id, its width, the first's)
_WIDTHS = (
    "chunk {!r}: its stored vector has {} numbers, the first chunk's {}: the store holds vectors "
    "of two models? embed it again, or audit the texts (no vectors)"
)


def stored_rows(ids: Sequence[str], vectors: Any) -> np.ndarray:
    """A batch's stored ``vectors`` as float32 rows, or a ``ValueError`` naming the first chunk
    whose vector is not a row of the first's width (a store holding two models' vectors)."""
    if isinstance(vectors, np.ndarray) and vectors.ndim == 2 and vectors.shape[1]:
        with np.errstate(over="ignore"):  # rows of one width already (a file, a batch checked)
            return vectors.astype(np.float32, copy=False)
    widths = [int(np.size(v)) if np.ndim(v) == 1 else 0 for v in vectors]
    if not widths:
        return np.zeros((0, 0), dtype=np.float32)
    missing = next((i for i, w in enumerate(widths) if not w), None)
    if missing is not None:  # a None, a number, a matrix: no row of numbers
        raise ValueError(
            f"chunk {ids[missing]!r}: its stored vector is not a row of numbers (got "
            f"{type(vectors[missing]).__name__}): give every chunk one, or none (the texts)"
        )
    bad = next((i for i, w in enumerate(widths) if w != widths[0]), None)
    if bad is not None:
        raise ValueError(_WIDTHS.format(ids[bad], widths[bad], widths[0]))
    with np.errstate(over="ignore"):  # beyond float32's range: refused by check_stored
        rows: np.ndarray = np.asarray(vectors, dtype=np.float32).reshape(len(widths), -1)
    return rows


def one_width(batches: Iterable[Any]) -> Iterator[Any]:
    """``batches``, refused at the first whose stored vectors are of another width than the
    first such batch's (found here, not when the search joins the parts)."""
    width = 0
    for batch in batches:
        if batch.vectors is not None and len(batch.ids):
            width = width or int(np.shape(batch.vectors)[1])
            if np.shape(batch.vectors)[1] != width:
                raise ValueError(_WIDTHS.format(batch.ids[0], np.shape(batch.vectors)[1], width))
        yield batch


def check_stored(ids: Sequence[str], vectors: Any, texts: Sequence[str]) -> None:
    """Refuse stored vectors the search cannot use, naming the first such chunk: not rows of
    one width (:func:`stored_rows`), not finite (NaN, infinite, or beyond float32's range once
    stored as float32), or all zeros (no direction: near nothing, so never flagged; an
    embedding that failed) but for a blank text's, whose vector the audit zeroes anyway."""
    stored = stored_rows(ids, vectors)
    finite = np.isfinite(stored).all(axis=-1)
    if not finite.all():
        raise ValueError(
            f"chunk {ids[int(np.argmin(finite))]!r}: its stored vector is not finite (NaN, "
            "infinite, or beyond float32's range): embed it again, or audit the texts (no vectors)"
        )
    zero = ~stored.any(axis=-1) & np.array([bool(t.strip()) for t in texts], dtype=bool)
    if zero.any():
        raise ValueError(
            f"chunk {ids[int(np.argmax(zero))]!r}: its stored vector is all zeros (an embedding "
            "that failed?): embed it again, or audit the texts (no vectors)"
        )
