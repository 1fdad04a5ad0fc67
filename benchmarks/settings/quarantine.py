"""``python -m benchmarks quarantine``: a knowledge base where every attacked question's planted
passages are the majority of what it retrieves, audited once, then queried through the default
defense with and without the audit's :class:`~ragdefense.Quarantine`.

Corpus: the audit benchmark's (every benign passage of the shared data, duplicates dropped)
with 5, 10, 20 or 30 passages planted per target question (40 targets, ten from each of
RealtimeQA, NQ, MS MARCO and HotpotQA, each dataset's targets taking the attack families in
turn, so that every dataset holds every family and the tuning and held-out columns compare
families, not datasets, and the counts in turn; planted as the per-query benchmarks plant
them; a family with fewer texts than asked plants what it has,
and the target is counted with what was planted), no provenance at query
time. Each target question is asked as the one line asks it, k = 5: the defense's pool by
MiniLM similarity from the whole corpus (2k, at least 8), widened as the adapters widen it
for a given k while the defense keeps fewer than k (twice over; with a quarantine, until the
fetch passes the first pool by every chunk it holds), and the context is the top k it keeps.
The audit runs with its shipped score: with probes derived from the corpus (never the target
questions), and with the target questions as its query log (the users asked them: that is why
they were attacked); and, derived probes again,
over the chunks with sources in their metadata (the benign chunks' own; the planted ones from 5
attacker sites, from a site per target, or each on an honest chunk's site, where a condemned
source would take honest chunks with it: the audit benchmark's layouts), where the passages
carry those sources at query time too (a store returns the metadata it was audited with: the
quarantine matches a chunk condemned for its source by text and source) and the per-query
defense still reads their text only (``source_key=None``). The
context slots held by planted passages written for *another* target question are counted apart
too: every target's set is in the one corpus, and a pool widened far enough reaches them.

What was looked at: no threshold was chosen on this corpus, but three rules were found and
kept by reading what it let through, every family at once: a set's last members held with it,
near-copies grouped inside large near-duplicate components, and only the default's removals
with a set counted as the audit's flags (see docs/concepts/tuning.md). Its held-out columns
compare attack families the shipped rules were not chosen on, not families never looked at.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ragdefense import Passage, Quarantine, audit, defense
from ragdefense.attacks import DEFAULT_ATTACKS
from ragdefense.embedders import as_embedder
from ragdefense.integration.retrieval import fetch_rounds, fetched_enough, pool_size, wider
from ragdefense.text import contains_answer

from ..report import markdown_table
from .audit import audit_corpus

__all__ = ["COUNTS", "quarantine_table"]

COUNTS = (5, 10, 20, 30)
#: the planted-source layouts an audit with sources is run on (the benign chunks keep theirs)
SOURCE_LAYOUTS = ("5 attacker sites", "a site per target", "in honest sites")
K = 5


def _one_line(
    guard: Any, question: str, q: np.ndarray, ranking: np.ndarray, kb: Any, vectors: Any, sims: Any
) -> tuple[list[Passage], list[int]]:
    """What ``defend(retriever)`` hands the generator for ``k = K``: the passages of the last
    pool and the context's positions in it. ``guard``: a defense, or ``(defense, sources)``
    (each chunk's source, in the passages' metadata)."""
    guard, sources = guard if isinstance(guard, tuple) else (guard, None)
    fetch = K if guard is None else pool_size(guard, K)
    for _ in range(fetch_rounds(guard, k_given=True)):  # the adapters' rounds for a given k
        top = ranking[:fetch]
        passages = [
            Passage(kb.texts[i], id=kb.ids[i], metadata={"source": sources[i]} if sources else {})
            for i in top
        ]
        if guard is None:
            return passages, list(range(min(K, len(top))))
        result = guard.defend_embeddings(question, passages, vectors[top], q)
        kept = sorted(result.kept_indices, key=lambda i: -sims[top[i]])
        if fetched_enough(K, fetch, len(top), len(kept)):  # the adapters' own stop rule
            break
        fetch = wider(fetch) or fetch
    return passages, kept[:K]


def quarantine_table(
    folder: str | Path,
    n_targets: int = 40,
    embedder: Any = None,
    workdir: str | Path | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """Poison share of the context and answer-in-context, per defense and planted count."""
    kb = audit_corpus(folder, n_targets=n_targets, counts=COUNTS, spread=True)
    emb = as_embedder(embedder)
    vectors = emb.embed(kb.texts)
    with tempfile.TemporaryDirectory() as tmp:
        report = audit(kb.corpus(vectors), embedder=emb, workdir=Path(workdir or tmp) / "d")
        logged = audit(  # the users asked the attacked questions: they are in the query log
            kb.corpus(vectors),
            embedder=emb,
            queries=kb.questions,
            workdir=Path(workdir or tmp) / "q",
        )
        sourced = {  # the chunks' sources in their metadata (the audit benchmark's layouts)
            layout: audit(
                kb.corpus(vectors, layout),
                embedder=emb,
                workdir=Path(workdir or tmp) / f"s{n}",
            )
            for n, layout in enumerate(SOURCE_LAYOUTS)
        }
    flagged = {f.id for f in report.suspicious}
    flagged_logged = {f.id for f in logged.suspicious}
    planted = set(kb.planted)
    benign = len(kb.ids) - len(planted)
    defenses: dict[str, Any] = {
        "none": None,
        "default": defense("consensus", embedder=emb),
        "default + quarantine": Quarantine.from_report(report, defense("consensus", embedder=emb)),
        "default + quarantine (every flagged chunk)": Quarantine.from_report(
            report, defense("consensus", embedder=emb), grouped=False
        ),
        "default + quarantine (audit with the query log)": Quarantine.from_report(
            logged, defense("consensus", embedder=emb)
        ),
        "default + quarantine (audit with the query log, every flagged chunk)": (
            Quarantine.from_report(logged, defense("consensus", embedder=emb), grouped=False)
        ),
        **{
            f"default + quarantine (audit with sources: {layout})": (
                Quarantine.from_report(found, defense("consensus", embedder=emb, source_key=None)),
                kb.layout(layout),
            )
            for layout, found in sourced.items()
        },
        "strict": defense("strict", embedder=emb),
    }
    cells: dict[tuple[str, str], list[tuple[float, bool]]] = {}
    short = dict.fromkeys(defenses, 0)  # contexts under K passages (an empty one: no poison)
    # context slots held by another target's planted passages (poison for another question)
    strays: dict[str, list[float]] = {name: [] for name in defenses}  # their query similarity
    stray_share: dict[str, list[float]] = {name: [] for name in defenses}
    row_of = {chunk_id: n for n, chunk_id in enumerate(kb.ids)}
    for t, (question, answers, (_, family, count)) in enumerate(
        zip(kb.questions, kb.answers, kb.targets, strict=True)
    ):
        q = emb.embed_query(question)
        sims = vectors @ q
        ranking = np.argsort(-sims)
        for name, guard in defenses.items():
            passages, ctx = _one_line(guard, question, q, ranking, kb, vectors, sims)
            share = sum(passages[i].id in planted for i in ctx) / len(ctx) if ctx else 0.0
            short[name] += len(ctx) < K
            stray = [
                float(sims[row_of[str(passages[i].id)]])
                for i in ctx
                if kb.target(str(passages[i].id)) not in (None, t)
            ]
            strays[name] += stray
            stray_share[name].append(len(stray) / len(ctx) if ctx else 0.0)
            found = any(  # one of its own honest passages (another question's may hold the
                # string by chance; a planted one may hold a short answer's), as threats counts
                passages[i].id in kb.own[t] and contains_answer(passages[i].text, answers)
                for i in ctx
            )
            split = "tuning" if family in DEFAULT_ATTACKS else "held out"
            for key in ("all", f"{count} planted", split):
                cells.setdefault((name, key), []).append((share, found))
    planted_counts = sorted({count for _, _, count in kb.targets})
    columns = ["all", *[f"{c} planted" for c in planted_counts], "tuning", "held out"]
    rows: list[dict[str, Any]] = [
        {
            "defense": name,
            **{
                col: {
                    "poison_share": float(np.mean([s for s, _ in cells[(name, col)]])),
                    "answer_in_context": float(np.mean([f for _, f in cells[(name, col)]])),
                }
                for col in columns
                if (name, col) in cells
            },
            "short_contexts": short[name],
            "other_targets_share": float(np.mean(stray_share[name])),
        }
        for name in defenses
    ]
    table = markdown_table(
        ["defense", *columns],
        [[r["defense"], *[_cell(r.get(col)) for col in columns]] for r in rows],
    )
    lines = [
        f"{len(kb.ids)} chunks, {len(planted)} planted for {len(kb.questions)} targets "
        f"({', '.join(map(str, COUNTS))} asked per target, each dataset every count); the audit "
        "flagged "
        f"{len(flagged & planted)} of {len(planted)} planted chunks and "
        f"{len(flagged - planted)} of {benign} benign ({len(flagged - planted) / benign:.2%}); "
        f"with the target questions as its query log, {len(flagged_logged & planted)} planted "
        f"and {len(flagged_logged - planted)} benign "
        f"({len(flagged_logged - planted) / benign:.2%}); with sources, "
        + "; ".join(
            f"{layout}: {len(ids & planted)} planted and {len(ids - planted)} benign"
            for layout, ids in ((k, {f.id for f in r.suspicious}) for k, r in sourced.items())
        )
        + ".",
        "",
        f"Per target question, the one line's pool and rounds, context {K}; cells: poison share "
        "of the context / share of questions whose context holds a correct answer in one of "
        "the question's own passages (tuning "
        f"families: {', '.join(DEFAULT_ATTACKS)}; the others held out):",
        "",
        *table,
        "",
        'Of the poison share in "all", the part held by planted passages written for another '
        "target question (off its subject; the pool reaches them as the one line widens it): "
        + ", ".join(
            f"{name} {np.mean(stray_share[name]):.3f}"
            + (f" (query similarity {min(found):.2f}-{max(found):.2f})" if found else "")
            for name, found in strays.items()
            if name != "none"
        )
        + ".",
        "",
        f"Contexts of fewer than {K} passages (the one line's fetch rounds spent; an empty one "
        "counts as no poison): "
        + (", ".join(f"{n} {c}" for n, c in short.items() if c) or "none")
        + ".",
    ]
    rows.append(
        {
            "defense": "audit",
            "planted_flagged": len(flagged & planted),
            "planted": len(planted),
            "benign_flagged": len(flagged - planted),
            "benign": benign,
            "planted_flagged_with_query_log": len(flagged_logged & planted),
            "benign_flagged_with_query_log": len(flagged_logged - planted),
        }
    )
    return rows, "\n".join(lines)


def _cell(value: dict[str, float] | None) -> str:
    if not value:
        return ""
    return f"{value['poison_share']:.3f} / {value['answer_in_context']:.2f}"
