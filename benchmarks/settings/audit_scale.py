"""``python -m benchmarks audit-scale``: how :func:`ragdefense.audit` grows with the knowledge base.

The corpus is synthetic (no data needed) and streamed, a part at a time, as a store would hand
it over with its stored vectors: topics of about 50 chunks each (unit vectors around a topic
centre, about 0.5 apart), and every 5,000 chunks a planted set of 1, 3, 5, 10 or 20 passages
written for one topic (about 0.9 apart from each other). The probes are derived from the
chunks' first sentences and embedded by the packaged MiniLM, as in a real audit.

Each run is a fresh process, so that its peak memory is its own; on Ray the peak resident
memory of each worker process is sampled every half second. The planted sets are a check that
approximate search keeps finding what the audit's score looks for at every size; the audit's
quality on real text is ``python -m benchmarks audit``.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragdefense.auditing import AuditSettings, audit
from ragdefense.auditing.corpus import Batch
from ragdefense.similarity import unit_rows

from ..report import markdown_table

__all__ = ["SyntheticCorpus", "audit_scale"]

#: the stages timed in the table (``stats["stage_seconds"]`` of an audit)
STAGES = ("read", "probes", "search", "defend", "recheck", "report")
SIZES = (100_000, 300_000, 1_000_000)
#: name: (engine, workers, shards, route); shards None: one per worker, route None: every shard
ENGINES: dict[str, tuple[str, int, int | None, int | None]] = {
    "local": ("local", 1, None, None),
    "ray": ("ray", 2, None, None),
    "ray-routed": ("ray", 2, 16, 3),
}
#: the routed setup's shards are small enough for exact search: beyond this it is not run
ROUTED_UP_TO = 1_000_000


class SyntheticCorpus:
    """``n`` chunks with stored vectors, generated a batch at a time (the same chunks for the
    same ``n``, ``seed`` and batch size); ``planted`` holds the planted chunks' ids by set size."""

    def __init__(
        self,
        n: int,
        seed: int = 0,
        dim: int = 384,
        topic_size: int = 50,
        spacing: int = 5_000,
        set_sizes: Sequence[int] = (1, 3, 5, 10, 20),
    ) -> None:
        self.n, self.seed, self.dim = n, seed, dim
        rng = np.random.default_rng(seed)
        n_topics = max(1, n // topic_size)
        self.centres = unit_rows(rng.normal(size=(n_topics, dim)).astype(np.float32), np.float32)
        self.topic = rng.integers(0, n_topics, n).astype(np.int32)
        self.sets = [  # (first position, size), each set whole inside the corpus
            (start, set_sizes[g % len(set_sizes)])
            for g, start in enumerate(range(spacing // 2, n, spacing))
            if start + set_sizes[g % len(set_sizes)] <= n
        ]
        self.planted: dict[int, list[str]] = {}
        for start, size in self.sets:
            self.topic[start : start + size] = self.topic[start]  # written for one topic
            self.planted.setdefault(size, []).extend(f"c{i}" for i in range(start, start + size))

    def fingerprint(self) -> str:
        """What the audit's working folder checks on a restart."""
        return f"synthetic {self.n} seed {self.seed}"

    def batches(self, size: int) -> Iterator[Batch]:
        for start in range(0, self.n, size):
            end = min(start + size, self.n)
            rng = np.random.default_rng([self.seed, start])
            topics = self.topic[start:end]
            noise = rng.normal(0, 1 / np.sqrt(self.dim), (end - start, self.dim))
            vectors = unit_rows(self.centres[topics] + noise.astype(np.float32), np.float32)
            for first, n_set in self.sets:
                if first < end and first + n_set > start:
                    planted = self._planted(first, n_set)
                    for i in range(max(first, start), min(first + n_set, end)):
                        vectors[i - start] = planted[i - first]
            texts = [
                self._text(i, int(t), rng) for i, t in zip(range(start, end), topics, strict=True)
            ]
            yield Batch([f"c{i}" for i in range(start, end)], texts, [""] * len(texts), vectors)

    def _planted(self, first: int, size: int) -> np.ndarray:
        """The vectors of the planted set of ``size`` starting at ``first``: close to one point
        of its topic, and to each other."""
        rng = np.random.default_rng([self.seed, 1, first])
        point = self.centres[self.topic[first]] + rng.normal(0, 1 / np.sqrt(self.dim), self.dim)
        spread = rng.normal(0, 0.35 / np.sqrt(self.dim), (size, self.dim))
        return unit_rows((point + spread).astype(np.float32), np.float32)

    @staticmethod
    def _text(i: int, topic: int, rng: np.random.Generator) -> str:
        """A chunk of about 60 words: its topic's vocabulary and common words."""
        words = [f"t{topic}w{j}" for j in rng.integers(0, 30, 40)]
        words += [f"w{j}" for j in rng.integers(0, 5_000, 20)]
        return f"Note {i} on {' '.join(words[:6])}. {' '.join(words[6:])}."


class _WorkerPeaks:
    """Samples the resident memory of this machine's Ray worker processes until stopped."""

    def __init__(self) -> None:
        import psutil  # comes with Ray

        self._psutil = psutil
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            for proc in self._psutil.process_iter(["name", "memory_info"]):
                name, memory = proc.info["name"] or "", proc.info["memory_info"]
                if name.startswith("ray::") and memory is not None:
                    self.peaks[proc.pid] = max(self.peaks.get(proc.pid, 0), memory.rss)

    def stop(self) -> int:
        """The largest peak, in MB."""
        self._stop.set()
        self._thread.join()
        return round(max(self.peaks.values(), default=0) / 2**20)


def _run(n: int, name: str, workdir: str, max_probes: int, date: str = "") -> dict[str, Any]:
    """One timed audit of ``n`` synthetic chunks on ``ENGINES[name]`` (in a fresh process)."""
    engine, workers, shards, route = ENGINES[name]
    corpus = SyntheticCorpus(n)
    peaks = _WorkerPeaks() if engine == "ray" else None
    t0 = time.perf_counter()
    settings = AuditSettings(max_probes=max_probes, shards=shards, route=route)
    wd = Path(workdir) / f"{n}-{name}"
    on_ray = workers if engine == "ray" else None  # in process: one worker, this one
    report = audit(corpus, settings, fresh=True, engine=engine, workdir=wd, workers=on_ray)
    seconds = time.perf_counter() - t0
    worker_mb = peaks.stop() if peaks is not None else None
    if engine == "ray":
        import ray

        ray.shutdown()
    stages = report.stats["stage_seconds"]
    flagged = {f.id for f in report.suspicious}
    planted = {i for ids in corpus.planted.values() for i in ids}

    def found(sizes: Sequence[int]) -> float:
        ids = [i for size in sizes for i in corpus.planted.get(size, [])]
        return round(sum(i in flagged for i in ids) / len(ids), 3) if ids else float("nan")

    n_shards = int(report.stats["shards"])
    routed = report.stats.get("route")
    return {
        "chunks": n,
        "engine": f"ray x{workers}" if engine == "ray" else engine,
        "index": report.stats["index"],
        "search": f"{routed} of {n_shards} shards" if routed else f"every shard ({n_shards})",
        "probes": int(report.stats["probes"]),
        "total s": round(seconds, 1),
        **{f"{stage} s": round(stages.get(stage, 0.0), 1) for stage in STAGES},
        "chunks/s": round(n / seconds),
        "peak MB (driver)": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "peak MB (worker)": "" if worker_mb is None else worker_mb,
        "shards": n_shards,
        "route": routed,
        "largest shard": _balance(wd, n_shards) if routed else "",
        "rechecked": _rechecked(wd, n) if routed else "",
        "neighbour recall@10": neighbour_recall(wd, n_shards),
        "flagged: sets of 3-5": found((3, 5)),
        "flagged: sets of 10-20": found((10, 20)),
        "flagged: single": found((1,)),
        "benign flagged": f"{len(flagged - planted) / (n - len(planted)):.2%}",
        "setup": name,
        "date": date,
    }


def _balance(workdir: Path, n_shards: int) -> float:
    """The largest routed shard's size over the mean shard's."""
    from ragdefense.auditing.workdir import Workdir, route_file

    wd = Workdir(workdir)
    own = [np.asarray(wd.read_array(route_file("chunks", p)))[:, 0]
           for p in range(len(wd.noted("part_sizes")))]  # fmt: skip
    counts = np.bincount(np.concatenate(own), minlength=n_shards)
    return round(float(counts.max() / counts.mean()), 2)


def _rechecked(workdir: Path, n: int) -> str:
    """The share of the chunks a routed audit searched again in every shard (its suspects)."""
    from ragdefense.auditing.workdir import Workdir

    return f"{len(Workdir(workdir).read_array('route/suspects.npy')) / n:.2%}"


def neighbour_recall(workdir: Path, n_shards: int, k: int = 10, sample: int = 2_000) -> float:
    """Share of the exact ``k`` nearest neighbours the audit's search found, over ``sample``
    chunks spread over the corpus (exact: a brute-force pass over every part's vectors)."""
    from ragdefense.auditing.steps import merged_hits
    from ragdefense.auditing.workdir import Workdir, part_name, part_starts

    wd = Workdir(workdir)
    sizes = wd.noted("part_sizes")
    starts = part_starts(sizes)
    chosen = np.linspace(0, len(sizes) - 1, min(len(sizes), 8)).astype(int)
    per_part = max(1, sample // len(chosen))
    queries, found, me = [], [], []
    for part in sorted(set(chosen.tolist())):
        vectors = np.asarray(wd.read_array(f"{part_name('chunks', part)}.npy"))[:per_part]
        _, positions = merged_hits(wd, "chunks", part, n_shards, k + 1)
        queries.append(vectors)
        found.append(positions[: len(vectors)])
        me.append(np.arange(starts[part], starts[part] + len(vectors)))
    q, hits, own = np.concatenate(queries), np.concatenate(found), np.concatenate(me)
    best_s = np.full((len(q), k + 1), -np.inf, dtype=np.float32)
    best_p = np.full((len(q), k + 1), -1, dtype=np.int64)
    for part in range(len(sizes)):
        block = np.asarray(wd.read_array(f"{part_name('chunks', part)}.npy"))
        s = np.concatenate([best_s, q @ block.T], axis=1)
        p = np.concatenate([best_p, np.broadcast_to(starts[part] + np.arange(len(block)),
                                                     (len(q), len(block)))], axis=1)  # fmt: skip
        top = np.argpartition(-s, k, axis=1)[:, : k + 1]
        best_s, best_p = np.take_along_axis(s, top, axis=1), np.take_along_axis(p, top, axis=1)
    hit = 0
    for row in range(len(q)):
        order = np.argsort(-best_s[row], kind="stable")
        exact = [int(x) for x in best_p[row][order] if x != own[row]][:k]
        got = [int(x) for x in hits[row] if x not in (own[row], -1)][:k]
        hit += len(set(exact) & set(got))
    return round(hit / (k * len(q)), 3)


def audit_scale(
    workdir: str | Path,
    sizes: Sequence[int] = SIZES,
    engines: Sequence[str] = tuple(ENGINES),
    max_probes: int = 5_000,
    kept: Sequence[dict[str, Any]] = (),
) -> tuple[str, list[dict[str, Any]]]:
    """Audit synthetic corpora of ``sizes`` chunks on each of ``engines`` (names of
    :data:`ENGINES`), each run in a fresh process (its working folder removed afterwards); the
    table and its rows, with the rows of ``kept`` (an earlier run's) that were not run again."""
    import datetime
    import shutil
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    unknown = [name for name in engines if name not in ENGINES]
    if unknown:
        raise ValueError(f"unknown setup {', '.join(unknown)}: use {', '.join(ENGINES)}")
    today = datetime.date.today().isoformat()
    rows = []
    for n in sizes:
        for name in engines:
            if ENGINES[name][3] and n > ROUTED_UP_TO:
                continue
            with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
                rows.append(pool.submit(_run, n, name, str(workdir), max_probes, today).result())
            shutil.rmtree(Path(workdir) / f"{n}-{name}", ignore_errors=True)
    done = {(r["chunks"], r["setup"]) for r in rows}
    rows += [r for r in kept if (r["chunks"], r.get("setup", _setup(r))) not in done]
    rows.sort(key=lambda r: (r["chunks"], list(ENGINES).index(r.get("setup", _setup(r)))))
    return scale_table(rows), rows


def _setup(row: dict[str, Any]) -> str:
    """The :data:`ENGINES` name of a row written before rows named theirs."""
    return "local" if row["engine"] == "local" else "ray"


COLUMNS = ["chunks", "engine", "search", "index", "probes", "total s"]
COLUMNS += [f"{s} s" for s in STAGES]
COLUMNS += ["chunks/s", "peak MB (driver)", "peak MB (worker)", "neighbour recall@10", "rechecked"]
COLUMNS += ["flagged: sets of 3-5", "flagged: sets of 10-20", "flagged: single", "benign flagged"]


def scale_table(rows: Sequence[dict[str, Any]]) -> str:
    """The table of the runs, then the plan for 100M chunks worked out from its largest runs."""
    cells = [[_show(r.get(c) or _every(r, c)) for c in COLUMNS] for r in rows]
    dates: dict[str, list[str]] = {}
    for r in (r for r in rows if r.get("kept")):
        setup = f"{r['chunks']:,} {r.get('setup', _setup(r))}"
        dates.setdefault(str(r.get("date") or "an earlier date"), []).append(setup)
    when = [] if not dates else [
        "Rows kept from an earlier run of this benchmark (`--keep`): "
        + "; ".join(f"{', '.join(setups)} ({day})" for day, setups in sorted(dates.items()))
        + ".", "",
    ]  # fmt: skip
    return "\n".join([*markdown_table(COLUMNS, cells), "", *when, *plan(rows)])


def _every(row: dict[str, Any], column: str) -> Any:
    """A cell a row has no value for (a row written before routing: every shard searched)."""
    return f"every shard ({row.get('shards', '')})" if column == "search" else row.get(column, "")


def plan(
    rows: Sequence[dict[str, Any]], target: int = 100_000_000, workers: int = 64, routed: int = 3
) -> list[str]:
    """A plan for auditing ``target`` chunks on a Ray cluster of ``workers`` one-CPU actors,
    from the measured per-worker search throughput, every shard searched and, where a routed
    Ray run was measured, routed (paragraphs of Markdown; none without a Ray run)."""
    ray = [r for r in rows if str(r["engine"]).startswith("ray") and not r.get("route")]
    local = [r for r in rows if r["engine"] == "local"]
    if not ray:
        return []
    big = max(ray, key=lambda r: r["chunks"])
    n, w = int(big["chunks"]), int(str(big["engine"]).split("x")[1])
    shards = int(big.get("shards", w))
    rate = n * shards / (float(big["search s"]) * w)  # chunk x shard searches per worker-second
    shard = -(-target // workers)  # the audit makes one shard per worker
    growth = np.log(shard) / np.log(n / shards)  # a search's cost grows with log(shard size)
    everywhere = target * workers * growth / rate / workers / 3600
    lines = [
        f"**Plan for {target / 1e6:.0f}M chunks on a Ray cluster.** Measured here: at "
        f"{n:,} chunks on Ray with {w} one-CPU workers ({shards} shards of {n // shards:,}), "
        f"building and searching the shard indexes took {big['search s']} s, that is "
        f"{rate:,.0f} chunk-in-shard searches (index build included) per worker-second; the "
        f"largest worker process peaked at {big['peak MB (worker)']} MB."
    ]
    if local:
        one = max(local, key=lambda r: r["chunks"])
        lines[0] += (
            f" In one process the {int(one['chunks']):,}-chunk audit took {one['total s']} s with "
            f"a peak of {one['peak MB (driver)']} MB."
        )
    lines += [
        "",
        f"- **Shards.** {target / 1e6:.0f}M vectors of 384 floats are about "
        f"{target * 384 * 4 / 1e9:.0f} GB. Each worker builds its shards' indexes once: on "
        f"{workers} workers, shards of {shard / 1e6:.1f}M vectors, an HNSW index of about "
        f"{shard * (384 * 4 + 32 * 2 * 4) / 1e9:.1f} GB each; the working folder on storage "
        "every machine reads (a bucket or NFS).",
        f'- **Search, every shard** (`audit(..., engine="ray", workers={workers})`): '
        f"{workers} searches per chunk, about {everywhere:,.0f} hours at the measured rate "
        f"(slowed {growth:.2f}x for shards {shard * shards / n:.1f}x larger: an HNSW search "
        "costs about the logarithm of the shard's size).",
        _routed(rows, target, workers, routed, rate, growth),
        "- **Defend and report.** The probes are capped (`max_probes`), so the defend stage "
        "does not grow with the corpus. The report keeps ten neighbours and a few numbers per "
        f"chunk: about {target * 200 / 1e9:.0f} GB for {target / 1e6:.0f}M chunks on the "
        "driver, to be split by shard before that size.",
    ]
    return lines


def _routed(
    rows: Sequence[dict[str, Any]], target: int, workers: int, route: int, rate: float, grow: float
) -> str:
    """The plan's routed search, worked out from the every-shard ``rate`` (a routed search
    costs what any search in a shard of that size does; slowed ``grow`` for the target's
    shards), with what a routed Ray run in ``rows`` measured: its time against every shard's
    at its size, the balance of its cells, the neighbours it kept and the share of suspects
    it searched again in every shard."""
    hours = target * route * grow / rate / workers / 3600
    text = (
        f'- **Search, routed** (`audit(..., engine="ray", workers={workers}, '
        f"shards={workers}, route={route})`): shards cut by a k-means of a sample, each chunk "
        f"searched in its own shard and the {route - 1} nearest others (as an IVF index routes "
        f"a query): {route} searches per chunk, about {hours:,.1f} hours at that rate"
    )
    measured = [r for r in rows if str(r["engine"]).startswith("ray") and r.get("route")]
    if not measured:
        return f"{text}."
    big = max(measured, key=lambda r: r["chunks"])
    share = float(str(big.get("rechecked") or "0%").rstrip("%")) / 100
    again = target * share * (workers - route) * grow / rate / workers / 3600
    base = [r for r in rows if r["chunks"] == big["chunks"] and r.get("setup") == "ray"]
    against = f" against {base[0]['search s']} s searching every shard" if base else ""
    return (
        f"{text}, and the suspects searched again in every other shard ({big.get('rechecked')} "
        f"of the chunks here), about {again:,.1f} hours more. Measured here at "
        f"{int(big['chunks']):,} chunks on {big['engine']}, {big['shards']} shards searched "
        f"{big['route']} per chunk: {big['search s']} s (routing included){against}, and "
        f"{big.get('recheck s', '?')} s for the recheck; the largest cell holds "
        f"{big.get('largest shard', '?')}x the mean (its worker finishes last); neighbour "
        f"recall@10 {big['neighbour recall@10']}. That recall is this synthetic corpus's, "
        "whose topics are scattered at random with no structure above them, the worst case for "
        "cells; on real MiniLM vectors see the routed row of the [audit page](audit.md)."
    )


def _show(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)
