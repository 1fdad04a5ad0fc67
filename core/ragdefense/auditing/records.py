"""The defenses' records of each probe (which chunks it retrieved, which each defense removed
and why), the probe texts, and each chunk's closest logged question, read back a part at a
time for the evidence and the report."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .steps import merged_hits
from .workdir import Workdir, part_name

__all__ = [
    "LONE_REMOVAL",
    "closest_queries",
    "closest_questions",
    "counts",
    "flag_examples",
    "probe_records",
]


def probe_records(
    wd: Workdir, probe_parts: int, n_chunks: int
) -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    """Each probe's record, with the probe texts of its part by id. A part that parses but does
    not hold one well-formed record per probe (cut short, edited, another audit's) is refused
    by name: counted as it is, it would quietly lower every chunk's evidence."""
    for part in range(probe_parts):
        probes = wd.read_json(f"{part_name('probes', part)}.json")
        texts = dict(zip(probes["ids"], probes["texts"], strict=True))
        name = f"{part_name('probed', part)}.json"
        records = wd.read_json(name)
        problem = _malformed(records, probes["ids"], n_chunks)
        if problem:
            raise ValueError(
                f"{wd.path / name}: damaged ({problem}); run the audit again with fresh=True "
                "(--fresh) to redo it"
            )
        yield from ((record, texts) for record in records)


def _malformed(records: Any, probe_ids: list[str], n_chunks: int) -> str:
    """What is wrong with a ``probed`` part ('' when nothing): one record per probe, in order,
    each with chunk positions in range and, per defense, the removed positions among its hits."""
    if not isinstance(records, list) or len(records) != len(probe_ids):
        size = len(records) if isinstance(records, list) else type(records).__name__
        return f"{size} records for {len(probe_ids)} probes"
    for record, probe in zip(records, probe_ids, strict=True):
        if not isinstance(record, dict) or record.get("probe") != probe:
            return f"no record of probe {probe!r} in its place"
        hits, flags = record.get("hits"), record.get("flags")
        if not isinstance(hits, list) or not all(
            type(h) is int and 0 <= h < n_chunks for h in hits
        ):
            return f"probe {probe!r}: hits are not chunk positions"
        if not isinstance(flags, dict) or not all(
            isinstance(removed, dict) and set(removed) <= {str(h) for h in hits}
            for removed in flags.values()
        ):
            return f"probe {probe!r}: flags are not among its hits"
    return ""


#: how a removal on one pool's difference alone begins (Consensus's unsupported veto): it is
#: no evidence of a planted set, and in a poisoned pool it removes the honest minority
LONE_REMOVAL = "removed: unsupported"
#: how the default's reason for a copy of a removed passage opens, before that passage's reason
_COPY_OF = re.compile(r"removed: a copy of passage \d+, removed with it: ")


def _lone(reason: str) -> bool:
    """Whether a removal is :data:`LONE_REMOVAL`, a copy of a passage removed so included."""
    copy = _COPY_OF.match(reason)
    return ("removed: " + reason[copy.end() :] if copy else reason).startswith(LONE_REMOVAL)


def counts(
    wd: Workdir, n_chunks: int, probe_parts: int, defenses: list[str]
) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """How often each chunk was retrieved, removed by each defense, and removed by each defense
    with a set (any reason but :data:`LONE_REMOVAL`)."""
    retrieved = np.zeros(n_chunks, dtype=np.int64)
    flagged = {d: np.zeros(n_chunks, dtype=np.int64) for d in defenses}
    with_set = {d: np.zeros(n_chunks, dtype=np.int64) for d in defenses}
    for record, _ in probe_records(wd, probe_parts, n_chunks):
        np.add.at(retrieved, np.asarray(record["hits"], dtype=np.int64), 1)
        for defense, removed in record["flags"].items():
            for position, reason in removed.items():
                flagged[defense][int(position)] += 1
                with_set[defense][int(position)] += not _lone(reason)
    return retrieved, flagged, with_set


def flag_examples(
    wd: Workdir, probe_parts: int, positions: set[int], most: int = 3
) -> dict[int, list[dict[str, str]]]:
    """Up to ``most`` probes that flagged each of ``positions``, with the defense's reason (a
    second pass over the records, for the chunks a report lists: memory stays a few numbers per
    chunk)."""
    examples: dict[int, list[dict[str, str]]] = {}
    for record, texts in probe_records(wd, probe_parts, sum(wd.noted("part_sizes"))):
        for defense, removed in record["flags"].items():
            for position, reason in removed.items():
                i = int(position)
                if i in positions and len(examples.setdefault(i, [])) < most:
                    probe = texts.get(record["probe"], record["probe"])
                    examples[i].append({"probe": probe, "defense": defense, "reason": reason})
    return examples


def closest_questions(
    wd: Workdir, closest: np.ndarray | None, positions: Sequence[int]
) -> dict[int, str]:
    """The logged question closest to each of ``positions`` (those a question retrieved)."""
    if closest is None:
        return {}
    wanted = {i: int(closest[i]) for i in positions if closest[i] >= 0}
    texts: dict[int, str] = {}
    start = 0
    for part in range(wd.noted("probe_parts")):
        data = wd.read_json(f"{part_name('probes', part)}.json")
        end = start + len(data["texts"])
        texts.update({q: data["texts"][q - start] for q in wanted.values() if start <= q < end})
        start = end
    return {i: texts[q] for i, q in wanted.items() if q in texts}


def closest_queries(
    wd: Workdir, n_chunks: int, n_shards: int, top_m: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk position: the best cosine to a probe whose top ``top_m`` holds it (``-inf``
    where none does), and that probe's number (``-1``)."""
    best = np.full(n_chunks, -np.inf)
    which = np.full(n_chunks, -1, dtype=np.int64)
    start = 0
    for part in range(wd.noted("probe_parts")):
        sims, positions = merged_hits(wd, "probes", part, n_shards, top_m)
        rows = np.broadcast_to(start + np.arange(len(positions))[:, None], positions.shape)
        valid = positions >= 0
        at, cos, row = positions[valid], sims[valid].astype(np.float64), rows[valid]
        np.maximum.at(best, at, cos)
        won = cos >= best[at]  # this part's probe is the closest (so far)
        which[at[won]] = row[won]
        start += len(positions)
    return best, which
