"""The RAGDefender setting (``../shared/data/ragdefender``): gold passages + poison at 1x-6x,
our task types against the authors' package, and the cold timing (embedding included)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from ragdefense.attacks import poisonedrag
from ragdefense.defenses.ragdefender import RAGDefender
from ragdefense.embedders import CallableEmbedder, as_embedder

from ..cases import RAGDEFENDER_BASE, case_embedder, ragdefender_cases
from ..datasets import load_ragdefender
from ..report import cell, markdown_table, value
from ..runner import CaseDefense, on_case, run_cases, summarize

__all__ = ["RAGDEFENDER_REFERENCE", "ragdefender_table", "run_ragdefender_bench"]

# The authors' package (ragdefender 0.2.0) on this very setting, same embedder, all questions:
# (poison share of the context, share of queries with a gold passage in the context).
RAGDEFENDER_REFERENCE = {
    "nq": {1: (0.013, 1.00), 2: (0.026, 0.99), 4: (0.081, 0.95), 6: (0.112, 0.92)},
    "msmarco": {1: (0.040, 1.00), 2: (0.040, 0.98), 4: (0.105, 0.92), 6: (0.205, 0.85)},
    "hotpotqa": {1: (0.030, 1.00), 2: (0.000, 1.00), 4: (0.005, 1.00), 6: (0.040, 0.99)},
}


def run_ragdefender_bench(
    folder: str | os.PathLike[str],
    defenses: dict[str, CaseDefense],
    datasets: Sequence[str] = ("nq", "msmarco", "hotpotqa"),
    ratios: Sequence[int] = (1, 2, 4, 6),
    limit: int | None = None,
    embedder: Any = None,
) -> list[dict[str, Any]]:
    """Run ``defenses`` on the RAGDefender setting; one row per (dataset, ratio, defense)."""
    emb = case_embedder(embedder)
    rows = []
    for ds in datasets:
        records = load_ragdefender(folder, ds)[:limit]
        cases = ragdefender_cases(records, ds, ratios, emb)
        for ratio in ratios:
            sub = [c for c in cases if c.setting == f"{ratio}x"]
            for name, defense in defenses.items():
                rows.append(
                    {"dataset": ds, "setting": f"{ratio}x", "defense": name}
                    | summarize(run_cases(defense, sub, f"{ds} {ratio}x {name}"))
                )
    return rows


def ragdefender_table(
    folder: str | os.PathLike[str],
    datasets: Sequence[str] = ("nq", "msmarco", "hotpotqa"),
    ratios: Sequence[int] = (1, 2, 4, 6),
    limit: int | None = None,
    timing_queries: int = 20,
    embedder: Any = None,
) -> tuple[list[dict[str, Any]], str]:
    """The RAGDefender benchmark: our three task types against the authors' package.

    Returns the rows and a Markdown report (quality table, then cold timing).
    """
    defenses = {t: on_case(RAGDefender(task_type=t)) for t in ("auto", "single_hop", "multi_hop")}
    rows = run_ragdefender_bench(folder, defenses, datasets, ratios, limit, embedder)
    by = {(r["dataset"], r["setting"], r["defense"]): r for r in rows}
    table = []
    deltas = []
    for ds in datasets:
        for ratio in ratios:
            cells = [by[(ds, f"{ratio}x", t)] for t in defenses]
            ref = RAGDEFENDER_REFERENCE.get(ds, {}).get(ratio)
            a = cells[0]
            if ref:
                deltas.append((a["poison_share"] - ref[0], a["gold_in_context"] - ref[1]))
            table.append(
                [ds, f"{ratio}x", f"{ref[0]:.3f} / {ref[1]:.2f}" if ref else "-"]
                + [cell(c) for c in cells]
                + [value(a, "poison_removed", 3), value(a, "gold_kept", 3), value(a, "ms_p50", 2)]
            )
    # the reference is the authors' package over every question: say so beside a sample
    reference = "authors' pkg" if limit is None else "authors' pkg (all questions)"
    header = [
        "dataset", "poison", reference, "**ours (auto)**", "ours single_hop",
        "ours multi_hop", "poison removed", "gold kept", "defense ms p50",
    ]  # fmt: skip
    lines = markdown_table(header, table)
    if deltas:
        mp = sum(d[0] for d in deltas) / len(deltas)
        mg = sum(d[1] for d in deltas) / len(deltas)
        worst_p = max(d[0] for d in deltas)
        worst_g = min(d[1] for d in deltas)
        lines += [
            "",
            f"auto vs the authors' package over {len(deltas)} cells: mean poison share "
            f"{mp:+.3f}, mean gold-in-context {mg:+.3f}; worst cell poison share {worst_p:+.3f}, "
            f"gold-in-context {worst_g:+.3f} (cells: poison share of the context / share of "
            "queries with a gold passage in the context).",
        ]
    if timing_queries > 0:
        lines += ["", _cold_timing(folder, datasets, max(ratios), timing_queries, embedder, rows)]
    return rows, "\n".join(lines)


#: runs of each way per query in the cold timing (the fastest kept); even, so that each way
#: runs second (on warm allocator and caches) as often as the other
REPEATS = 4


def _cold_timing(
    folder: str | os.PathLike[str],
    datasets: Sequence[str],
    ratio: int,
    n_queries: int,
    embedder: Any,
    rows: list[dict[str, Any]],
) -> str:
    """Median ms per query: one embedding pass of the passages alone vs embedding +
    RAGDefender (no cache). RAGDefender embeds the query only when an outlier candidate needs
    it, so the baseline does not embed it (the retriever already has); the share of queries
    where the defense did is printed. Each query is timed :data:`REPEATS` times both ways, in
    alternating order, and each way's fastest run is kept (the cost without the machine's
    noise); the ratio is the median of the queries' own ratios."""
    model = as_embedder(getattr(embedder, "inner", embedder))  # the model, never a disk cache
    table = []
    for ds in datasets:
        records = load_ragdefender(folder, ds)[:n_queries]
        base = RAGDEFENDER_BASE.get(ds, 2)
        t_embed, t_full, ratios, sizes, asked = [], [], [], [], []
        for r in records:
            items = list(r.benign) + poisonedrag(r.question, r.poison[: base * ratio])
            sizes.append(len(items))
            runs: dict[str, list[float]] = {"embed": [], "full": []}
            for rep in range(REPEATS):
                for way in ("embed", "full") if rep % 2 == 0 else ("full", "embed"):
                    # a fresh cache-less wrapper: every call really runs the model
                    queries: list[str] = []

                    def query_fn(q: str, queries: list[str] = queries) -> Any:
                        queries.append(q)
                        return model._embed_query(q)

                    fresh = CallableEmbedder(model._embed, query_fn=query_fn, cache_size=0)
                    t0 = time.perf_counter()
                    if way == "embed":
                        fresh.embed(items)
                    else:
                        RAGDefender(embedder=fresh).defend(r.question, items)
                    runs[way].append((time.perf_counter() - t0) * 1000)
                    if way == "full" and rep == 0:
                        asked.append(bool(queries))
            e, f = min(runs["embed"]), min(runs["full"])
            t_embed.append(e)
            t_full.append(f)
            ratios.append(f / e)
        table.append(
            [
                ds,
                f"{statistics.median(sizes):.0f}",
                f"{statistics.median(t_embed):.1f}",
                f"{statistics.median(t_full):.1f}",
                f"{statistics.median(ratios):.3f}",
                f"{statistics.mean(asked):.2f}",
            ]
        )
    p50 = max(r["ms_p50"] for r in rows if r["defense"] == "auto")
    header = [
        "dataset",
        "passages",
        "embedding pass",
        "embedding + RAGDefender",
        "ratio",
        "query embedded",
    ]
    lines = [
        f"Cold timing, {n_queries} queries per dataset at {ratio}x (no embedding cache; median ms "
        f"per query, each the fastest of {REPEATS} runs, the two ways alternated; embedding pass: "
        "the passages' (the retriever has embedded the query); ratio: the median of the queries' "
        "own; query embedded: the share of queries where RAGDefender needed the query's vector):",
        "",
        *markdown_table(header, table),
        "",
        f"Defense only (embeddings given): worst median over the cells {p50:.2f} ms.",
    ]
    return "\n".join(lines)
