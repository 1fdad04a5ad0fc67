"""Probe questions derived from the knowledge base itself, with no LLM: each chunk's title, else
its first sentence (what a user asking about that chunk's topic would roughly type). Planted
poison is written to be retrieved for a question, so the questions a knowledge base is about
are where it shows."""

from __future__ import annotations

import hashlib
import heapq
import re
from collections.abc import Iterable

__all__ = ["derive_probes", "probe_text"]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"\S+")
MAX_WORDS = 32
MIN_WORDS = 3


def probe_text(text: str, title: str = "") -> str | None:
    """The probe for one chunk: its title, else (no title, or one of fewer than 3 words, such as
    a name) its first sentence, at most 32 words; ``None`` when that leaves fewer than 3."""
    for source in (title.strip(), _SENTENCE_END.split(text.strip(), maxsplit=1)[0]):
        words = _WORD.findall(source)
        if len(words) >= MIN_WORDS:
            return " ".join(words[:MAX_WORDS])
    return None


def derive_probes(
    chunks: Iterable[tuple[str, str, str]], max_probes: int | None = None, seed: int = 0
) -> list[tuple[str, str]]:
    """``(probe, chunk id)`` for ``(id, text, title)`` chunks: one probe per distinct
    title / first sentence (case and spacing ignored; the first chunk that has it), in corpus
    order; at most ``max_probes``, a seeded sample when there are more. The sample keeps the
    ``max_probes`` distinct probes of least seeded hash, so memory holds those alone, never
    one entry per chunk."""
    if max_probes is None:
        seen: set[str] = set()
        out: list[tuple[str, str]] = []
        for chunk_id, text, title in chunks:
            probe = probe_text(text, title)
            if probe is not None and probe.casefold() not in seen:
                seen.add(probe.casefold())
                out.append((probe, chunk_id))
        return out
    salt = seed.to_bytes(8, "little", signed=True)
    kept: dict[str, tuple[int, str, str]] = {}  # key -> (position, probe, chunk id)
    heap: list[tuple[int, str]] = []  # (-rank, key): the largest kept rank on top
    for position, (chunk_id, text, title) in enumerate(chunks):
        probe = probe_text(text, title)
        if probe is None:
            continue
        key = probe.casefold()
        if key in kept:
            continue  # a later chunk of a probe already kept
        digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8, salt=salt).digest()
        rank = int.from_bytes(digest, "little")
        if len(heap) < max_probes:
            heapq.heappush(heap, (-rank, key))
        elif rank < -heap[0][0]:  # ranks above the kept ones never come back: one decision
            del kept[heapq.heapreplace(heap, (-rank, key))[1]]
        else:
            continue
        kept[key] = (position, probe, chunk_id)
    return [(probe, chunk_id) for _, probe, chunk_id in sorted(kept.values())]
