"""The GRADA setting: RealtimeQA web results + 0/1/3/5 poison, top M = 10 retrieved, context of
n = 5; GRADA's variants against the reference implementation's numbers."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from typing import Any

from ragdefense.defenses import registry
from ragdefense.similarity import BM25

from ..cases import case_embedder, realtimeqa_cases
from ..datasets import load_realtimeqa
from ..report import cell, markdown_table
from ..runner import CaseDefense, no_defense, on_case, run_cases, summarize

__all__ = ["GRADA_REFERENCE", "grada_table", "grada_variants", "run_realtimeqa_bench"]

# A reference implementation of the GRADA paper on this setting (poison share of the context /
# share of queries whose context holds a correct answer string), from the GRADA issue.
GRADA_REFERENCE = {
    "none": {1: (0.186, 0.62), 3: (0.544, 0.55), 5: (0.854, 0.17)},
    "ebd": {1: (0.056, 0.63), 3: (0.402, 0.62)},
    "bm25": {1: (0.108, 0.66), 3: (0.464, 0.61)},
    "hrsim": {1: (0.014, 0.63), 3: (0.338, 0.61), 5: (0.784, 0.28)},
}


def grada_variants() -> dict[str, CaseDefense]:
    """The GRADA variants benchmarked (embeddings given, as a vector store would)."""
    return {
        "none": no_defense,
        "ebd": on_case(registry.defense("grada-ebd")),
        "bm25": on_case(registry.defense("grada-bm25")),
        "hrsim": on_case(registry.defense("grada")),
        "hrsim (authors' BM25 collection)": on_case(
            registry.defense("grada", bm25=BM25(corpus="pair"))
        ),
        "hrsim/ebd": on_case(registry.defense("grada-hrsim-ebd")),
        "hrsim+peel": on_case(registry.defense("grada-peel")),
    }


def run_realtimeqa_bench(
    folder: str | os.PathLike[str],
    defenses: dict[str, CaseDefense],
    n_poison: Sequence[int] = (0, 1, 3, 5),
    limit: int | None = None,
    embedder: Any = None,
) -> list[dict[str, Any]]:
    """Run ``defenses`` on the GRADA setting (RealtimeQA top 10, context 5); one row per
    (poison count, defense)."""
    cases = realtimeqa_cases(load_realtimeqa(folder)[:limit], n_poison, case_embedder(embedder))
    rows: list[dict[str, Any]] = []
    for p in n_poison:
        sub = [c for c in cases if c.setting == f"{p}p"]
        for name, defense in defenses.items():
            rows.append(
                {"poison": p, "defense": name}
                | summarize(run_cases(defense, sub, f"{p} poison {name}"))
            )
    return rows


def grada_table(
    folder: str | os.PathLike[str],
    n_poison: Sequence[int] = (0, 1, 3, 5),
    limit: int | None = None,
    embedder: Any = None,
    defenses: dict[str, CaseDefense] | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """The GRADA benchmark on RealtimeQA: top M=10 retrieved, context n=5."""
    defenses = defenses or grada_variants()
    rows = run_realtimeqa_bench(folder, defenses, n_poison, limit, embedder)
    by = {(r["poison"], r["defense"]): r for r in rows}
    names = list(defenses)
    quality = []
    for p in n_poison:
        cells = []
        for name in names:
            ref = GRADA_REFERENCE.get(name, {}).get(p)
            note = f" (ref {ref[0]:.3f} / {ref[1]:.2f})" if ref else ""
            cells.append(cell(by[(p, name)]) + note)
        quality.append([p, *cells])
    timing = []
    for name in names:
        anyp = " / ".join(
            f"{by[(p, name)]['any_poison']:.2f}" for p in n_poison if p and (p, name) in by
        )
        ms = [float(by[(p, name)]["ms_p50"]) for p in n_poison]
        p95 = [float(by[(p, name)]["ms_p95"]) for p in n_poison]
        timing.append([name, anyp, f"{statistics.median(ms):.2f}", f"{max(p95):.2f}"])
    lines = [
        *markdown_table(["poison planted", *names], quality),
        "",
        "Cells: poison share of the context / share of queries whose context holds a correct "
        "answer string in a web result; (ref ...) = the reference implementation's number from "
        "the GRADA issue. The planted passages are ranked with the web results by query "
        "similarity and the top 10 retrieved; GRADA's context is its own top 5, in its order.",
        "",
        *markdown_table(
            [
                "defense",
                "queries with any poison (1 / 3 / 5 poison)",
                "median ms per query",
                "p95 ms",
            ],
            timing,
        ),
    ]
    return rows, "\n".join(lines)
