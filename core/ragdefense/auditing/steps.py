"""The audit's steps. Each one processes one *part* (a few hundred chunks or probes) and writes
its result to the working folder; the engines (:mod:`ragdefense.auditing.engines`) only decide
where the parts run: in this process, or in Ray Data's ``map_batches``. A step is a small
picklable object that loads its models and index once per process.

1. :class:`EmbedStep`: embed a part of chunks (or of probes) and store unit vectors.
2. :class:`SearchStep`: search a part's vectors in one shard of the index (FAISS when installed,
   else exact numpy) and store the shard's top hits; :class:`ShardSearchStep` runs it on every
   part for one shard, so that a worker builds that shard's index once. Routed
   (:mod:`ragdefense.auditing.routing`), a shard holds the chunks of one k-means cell and
   searches only the vectors routed to it.
3. :class:`DefendStep`: merge a probe part's hits over all shards into its top M, run each
   defense on them with the stored vectors, store who was flagged and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..similarity import unit_rows
from .space import check_spread
from .workdir import (
    Workdir,
    index_file,
    locate,
    part_name,
    part_starts,
    part_texts,
    route_file,
    search_file,
)

__all__ = [
    "EF_SEARCH",
    "DefendStep",
    "EmbedStep",
    "SearchStep",
    "ShardIndex",
    "ShardSearchStep",
    "merged_hits",
    "shard_hits",
    "shard_parts",
    "step_embedder",
    "unit",
    "write_routed",
]

_ADD_BLOCK = 65_536  # vectors handed to FAISS at once while a shard's index is built
EF_SEARCH = 64  # HNSW's search width
_CACHE: dict[Any, Any] = {}  # per process: the default embedder, defenses, shard indexes


def unit(vectors: Any, texts: list[str] | None = None) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), float32: what the parts store. The
    rows of blank ``texts`` (empty pages) are zero: no direction, so never anyone's neighbour,
    never a group, retrieved (at cosine 0) only by a probe that fewer chunks with text than it
    asks for resemble more, whatever the model made of nothing."""
    out = unit_rows(np.asarray(vectors, dtype=np.float32), np.float32)
    if texts is not None:
        out[[i for i, t in enumerate(texts) if not t.strip()]] = 0.0
    return out


def shard_parts(n_parts: int, n_shards: int, shard: int) -> range:
    """The chunk parts in ``shard`` (contiguous ranges, sizes differing by at most one)."""
    base, extra = divmod(n_parts, n_shards)
    start = shard * base + min(shard, extra)
    return range(start, start + base + (shard < extra))


def step_embedder(spec: Any) -> Any:
    """``as_embedder(spec)``, which keeps one wrapper per model; the default is kept here, once
    per process, so that its model loads once."""
    from ..embedders import as_embedder

    if spec is not None:
        return as_embedder(spec)
    if "default embedder" not in _CACHE:
        _CACHE["default embedder"] = as_embedder(None)
    return _CACHE["default embedder"]


@dataclass
class EmbedStep:
    """Embed part ``part`` of ``kind`` (``chunks`` or ``probes``) into ``<part>.npy``."""

    workdir: str
    kind: str
    embedder: Any = None

    def output(self, part: int) -> str:
        """The file this step writes for ``part``."""
        return f"{part_name(self.kind, part)}.npy"

    def __call__(self, part: int) -> int:
        wd = Workdir(self.workdir)
        name = part_name(self.kind, part)
        data = wd.read_json(f"{name}.json")
        texts = data["texts"]
        model = step_embedder(self.embedder)
        # probes as queries (an asymmetric model embeds them apart), batched where it can
        vectors = model.embed_queries(texts) if self.kind == "probes" else model.embed(texts)
        rows = unit(vectors, texts)  # chunks the model cannot tell apart: nothing to audit
        wd.write_array(f"{name}.npy", check_spread(rows, texts) if self.kind == "chunks" else rows)
        return len(texts)


class ShardIndex:
    """The vectors of some chunk parts, searchable: FAISS (flat inner product, or HNSW for
    large shards) when installed, else exact numpy blocks. Routed (``cell`` given), only the
    rows of those parts whose own shard is ``cell``."""

    def __init__(
        self,
        wd: Workdir,
        parts: range,
        sizes: list[int],
        index: str,
        cell: int | None = None,
        build: bool = True,
    ) -> None:
        starts = part_starts(sizes)
        self.ids: np.ndarray | None = None  # global positions of the rows (routed shards)
        if cell is None:
            self.offset, self.size = starts[parts.start], sum(sizes[p] for p in parts)
            blocks: Any = (np.asarray(wd.read_array(f"{part_name('chunks', p)}.npy"))
                           for p in parts)  # fmt: skip
        else:
            homes = {p: np.flatnonzero(wd.read_array(route_file("chunks", p))[:, 0] == cell)
                     for p in parts}  # fmt: skip
            self.offset, self.size = 0, sum(len(rows) for rows in homes.values())
            found = [(starts[p] + rows).astype(np.int64) for p, rows in homes.items()]
            self.ids = np.concatenate(found or [np.zeros(0, np.int64)])
            blocks = (np.asarray(wd.read_array(f"{part_name('chunks', p)}.npy")[rows])
                      for p, rows in homes.items() if len(rows))  # fmt: skip
        dim = int(wd.noted("dim"))
        self.vectors = np.zeros((0, dim), np.float32)  # the numpy fallback's copy
        self.faiss: Any = None
        if not build:  # the caller sets a saved index
            return
        try:
            import faiss
        except ImportError:
            loaded = list(blocks)
            if loaded:
                self.vectors = np.concatenate(loaded)
            return
        if index == "hnsw":
            # The graph bounds recall: a denser build (efConstruction) finds the neighbours a
            # wider search (efSearch) on FAISS's default graph still misses, at less search time.
            self.faiss = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
            self.faiss.hnsw.efConstruction = 100
            self.faiss.hnsw.efSearch = EF_SEARCH
        else:
            self.faiss = faiss.IndexFlatIP(dim)
        pending: list[np.ndarray] = []  # added a block at a time: FAISS keeps the only copy
        for block in blocks:
            pending.append(block)
            if sum(map(len, pending)) >= _ADD_BLOCK:
                self.faiss.add(np.ascontiguousarray(np.concatenate(pending), dtype=np.float32))
                pending = []
        if pending:
            self.faiss.add(np.ascontiguousarray(np.concatenate(pending), dtype=np.float32))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` (similarities, global positions) per query; position -1 pads."""
        k = min(k, self.size)
        if k == 0:
            empty = np.zeros((len(queries), 0))
            return empty.astype(np.float32), empty.astype(np.int64)
        if self.faiss is not None:
            sims, idx = self.faiss.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        else:
            scores = queries @ self.vectors.T
            idx = np.argsort(-scores, axis=1, kind="stable")[:, :k]
            sims = np.take_along_axis(scores, idx, axis=1)
        found = idx >= 0
        if self.ids is not None:
            positions = np.where(found, self.ids[np.where(found, idx, 0)], -1)
        else:
            positions = np.where(found, idx + self.offset, -1)
        return sims.astype(np.float32), positions.astype(np.int64)


@dataclass
class SearchStep:
    """Search part ``part`` of ``kind`` in shard ``shard`` of ``n_shards``; keep the top ``k``.
    Routed (``route`` shards per vector), only the part's rows routed to this shard are
    searched; the others get no hits here (position -1)."""

    workdir: str
    kind: str
    shard: int
    n_shards: int
    k: int
    index: str = "flat"
    route: int | None = None

    def output(self, part: int) -> str:
        """The file this step writes for ``part``."""
        return search_file(self.shard, self.n_shards, self.kind, part)

    def key(self, run: str) -> tuple[Any, ...]:
        """Where this process keeps the shard's index (one per audit run, shard and kind of
        index; the probes and chunks of a shard share it)."""
        return ("shard", self.workdir, run, self.shard, self.n_shards, self.index, self.route)

    def __call__(self, part: int) -> int:
        return self.batch([part])

    def batch(self, parts: list[int]) -> int:
        """Search ``parts`` (routed: their routed rows in one search); the rows searched."""
        wd = Workdir(self.workdir)
        key = self.key(wd.run)
        if key not in _CACHE:
            sizes = wd.noted("part_sizes")
            if self.route:
                _CACHE[key] = ShardIndex(wd, range(len(sizes)), sizes, self.index, self.shard)
            else:
                _CACHE[key] = ShardIndex(wd, shard_parts(len(sizes), self.n_shards, self.shard),
                                     sizes, self.index)  # fmt: skip
        shard: ShardIndex = _CACHE[key]
        vectors = [np.asarray(wd.read_array(f"{part_name(self.kind, p)}.npy")) for p in parts]
        if not self.route:
            for part, queries in zip(parts, vectors, strict=True):
                sims, positions = shard.search(queries, self.k)
                wd.write_arrays(self.output(part), sims=sims, positions=positions)
            return sum(map(len, vectors))
        rows = [
            np.flatnonzero((np.asarray(wd.read_array(route_file(self.kind, p))) == self.shard)
                           .any(axis=1))
            for p in parts
        ]  # fmt: skip
        queries = np.concatenate([v[r] for v, r in zip(vectors, rows, strict=True)])
        sims, positions = shard.search(queries, self.k)
        at = 0
        for part, queries, routed in zip(parts, vectors, rows, strict=True):
            end = at + len(routed)
            write_routed(wd, self.output(part), len(queries), routed, sims[at:end],
                         positions[at:end])  # fmt: skip
            at = end
        return at


@dataclass
class ShardSearchStep:
    """Search every part of each ``(kind, parts, k)`` of ``searches`` in shard ``shard`` (the
    item this step is run on): the shard's index is built once, here, and dropped at the end;
    parts already searched (a resumed audit) are skipped."""

    workdir: str
    n_shards: int
    searches: list[tuple[str, int, int]]
    index: str = "flat"
    progress: bool = False
    route: int | None = None

    def output(self, shard: int) -> str:
        """The file this step writes, last, for ``shard``."""
        return f"search/{shard}-of-{self.n_shards}/done.json"

    def __call__(self, shard: int) -> int:
        from ..progress import progress_bar

        wd = Workdir(self.workdir)
        steps = [SearchStep(self.workdir, kind, shard, self.n_shards, k, self.index, self.route)
                 for kind, _, k in self.searches]  # fmt: skip
        # routed, a shard searches a few rows of each part: parts go together, one search
        group = max(1, 4 * self.n_shards // self.route) if self.route else 1
        todo = []
        for step, (_, parts, _) in zip(steps, self.searches, strict=True):
            left = [part for part in range(parts) if not wd.has(step.output(part))]
            todo += [(step, left[i : i + group]) for i in range(0, len(left), group)]
        desc = f"search shard {shard + 1}/{self.n_shards}" if self.progress else None
        try:
            done = int(sum(step.batch(parts) for step, parts in progress_bar(todo, desc)))
            built = _CACHE.get(steps[0].key(wd.run))
            if self.route and self.index == "hnsw" and built is not None and built.faiss:
                _save_index(wd, index_file(shard, self.n_shards), built.faiss)  # for recheck
        finally:  # the index is this shard's: free it for the next, also after a failure
            _CACHE.pop(steps[0].key(wd.run), None)
        wd.write_json(self.output(shard), {"searched": done})
        return done


def _save_index(wd: Workdir, name: str, index: Any) -> None:
    """Write a FAISS index into the working folder, atomically, as every file of it is."""
    import faiss

    writer = faiss.PyCallbackIOWriter  # type: ignore[attr-defined]  # not in FAISS's stubs
    wd.write_stream(name, lambda f: faiss.write_index(index, writer(f.write)))


def write_routed(
    wd: Workdir, name: str, n: int, rows: np.ndarray, sims: np.ndarray, positions: np.ndarray
) -> None:
    """A routed shard's hits for a part of ``n`` rows: only the ``rows`` searched there."""
    wd.write_arrays(name, n=np.asarray(n), rows=rows, sims=sims, positions=positions)


def shard_hits(wd: Workdir, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A shard's hits for a part, one row per vector (rows a routed shard did not search: no
    hits, position -1)."""
    found = wd.read_arrays(name)
    if "rows" not in found:
        return found["sims"], found["positions"]
    n, width = int(found["n"]), found["sims"].shape[1]
    sims = np.full((n, width), -np.inf, dtype=np.float32)
    positions = np.full((n, width), -1, dtype=np.int64)
    sims[found["rows"]], positions[found["rows"]] = found["sims"], found["positions"]
    return sims, positions


def merged_hits(wd: Workdir, kind: str, part: int, n_shards: int, k: int) -> tuple[Any, Any]:
    """A part's top ``k`` over every shard: (similarities, global positions), best first."""
    found = [shard_hits(wd, search_file(s, n_shards, kind, part)) for s in range(n_shards)]
    sims = np.concatenate([f[0] for f in found], axis=1)
    positions = np.concatenate([f[1] for f in found], axis=1)
    sims = np.where(positions >= 0, sims, -np.inf)
    order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(sims, order, axis=1), np.take_along_axis(positions, order, axis=1)


@dataclass
class DefendStep:
    """Run ``defenses`` on the top ``top_m`` chunks of every probe of part ``part``."""

    workdir: str
    defenses: list[Any]
    n_shards: int
    top_m: int
    embedder: Any = None

    def output(self, part: int) -> str:
        """The file this step writes for ``part``."""
        return f"{part_name('probed', part)}.json"

    def _defenses(self, run: str) -> list[tuple[str, Any]]:
        """The defenses, made once per process for audit ``run`` (one audit's kept at a time:
        another's, or a fresh start's in the same folder, is dropped, with its models)."""
        from ..defenses.registry import defense
        from .naming import defense_names

        key = ("defenses", self.workdir, run, tuple(map(str, self.defenses)))
        made = _CACHE.get(key)
        if made is None:
            for old in [k for k in list(_CACHE) if k[0] == "defenses"]:
                _CACHE.pop(old, None)
            made = []
            for name, d in zip(defense_names(self.defenses), self.defenses, strict=True):
                obj = defense(d, embedder=step_embedder(self.embedder)) if isinstance(d, str) else d
                made.append((name, obj))
            _CACHE[key] = made
        return list(made)

    def __call__(self, part: int) -> int:
        from ..types import Passage, defend_given

        wd = Workdir(self.workdir)
        probes = wd.read_json(f"{part_name('probes', part)}.json")
        queries = np.asarray(wd.read_array(f"{part_name('probes', part)}.npy"))
        _, positions = merged_hits(wd, "probes", part, self.n_shards, self.top_m)
        chunks = _chunks(wd, {int(p) for p in positions.ravel() if p >= 0})
        records = []
        for row, question in enumerate(probes["texts"]):
            hits = [int(p) for p in positions[row] if p >= 0]
            passages = [Passage(chunks[p][0], id=str(p)) for p in hits]
            vectors = np.stack([chunks[p][1] for p in hits]) if hits else None
            record: dict[str, Any] = {"probe": probes["ids"][row], "hits": hits, "flags": {}}
            for name, defense in self._defenses(wd.run):
                if len(passages) < 2:
                    break
                result = defend_given(defense, question, passages, vectors, queries[row])
                record["flags"][name] = {  # a copy left out is no flag: its text stays
                    str(hits[v.index]): v.reason
                    for v in result.verdicts
                    if not v.kept and not v.details.get("copy")
                }
            records.append(record)
        wd.write_json(self.output(part), records)
        return len(records)


def _chunks(wd: Workdir, positions: set[int]) -> dict[int, tuple[str, np.ndarray]]:
    """Text and vector of each chunk position, reading each part that holds one once."""
    starts = part_starts(wd.noted("part_sizes"))
    by_part: dict[int, list[tuple[int, int]]] = {}
    for p in positions:
        part, offset = locate(starts, p)
        by_part.setdefault(part, []).append((p, offset))
    out = {}
    for c, members in sorted(by_part.items()):
        texts = part_texts(wd, c)["texts"]
        vectors = wd.read_array(f"{part_name('chunks', c)}.npy")
        for p, offset in members:
            out[p] = (texts[offset], np.asarray(vectors[offset]))
    return out
