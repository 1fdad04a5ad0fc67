"""Whether a knowledge base's stored vectors are in the space of the model the audit embeds its
probes with: a store embedded by another model of the same width gives vectors the audit would
compare with its probes silently (no planted passage found, no word said)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["SAME_SPACE", "SAMPLE", "check_space"]

#: chunks embedded again to compare with their stored vectors
SAMPLE = 8
#: the least median cosine between a chunk's stored vector and its text embedded again: one
#: model gives about 1 (less where the store embedded metadata with the text), two models of
#: one width give unrelated directions
SAME_SPACE = 0.5


def check_space(texts: Sequence[str], vectors: Any, embedder: Any) -> None:
    """Warn where ``embedder`` does not reproduce stored ``vectors`` from their ``texts`` (a
    sample of the first non-blank ones): a warning, not an error, as vectors made on purpose
    (synthetic, or of texts the chunks do not hold) may be audited too."""
    picked = [i for i, t in enumerate(texts) if t.strip()][:SAMPLE]
    if not picked:
        return
    stored = np.asarray(vectors, dtype=np.float64)[picked]
    again = np.asarray(embedder.embed([texts[i] for i in picked]), dtype=np.float64)
    if again.shape != stored.shape:
        return  # another width: the search names it
    norms = np.linalg.norm(stored, axis=1) * np.linalg.norm(again, axis=1)
    cosines = np.sum(stored * again, axis=1) / np.where(norms > 0, norms, 1.0)
    median = float(np.median(cosines))
    if median < SAME_SPACE:
        warnings.warn(
            f"the stored vectors do not look like the audit's embedding model's: {len(picked)} "
            f"chunks embedded again agree with their stored vectors at a median cosine of "
            f"{median:.2f} (< {SAME_SPACE}), and the probes are compared with them: pass "
            "embedder=, the model the knowledge base was embedded with",
            UserWarning,
            stacklevel=5,
        )
