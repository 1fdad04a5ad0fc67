"""``python -m benchmarks quarantine``: a knowledge base where every attacked question's planted
passages are the majority of what it retrieves, audited once, then queried through the default
defense with and without the audit's :class:`~ragdefense.Quarantine`.

Corpus: the audit benchmark's (every benign passage of the shared data, duplicates dropped)
with 5, 10, 20 or 30 passages planted per target question (40 targets, ten from each of
RealtimeQA, NQ, MS MARCO and HotpotQA; the attack families in turn), no provenance. Each target
question retrieves its top 10 by MiniLM similarity from the whole corpus; the defense runs on
those with the stored vectors; the context is the top 5 it keeps. The audit uses probes derived
from the corpus (never the target questions) and its shipped score; nothing here was tuned.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ragdefense import Passage, Quarantine, audit, defense
from ragdefense.attacks import DEFAULT_ATTACKS
from ragdefense.embedders import as_embedder
from ragdefense.text import contains_answer

from ..report import markdown_table
from .audit import audit_corpus

__all__ = ["COUNTS", "quarantine_table"]

COUNTS = (5, 10, 20, 30)
M, K = 10, 5


def _context(result: Any, sims: np.ndarray) -> list[int]:
    kept = result.kept_indices if result is not None else range(len(sims))
    return sorted(kept, key=lambda i: -sims[i])[:K]


def quarantine_table(
    folder: str | Path,
    n_targets: int = 40,
    embedder: Any = None,
    workdir: str | Path | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """Poison share of the context and answer-in-context, per defense and planted count."""
    kb = audit_corpus(folder, n_targets=n_targets, counts=COUNTS)
    emb = as_embedder(embedder)
    vectors = emb.embed(kb.texts)
    with tempfile.TemporaryDirectory() as tmp:
        report = audit(kb.corpus(vectors), embedder=emb, workdir=workdir or tmp)
    flagged = {f.id for f in report.suspicious}
    planted = set(kb.planted)
    benign = len(kb.ids) - len(planted)
    defenses: dict[str, Any] = {
        "none": None,
        "default": defense("consensus", embedder=emb),
        "default + quarantine": Quarantine.from_report(report, defense("consensus", embedder=emb)),
        "default + quarantine (every flagged chunk)": Quarantine.from_report(
            report, defense("consensus", embedder=emb), grouped=False
        ),
        "strict": defense("strict", embedder=emb),
    }
    cells: dict[tuple[str, str], list[tuple[float, bool]]] = {}
    for question, answers, (_, family, count) in zip(
        kb.questions, kb.answers, kb.targets, strict=True
    ):
        q = emb.embed_query(question)
        sims = vectors @ q
        top = np.argsort(-sims)[:M]
        passages = [Passage(kb.texts[i], id=kb.ids[i]) for i in top]
        for name, guard in defenses.items():
            result = (
                None
                if guard is None
                else guard.defend_embeddings(question, passages, vectors[top], q)
            )
            ctx = _context(result, sims[top])
            share = sum(passages[i].id in planted for i in ctx) / len(ctx) if ctx else 0.0
            found = any(contains_answer(passages[i].text, answers) for i in ctx)
            split = "tuning" if family in DEFAULT_ATTACKS else "held out"
            for key in ("all", f"{count} planted", split):
                cells.setdefault((name, key), []).append((share, found))
    columns = ["all", *[f"{c} planted" for c in COUNTS], "tuning", "held out"]
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
        }
        for name in defenses
    ]
    table = markdown_table(
        ["defense", *columns],
        [[r["defense"], *[_cell(r.get(col)) for col in columns]] for r in rows],
    )
    lines = [
        f"{len(kb.ids)} chunks, {len(planted)} planted for {len(kb.questions)} targets "
        f"({', '.join(map(str, COUNTS))} each); the audit flagged "
        f"{len(flagged & planted)} of {len(planted)} planted chunks and "
        f"{len(flagged - planted)} of {benign} benign ({len(flagged - planted) / benign:.2%}).",
        "",
        f"Per target question, top {M} retrieved, context {K}; cells: poison share of the "
        "context / share of questions whose context holds a correct answer (tuning families: "
        f"{', '.join(DEFAULT_ATTACKS)}; the others held out):",
        "",
        *table,
    ]
    rows.append(
        {
            "defense": "audit",
            "planted_flagged": len(flagged & planted),
            "planted": len(planted),
            "benign_flagged": len(flagged - planted),
            "benign": benign,
        }
    )
    return rows, "\n".join(lines)


def _cell(value: dict[str, float] | None) -> str:
    if not value:
        return ""
    return f"{value['poison_share']:.3f} / {value['answer_in_context']:.2f}"
