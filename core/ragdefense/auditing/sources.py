"""Provenance as audit evidence: each chunk's source (read with the per-query defenses' rules
when the audit ingests the knowledge base), and how suspicious the *other* chunks of its source
are on their own evidence. Planted passages arrive together, from the few sources an attacker
controls (an upload, a site): a source most of whose chunks look planted, far more than the
rest of the knowledge base, condemns the rest of its chunks, however they are worded."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..provenance import AUTO, metadata_source
from .corpus import Batch
from .workdir import Workdir, part_name

if TYPE_CHECKING:
    from .evidence import Evidence

__all__ = [
    "SOURCE_PRIOR",
    "SourceTally",
    "batch_sources",
    "chunk_source",
    "condemned_positions",
    "note_sourced",
    "read_sources",
    "source_reason",
    "source_tally",
    "support_of",
    "suspect_sources",
]


#: unseen chunks counted, as not suspicious, with every source's others (see
#: :class:`~ragdefense.auditing.evidence.Scoring`)
SOURCE_PRIOR = 2


@dataclass(frozen=True)
class SourceTally:
    """Per source number: its chunks, how many of them are suspicious on their own evidence,
    and the suspicious share of every chunk not from it, with a source or without (1 when
    there is none)."""

    size: np.ndarray
    bad: np.ndarray
    rest: np.ndarray

    def others(
        self, source: np.ndarray, suspicious: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For chunks of the sources ``source`` (numbers, or -1: none), each ``suspicious``
        on its own or not: the suspicious among the other chunks of its source, the number of
        those others, and its source's ``rest`` (0, 0 and 1 without a source)."""
        known = source >= 0
        at = np.where(known, source, 0)
        bad = np.where(known, self.bad[at] - suspicious, 0)
        others = np.where(known, self.size[at] - 1, 0)
        return bad, others, np.where(known, self.rest[at], 1.0)

    def support(self, source: np.ndarray, suspicious: np.ndarray) -> np.ndarray:
        """:func:`support_of` each chunk's source (0 without a source)."""
        out: np.ndarray = support_of(*self.others(source, suspicious))
        return out

    def condemned(self, threshold: float) -> np.ndarray:
        """Per source: whether one of its chunks is suspicious on the others' evidence alone
        (a chunk that is not suspicious on its own, where it has one)."""
        every = np.arange(len(self.size))
        found: np.ndarray = self.support(every, self.bad == self.size) >= threshold
        return found & (threshold > 0)


def source_tally(evidence: Evidence, suspicious: np.ndarray) -> SourceTally | None:
    """The :class:`SourceTally` of the knowledge base, ``suspicious`` per chunk position on its
    own evidence; ``None`` when no chunk has a source."""
    source = evidence.source
    if source is None:
        return None
    known = source >= 0
    size = np.bincount(source[known], minlength=len(evidence.source_names))
    bad = np.bincount(source[known], weights=suspicious[known], minlength=len(size))
    bad = bad.astype(np.int64)
    outside = len(source) - size
    n_bad = int(suspicious.sum())
    rest = np.divide(n_bad - bad, outside, out=np.ones(len(size)), where=outside > 0)
    return SourceTally(size, bad, rest)


def support_of(bad: Any, others: Any, rest: Any) -> Any:
    """How much more suspicious a chunk's source is than the rest of the knowledge base:
    ``share = bad / (others + SOURCE_PRIOR)`` (``bad`` of the source's ``others`` other chunks
    suspicious), chance-corrected by ``rest``, the suspicious share of the chunks not from
    that source: ``(share - rest) / (1 - rest)``, at least 0 (elementwise on arrays)."""
    share = np.asarray(bad) / (np.asarray(others) + SOURCE_PRIOR)
    rest = np.asarray(rest, dtype=np.float64)
    room = np.where(rest < 1, 1 - rest, 1.0)
    return np.where(rest < 1, np.maximum(share - rest, 0.0) / room, 0.0)


def note_sourced(wd: Workdir, sourced: bool, source_key: str | None) -> None:
    """Record whether any chunk has a source; warn where a ``source_key`` named gave none (a
    misspelled key would run the audit without provenance, silently)."""
    wd.note("sourced", sourced)
    if not sourced and source_key not in (None, AUTO):
        warnings.warn(
            f"source_key={source_key!r} gave no chunk a source: the audit runs without "
            "provenance; is the key misspelled?",
            UserWarning,
            stacklevel=3,
        )


def read_sources(wd: Workdir, chunk_parts: int) -> tuple[np.ndarray | None, list[str]]:
    """Per chunk position: its source as a number into the returned names (``-1``: none);
    ``(None, [])`` when no chunk has one. Reads the parts' small source files only."""
    if not wd.noted("sourced"):
        return None, []
    numbers: dict[str, int] = {}
    codes = []
    for part, size in enumerate(wd.noted("part_sizes")[:chunk_parts]):
        name = f"{part_name('chunks', part)}.sources.json"
        found = wd.read_json(name) if wd.has(name) else [""] * size
        part_codes = [numbers.setdefault(s, len(numbers)) if s else -1 for s in found]
        codes.append(np.asarray(part_codes, dtype=np.int64))
    return np.concatenate(codes), list(numbers)


def batch_sources(batch: Batch, source_key: str | None) -> list[str] | None:
    """Each chunk's source (``""``: none), or ``None`` when no chunk of the batch has one."""
    if batch.metadata is None or source_key is None:
        return None
    found = [metadata_source(m, source_key) or "" for m in batch.metadata]
    return found if any(found) else None


def chunk_source(
    evidence: Evidence, tally: SourceTally | None, own: np.ndarray, i: int
) -> tuple[str, int, int, float] | None:
    """Position ``i``'s source, the suspicious among the source's other chunks (on their own
    evidence), the number of those others, and the rest's suspicious share; ``None`` without
    a source."""
    if tally is None or evidence.source is None or evidence.source[i] < 0:
        return None
    bad, others, rest = tally.others(evidence.source[i : i + 1], own[i : i + 1])
    name = evidence.source_names[int(evidence.source[i])]
    return name, int(bad[0]), int(others[0]), float(rest[0])


def condemned_positions(
    evidence: Evidence, tally: SourceTally | None, threshold: float
) -> np.ndarray:
    """Per position: whether its source is condemned (:meth:`SourceTally.condemned`); no
    position is without sources."""
    if tally is None or evidence.source is None:
        return np.zeros(len(evidence.retrieved), dtype=bool)
    bad = tally.condemned(threshold)
    out: np.ndarray = (evidence.source >= 0) & bad[np.maximum(evidence.source, 0)]
    return out


def suspect_sources(
    evidence: Evidence, tally: SourceTally | None, suspicious: np.ndarray, threshold: float
) -> list[dict[str, Any]]:
    """The sources one of whose chunks is suspicious on the others' evidence alone, most
    chunks first: ``{source, chunks, suspicious, on_own_evidence}``."""
    if tally is None or evidence.source is None:
        return []
    known = evidence.source >= 0
    total = np.bincount(evidence.source[suspicious & known], minlength=len(tally.size))
    rows = [
        {
            "source": evidence.source_names[c],
            "chunks": int(tally.size[c]),
            "suspicious": int(total[c]),
            "on_own_evidence": int(tally.bad[c]),
        }
        for c in np.flatnonzero(tally.condemned(threshold))
    ]
    return sorted(rows, key=lambda r: (-r["chunks"], r["source"]))


def source_reason(source: tuple[str, int, int, float], threshold: float) -> str:
    """A chunk's source evidence in words: ``source`` as :func:`chunk_source` gives it,
    ``threshold`` the support that condemns (``Scoring.source_threshold``)."""
    name, bad, others, rest = source
    if threshold > 0 and float(support_of(bad, others, rest)) >= threshold:
        return (
            f"from source {name!r}, {bad} of whose {others} other chunks are suspicious on "
            f"their own evidence (against {rest:.1%} of the rest of the knowledge base): "
            "planted passages arrive together, from the sources an attacker controls"
        )
    return f"from source {name!r} ({bad} of its {others} other chunks suspicious, targeting aside)"
