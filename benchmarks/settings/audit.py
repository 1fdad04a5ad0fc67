"""``python -m benchmarks audit``: how well and how fast :func:`ragdefense.audit` finds planted
poison in a whole knowledge base.

Corpus: every benign passage of the shared data (RealtimeQA's web results, the RAGDefender
bundles' gold passages; duplicates dropped), with poison planted for 100 target questions (25
from each of RealtimeQA, NQ, MS MARCO, HotpotQA), the attack families of
:mod:`ragdefense.attacks` in turn (planted as the per-query benchmarks plant them) and 1, 3
or 5 passages per target. Probes are derived from the
corpus (not the target questions); a second run gives the target questions as the query log.
Recall and benign chunks flagged are also shown by kind of data (:data:`KINDS`): web results,
where several outlets report one story and a planted set sits among honest near-duplicates, and
the bundles' gold passages, where the benign chunks are the very passages the planted ones
contradict. Each run is also made with sources in the chunks' metadata: the benign chunks' own
(RealtimeQA's web results' links, counted per host; each gold passage of the other datasets a
document of its own), the planted ones' in each of :data:`LAYOUTS`.

What was looked at while choosing the scoring (:class:`~ragdefense.auditing.evidence.Scoring`):
the *tuning* part: targets from RealtimeQA and NQ attacked by ``poisonedrag``, ``injection`` or
``multi-answer``. Everything else is reported as held out: the other two datasets, and every
other family. The targeting threshold is the round margin above the 99.8th percentile of the
tuning part's benign chunks; the tuning part holds six single planted passages, too few to
choose by, and the held-out recall of margins from 0.05 to 0.3 was seen while comparing them.
The source threshold and prior were chosen on the tuning part's numbers in the layouts (the
first grid printed every split; see docs/concepts/tuning.md). With a query log the shipped score
also counts the audit's defense's (the per-query default's) removals with a set on the logged
questions (not its lone-passage veto), for chunks with some isolation or targeting; that gate is
the tuning part's best at 1% of its benign chunks. The shipped threshold was chosen as the
lowest of 0.30, 0.31, ... at which the shipped verdict with derived probes (the possible victims
aside) flagged at most 1% of the tuning part's benign chunks, on this corpus before its planted
passages were made as the per-query benchmarks make them; it was not chosen again, and on this
corpus it flags a little more (the "benign flagged: tuning part" column). The possible victims'
bar (half the words a group shares) was read on every family at once (none held out).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragdefense.attacks import ATTACKS
from ragdefense.auditing import ListCorpus, audit

from ..cases import attack_passages
from ..datasets import load_qa
from ..report import markdown_table

__all__ = ["AuditCorpus", "audit_corpus", "audit_quality", "audit_table"]

DATASETS = ("realtimeqa", "ragdefender/nq", "ragdefender/msmarco", "ragdefender/hotpotqa")
TUNING_DATASETS = ("realtimeqa", "ragdefender/nq")
TUNING_FAMILIES = ("poisonedrag", "injection", "multi-answer")
COUNTS = (1, 3, 5)
#: where the planted passages come from (the benign chunks keep their own sources): all from
#: one upload; each target's from one of 5 attacker sites; each target's from a site of its
#: own; each from an honest chunk's site (an attacker posting on sites honest documents come
#: from, where provenance should add nothing, and must take nothing away)
LAYOUTS = ("one upload", "5 attacker sites", "a site per target", "in honest sites")


@dataclass
class AuditCorpus:
    """The benchmark corpus: chunks, and for each planted one its target's dataset, family and
    count (benign chunks are absent from ``planted``)."""

    ids: list[str]
    texts: list[str]
    titles: list[str]
    planted: dict[str, tuple[str, str, int]]
    questions: list[str]
    sources: dict[str, str]
    #: per benign chunk: where it came from (a RealtimeQA web result's link; a gold passage of
    #: a RAGDefender bundle is a document of its own)
    links: dict[str, str] = field(default_factory=dict)
    #: per target (aligned with ``questions``): its correct answers, and (dataset, family, count)
    answers: list[tuple[str, ...]] = field(default_factory=list)
    targets: list[tuple[str, str, int]] = field(default_factory=list)
    #: per target: its own benign chunks (its record's passages; a passage two records hold
    #: is one chunk, owned by both)
    own: list[frozenset[str]] = field(default_factory=list)

    def corpus(self, vectors: Any = None, layout: str | None = None) -> ListCorpus:
        """As an audit input (with the vectors a store would hold, when given; with each chunk's
        source in its metadata when a :data:`LAYOUTS` ``layout`` is named)."""
        meta = None if layout is None else [{"source": s} for s in self.layout(layout)]
        return ListCorpus(self.texts, self.ids, self.titles, vectors, meta)

    def layout(self, name: str, seed: int = 1) -> list[str]:
        """Each chunk's source under the planted-source layout ``name`` (:data:`LAYOUTS`)."""
        rng = random.Random(seed)
        honest = [self.links[i] for i in self.ids if i not in self.planted]
        out = []
        for chunk_id in self.ids:
            if chunk_id not in self.planted:
                out.append(self.links[chunk_id])
                continue
            target = _target(chunk_id)
            out.append(
                {
                    "one upload": "uploads/planted.pdf",
                    "5 attacker sites": f"https://attacker-{target % 5 + 1}.example/{chunk_id}",
                    "a site per target": f"https://attacker-{target}.example/{chunk_id}",
                    "in honest sites": rng.choice(honest),
                }[name]
            )
        return out

    def target(self, chunk_id: str) -> int | None:
        """The index (in ``questions``) of the target a planted chunk was written for."""
        return _target(chunk_id) if chunk_id in self.planted else None

    def tuning(self, chunk_id: str) -> bool:
        """Whether a chunk is in the tuning part (planted, or benign from a tuning dataset)."""
        if chunk_id in self.planted:
            return _split(*self.planted[chunk_id][:2]) == "tuning"
        return self.sources[chunk_id] in TUNING_DATASETS


def _target(chunk_id: str) -> int:
    """The target index in a planted chunk's id (``t{target}-p{n}``)."""
    return int(chunk_id[1:].split("-")[0])


def _title(text: str) -> tuple[str, str]:
    head, sep, _ = text.partition("\n")
    return (head, text) if sep else ("", text)


def audit_corpus(
    folder: str | Path,
    n_targets: int = 100,
    seed: int = 0,
    counts: Sequence[int] = COUNTS,
    spread: bool = False,
) -> AuditCorpus:
    """Build the corpus (deterministic for a given ``seed``): ``counts`` planted passages per
    target, in turn, a family per run of them (``spread``: within each dataset a family and a
    count per target in turn, so that every dataset holds every family and every count); the
    planted passages are :func:`~benchmarks.cases.attack_passages`, as every per-query
    benchmark plants them; a target is labelled with what was planted for it (a family may
    have fewer texts than asked)."""
    records = {d: load_qa(folder, d) for d in DATASETS}
    ids: list[str] = []
    texts: list[str] = []
    titles: list[str] = []
    seen: dict[str, str] = {}  # passage -> its chunk
    chunks_of: dict[int, set[str]] = {}  # a record (by identity) -> its chunks
    sources: dict[str, str] = {}
    links: dict[str, str] = {}
    for dataset in DATASETS:
        for record in records[dataset]:
            for j, passage in enumerate(record.benign):
                if passage in seen:
                    chunks_of.setdefault(id(record), set()).add(seen[passage])
                if passage.strip() and passage not in seen:
                    seen[passage] = f"b{len(ids)}"
                    chunks_of.setdefault(id(record), set()).add(f"b{len(ids)}")
                    title, text = _title(passage)
                    sources[f"b{len(ids)}"] = dataset
                    links[f"b{len(ids)}"] = (
                        record.sources[j]
                        if record.sources
                        else f"https://gold-{len(ids)}.{dataset.replace('/', '-')}.example/"
                    )
                    ids.append(f"b{len(ids)}")
                    texts.append(text)
                    titles.append(title)
    rng = random.Random(seed)
    per = n_targets // len(DATASETS)
    chosen = [(d, r) for d in DATASETS for r in rng.sample(records[d], per)]
    planted: dict[str, tuple[str, str, int]] = {}
    questions, answers, targets, own = [], [], [], []
    # multi-answer's alternatives are drawn from the other questions' wrong answers
    others = {d: [r.wrong_answer for r in records[d]] for d in DATASETS}
    for t, (dataset, record) in enumerate(chosen):
        if spread:  # within each dataset, the families in turn and the counts in turn
            i = t % per + 3 * DATASETS.index(dataset)  # each dataset from another family
            family, count = ATTACKS[i % len(ATTACKS)], counts[t % per % len(counts)]
        else:
            family = ATTACKS[t % len(ATTACKS)]
            count = counts[t // len(ATTACKS) % len(counts)]
        # as the per-query benchmarks plant them (dispersed in the record's own passages)
        poison = attack_passages(record, family, count, others[dataset], seed=seed)
        count = len(poison)
        questions.append(record.question)
        answers.append(tuple(record.answers))
        own.append(frozenset(chunks_of.get(id(record), ())))
        targets.append((dataset, family, count))
        for j, passage in enumerate(poison):
            chunk_id = f"t{t}-p{j}"
            ids.append(chunk_id)
            texts.append(passage)
            titles.append("")
            planted[chunk_id] = (dataset, family, count)
    order = rng.sample(range(len(ids)), len(ids))  # planted chunks are not all at the end
    return AuditCorpus(
        [ids[i] for i in order],
        [texts[i] for i in order],
        [titles[i] for i in order],
        planted,
        questions,
        sources,
        links,
        answers,
        targets,
        own,
    )


def _split(dataset: str, family: str) -> str:
    if dataset in TUNING_DATASETS and family in TUNING_FAMILIES:
        return "tuning"
    return "held out: family" if family not in TUNING_FAMILIES else "held out: dataset"


#: the corpus's two kinds of data: RealtimeQA's web results (about 49 per question, several
#: outlets on one story), and the RAGDefender bundles' gold passages (one or two per question:
#: the passages the planted ones contradict)
KINDS = ("web (realtimeqa)", "gold (bundles)")


def _kind(dataset: str) -> str:
    return KINDS[0] if dataset == "realtimeqa" else KINDS[1]


def _recall_rows(kb: AuditCorpus, flagged: set[str], run: str, variant: str) -> dict[str, Any]:
    """One table row: recall per split, benign flagged, precision."""
    parts: dict[str, list[str]] = {}
    for chunk, (dataset, family, count) in kb.planted.items():
        parts.setdefault(_split(dataset, family), []).append(chunk)
        parts.setdefault(f"{count} per target", []).append(chunk)
        parts.setdefault(family, []).append(chunk)
        parts.setdefault(_kind(dataset), []).append(chunk)
    benign = len(kb.ids) - len(kb.planted)
    false = len(flagged - set(kb.planted))
    row: dict[str, Any] = {
        "run": run,
        "scoring": variant,
        "recall": len(flagged & set(kb.planted)) / len(kb.planted),
    }
    for name in ("tuning", "held out: family", "held out: dataset", *KINDS, *ATTACKS, *[
        f"{c} per target" for c in COUNTS
    ]):  # fmt: skip
        chunks = parts.get(name, [])
        row[name] = sum(c in flagged for c in chunks) / len(chunks) if chunks else ""
    row["benign flagged"] = f"{false} ({false / benign:.2%})"
    for kind in KINDS:
        honest = [i for i, d in kb.sources.items() if _kind(d) == kind]
        wrong = sum(i in flagged for i in honest)
        row[f"benign flagged: {kind}"] = f"{wrong} ({wrong / len(honest):.2%})" if honest else ""
    for part, tuned in (("tuning part", True), ("held-out part", False)):  # thresholds: tuning's
        honest = [i for i in kb.sources if kb.tuning(i) == tuned]
        wrong = sum(i in flagged for i in honest)
        row[f"benign flagged: {part}"] = f"{wrong} ({wrong / len(honest):.2%})" if honest else ""
    row["precision"] = (len(flagged) - false) / len(flagged) if flagged else 0.0
    return row


def at_most(benign: Sequence[float], share: float) -> float:
    """The least threshold above which (``score > threshold``) at most ``share`` of ``benign``
    lies: scores tied at it are all below it, never flagged together past the budget."""
    top = sorted(benign, reverse=True)
    allowed = int(share * len(top))
    return float(top[allowed]) if allowed < len(top) else float("-inf")


def _variants(kb: AuditCorpus, workdir: Path) -> dict[str, dict[str, float]]:
    """Scores of every chunk under the ablation's variants, from an audit's working folder (the
    audit's defense: the default): isolation and targeting (with a query log), isolation
    alone, probe evidence only (flag rate), isolation and probe evidence mixed 0.7 / 0.3, and
    with a query log the shipped score, which adds the default's flags on the logged questions
    (gated at 0.1, the tuning part's best at 1% of its benign chunks among 0.1, 0.15 and 0.2,
    with every split printed)."""
    from ragdefense.auditing.evidence import Scoring, assess, score
    from ragdefense.auditing.workdir import Workdir, part_texts

    wd = Workdir(workdir)
    ids = [i for p in range(len(wd.noted("part_sizes"))) for i in part_texts(wd, p)["ids"]]
    defenses = wd.read_json("manifest.json")["params"]["defenses"]
    evidence = assess(wd, defenses, Scoring())
    variants = {
        "isolation + targeting": Scoring(flag_threshold=0),
        "isolation": Scoring(target_threshold=0, flag_threshold=0),
        "probe flags": Scoring(probe_weight=1.0, target_threshold=0, flag_threshold=0),
        "mixed 0.3": Scoring(probe_weight=0.3, target_threshold=0, flag_threshold=0),
        "isolation + targeting + the default's flags": Scoring(),
    }
    out = {}
    for name, scoring in variants.items():
        if "targeting" in name and evidence.targeting is None:
            continue  # derived probes: no targeting, no flags on logged questions
        values = score(evidence, defenses[0], scoring)
        out[name] = dict(zip(ids, values.tolist(), strict=True))
    return out


#: the routed run's (shards, route): as the audit-scale benchmark's routed setup
ROUTED = (16, 3)


def audit_quality(
    folder: str | Path, workdir: str | Path, engine: str = "local", progress: bool = True
) -> tuple[str, list[dict[str, Any]]]:
    """Audit the benchmark corpus twice (derived probes; the target questions as query log),
    over vectors embedded once as a store holds them; the ablation of the score's evidence,
    each variant flagging what scores above its threshold, the least that leaves at most 1% of
    the tuning part's benign chunks above it (ties at it are not flagged)."""
    from ragdefense.auditing.evidence import Scoring
    from ragdefense.auditing.workdir import Workdir
    from ragdefense.embedders import default_embedder

    from .audit_scale import neighbour_recall

    kb = audit_corpus(folder)
    t0 = time.perf_counter()
    vectors = default_embedder().embed(kb.texts)
    embed_seconds = time.perf_counter() - t0
    rows = []
    for run, queries in (("derived probes", None), ("query log", kb.questions)):
        work = Path(workdir) / run.replace(" ", "-")
        for layout in (None, *LAYOUTS):
            folder = work if layout is None else work.with_name(f"{work.name}-{_slug(layout)}")
            report = audit(kb.corpus(vectors, layout), queries=queries, workdir=folder,
                           engine=engine, progress=progress)  # fmt: skip
            row = _recall_rows(kb, {f.id for f in report.suspicious}, run, "shipped default")
            found = {f.id for f in report.findings if any("honest passage" in r for r in f.reasons)}
            shown = f"{len(found - set(kb.planted))} / {len(found & set(kb.planted))}"
            rows.append({**row, "sources": layout or "none", "seconds": report.stats["seconds"],
                         "possible victims": shown})  # fmt: skip
        if queries is None:  # the same audit, its search routed: what approximate search costs
            exact = neighbour_recall(work, int(Workdir(work).noted("shards")))
            rows[-1 - len(LAYOUTS)]["neighbour recall@10"] = exact
            routed = work.with_name(f"{work.name}-routed")
            report = audit(kb.corpus(vectors), workdir=routed, engine=engine, progress=progress,
                           shards=ROUTED[0], route=ROUTED[1])  # fmt: skip
            variant = f"shipped default, search routed ({ROUTED[1]} of {ROUTED[0]} shards)"
            row = _recall_rows(kb, {f.id for f in report.suspicious}, run, variant)
            recall = neighbour_recall(routed, ROUTED[0])
            rows.append({**row, "sources": "none", "seconds": report.stats["seconds"],
                         "neighbour recall@10": recall})  # fmt: skip
        # the same audit, its possible victims counted as suspects (only the report is made again)
        kept = audit(kb.corpus(vectors), queries=queries, workdir=work,
                     scoring=Scoring(victim_share=0), engine=engine, progress=False)  # fmt: skip
        variant = "shipped default, its possible victims counted as suspects"
        rows.append({**_recall_rows(kb, {f.id for f in kept.suspicious}, run, variant),
                     "sources": "none"})  # fmt: skip
        for variant, scores in _variants(kb, work).items():
            tuning_benign = [v for i, v in scores.items() if i not in kb.planted and kb.tuning(i)]
            threshold = at_most(tuning_benign, 0.01)
            flagged = {i for i, v in scores.items() if v > threshold}
            rows.append({**_recall_rows(kb, flagged, run, variant), "threshold": threshold,
                         "sources": "none"})  # fmt: skip
    columns = ["run", "scoring", "sources", "threshold", "recall", "tuning", "held out: family"]
    columns += ["held out: dataset", *KINDS, *ATTACKS, *[f"{c} per target" for c in COUNTS]]
    columns += ["benign flagged", *[f"benign flagged: {k}" for k in KINDS]]
    columns += ["benign flagged: tuning part", "benign flagged: held-out part"]
    columns += ["precision", "possible victims", "neighbour recall@10", "seconds"]
    head = (
        f"{len(kb.ids)} chunks ({len(kb.planted)} planted for {len(kb.questions)} targets); "
        f"embedded once in {embed_seconds:.1f} s ({len(kb.ids) / embed_seconds:.0f} chunks/s, "
        f"packaged MiniLM); shipped threshold {Scoring().threshold}\n\n"
    )
    return head + _table(columns, rows), rows


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text)


def _table(columns: list[str], rows: list[dict[str, Any]]) -> str:
    def show(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    return "\n".join(markdown_table(columns, [[show(r.get(c, "")) for c in columns] for r in rows]))


def audit_table(folder: str | Path) -> tuple[list[dict[str, Any]], str]:
    """``python -m benchmarks audit``; the working folders go in a temporary folder (``--out``
    holds the results only)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ragdefense-bench-audit-") as tmp:
        work = Path(tmp) / "audit-work"
        table, rows = audit_quality(folder, work)
    return rows, table
