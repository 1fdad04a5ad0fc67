"""Routed search: each chunk and probe searched in a few shards, not in all of them.

Without routing the shards are contiguous ranges of parts and every vector is searched in every
shard, so the search grows with shards x chunks. With ``AuditSettings(route=r)`` the shards are
the cells of a coarse spherical k-means of a sample of the chunk vectors (as an IVF index cuts
its lists): a chunk belongs to the shard of its nearest centre, and every chunk and probe is
searched in the ``r`` shards whose centres are nearest to it. Near neighbours share a cell or
sit in the next one, so the search stays near the exhaustive one at ``r`` searches per vector
whatever the number of shards; what it misses is what lies beyond the ``r`` nearest cells.

A chunk whose neighbours were missed looks more isolated than it is, which is what the audit's
score looks for; so after the defenses, the chunks suspicious on the routed evidence are
searched again in every shard they were not routed to (:class:`RecheckStep`, reading back the
HNSW index each shard saved), and the report scores them on their exhaustive neighbours. Only
the suspects pay for a search of every shard.

```
route/centroids.npy        the shards' centres (unit rows, float32)
route/chunks-00000.npy     per row of a part: its r nearest shards, nearest first (int32)
route/probes-00000.npy
route/suspects.npy         the chunks searched again in every shard (positions)
```
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..similarity import unit_rows
from .steps import EF_SEARCH, ShardIndex, write_routed
from .workdir import (
    Workdir,
    index_file,
    part_name,
    part_starts,
    route_file,
    rows_at,
    search_file,
)

__all__ = [
    "RecheckStep",
    "RouteStep",
    "centroids",
    "contiguous_shards",
    "effective_route",
    "nearest_shards",
    "recheck_suspects",
    "route_parts",
]

_SAMPLE_PER_SHARD = 256  # k-means sample: enough per centre (FAISS's rule of thumb is 39-256)
_MAX_SAMPLE = 200_000
_ITERATIONS = 20
_BLOCK = 65_536  # rows scored against the centres at once
_RECHECK_PARTS = 256  # parts whose suspects are searched together

logger = logging.getLogger("ragdefense")


def effective_route(route: int | None, n_shards: int, chunks: int, needed: int = 0) -> int | None:
    """``route`` where it routes (fewer than the shards, and the shards no more than the
    chunks), else ``None``: every shard searched, with a warning when a route was asked for.
    Also warned: routes that reach fewer chunks than the ``needed`` neighbours a chunk's
    isolation reads (it would look isolated among too few)."""
    if route and route < n_shards <= chunks:
        if route * chunks / n_shards < needed:
            logger.warning(
                "route=%d over %d shards of %d chunks reaches about %d chunks per search, "
                "fewer than the %d neighbours the audit reads: give fewer shards or a larger "
                "route", route, n_shards, chunks, route * chunks // n_shards, needed,
            )  # fmt: skip
        return route
    if route:
        logger.warning(
            "route=%d with %d shards and %d chunks: every shard is searched (routing needs "
            "more shards than route, and no more shards than chunks: give shards=)",
            route, n_shards, chunks,
        )  # fmt: skip
    return None


def contiguous_shards(n_shards: int, parts: int, asked: int | None) -> int:
    """Shards of unrouted search, one or more parts of chunks each: ``n_shards`` at most
    ``parts``, with a warning where the ``shards=`` asked for is cut."""
    shards = max(1, min(n_shards, parts))
    if asked and shards < asked:
        logger.warning(
            "shards=%d over %d part(s) of chunks: %d shard(s) searched (a shard holds whole "
            "parts of chunks: audit(part_size=) sets their size)", asked, parts, shards,
        )  # fmt: skip
    return shards


def nearest_shards(vectors: np.ndarray, centres: np.ndarray, route: int) -> np.ndarray:
    """The ``route`` centres nearest each row (highest inner product first, ties by index):
    an ``(n, route)`` int32 array, scored a block of rows at a time; column 0 is the row's own
    shard."""
    rows = np.asarray(vectors, dtype=np.float32)
    out = np.zeros((len(rows), min(route, len(centres))), dtype=np.int32)
    for start in range(0, len(rows), _BLOCK):
        scores = rows[start : start + _BLOCK] @ centres.T
        out[start : start + _BLOCK] = np.argsort(-scores, axis=1, kind="stable")[:, :route]
    return out


def centroids(wd: Workdir, sizes: list[int], n_shards: int, seed: int = 0) -> np.ndarray:
    """Spherical k-means of a seeded sample of the chunk vectors into ``n_shards`` unit centres;
    notes the largest cell's share of the sample (``largest_cell``), which sets the index kind.

    The sample is spread over every part and read part by part (memory: the sample only). A
    centre whose cell empties is moved to a sample vector drawn at random."""
    from scipy.sparse import csr_matrix

    rng = np.random.default_rng(seed)
    starts = part_starts(sizes)
    want = min(starts[-1], max(n_shards, min(_MAX_SAMPLE, _SAMPLE_PER_SHARD * n_shards)))
    chosen = np.sort(rng.choice(starts[-1], size=want, replace=False))
    sample = rows_at(wd, "chunks", sizes, chosen).astype(np.float32)
    centres = sample[rng.choice(len(sample), size=n_shards, replace=False)].copy()
    cell = nearest_shards(sample, centres, 1)[:, 0]
    for _ in range(_ITERATIONS):
        members = csr_matrix(
            (np.ones(len(cell), np.float32), (cell, np.arange(len(cell)))),
            shape=(n_shards, len(sample)),
        )
        sums = np.asarray(members @ sample)
        empty = np.flatnonzero(np.bincount(cell, minlength=n_shards) == 0)
        sums[empty] = sample[rng.choice(len(sample), size=len(empty), replace=False)]
        centres = unit_rows(sums, np.float32)
        moved = nearest_shards(sample, centres, 1)[:, 0]
        if np.array_equal(moved, cell):
            break
        cell = moved
    wd.note("largest_cell", float(np.bincount(cell, minlength=n_shards).max() / len(cell)))
    return np.asarray(centres, dtype=np.float32)


@dataclass
class RouteStep:
    """Write the ``route`` shards nearest each vector of part ``part`` of ``kind``."""

    workdir: str
    kind: str
    route: int

    def output(self, part: int) -> str:
        """The file this step writes for ``part``."""
        return route_file(self.kind, part)

    def __call__(self, part: int) -> int:
        wd = Workdir(self.workdir)
        centres = np.asarray(wd.read_array("route/centroids.npy"))
        vectors = np.asarray(wd.read_array(f"{part_name(self.kind, part)}.npy"))
        wd.write_array(self.output(part), nearest_shards(vectors, centres, self.route))
        return len(vectors)


def route_parts(
    wd: Workdir,
    sizes: list[int],
    n_probe_parts: int,
    n_shards: int,
    route: int,
    run: Callable[[Any, int, str], None],
) -> float:
    """Cut the shards (the centres, once per audit) and route every chunk and probe part;
    ``run(step, parts, desc)`` runs a step on the parts not done yet. The chunks in the
    largest shard, as the k-means sample estimates them."""
    if not wd.has("route/centroids.npy"):
        wd.write_array("route/centroids.npy", centroids(wd, sizes, n_shards))
    run(RouteStep(str(wd.path), "chunks", route), len(sizes), "route chunks")
    run(RouteStep(str(wd.path), "probes", route), n_probe_parts, "route probes")
    return float(wd.noted("largest_cell")) * sum(sizes)


@dataclass
class RecheckStep:
    """Routed search only: search the suspects (``route/suspects.npy``, sorted chunk positions)
    in shard ``shard`` where they were not searched yet, and add their hits to the part's hit
    file there, so that a suspect's neighbours are those of a search of every shard. A chunk
    whose neighbours lie beyond its nearest cells looks more isolated than it is; this clears
    it, and only suspects pay for a search of every shard. An HNSW shard's index, saved by the
    search, is read back; a flat one is built again (adding its vectors)."""

    workdir: str
    n_shards: int
    k: int
    index: str = "flat"
    round: int = 1  # the suspects' version: a new list (another threshold) is a new round

    def output(self, shard: int) -> str:
        """The file this step writes, last, for ``shard``."""
        return f"search/{shard}-of-{self.n_shards}/rechecked-{self.round}.json"

    def __call__(self, shard: int) -> int:
        wd = Workdir(self.workdir)
        suspects = np.asarray(wd.read_array("route/suspects.npy"))
        starts = part_starts(wd.noted("part_sizes"))
        bounds = np.searchsorted(suspects, starts)
        parts = np.flatnonzero(bounds[1:] > bounds[:-1]).tolist()
        built: ShardIndex | None = None  # built (or read back) on the first row to search
        total = 0
        for first in range(0, len(parts), _RECHECK_PARTS):  # a few searches, not one a part
            todo = []  # (hit file, its hits, the rows to search, their vectors)
            for part in parts[first : first + _RECHECK_PARTS]:
                rows = suspects[bounds[part] : bounds[part + 1]] - starts[part]
                routes = np.asarray(wd.read_array(route_file("chunks", part)))[rows]
                rows = rows[~(routes == shard).any(axis=1)]  # not routed here
                name = search_file(shard, self.n_shards, "chunks", part)
                hits = wd.read_arrays(name)
                rows = rows[~np.isin(rows, hits["rows"])]  # nor searched by an earlier recheck
                if len(rows):
                    vectors = np.asarray(wd.read_array(f"{part_name('chunks', part)}.npy"))[rows]
                    todo.append((name, hits, rows, vectors))
            if not todo:
                continue
            built = built or self._index(wd, shard)
            sims, positions = built.search(np.concatenate([t[3] for t in todo]), self.k)
            at = 0
            for name, hits, rows, _ in todo:
                end = at + len(rows)
                write_routed(
                    wd,
                    name,
                    int(hits["n"]),
                    np.concatenate([hits["rows"], rows]),
                    np.concatenate([hits["sims"], sims[at:end]]),
                    np.concatenate([hits["positions"], positions[at:end]]),
                )
                at = end
            total += at
        wd.write_json(self.output(shard), {"rechecked": total})
        return total

    def _index(self, wd: Workdir, shard: int) -> ShardIndex:
        """The shard's index: the HNSW index its search saved, else built again."""
        sizes = wd.noted("part_sizes")
        saved = wd.path / index_file(shard, self.n_shards)
        built = ShardIndex(wd, range(len(sizes)), sizes, self.index, shard, not saved.is_file())
        if saved.is_file():
            import faiss

            built.faiss = faiss.read_index(str(saved))
            built.faiss.hnsw.efSearch = EF_SEARCH
        return built


#: at most this many rechecks per run (each may make suspects of chunks it was not given)
RECHECK_ROUNDS = 5


def recheck_suspects(
    wd: Workdir, names: list[str], settings: Any, index: str, run: Callable[[Any, int, str], None]
) -> None:
    """After a routed search and the defenses: the chunks suspicious on that evidence are
    searched in every shard they were not routed to (:class:`RecheckStep`), so that the report
    scores them on the neighbours a search of every shard finds. The suspects are kept
    (``route/suspects.npy``); every run scores the chunks with its own scoring and sources (a
    resumed audit may be given others) and searches only the suspects not searched yet. The
    shards' saved HNSW indexes are removed once every shard is rechecked."""
    from .evidence import Scoring, assess, scored

    scoring = settings.scoring or Scoring()
    k = settings.searched  # as the search's
    n_shards = int(wd.noted("shards"))
    round_ = int(wd.noted("recheck_round") or 0)

    def recheck() -> None:  # the round's shards not rechecked yet (all, or those a kill left)
        run(RecheckStep(str(wd.path), n_shards, k, index, round_), n_shards, "recheck suspects")

    for _ in range(RECHECK_ROUNDS):  # until no new suspect: a resumed run finds none
        if round_ and wd.has("route/suspects.npy"):  # none: killed before the first list
            recheck()
        scores = scored(assess(wd, names, scoring), names[0], scoring)[0]
        suspects = np.flatnonzero(scores >= scoring.threshold).astype(np.int64)
        # read into memory: the list is written over below, which a mapped file forbids (Windows)
        known = (
            np.array(wd.read_array("route/suspects.npy")) if wd.has("route/suspects.npy") else None
        )
        if known is not None and not np.setdiff1d(suspects, known).size:
            break
        found = suspects if known is None else np.union1d(known, suspects)
        round_ += 1
        wd.note("recheck_round", round_)  # first: a run killed before the list is written
        wd.write_array("route/suspects.npy", found)  # rechecks the old list again, then this
    else:
        recheck()
    for saved in wd.path.glob(f"search/*-of-{n_shards}/index.faiss"):
        saved.unlink()
