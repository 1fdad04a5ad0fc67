"""The one-store scenario of ``python -m benchmarks threats``: every benign passage of the data in
one store (RealtimeQA's web results and the RAGDefender bundles' gold passages), each question
fetching the pool the one line fetches, at each framework's default context; and the same store
with one planted passage per question (every question's at once), family by family. A bundle's
question finds one passage or two on its subject there, where RealtimeQA's top 10 holds many:
the vote on unsupported passages has little to go by.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..cases import Case, one_line_pool, store_cases
from ..datasets import QARecord
from ..report import markdown_table

__all__ = [
    "CLEAN",
    "PLANTED",
    "STORE_CONTEXTS",
    "STORE_DATASETS",
    "store_groups",
    "store_lines",
    "store_setting",
]

#: each framework's default k: LangChain's ``as_retriever()``, LlamaIndex's ``similarity_top_k``
STORE_CONTEXTS = (4, 2)
STORE_DATASETS = ("realtimeqa", "ragdefender/nq", "ragdefender/msmarco", "ragdefender/hotpotqa")
#: the scenarios: the clean store, and the store with one planted passage per question
CLEAN, PLANTED = "store", "store, 1 planted"

Key = tuple[str, str, str, str]
#: (row, scenario, settings, family or families) -> "poison share / answer"
Cell = Callable[[str, str, list[str], str | Sequence[str]], str]


def store_setting(dataset: str, k: int) -> str:
    """A store cell's setting: the question's dataset and the context."""
    return f"{dataset}, context {k}"


def store_groups(
    records: Sequence[QARecord],
    embedder: Any,
    families: Sequence[str],
    poison: Callable[[Sequence[QARecord], str], dict[str, list[str]]],
) -> dict[Key, list[Case]]:
    """(scenario, setting, family, kind) -> cases: the clean store (family ``"-"``), and per
    family the store holding ``poison(records, family)`` (one passage per question id, called
    with the records of one dataset) for every question at once."""
    planted = {
        family: {
            (d, qid): texts
            for d in STORE_DATASETS
            for qid, texts in poison([r for r in records if r.dataset == d], family).items()
        }
        for family in families
    }
    out: dict[Key, list[Case]] = {}
    for k in STORE_CONTEXTS:
        runs = [(CLEAN, "-", None), *((PLANTED, f, planted[f]) for f in families)]
        for scenario, family, texts in runs:
            for kind, cases in store_cases(records, embedder, k=k, planted=texts).items():
                for case in cases:
                    key = (scenario, store_setting(case.dataset, k), family, kind)
                    out.setdefault(key, []).append(case)
    return out


def store_lines(
    by: dict[Any, dict[str, Any]], labels: Sequence[str], cell: Cell, tuning: str, held: list[str]
) -> list[str]:
    """The page's two store tables: the clean store's answer by dataset and context, and the
    planted store's poison share / answer."""
    at = {d: [store_setting(d, k) for k in STORE_CONTEXTS] for d in STORE_DATASETS}
    clean = [
        [label, *(" / ".join(_answer(by, (label, CLEAN, s, "-")) for s in at[d]) for d in at)]
        for label in labels
    ]
    contexts = " / ".join(map(str, STORE_CONTEXTS))
    clean_header = ["row", *(f"{d.split('/')[-1]} (context {contexts})" for d in at)]
    questions = sum(by.get(("none", CLEAN, at[d][0], "-"), {}).get("cases", 0) for d in at)
    first, second = ([at[d][i] for d in at] for i in range(2))
    planted = [
        [
            label,
            *(cell(label, PLANTED, [at[d][0]], tuning) for d in at),
            cell(label, PLANTED, first, held),
            cell(label, PLANTED, second, tuning),
        ]
        for label in labels
    ]
    planted_header = ["row", *(d.split("/")[-1] for d in at), "held out", "context 2"]
    return [
        'Clean retrieval from one store (column "clean, one store"): every benign passage '
        "of the data in one store, RealtimeQA's web results and the bundles' gold passages; "
        f"each of {questions} questions fetches the pool the one line fetches "
        f"({' / '.join(str(one_line_pool(k)) for k in STORE_CONTEXTS)}), its answer "
        "its own gold passages (bundles) or its own results holding an answer (RealtimeQA). "
        "A bundle's question finds one passage or two on its subject, the rest of the pool "
        "about neighbouring ones; a RealtimeQA question finds its own web results. Share of "
        "questions whose context holds an answer, at LangChain's context (4) / LlamaIndex's "
        "(2); the trusted row trusts the bundles' passages, not the web's:",
        "",
        *markdown_table(clean_header, clean),
        "",
        'The same store with one planted passage per question (column "one store, 1 planted"; '
        "every question's at once, from one attacker host, and another question's planted "
        "passage in a pool counts as poison too): poison share of the context / "
        f"share whose context holds an answer; {tuning} by dataset at context 4, then every "
        "dataset: the held-out families at context 4, and "
        f"{tuning} at context 2:",
        "",
        *markdown_table(planted_header, planted),
    ]


def _answer(by: dict[Any, dict[str, Any]], key: Key) -> str:
    """A cell's share of questions whose context holds an answer ("-" where it did not run)."""
    return f"{by[key]['gold_in_context']:.2f}" if key in by else "-"
