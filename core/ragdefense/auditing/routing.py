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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .steps import _EF_SEARCH, _index_file, _search_file, _Shard, write_routed
from .workdir import Workdir, part_name, part_starts, route_file

__all__ = [
    "RecheckStep",
    "RouteStep",
    "centroids",
    "nearest_shards",
    "recheck_suspects",
    "route_parts",
]

_SAMPLE_PER_SHARD = 256  # k-means sample: enough per centre (FAISS's rule of thumb is 39-256)
_MAX_SAMPLE = 200_000
_ITERATIONS = 20


def nearest_shards(vectors: np.ndarray, centres: np.ndarray, route: int) -> np.ndarray:
    """The ``route`` centres nearest each row (highest inner product first, ties by index):
    an ``(n, route)`` int32 array; column 0 is the row's own shard."""
    scores = np.asarray(vectors, dtype=np.float32) @ centres.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :route]
    return order.astype(np.int32)


def centroids(wd: Workdir, sizes: list[int], n_shards: int, seed: int = 0) -> np.ndarray:
    """Spherical k-means of a seeded sample of the chunk vectors into ``n_shards`` unit centres.

    The sample is spread over every part and read part by part (memory: the sample only). A
    centre whose cell empties keeps its last position, so every shard keeps a centre."""
    rng = np.random.default_rng(seed)
    total = sum(sizes)
    want = min(total, max(n_shards, min(_MAX_SAMPLE, _SAMPLE_PER_SHARD * n_shards)))
    chosen = np.sort(rng.choice(total, size=want, replace=False))
    rows, start = [], 0
    for part, size in enumerate(sizes):
        inside = chosen[(chosen >= start) & (chosen < start + size)] - start
        if len(inside):
            rows.append(np.asarray(wd.read_array(f"{part_name('chunks', part)}.npy"))[inside])
        start += size
    sample = np.concatenate(rows).astype(np.float32)
    centres = sample[rng.choice(len(sample), size=n_shards, replace=False)].copy()
    for _ in range(_ITERATIONS):
        cell = np.argmax(sample @ centres.T, axis=1)
        sums = np.zeros_like(centres)
        np.add.at(sums, cell, sample)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        filled = norms[:, 0] > 0
        moved = np.where(filled[:, None], sums / np.where(norms > 0, norms, 1), centres)
        if np.allclose(moved, centres, atol=1e-6):
            break
        centres = moved.astype(np.float32)
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
) -> None:
    """Cut the shards (the centres, once per audit) and route every chunk and probe part;
    ``run(step, parts, desc)`` runs a step on the parts not done yet."""
    if not wd.has("route/centroids.npy"):
        wd.write_array("route/centroids.npy", centroids(wd, sizes, n_shards))
    run(RouteStep(str(wd.path), "chunks", route), len(sizes), "route chunks")
    run(RouteStep(str(wd.path), "probes", route), n_probe_parts, "route probes")


@dataclass
class RecheckStep:
    """Routed search only: search the suspects (``route/suspects.npy``, chunk positions) in
    shard ``shard`` where they were not routed, and write their hits into the part's hit file
    there, so that a suspect's neighbours are the exhaustive search's. A chunk whose neighbours
    lie beyond its nearest cells looks more isolated than it is; this clears it (and only
    suspects pay for a search of every shard). The shard's HNSW index saved by the search is
    read back, else the shard is built again."""

    workdir: str
    n_shards: int
    k: int
    index: str = "flat"

    def output(self, shard: int) -> str:
        """The file this step writes, last, for ``shard``."""
        return f"search/{shard}-of-{self.n_shards}/rechecked.json"

    def __call__(self, shard: int) -> int:
        wd = Workdir(self.workdir)
        suspects = np.asarray(wd.read_array("route/suspects.npy"))
        sizes = wd.noted("part_sizes")
        starts = part_starts(sizes)
        todo: dict[int, np.ndarray] = {}
        for part in range(len(sizes)):
            rows = suspects[(suspects >= starts[part]) & (suspects < starts[part + 1])]
            rows = rows - starts[part]
            if len(rows):
                routes = np.asarray(wd.read_array(route_file("chunks", part)))[rows]
                rows = rows[~(routes == shard).any(axis=1)]  # not searched here yet
            if len(rows):
                todo[part] = rows
        saved = wd.path / _index_file(shard, self.n_shards)
        if todo:
            built = _Shard(wd, range(len(sizes)), sizes, self.index, shard, not saved.is_file())
            if saved.is_file():
                import faiss

                built.faiss = faiss.read_index(str(saved))
                built.faiss.hnsw.efSearch = _EF_SEARCH
            for part, rows in todo.items():
                name = _search_file(shard, self.n_shards, "chunks", part)
                hits = wd.read_arrays(name)
                rows = rows[~np.isin(rows, hits["rows"])]  # a resumed recheck: once per row
                vectors = np.asarray(wd.read_array(f"{part_name('chunks', part)}.npy"))[rows]
                sims, positions = built.search(vectors, self.k)
                write_routed(wd, name, int(hits["n"]), np.concatenate([hits["rows"], rows]),
                             np.concatenate([hits["sims"], sims]),
                             np.concatenate([hits["positions"], positions]))  # fmt: skip
        wd.write_json(self.output(shard), {"rechecked": sum(map(len, todo.values()))})
        saved.unlink(missing_ok=True)
        return sum(map(len, todo.values()))


def recheck_suspects(
    wd: Workdir, names: list[str], settings: Any, index: str, run: Callable[[Any, int, str], None]
) -> None:
    """After a routed search and the defenses: the chunks suspicious on that evidence (kept in
    ``route/suspects.npy``, once) are searched in every shard they were not routed to
    (:class:`RecheckStep`), so that the report scores them on exhaustive neighbours."""
    from .evidence import Scoring, assess, scored

    scoring = settings.scoring or Scoring()
    k = max(settings.neighbours, settings.wide_neighbours) + 1  # as the search's

    if not wd.has("route/suspects.npy"):
        scores = scored(assess(wd, names, scoring), names[0], scoring)[0]
        suspects = np.flatnonzero(scores >= scoring.threshold).astype(np.int64)
        wd.write_array("route/suspects.npy", suspects)
    n_shards = int(wd.noted("shards"))
    run(RecheckStep(str(wd.path), n_shards, k, index), n_shards, "recheck suspects")
