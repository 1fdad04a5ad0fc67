"""Every retrieval-level defense on the built-in poisoned knowledge base (no data needed)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ragdefense.defenses import registry

from ..cases import demo_cases
from ..report import markdown_table
from ..runner import CaseDefense, no_defense, on_case, run_cases, summarize
from .grada import grada_variants

__all__ = ["demo_table"]


def demo_table(
    embedder: Any = None, k: int = 8, context: int = 4
) -> tuple[list[dict[str, Any]], str]:
    """Every retrieval-level defense on the built-in poisoned knowledge base (no data needed):
    each question's top ``k`` filtered, the first ``context`` kept passages its context, as the
    one line hands them on (LangChain's 4 from a pool of 8); without a defense, the top
    ``context``. One size for every row: a reranker keeping half the pool is compared with no
    defense at the same size, not with the whole pool."""
    cases = [replace(c, k=context) for c in demo_cases(embedder, k)]
    defenses: dict[str, CaseDefense] = {
        "none": no_defense,
        "Consensus (default)": on_case(registry.defense(registry.DEFAULT_DEFENSE)),
        "RAGDefender (strict)": on_case(registry.defense("ragdefender")),
        **{f"GRADA-{n}": d for n, d in grada_variants().items() if n != "none"},
    }
    rows = [{"defense": n} | summarize(run_cases(d, cases)) for n, d in defenses.items()]
    lines = [
        f"Built-in poisoned knowledge base: {len(cases)} questions, top {k} retrieved, the "
        f"first {context} kept passages the context (5 poison passages per question in the store)",
        "",
        *markdown_table(
            [
                "defense",
                "poison share of the context",
                "queries with any poison",
                "answer passage kept",
                "benign removed per query",
                "median ms",
            ],
            [
                [
                    r["defense"],
                    f"{r['poison_share']:.3f}",
                    f"{r['any_poison']:.2f}",
                    f"{r['gold_kept']:.2f}",
                    f"{r['benign_removed']:.2f}",
                    f"{r['ms_p50']:.2f}",
                ]
                for r in rows
            ],
        ),
    ]
    return rows, "\n".join(lines)
