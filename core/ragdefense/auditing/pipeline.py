"""``ragdefense.audit``: which documents of a knowledge base look planted?

1. Read the knowledge base in parts (stored vectors kept; nothing is written to the store).
2. Embed the parts that have no vectors.
3. Probe questions: the query log when given, else one per chunk (title / first sentence).
4. Search every probe and every chunk in the sharded vector index (FAISS when installed).
5. Run the defenses on each probe's top M (the default defense unless told otherwise).
6. Per chunk: how often it was retrieved and removed, and by which probes; tight near-duplicate
   groups (each chunk's nearest neighbours); a score, a verdict, the reasons.

Every step writes its files to the working folder: a killed audit restarts where it stopped.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .corpus import as_corpus, fingerprint, read_queries
from .engines import Engine, make_engine
from .evidence import Scoring, assess, flag_examples, reasons, score
from .probes import derive_probes
from .report import AuditReport, Finding
from .steps import DefendStep, EmbedStep, SearchStep, unit
from .workdir import Workdir, locate, part_name, part_starts, part_texts

__all__ = ["audit"]

logger = logging.getLogger("ragdefense")


def audit(
    knowledge_base: Any,
    *,
    queries: str | Path | Iterable[str] | None = None,
    defenses: Sequence[Any] = ("ragdefender",),
    embedder: Any = None,
    top_m: int = 10,
    max_probes: int | None = None,
    neighbours: int = 10,
    scoring: Scoring | None = None,
    workdir: str | Path | None = None,
    fresh: bool = False,
    engine: str | Engine = "local",
    address: str | None = None,
    workers: int | None = None,
    part_size: int = 512,
    index: str = "auto",
    report_top: int = 1000,
    progress: bool = False,
) -> AuditReport:
    """Audit a whole knowledge base for planted poison; never writes to it.

    Args:
        knowledge_base: A ``.jsonl`` / ``.parquet`` file of ``{id, text, title?, embedding?}``,
            a list of texts, a :class:`~ragdefense.auditing.corpus.Corpus`, a LangChain vector
            store or a LlamaIndex index (their stored vectors are reused).
        queries: The users' query log (a list, or a ``.txt`` / ``.jsonl`` / ``.json`` file);
            default: probes derived from the corpus (each chunk's title or first sentence).
        defenses: Registry names or defense objects run on each probe's top ``top_m``; the
            first one's flags score the chunks.
        embedder: For chunks without stored vectors and for the probes (default: the packaged
            MiniLM); must be the model the stored vectors were made with.
        top_m: Chunks retrieved per probe.
        max_probes: At most this many derived probes (a seeded sample).
        neighbours: Nearest neighbours per chunk for the near-duplicate groups.
        scoring: Weights and thresholds (:class:`~ragdefense.auditing.evidence.Scoring`).
        workdir: The working folder; give one to make the audit resumable (default: a
            temporary folder, removed afterwards).
        fresh: Clear ``workdir`` first instead of resuming.
        engine: ``"local"`` (this process) or ``"ray"`` (Ray Data; see ``address``,
            ``workers``).
        part_size: Chunks / probes per part (the unit of work, of resuming and of memory).
        index: ``"flat"`` (exact), ``"hnsw"`` (approximate, for millions of chunks) or
            ``"auto"`` (flat up to 200,000 chunks per shard).
        report_top: The report lists every suspicious chunk and at least this many of the
            highest scores.
        progress: Show progress bars on stderr.
    """
    if top_m < 2 or neighbours < 1 or part_size < 1:
        raise ValueError("top_m must be >= 2, neighbours and part_size >= 1")
    if not defenses:
        raise ValueError("give at least one defense")
    scoring = scoring or Scoring()
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="ragdefense-audit-") as tmp:
            return audit(
                knowledge_base, queries=queries, defenses=defenses, embedder=embedder,
                top_m=top_m, max_probes=max_probes, neighbours=neighbours, scoring=scoring,
                workdir=tmp, engine=engine, address=address, workers=workers,
                part_size=part_size, index=index, report_top=report_top, progress=progress,
            )  # fmt: skip
    started = time.perf_counter()
    names = [d if isinstance(d, str) else type(d).__name__ for d in defenses]
    query_list = None if queries is None else read_queries(queries)
    corpus = as_corpus(knowledge_base)
    wd = Workdir(workdir)
    wd.start(
        {
            "knowledge_base": fingerprint(corpus),
            "defenses": names,
            "top_m": top_m,
            "max_probes": max_probes,
            "neighbours": neighbours,
            "part_size": part_size,
            "queries": None if query_list is None else len(query_list),
            "embedder": None if embedder is None else repr(type(embedder)),
            "index": index,
        },
        fresh=fresh,
    )
    runner = make_engine(engine, address, workers)
    stages: dict[str, float] = {}

    def lap(stage: str) -> None:
        stages[stage] = round(time.perf_counter() - started - sum(stages.values()), 2)

    sizes = _ingest(wd, corpus, part_size)
    lap("read")
    pending = [p for p in range(len(sizes)) if not wd.has(f"{part_name('chunks', p)}.npy")]
    runner.map(EmbedStep(str(wd.path), "chunks", embedder), pending, "embed chunks", progress)
    if wd.noted("dim") is None:
        wd.note("dim", int(wd.read_array(f"{part_name('chunks', 0)}.npy").shape[1]) if sizes else 0)
    lap("embed chunks")

    n_probe_parts = _probes(wd, sizes, query_list, max_probes, part_size)
    pending = [p for p in range(n_probe_parts) if not wd.has(f"{part_name('probes', p)}.npy")]
    runner.map(EmbedStep(str(wd.path), "probes", embedder), pending, "embed probes", progress)
    lap("probes")

    probe_dim = int(wd.read_array(f"{part_name('probes', 0)}.npy").shape[1])
    if probe_dim != wd.noted("dim"):
        raise ValueError(
            f"the stored vectors have {wd.noted('dim')} dimensions but the embedder gives "
            f"{probe_dim}: pass embedder=, the model the knowledge base was embedded with"
        )
    n_shards = max(1, min(runner.workers, len(sizes)))
    wd.note("shards", n_shards)
    kind = index if index != "auto" else ("flat" if sum(sizes) / n_shards <= 200_000 else "hnsw")
    for shard in range(n_shards):
        for what, parts, k in (
            ("probes", n_probe_parts, top_m),
            ("chunks", len(sizes), neighbours + 1),
        ):
            step = SearchStep(str(wd.path), what, shard, n_shards, k, kind)
            todo = [p for p in range(parts) if not wd.has(step.output(p))]
            runner.map(step, todo, f"search {what} (shard {shard + 1}/{n_shards})", progress)
    lap("search")

    defend = DefendStep(str(wd.path), list(defenses), n_shards, top_m, embedder)
    todo = [p for p in range(n_probe_parts) if not wd.has(defend.output(p))]
    runner.map(defend, todo, "defend", progress)
    lap("defend")

    report = _report(wd, sizes, names, scoring, report_top)
    lap("report")
    report.stats.update(
        top_m=top_m,
        defenses=names,
        probe_source="query log" if query_list is not None else "derived from the corpus",
        engine=engine if isinstance(engine, str) else type(engine).__name__,
        shards=n_shards,
        index=kind,
        seconds=round(time.perf_counter() - started, 2),
        stage_seconds=stages,
    )
    return report


def _digest(ids: Sequence[str], texts: Sequence[str]) -> str:
    """A part's identity: a hash of its ids and texts."""
    return hashlib.sha256("\0".join([*ids, *texts]).encode("utf-8")).hexdigest()[:32]


def _ingest(wd: Workdir, corpus: Any, part_size: int) -> list[int]:
    """Write the corpus as parts (skipping parts already written); the part sizes. Every part
    already in the folder must hold what the knowledge base holds now: an audit resumed on a
    changed knowledge base (the same size, other texts) is refused, never silently mixed."""
    known = wd.noted("part_digests")
    sizes, digests = [], []
    for part, batch in enumerate(corpus.batches(part_size)):
        name = part_name("chunks", part)
        digest = _digest(batch.ids, batch.texts)
        if wd.has(f"{name}.json"):
            written = part_texts(wd, part)
            if _digest(written["ids"], written["texts"]) != digest:
                raise ValueError(_changed(wd, part))
        else:
            if known is not None:  # the knowledge base grew since the audit read it
                raise ValueError(_changed(wd, part))
            if batch.vectors is not None:
                wd.write_array(f"{name}.npy", unit(batch.vectors))
            wd.write_json(
                f"{name}.json", {"ids": batch.ids, "texts": batch.texts, "titles": batch.titles}
            )
        sizes.append(len(batch.ids))
        digests.append(digest)
    if not sizes:
        raise ValueError("the knowledge base is empty")
    if known is not None and known != digests:
        raise ValueError(_changed(wd, len(digests)))
    if known is None:
        wd.note("part_sizes", sizes)
        wd.note("part_digests", digests)
    return sizes


def _changed(wd: Workdir, part: int) -> str:
    return (
        f"{wd.path}: the knowledge base changed since this audit read it (chunk part {part} "
        "differs): give fresh=True (--fresh) to start over, or another folder"
    )


def _probes(
    wd: Workdir, sizes: list[int], queries: list[str] | None, max_probes: int | None, size: int
) -> int:
    """Write the probe parts (once); their number."""
    known = wd.noted("probe_parts")
    if known is not None:
        return int(known)
    if queries is not None:
        probes = [(q, "query log") for q in queries]
    else:

        def chunks() -> Iterable[tuple[str, str, str]]:
            for part in range(len(sizes)):
                data = part_texts(wd, part)
                yield from zip(data["ids"], data["texts"], data["titles"], strict=True)

        probes = derive_probes(chunks(), max_probes)
    if not probes:
        raise ValueError("no probe: the corpus has no title or sentence of 3 words or more")
    parts = 0
    for start in range(0, len(probes), size):
        chunk = probes[start : start + size]
        wd.write_json(
            f"{part_name('probes', parts)}.json",
            {
                "ids": [f"q{start + i}" for i in range(len(chunk))],
                "texts": [p for p, _ in chunk],
                "sources": [s for _, s in chunk],
            },
        )
        parts += 1
    wd.note("probe_parts", parts)
    wd.note("probes", len(probes))
    return parts


def _report(
    wd: Workdir, sizes: list[int], names: list[str], scoring: Scoring, report_top: int
) -> AuditReport:
    evidence = assess(wd, names, scoring)
    scores = score(evidence, names[0], scoring)
    suspicious = int((scores >= scoring.threshold).sum())
    # the report lists every suspicious chunk and at least the `report_top` highest scores
    chosen = np.argsort(-scores, kind="stable")[: max(report_top, suspicious)].tolist()
    examples = flag_examples(wd, wd.noted("probe_parts"), set(chosen))
    starts = part_starts(sizes)
    findings = []
    for i in sorted(chosen):  # part by part
        part, offset = locate(starts, i)
        data = part_texts(wd, part)
        findings.append(
            Finding(
                id=data["ids"][offset],
                text=data["texts"][offset],
                score=float(scores[i]),
                suspicious=bool(scores[i] >= scoring.threshold),
                reasons=reasons(i, evidence, names[0], scoring),
                retrieved=int(evidence.retrieved[i]),
                flagged={d: int(evidence.flagged[d][i]) for d in names},
                probes=examples.get(i, []),
                group=evidence.group(i),
            )
        )
    findings.sort(key=lambda f: (-f.score, f.id))
    stats = {
        "chunks": sum(sizes),
        "probes": wd.noted("probes"),
        "suspicious": suspicious,
        "listed": len(findings),
        "retrieved_at_least_once": int((evidence.retrieved > 0).sum()),
        "flagged_at_least_once": int((evidence.flagged[names[0]] > 0).sum()),
        "groups": len(evidence.groups),
        "scoring": asdict(scoring),
    }
    return AuditReport(findings, scoring.threshold, stats)
