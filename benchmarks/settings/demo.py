"""Every retrieval-level defense on the built-in poisoned knowledge base (no data needed)."""

from __future__ import annotations

from typing import Any

from ragdefense.defenses import registry

from ..cases import demo_cases
from ..report import markdown_table
from ..runner import CaseDefense, no_defense, on_case, run_cases, summarize
from .grada import grada_variants

__all__ = ["demo_table"]


def demo_table(embedder: Any = None, k: int = 8) -> tuple[list[dict[str, Any]], str]:
    """Every retrieval-level defense on the built-in poisoned knowledge base (no data needed)."""
    cases = demo_cases(embedder, k)
    defenses: dict[str, CaseDefense] = {
        "none": no_defense,
        "Consensus (default)": on_case(registry.defense(registry.DEFAULT_DEFENSE)),
        "RAGDefender (strict)": on_case(registry.defense("ragdefender")),
        **{f"GRADA-{n}": d for n, d in grada_variants().items() if n != "none"},
    }
    rows = [{"defense": n} | summarize(run_cases(d, cases)) for n, d in defenses.items()]
    lines = [
        f"Built-in poisoned knowledge base: {len(cases)} questions, top {k} retrieved "
        "(5 poison passages per question in the store)",
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
