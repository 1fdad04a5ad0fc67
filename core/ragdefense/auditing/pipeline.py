"""``ragdefense.audit``: which documents of a knowledge base look planted?

1. Read the knowledge base in parts (stored vectors kept; nothing is written to the store).
2. Embed the parts that have no vectors.
3. Probe questions: the query log when given, else one per chunk (title / first sentence).
4. Search every probe and every chunk in the sharded vector index (FAISS when installed).
5. Run the defenses on each probe's top M (the default defense unless told otherwise).
6. Per chunk: how often it was retrieved and removed, and by which probes; its near-duplicate
   group; its source's other chunks (where chunks carry sources); a score, a verdict, reasons.

Every step writes its files to the working folder: a killed audit restarts where it stopped.
"""

from __future__ import annotations

import logging
import tempfile
import time
import warnings
from collections.abc import Iterable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .corpus import Corpus, as_corpus, fingerprint, read_queries, unique_ids
from .engines import Engine, LocalEngine, check_engine, make_engine
from .evidence import Scoring, assess, reasons, scored
from .naming import defense_names
from .probes import derive_probes
from .records import closest_questions, flag_examples
from .report import BLANK, AuditReport, Finding
from .routing import contiguous_shards, effective_route, recheck_suspects, route_parts
from .settings import AuditSettings, defense_mark, embedder_mark, queries_mark, with_overrides
from .sources import batch_sources, chunk_source, condemned_positions, note_sourced, suspect_sources
from .space import check_space, one_width, other_width
from .steps import DefendStep, EmbedStep, ShardSearchStep, step_embedder, unit
from .victims import like_reason, like_their_group, possible_victims
from .workdir import Workdir, locate, part_digest, part_name, part_starts, part_texts

__all__ = ["audit"]

logger = logging.getLogger("ragdefense")
_CHANGED = (
    "{}: the knowledge base changed since this audit read it (chunk part {} differs; or an "
    "earlier ragdefense wrote the folder): give fresh=True (--fresh), or another folder"
)


def audit(
    knowledge_base: Any,
    settings: AuditSettings | None = None,
    *,
    queries: str | Path | Iterable[str] | None = None,
    embedder: Any = None,
    workdir: str | Path | None = None,
    fresh: bool = False,
    engine: str | Engine = "local",
    address: str | None = None,
    workers: int | None = None,
    progress: bool = False,
    **overrides: Any,
) -> AuditReport:
    """Audit a whole knowledge base for planted poison; never writes to it.

    Args:
        knowledge_base: A ``.jsonl`` / ``.parquet`` file of ``{id, text, title?, embedding?,
            metadata?}`` (any other field is metadata too), a list of texts, a
            :class:`~ragdefense.auditing.corpus.Corpus`, a LangChain vector store or a
            LlamaIndex index (their stored vectors and metadata are read).
        settings: What to compute (:class:`~ragdefense.auditing.settings.AuditSettings`, each
            field documented there); default: ``AuditSettings()``.
        queries: The users' query log (a list, or a ``.txt`` / ``.jsonl`` / ``.json`` file);
            default: probes derived from the corpus (each chunk's title or first sentence).
        embedder: For chunks without stored vectors and for the probes (default: the packaged
            MiniLM); must be the model the stored vectors were made with.
        workdir: The working folder; give one to make the audit resumable (default: a
            temporary folder, removed afterwards).
        fresh: Start over instead of resuming: the audit's own files in ``workdir`` are
            removed first (a folder holding other files and no audit is refused).
        engine: ``"local"`` (this process) or ``"ray"`` (Ray Data; see ``address``,
            ``workers``).
        address: Ray: a running cluster (default ``$RAY_ADDRESS``, else a local instance).
        workers: Ray: actors per step (with another engine, it and ``address`` are errors).
        progress: Show progress bars on stderr.
        **overrides: Fields of :class:`~ragdefense.auditing.settings.AuditSettings` replacing
            those of ``settings`` (``audit(kb, part_size=32)``); any other name is a
            ``TypeError``.
    """
    chosen = with_overrides(settings, overrides)
    check_engine(engine, workers, address)
    folder: AbstractContextManager[str | Path] = (
        tempfile.TemporaryDirectory(prefix="ragdefense-audit-")
        if workdir is None
        else nullcontext(workdir)
    )
    with folder as path, ExitStack() as lock:  # the folder's lock, taken once inputs are read
        options = _Options(queries, embedder, path, fresh, engine, address, workers, progress)
        return _run(knowledge_base, chosen, options, lock)


@dataclass(frozen=True)
class _Options:
    """Where and how an audit runs (:func:`audit`'s other arguments), the folder known."""

    queries: str | Path | Iterable[str] | None
    embedder: Any
    workdir: str | Path
    fresh: bool
    engine: str | Engine
    address: str | None
    workers: int | None
    progress: bool


class _Resumable(Protocol):
    """A step that writes one file per part."""

    def __call__(self, part: int, /) -> int: ...

    def output(self, part: int, /) -> str: ...


@dataclass
class _Job:
    """An audit under way: what it computes, its inputs, its folder, where its steps run."""

    settings: AuditSettings
    options: _Options
    names: list[str]
    queries: list[str] | None
    wd: Workdir
    runner: Engine

    def map(self, step: _Resumable, parts: int, desc: str) -> None:
        """Run ``step`` on the parts (of ``parts``) whose file is not written yet."""
        todo = [p for p in range(parts) if not self.wd.has(step.output(p))]
        self.runner.map(step, todo, desc, self.options.progress)


def _run(
    knowledge_base: Any, settings: AuditSettings, options: _Options, lock: ExitStack
) -> AuditReport:
    """The audit, in ``options.workdir``: each stage resumes from the files already there."""
    started = time.perf_counter()
    stages: dict[str, float] = {}

    def lap(stage: str) -> None:
        stages[stage] = round(time.perf_counter() - started - sum(stages.values()), 2)

    job, corpus = _start(knowledge_base, settings, options, lock)
    sizes = _ingest(job.wd, corpus, settings.part_size, settings.source_key, options.embedder)
    lap("read")
    _embed_chunks(job, sizes)
    lap("embed chunks")
    n_probe_parts = _probes(job.wd, sizes, job.queries, settings.max_probes, settings.part_size)
    job.map(EmbedStep(str(job.wd.path), "probes", options.embedder), n_probe_parts, "embed probes")
    lap("probes")
    n_shards, kind = _search(job, sizes, n_probe_parts)
    lap("search")
    defend = DefendStep(
        str(job.wd.path), list(settings.defenses), n_shards, settings.top_m, options.embedder
    )
    job.map(defend, n_probe_parts, "defend")
    lap("defend")
    if job.wd.noted("route"):  # the suspects of a routed search, searched in every shard
        recheck_suspects(job.wd, job.names, settings, kind, job.map)
        lap("recheck")
    report = _report(job.wd, sizes, job.names, settings.scoring or Scoring(), settings.report_top)
    lap("report")
    engine = options.engine
    report.stats.update(
        top_m=settings.top_m,
        defenses=job.names,
        probe_source="query log" if job.queries is not None else "derived from the corpus",
        engine=engine if isinstance(engine, str) else type(engine).__name__,
        shards=n_shards,
        route=job.wd.noted("route"),
        index=kind,
        source_key=settings.source_key,
        seconds=round(time.perf_counter() - started, 2),
        stage_seconds=stages,
    )
    return report


def _start(
    knowledge_base: Any, settings: AuditSettings, options: _Options, lock: ExitStack
) -> tuple[_Job, Corpus]:
    """Read the inputs, lock the folder (:meth:`Workdir.held`, in ``lock``), record the
    parameters there (checked against those recorded on a restart), start the engine."""
    names = defense_names(settings.defenses)
    queries = None if options.queries is None else read_queries(options.queries)
    if queries is not None and settings.max_probes is not None:  # shared settings: say so
        warnings.warn("max_probes samples derived probes: a query log is asked whole", stacklevel=4)
    corpus = as_corpus(knowledge_base)
    wd = Workdir(options.workdir)
    lock.enter_context(wd.held())
    embedder = options.embedder
    wd.start(
        {
            "knowledge_base": fingerprint(corpus),
            "defenses": [defense_mark(d) for d in settings.defenses],
            "top_m": settings.top_m,
            "max_probes": settings.max_probes if queries is None else None,  # derived only
            "neighbours": settings.neighbours,
            "wide_neighbours": settings.wide_neighbours,
            "part_size": settings.part_size,
            "queries": None if queries is None else queries_mark(queries),
            "embedder": embedder_mark(embedder, wd.recorded("embedder")),
            "index": settings.index,
            "shards": settings.shards,
            "route": settings.route,
        },
        fresh=options.fresh,
    )
    runner = make_engine(options.engine, options.address, options.workers)
    return _Job(settings, options, names, queries, wd, runner), corpus


def _embed_chunks(job: _Job, sizes: list[int]) -> None:
    """Embed the chunk parts without stored vectors; note the vectors' dimension."""
    wd = job.wd
    job.map(EmbedStep(str(wd.path), "chunks", job.options.embedder), len(sizes), "embed chunks")
    if wd.noted("dim") is None:
        wd.note("dim", int(wd.read_array(f"{part_name('chunks', 0)}.npy").shape[1]) if sizes else 0)


def _search(job: _Job, sizes: list[int], n_probe_parts: int) -> tuple[int, str]:
    """Search every probe and every chunk in each shard of the index; (shards, index kind)."""
    wd, settings = job.wd, job.settings
    probe_dim = int(wd.read_array(f"{part_name('probes', 0)}.npy").shape[1])
    if probe_dim != wd.noted("dim"):
        raise other_width(wd.noted("dim"), probe_dim)
    # a resumed audit keeps its shards whatever its workers now: the parts searched stay valid
    n_shards = int(wd.noted("shards") or settings.shards or min(job.runner.workers, len(sizes)))
    route = effective_route(settings.route, n_shards, sum(sizes), needed := settings.searched)
    n_shards = n_shards if route else contiguous_shards(n_shards, len(sizes), settings.shards)
    wd.note("shards", n_shards)
    wd.note("route", route)
    largest = route_parts(wd, sizes, n_probe_parts, n_shards, route, job.map) if route else None
    kind = settings.index
    if kind == "auto":  # exact search up to 200,000 chunks in the largest shard
        kind = "flat" if (largest or sum(sizes) / n_shards) <= 200_000 else "hnsw"
    searches = [
        ("probes", n_probe_parts, settings.top_m),
        ("chunks", len(sizes), needed),
    ]
    bars = job.options.progress and isinstance(job.runner, LocalEngine)  # not a Ray actor's log
    step = ShardSearchStep(str(wd.path), n_shards, searches, kind, bars, route)
    job.map(step, n_shards, "search (a shard per worker)")
    return n_shards, kind


def _ingest(
    wd: Workdir, corpus: Any, part_size: int, source_key: str | None, embedder: Any
) -> list[int]:
    """Write the corpus as parts (skipping parts already written); the part sizes. Every part
    already in the folder must hold what the knowledge base holds now: a changed one (the same
    size, other texts) is refused, never silently mixed. The chunks' sources feed the report
    only, written again on every run (a resume reports what the metadata and ``source_key``
    give now). A run's first stored vectors are checked against ``embedder`` (``check_space``)."""
    known = wd.noted("part_digests")
    sizes, digests, sourced, checked = [], [], False, False
    for part, batch in enumerate(one_width(unique_ids(corpus.batches(part_size)))):
        name = part_name("chunks", part)
        digest = part_digest(batch.ids, batch.texts, batch.titles, batch.vectors)
        if wd.has(f"{name}.json"):  # the same ids, texts, titles and stored vectors
            if part_texts(wd, part).get("digest") != digest:
                raise ValueError(_CHANGED.format(wd.path, part))
        else:
            if known is not None:  # the knowledge base grew since the audit read it
                raise ValueError(_CHANGED.format(wd.path, part))
            if batch.vectors is not None:
                if not checked and (said := check_space(batch, step_embedder(embedder))):
                    wd.note("cautions", [said])  # said in every report: a resumed run's too
                checked = True
                wd.write_array(f"{name}.npy", unit(batch.vectors, batch.texts))
            wd.write_json(
                f"{name}.json",
                {"ids": batch.ids, "texts": batch.texts, "titles": batch.titles, "digest": digest},
            )
        sources = batch_sources(batch, source_key)
        if sources is not None:
            wd.write_json(f"{name}.sources.json", sources)
        elif wd.has(f"{name}.sources.json"):
            (wd.path / f"{name}.sources.json").unlink()
        sourced = sourced or sources is not None
        sizes.append(len(batch.ids))
        digests.append(digest)
    note_sourced(wd, sourced, source_key)
    if not sizes:
        raise ValueError("the knowledge base is empty")
    if known is not None and known != digests:
        raise ValueError(_CHANGED.format(wd.path, len(digests)))
    if known is None:
        wd.note("part_sizes", sizes)
        wd.note("part_digests", digests)
    return sizes


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
    wd.note("probes", len(probes))  # before probe_parts, which marks the stage done
    wd.note("probe_parts", parts)
    return parts


def _report(
    wd: Workdir, sizes: list[int], names: list[str], scoring: Scoring, report_top: int
) -> AuditReport:
    evidence = assess(wd, names, scoring)
    scores, own, tally = scored(evidence, names[0], scoring)
    above = scores >= scoring.threshold
    condemned = condemned_positions(evidence, tally, scoring.source_threshold)
    victims = possible_victims(wd, evidence, above, condemned, scoring)
    top = np.argsort(-scores, kind="stable")[: max(report_top, int(above.sum()))].tolist()
    above &= ~(cleared := victims.cleared(len(above)))  # possible victims, not suspects
    joined = like_their_group(wd, evidence, above, ~cleared)  # a set's members under the cut
    above[list(joined)] = True
    chosen = sorted({*top, *joined})
    examples = flag_examples(wd, wd.noted("probe_parts"), set(chosen))
    asked = closest_questions(wd, evidence.closest_probe, chosen)
    starts = part_starts(sizes)
    findings = []
    for i in chosen:  # part by part
        part, offset = locate(starts, i)
        data = part_texts(wd, part)
        source, text = chunk_source(evidence, tally, own, i), data["texts"][offset]
        above[i] &= bool(text.strip())  # a blank chunk: never suspicious, its source's aside
        findings.append(
            Finding(
                id=data["ids"][offset],
                text=text,
                score=float(scores[i]),
                suspicious=bool(above[i]),
                reasons=reasons(i, evidence, names[0], scoring, asked.get(i), source)
                + victims.reasons(i)
                + (like_reason(joined[i]) if i in joined else [])
                + ([] if text.strip() else [BLANK]),
                retrieved=int(evidence.retrieved[i]),
                flagged={d: int(evidence.flagged[d][i]) for d in names},
                probes=examples.get(i, []),
                group=evidence.group(i),
                source=None if source is None else source[0],
                victim_of=victims.unlike[i][0] if i in victims.unlike else None,
            )
        )
    findings.sort(key=lambda f: (-f.score, f.id))
    stats = {
        "chunks": sum(sizes),
        "probes": wd.noted("probes"),
        "suspicious": int(above.sum()),
        "listed": len(findings),
        "listed_down_to": float(scores[top[-1]]) if top else None,  # every score above listed
        "retrieved_at_least_once": int((evidence.retrieved > 0).sum()),
        "flagged_at_least_once": int((evidence.flagged[names[0]] > 0).sum()),
        "groups": len(evidence.groups),
        **victims.counts(),
        "joined": len(joined),
        "targeted": 0
        if evidence.targeting is None or scoring.target_threshold <= 0
        else int((evidence.targeting >= scoring.target_threshold).sum()),
        "scoring": asdict(scoring),
        "sources": len(evidence.source_names),
        "suspect_sources": suspect_sources(evidence, tally, above, scoring.source_threshold),
        "cautions": wd.noted("cautions") or [],
    }
    return AuditReport(findings, scoring.threshold, stats)
