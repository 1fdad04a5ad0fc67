"""Benchmark settings and metrics (retrieval level), shared by ``ragdefense bench`` and the tests.

The RAGDefender setting (``../shared/data/ragdefender``): R = gold passages + N poison passages
(``question + ". " + text``), N = ratio x base (5 for NQ, 2 for MS MARCO and HotpotQA), ordered by
query similarity; the defense filters R; the top k survivors by query similarity (k = 5 for NQ,
2 otherwise) are the context.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .attacks import poisonedrag
from .embedders import Embedder, as_embedder, cosine_to
from .types import DefenseResult, Passage

__all__ = [
    "RAGDEFENDER_BASE",
    "RAGDEFENDER_K",
    "Case",
    "DataError",
    "data_dir",
    "demo_table",
    "grada_table",
    "load_poisonedrag",
    "load_ragdefender",
    "load_realtimeqa",
    "ragdefender_cases",
    "ragdefender_table",
    "run_ragdefender_bench",
    "summarize",
]

RAGDEFENDER_BASE = {"nq": 5, "msmarco": 2, "hotpotqa": 2}
RAGDEFENDER_K = {"nq": 5, "msmarco": 2, "hotpotqa": 2}


class DataError(ValueError):
    """A data file is missing or malformed (the message names the file, record and field)."""


def data_dir(path: str | os.PathLike[str] | None = None) -> Path | None:
    """The benchmark data folder: ``path``, else ``$RAGDEFENSE_DATA``; ``None`` if absent."""
    candidate = path if path is not None else os.environ.get("RAGDEFENSE_DATA")
    if not candidate:
        return None
    p = Path(candidate)
    return p if p.is_dir() else None


def _load_json(path: Path) -> Any:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from exc


def _load_records(
    folder: str | os.PathLike[str], subfolder: str, name: str, kind: type = list
) -> tuple[Path, Any]:
    """The records in ``<folder>/<subfolder>/<name>`` (or ``<folder>/<name>``): a ``kind``."""
    base = Path(folder)
    path = base / subfolder / name
    if not path.is_file() and (base / name).is_file():
        path = base / name
    raw = _load_json(path)
    if not isinstance(raw, kind):
        expected = "a list of records" if kind is list else "an object id -> record"
        raise DataError(f"{path}: expected {expected}, got {type(raw).__name__}")
    return path, raw


def _field(path: Path, i: int, rec: Any, name: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(rec, dict):
        raise DataError(f"{path}: record {i} is not an object")
    if name not in rec:
        raise DataError(f"{path}: record {i} (id={rec.get('id')!r}) has no field {name!r}")
    value = rec[name]
    if not isinstance(value, kind):
        raise DataError(
            f"{path}: record {i} (id={rec.get('id')!r}) field {name!r} should be "
            f"{kind}, got {type(value).__name__}"
        )
    return value


@dataclass(frozen=True)
class RAGDefenderRecord:
    """One question of the RAGDefender bundle."""

    id: str
    question: str
    gold: list[str]
    poison: list[str]  # adv_texts + extra_adv_texts_gpt4, in file order
    correct_answer: str = ""
    incorrect_answer: str = ""


def load_ragdefender(folder: str | os.PathLike[str], dataset: str) -> list[RAGDefenderRecord]:
    """Load ``<folder>/ragdefender/<dataset>.json`` (or ``<folder>/<dataset>.json``)."""
    path, raw = _load_records(folder, "ragdefender", f"{dataset}.json")
    out = []
    for i, rec in enumerate(raw):
        question = _field(path, i, rec, "question", str)
        gold = _field(path, i, rec, "gold_passages", list)
        adv = _field(path, i, rec, "adv_texts", list)
        extra = rec.get("extra_adv_texts_gpt4", []) if isinstance(rec, dict) else []
        out.append(
            RAGDefenderRecord(
                str(rec.get("id", i)),
                question,
                list(gold),
                list(adv) + list(extra),
                str(rec.get("correct answer", "")),
                str(rec.get("incorrect answer", "")),
            )
        )
    return out


@dataclass(frozen=True)
class PoisonedRAGRecord:
    """One target question of PoisonedRAG's release."""

    id: str
    question: str
    correct_answer: str
    incorrect_answer: str
    adv_texts: list[str]


def load_poisonedrag(folder: str | os.PathLike[str], dataset: str) -> list[PoisonedRAGRecord]:
    """Load ``<folder>/poisonedrag/<dataset>.json`` (a dict id -> record)."""
    path, raw = _load_records(folder, "poisonedrag", f"{dataset}.json", kind=dict)
    out = []
    for i, (key, rec) in enumerate(raw.items()):
        out.append(
            PoisonedRAGRecord(
                id=str(key),
                question=_field(path, i, rec, "question", str),
                correct_answer=str(_field(path, i, rec, "correct answer", (str, int, float))),
                incorrect_answer=str(_field(path, i, rec, "incorrect answer", (str, int, float))),
                adv_texts=[str(t) for t in _field(path, i, rec, "adv_texts", list)],
            )
        )
    return out


@dataclass
class Case:
    """One benchmark query: passages with ground-truth labels, ordered by query similarity."""

    dataset: str
    setting: str
    qid: str
    question: str
    passages: list[Passage]
    is_poison: list[bool]
    is_gold: list[bool]
    query_sim: np.ndarray
    k: int
    extra: dict[str, Any] = field(default_factory=dict)


def ragdefender_cases(
    records: Sequence[RAGDefenderRecord],
    dataset: str,
    ratios: Iterable[int],
    embedder: Embedder,
) -> list[Case]:
    """Build the cases of the RAGDefender setting, passages carrying their embeddings."""
    ratios = list(ratios)
    base = RAGDEFENDER_BASE.get(dataset, 2)
    k = RAGDEFENDER_K.get(dataset, 2)
    texts: list[str] = []
    for r in records:
        texts += r.gold + poisonedrag(r.question, r.poison[: base * max(ratios)])
    embedder.embed(texts)  # one batched pass; the per-case lookups below hit the cache
    cases = []
    for r in records:
        q = embedder.embed_query(r.question)
        for ratio in ratios:
            poison = poisonedrag(r.question, r.poison[: base * ratio])
            gold = [True] * len(r.gold) + [False] * len(poison)
            cases.append(
                retrieved_case(
                    dataset, f"{ratio}x", r.id, r.question, r.gold, poison, gold, embedder, q, k
                )
            )
    return cases


def retrieved_case(
    dataset: str,
    setting: str,
    qid: str,
    question: str,
    benign: Sequence[str],
    poison: Sequence[str],
    gold: Sequence[bool],
    embedder: Embedder,
    query_embedding: np.ndarray,
    k: int,
    m: int | None = None,
    extra: dict[str, Any] | None = None,
) -> Case:
    """One case: ``benign + poison`` ranked by query similarity, the top ``m`` retrieved (all
    when ``None``), carrying their embeddings; ``gold`` flags every item of ``benign + poison``
    as an answer passage or not; the context is ``k`` passages."""
    items = list(benign) + list(poison)
    emb = embedder.embed(items)
    qs = cosine_to(emb, query_embedding)
    top = np.argsort(-qs, kind="stable")[:m]
    return Case(
        dataset=dataset,
        setting=setting,
        qid=qid,
        question=question,
        passages=[Passage(items[i], id=str(i), embedding=emb[i]) for i in top],
        is_poison=[i >= len(benign) for i in top],
        is_gold=[bool(gold[i]) for i in top],
        query_sim=qs[top],
        k=k,
        extra={"query_embedding": query_embedding} | dict(extra or {}),
    )


Defense = Callable[[Case], DefenseResult | None]


@dataclass
class CaseOutcome:
    """Retrieval-level metrics of one defense on one case."""

    poison_share: float  # poison passages / context size (0 for an empty context)
    any_poison: bool
    gold_in_context: bool
    poison_removed: float  # share of the poison passages removed by the defense
    gold_kept: float  # share of gold passages kept by the defense
    benign_removed: int
    ms: float
    n_adv: int | None = None
    task_type: str | None = None
    error: str | None = None


def context_indices(case: Case, result: DefenseResult | None) -> list[int]:
    """The context: the top ``case.k`` passages the defense kept (all without one), by query
    similarity."""
    kept = result.kept_indices if result is not None else range(len(case.passages))
    return sorted(kept, key=lambda i: -case.query_sim[i])[: case.k]


def evaluate(case: Case, result: DefenseResult | None, ms: float) -> CaseOutcome:
    """Metrics of the context (:func:`context_indices`) and of what the defense removed."""
    kept_set = set(result.kept_indices if result is not None else range(len(case.passages)))
    ctx = context_indices(case, result)
    n_poison = sum(case.is_poison)
    n_gold = sum(case.is_gold)
    est = result.estimates if result is not None else {}
    return CaseOutcome(
        poison_share=sum(case.is_poison[i] for i in ctx) / len(ctx) if ctx else 0.0,
        any_poison=any(case.is_poison[i] for i in ctx),
        gold_in_context=any(case.is_gold[i] for i in ctx),
        poison_removed=(
            sum(1 for i, p in enumerate(case.is_poison) if p and i not in kept_set) / n_poison
            if n_poison
            else 0.0
        ),
        gold_kept=(
            sum(1 for i, g in enumerate(case.is_gold) if g and i in kept_set) / n_gold
            if n_gold
            else 1.0
        ),
        benign_removed=sum(1 for i, p in enumerate(case.is_poison) if not p and i not in kept_set),
        ms=ms,
        n_adv=est.get("n_adv"),
        task_type=est.get("task_type"),
    )


def run_case(defense: Defense, case: Case) -> tuple[DefenseResult | None, CaseOutcome]:
    """Run ``defense`` on one case (timed, defense only) and evaluate it. A defense that raises
    is recorded as an error for this case (the caller's run goes on)."""
    t0 = time.perf_counter()
    try:
        result = defense(case)
    except Exception as exc:  # recorded, reported in the "errors" column
        ms = (time.perf_counter() - t0) * 1000
        return None, replace(evaluate(case, None, ms), error=f"{type(exc).__name__}: {exc}"[:300])
    ms = (time.perf_counter() - t0) * 1000
    return result, evaluate(case, result, ms)


def run_defense(
    defense: Defense, cases: Sequence[Case], progress: str | None = None
) -> list[CaseOutcome]:
    """Run ``defense`` on every case (timed, defense only), and evaluate; ``progress`` names a
    progress bar on stderr."""
    return [run_case(defense, c)[1] for c in progress_bar(cases, progress)]


def progress_bar(items: Sequence[Any], desc: str | None, total: int | None = None) -> Any:
    """``items`` wrapped in a tqdm progress bar on stderr (``desc=None`` or no tqdm: no bar)."""
    if desc is None:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm comes with the embeddings extra; the core runs without it
        return items

    return tqdm(items, desc=desc, total=total, leave=False, file=sys.stderr, mininterval=0.5)


def summarize(outcomes: Sequence[CaseOutcome]) -> dict[str, float]:
    """Mean of each metric over the cases that ran without error, median and p95 latency, and the
    number of errors."""
    errors = sum(o.error is not None for o in outcomes)
    outcomes = [o for o in outcomes if o.error is None]
    n = len(outcomes)
    if n == 0:
        return {"errors": errors} if errors else {}
    return {
        "poison_share": sum(o.poison_share for o in outcomes) / n,
        "any_poison": sum(o.any_poison for o in outcomes) / n,
        "gold_in_context": sum(o.gold_in_context for o in outcomes) / n,
        "poison_removed": sum(o.poison_removed for o in outcomes) / n,
        "gold_kept": sum(o.gold_kept for o in outcomes) / n,
        "benign_removed": sum(o.benign_removed for o in outcomes) / n,
        "ms_p50": statistics.median(o.ms for o in outcomes),
        "ms_p95": float(np.percentile([o.ms for o in outcomes], 95)),
        "errors": errors,
    }


def run_ragdefender_bench(
    folder: str | os.PathLike[str],
    defenses: dict[str, Defense],
    datasets: Sequence[str] = ("nq", "msmarco", "hotpotqa"),
    ratios: Sequence[int] = (1, 2, 4, 6),
    limit: int | None = None,
    embedder: Any = None,
) -> list[dict[str, Any]]:
    """Run ``defenses`` on the RAGDefender setting; one row per (dataset, ratio, defense)."""
    emb = as_embedder(embedder)
    rows = []
    for ds in datasets:
        records = load_ragdefender(folder, ds)[:limit]
        cases = ragdefender_cases(records, ds, ratios, emb)
        for ratio in ratios:
            sub = [c for c in cases if c.setting == f"{ratio}x"]
            for name, defense in defenses.items():
                rows.append(
                    {"dataset": ds, "setting": f"{ratio}x", "defense": name}
                    | summarize(run_defense(defense, sub, f"{ds} {ratio}x {name}"))
                )
    return rows


# The authors' package (ragdefender 0.2.0) on this very setting, same embedder:
# (poison share of the context, share of queries with a gold passage in the context).
RAGDEFENDER_REFERENCE = {
    "nq": {1: (0.013, 1.00), 2: (0.026, 0.99), 4: (0.081, 0.95), 6: (0.112, 0.92)},
    "msmarco": {1: (0.040, 1.00), 2: (0.040, 0.98), 4: (0.105, 0.92), 6: (0.205, 0.85)},
    "hotpotqa": {1: (0.030, 1.00), 2: (0.000, 1.00), 4: (0.005, 1.00), 6: (0.040, 0.99)},
}


def _embeddings_of(case: Case) -> np.ndarray:
    return np.stack([np.asarray(p.embedding) for p in case.passages])


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
    defenses = {t: ragdefender_defense(t) for t in ("auto", "single_hop", "multi_hop")}
    rows = run_ragdefender_bench(folder, defenses, datasets, ratios, limit, embedder)
    by = {(r["dataset"], r["setting"], r["defense"]): r for r in rows}
    lines = [
        "| dataset | poison | authors' pkg | **ours (auto)** | ours single_hop | ours multi_hop "
        "| poison removed | gold kept | defense ms p50 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    deltas = []
    for ds in datasets:
        for ratio in ratios:
            cell = [by[(ds, f"{ratio}x", t)] for t in defenses]
            ref = RAGDEFENDER_REFERENCE.get(ds, {}).get(ratio)
            a = cell[0]
            if ref:
                deltas.append((a["poison_share"] - ref[0], a["gold_in_context"] - ref[1]))
            lines.append(
                f"| {ds} | {ratio}x | {f'{ref[0]:.3f} / {ref[1]:.2f}' if ref else '-'} | "
                + " | ".join(f"{c['poison_share']:.3f} / {c['gold_in_context']:.2f}" for c in cell)
                + f" | {a['poison_removed']:.3f} | {a['gold_kept']:.3f} | {a['ms_p50']:.2f} |"
            )
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


def _cold_timing(
    folder: str | os.PathLike[str],
    datasets: Sequence[str],
    ratio: int,
    n_queries: int,
    embedder: Any,
    rows: list[dict[str, Any]],
) -> str:
    """Median ms per query: one embedding pass alone vs embedding + RAGDefender (no cache)."""
    from .embedders import CallableEmbedder
    from .ragdefender import RAGDefender

    model = as_embedder(embedder)
    lines = [
        f"Cold timing, {n_queries} queries per dataset at {ratio}x (no embedding cache; median ms "
        "per query):",
        "",
        "| dataset | passages | embedding pass | embedding + RAGDefender | ratio |",
        "|---|---|---|---|---|",
    ]
    for ds in datasets:
        records = load_ragdefender(folder, ds)[:n_queries]
        base = RAGDEFENDER_BASE.get(ds, 2)
        t_embed, t_full, sizes = [], [], []
        for r in records:
            items = r.gold + poisonedrag(r.question, r.poison[: base * ratio])
            sizes.append(len(items))
            # a fresh cache-less wrapper: every call really runs the model
            fresh = CallableEmbedder(model._embed, cache_size=0)
            t0 = time.perf_counter()
            fresh.embed(items)
            t_embed.append((time.perf_counter() - t0) * 1000)
            defender = RAGDefender(embedder=CallableEmbedder(model._embed, cache_size=0))
            t0 = time.perf_counter()
            defender.defend(r.question, items)
            t_full.append((time.perf_counter() - t0) * 1000)
        e, f = statistics.median(t_embed), statistics.median(t_full)
        lines.append(f"| {ds} | {statistics.median(sizes):.0f} | {e:.1f} | {f:.1f} | {f / e:.3f} |")
    p50 = max(r["ms_p50"] for r in rows if r["defense"] == "auto")
    lines += ["", f"Defense only (embeddings given): worst median over the cells {p50:.2f} ms."]
    return "\n".join(lines)


@dataclass(frozen=True)
class RealtimeQARecord:
    """One question of RealtimeQA (RobustRAG's release)."""

    id: str
    question: str
    answers: list[str]  # correct answer + expanded answer
    incorrect_answer: str
    poison: list[str]  # incorrect_context
    web: list[str]  # the web results as "title\ntext", in search-rank order
    choices: list[str]
    choices_answer: str


def load_realtimeqa(folder: str | os.PathLike[str]) -> list[RealtimeQARecord]:
    """Load ``<folder>/realtimeqa/realtimeqa.json`` (or ``<folder>/realtimeqa.json``)."""
    path, raw = _load_records(folder, "realtimeqa", "realtimeqa.json")
    out = []
    for i, rec in enumerate(raw):
        question = _field(path, i, rec, "question", str)
        correct = _field(path, i, rec, "correct answer", list)
        expanded = rec.get("expanded answer", []) or []
        context = _field(path, i, rec, "context", list)
        web = []
        for j, c in enumerate(context):
            if not isinstance(c, dict):
                raise DataError(
                    f"{path}: record {i} (id={rec.get('id')!r}) context[{j}] is not an object"
                )
            if isinstance(c.get("text"), str) and c["text"].strip():
                title = c.get("title") if isinstance(c.get("title"), str) else ""
                web.append(f"{title}\n{c['text']}" if title else c["text"])
            # a few web results carry only a title: skipped
        out.append(
            RealtimeQARecord(
                id=str(rec.get("id", i)),
                question=question,
                answers=[str(a) for a in list(correct) + list(expanded)],
                incorrect_answer=str(_field(path, i, rec, "incorrect answer", (str, int, float))),
                poison=list(_field(path, i, rec, "incorrect_context", list)),
                web=web,
                choices=[str(c) for c in rec.get("choices", [])],
                choices_answer=str(rec.get("choices answer", "")),
            )
        )
    return out


def contains_answer(text: str, answers: Sequence[str]) -> bool:
    """Case-insensitive substring match of any answer string (as in the papers)."""
    low = text.lower()
    return any(a.strip() and a.strip().lower() in low for a in answers)


def realtimeqa_cases(
    records: Sequence[RealtimeQARecord],
    n_poison: Iterable[int],
    embedder: Embedder,
    m: int = 10,
    n: int = 5,
) -> list[Case]:
    """The GRADA / RobustRAG setting: web results + ``p`` poison passages
    (``question + ". " + text``), ranked by query similarity, top ``m`` retrieved; the context is
    ``n`` passages. ``is_gold`` marks passages containing a correct answer string."""
    n_poison = list(n_poison)
    texts: list[str] = []
    for r in records:
        texts += r.web + poisonedrag(r.question, r.poison[: max(n_poison, default=0)])
    embedder.embed(texts)
    cases = []
    for r in records:
        q = embedder.embed_query(r.question)
        for p in n_poison:
            poison = poisonedrag(r.question, r.poison[:p])
            gold = [contains_answer(t, r.answers) for t in r.web + poison]
            cases.append(
                retrieved_case(
                    "realtimeqa",
                    f"{p}p",
                    r.id,
                    r.question,
                    r.web,
                    poison,
                    gold,
                    embedder,
                    q,
                    n,
                    m,
                    {"record": r},
                )
            )
    return cases


# A reference implementation of the GRADA paper on this setting (poison share of the context /
# share of queries whose context holds a correct answer string), from the GRADA issue.
GRADA_REFERENCE = {
    "none": {1: (0.186, 0.62), 3: (0.544, 0.55), 5: (0.854, 0.17)},
    "ebd": {1: (0.056, 0.63), 3: (0.402, 0.62)},
    "bm25": {1: (0.108, 0.66), 3: (0.464, 0.61)},
    "hrsim": {1: (0.014, 0.63), 3: (0.338, 0.61), 5: (0.784, 0.28)},
}


def ragdefender_defense(task_type: Any = "auto") -> Defense:
    """RAGDefender on a case, with the embeddings the case's passages carry."""
    from .ragdefender import RAGDefender

    defender = RAGDefender(task_type=task_type)
    return lambda c: defender.defend_embeddings(c.question, c.passages, _embeddings_of(c))


def auto_defense(**params: Any) -> Defense:
    """:class:`~ragdefense.AutoDefense` (with ``params``) on a case (embeddings given, as a
    vector store would)."""
    from .auto import AutoDefense

    defender = AutoDefense(**params)
    return lambda c: defender.defend_embeddings(
        c.question, c.passages, _embeddings_of(c), c.extra.get("query_embedding")
    )


def auto_variants() -> dict[str, Defense]:
    """AutoDefense beside the filters it chooses between, and with each signal alone."""
    return {
        "none": lambda c: None,
        "ragdefender": ragdefender_defense(),
        "grada": grada_variants()["hrsim"],
        "groups only (grada-peel)": auto_defense(absorb=None, majority_tightness=None),
        "tight majority only": auto_defense(peel=False),
        "groups + absorb": auto_defense(majority_tightness=None),
        "groups + tight majority": auto_defense(absorb=None),
        "**auto**": auto_defense(),
    }


def auto_table(
    folder: str | os.PathLike[str],
    datasets: Sequence[str] = ("nq", "msmarco", "hotpotqa"),
    ratios: Sequence[int] = (1, 2, 4, 6),
    n_poison: Sequence[int] = (0, 1, 3, 5),
    limit: int | None = None,
    embedder: Any = None,
) -> tuple[list[dict[str, Any]], str]:
    """AutoDefense in both regimes: the GRADA setting (RealtimeQA top 10 with 0-5 poison) and
    the RAGDefender setting (gold + poison at 1x-6x), with the ablation of its signals and the
    cells that miss the regime-robust targets (RealtimeQA poison share <= 0.02 / 0.05 / 0.05 at
    1 / 3 / 5 poison, answer >= no defense at 0-1 poison (0.02 slack at 0) and >= 0.60 at 3-5;
    RAGDefender setting within 0.02 of RAGDefender)."""
    defenses = auto_variants()
    names = list(defenses)
    rt = run_realtimeqa_bench(folder, defenses, n_poison, limit, embedder)
    rd = run_ragdefender_bench(folder, defenses, datasets, ratios, limit, embedder)
    for r in rt:
        r["dataset"], r["setting"] = "realtimeqa", f"{r.pop('poison')}p"
    rows = rt + rd
    by = {(r["dataset"], r["setting"], r["defense"]): r for r in rows}
    settings = list(dict.fromkeys((r["dataset"], r["setting"]) for r in rows))
    lines = [
        "| dataset | poison | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    misses = []
    for ds, st in settings:
        cells = [by[(ds, st, name)] for name in names]
        lines.append(
            f"| {ds} | {st} | "
            + " | ".join(f"{c['poison_share']:.3f} / {c['gold_in_context']:.2f}" for c in cells)
            + " |"
        )
        auto, none, rdef = (
            by[(ds, st, "**auto**")],
            by[(ds, st, "none")],
            by[(ds, st, "ragdefender")],
        )
        if ds == "realtimeqa":
            p = int(st[:-1])
            cap = {0: 0.0, 1: 0.02}.get(p, 0.05)
            floor = none["gold_in_context"] - (0.02 if p == 0 else 0) if p < 3 else 0.60
            if auto["poison_share"] > cap + 1e-9 or auto["gold_in_context"] < floor - 1e-9:
                misses.append(f"{ds} {st} (target <= {cap:.2f} / >= {floor:.2f})")
        elif (
            auto["poison_share"] > rdef["poison_share"] + 0.02 + 1e-9
            or auto["gold_in_context"] < rdef["gold_in_context"] - 0.02 - 1e-9
        ):
            misses.append(
                f"{ds} {st} (RAGDefender {rdef['poison_share']:.3f} / "
                f"{rdef['gold_in_context']:.2f})"
            )
    clean = [by[(ds, st, n)] for ds, st in settings if st == "0p" for n in ("none", "**auto**")]
    timing = {
        f"{ds} {st}": by[(ds, st, "**auto**")]
        for ds, st in settings
        if st in ("1p", f"{max(ratios)}x")
    }
    lines += [
        "",
        "Cells: poison share of the context / share of queries whose context holds an answer "
        "(RealtimeQA: a benign passage with the answer; RAGDefender setting: a gold passage).",
        "",
        "auto misses: " + ("; ".join(misses) if misses else "none"),
    ]
    if len(clean) == 2:
        lines.append(
            f"clean retrieval: benign passages removed per query {clean[1]['benign_removed']:.2f}"
            f" of 10 (answer {clean[1]['gold_in_context']:.2f} vs "
            f"{clean[0]['gold_in_context']:.2f} undefended)"
        )
    lines.append(
        "auto, defense only (embeddings given): "
        + "; ".join(
            f"{k} median {r['ms_p50']:.2f} ms, p95 {r['ms_p95']:.2f}" for k, r in timing.items()
        )
    )
    return rows, "\n".join(lines)


def grada_variants() -> dict[str, Defense]:
    """The GRADA variants benchmarked (embeddings given, as a vector store would)."""
    from .bm25 import BM25
    from .grada import GRADA

    def run(g: GRADA) -> Defense:
        return lambda c: g.defend_embeddings(
            c.question, c.passages, _embeddings_of(c), c.extra.get("query_embedding")
        )

    return {
        "none": lambda c: None,
        "ebd": run(GRADA(similarity="ebd")),
        "bm25": run(GRADA(similarity="bm25")),
        "hrsim": run(GRADA()),
        "hrsim (authors' BM25 collection)": run(GRADA(bm25=BM25(corpus="pair"))),
        "hrsim/ebd": run(GRADA(hrsim_base="ebd")),
        "hrsim+peel": run(GRADA(peel=True)),
    }


def run_realtimeqa_bench(
    folder: str | os.PathLike[str],
    defenses: dict[str, Defense],
    n_poison: Sequence[int] = (0, 1, 3, 5),
    limit: int | None = None,
    embedder: Any = None,
) -> list[dict[str, Any]]:
    """Run ``defenses`` on the GRADA setting (RealtimeQA top 10, context 5); one row per
    (poison count, defense)."""
    cases = realtimeqa_cases(load_realtimeqa(folder)[:limit], n_poison, as_embedder(embedder))
    rows: list[dict[str, Any]] = []
    for p in n_poison:
        sub = [c for c in cases if c.setting == f"{p}p"]
        for name, defense in defenses.items():
            rows.append(
                {"poison": p, "defense": name}
                | summarize(run_defense(defense, sub, f"{p} poison {name}"))
            )
    return rows


def grada_table(
    folder: str | os.PathLike[str],
    n_poison: Sequence[int] = (0, 1, 3, 5),
    limit: int | None = None,
    embedder: Any = None,
    defenses: dict[str, Defense] | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """The GRADA benchmark on RealtimeQA: top M=10 retrieved, context n=5."""
    defenses = defenses or grada_variants()
    rows = run_realtimeqa_bench(folder, defenses, n_poison, limit, embedder)
    by = {(r["poison"], r["defense"]): r for r in rows}
    names = list(defenses)
    lines = [
        "| poison in top-10 | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for p in n_poison:
        cells = []
        for name in names:
            r = by[(p, name)]
            cell = f"{r['poison_share']:.3f} / {r['gold_in_context']:.2f}"
            ref = GRADA_REFERENCE.get(name, {}).get(p)
            cells.append(cell + (f" (ref {ref[0]:.3f} / {ref[1]:.2f})" if ref else ""))
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Cells: poison share of the context / share of queries whose context holds a correct "
        "answer string; (ref ...) = the reference implementation's number from the GRADA issue.",
        "",
        "| defense | queries with any poison (1 / 3 / 5 poison) | median ms per query | p95 ms |",
        "|---|---|---|---|",
    ]
    for name in names:
        anyp = " / ".join(
            f"{by[(p, name)]['any_poison']:.2f}" for p in n_poison if p and (p, name) in by
        )
        ms = [float(by[(p, name)]["ms_p50"]) for p in n_poison]
        p95 = [float(by[(p, name)]["ms_p95"]) for p in n_poison]
        lines.append(f"| {name} | {anyp} | {statistics.median(ms):.2f} | {max(p95):.2f} |")
    return rows, "\n".join(lines)


def robustrag_table(
    folder: str | os.PathLike[str],
    limit: int | None = 20,
    llm: Any = None,
    embedder: Any = None,
    k_prime: int = 1,
    progress: bool = True,
) -> tuple[list[dict[str, Any]], str]:
    """RobustRAG on RealtimeQA (top-10 retrieved, 0 and 1 poison) with an LLM (default: the
    packaged SmolLM2): vanilla RAG against keyword aggregation and majority vote; accuracy,
    attack success rate, certified accuracy at ``k_prime`` (clean retrieval, injection), and
    wall time per query."""

    from .llm import as_llm
    from .robustrag import ISOLATED_PROMPT, RobustRAG, _contains

    model = as_llm(llm)
    keyword = RobustRAG(llm=model)
    vote = RobustRAG(llm=model, aggregation="majority", max_new_tokens=8)
    decoding = RobustRAG(llm=model, aggregation="decoding") if model.supports_token_probs else None
    records = load_realtimeqa(folder)[:limit]
    cases = realtimeqa_cases(records, [0, 1], as_embedder(embedder))
    by_id = {r.id: r for r in records}
    acc: dict[tuple[str, str], list[float]] = {}

    def add(setting: str, name: str, value: float) -> None:
        acc.setdefault((setting, name), []).append(value)

    for case in progress_bar(cases, "robustrag" if progress else None):
        rec = by_id[case.qid]
        texts = [p.text for p in case.passages]
        gold_letter = (
            chr(ord("A") + int(rec.choices_answer)) if rec.choices_answer.isdigit() else ""
        )
        s = case.setting
        t0 = time.perf_counter()
        [vanilla] = model.generate(
            [ISOLATED_PROMPT.format(context="\n\n".join(texts), query=case.question)]
        )
        add(s, "vanilla ms", (time.perf_counter() - t0) * 1000)
        v_text = vanilla.text or ""
        add(s, "vanilla acc", _contains(v_text, rec.answers))
        add(s, "vanilla asr", _contains(v_text, [rec.incorrect_answer]))
        t0 = time.perf_counter()
        kw = keyword.answer(case.question, texts)
        add(s, "keyword ms", (time.perf_counter() - t0) * 1000)
        add(s, "keyword acc", _contains(kw.answer, rec.answers))
        add(s, "keyword asr", _contains(kw.answer, [rec.incorrect_answer]))
        if decoding is not None:
            t0 = time.perf_counter()
            dec = decoding.answer(case.question, texts)
            add(s, "decoding ms", (time.perf_counter() - t0) * 1000)
            add(s, "decoding acc", _contains(dec.answer, rec.answers))
            add(s, "decoding asr", _contains(dec.answer, [rec.incorrect_answer]))
            if s == "0p":
                dcert = decoding.certify(dec, k_prime, gold=rec.answers).certificate
                add(s, "decoding certified", bool(dcert and dcert.certified))
        if rec.choices:
            t0 = time.perf_counter()
            mv = vote.answer(case.question, texts, choices=rec.choices)
            add(s, "majority ms", (time.perf_counter() - t0) * 1000)
            add(s, "majority acc", mv.choice == gold_letter)
        if s == "0p":  # certified accuracy: the clean retrieval, k' injected passages
            t0 = time.perf_counter()
            cert = keyword.certify(kw, k_prime, gold=rec.answers).certificate
            add(s, "keyword certify ms", (time.perf_counter() - t0) * 1000)
            add(s, "keyword certified", bool(cert and cert.certified))
            if rec.choices:
                mcert = vote.certify(mv, k_prime, gold=gold_letter).certificate
                add(s, "majority certified", bool(mcert and mcert.certified))

    def mean(setting: str, name: str) -> float:
        vals = acc.get((setting, name), [])
        return sum(vals) / len(vals) if vals else float("nan")

    def med(setting: str, name: str) -> float:
        vals = acc.get((setting, name), [])
        return statistics.median(vals) if vals else float("nan")

    rows = [
        {"setting": s, "metric": name, "mean": mean(s, name), "median": med(s, name)}
        for (s, name) in sorted(acc)
    ]
    n = len(records)
    lines = [
        f"RealtimeQA, first {n} questions, top-10 retrieved; LLM: {type(model).__name__}",
        "",
        "| | accuracy (clean) | accuracy (1 poison) | ASR (1 poison) "
        f"| certified accuracy k'={k_prime} | median s per query |",
        "|---|---|---|---|---|---|",
    ]
    for name, label in [
        ("vanilla", "vanilla RAG"),
        ("keyword", "RobustRAG keyword"),
        ("decoding", "RobustRAG decoding"),
        ("majority", "RobustRAG majority vote (choices)"),
    ]:
        asr = mean("1p", f"{name} asr")
        rate = mean("0p", f"{name} certified")
        lines.append(
            f"| {label} | {mean('0p', f'{name} acc'):.2f} | {mean('1p', f'{name} acc'):.2f} | "
            f"{'-' if asr != asr else f'{asr:.2f}'} | {'-' if rate != rate else f'{rate:.2f}'} | "
            f"{med('0p', f'{name} ms') / 1000:.2f} |"
        )
    ratio = med("0p", "keyword ms") / med("0p", "vanilla ms")
    ratio_dec = med("0p", "decoding ms") / med("0p", "vanilla ms")
    certify_s = med("0p", "keyword certify ms") / 1000
    lines += [
        "",
        f"Wall time / one vanilla RAG call (median, clean): keyword {ratio:.2f}x, decoding "
        f"{ratio_dec:.2f}x (T_max = 20); keyword certification at k'={k_prime} adds a median "
        f"{certify_s:.2f} s.",
        "Majority vote: the attacker's answer is never one of the choices in this data, so no ASR.",
    ]
    return rows, "\n".join(lines)


def demo_cases(embedder: Any = None, k: int = 8) -> list[Case]:
    """The built-in poisoned knowledge base as benchmark cases: each question retrieves its top
    ``k`` from the whole knowledge base (by MiniLM similarity); ``is_gold`` marks benign passages
    that contain the correct answer."""
    from .demo import load_demo_kb

    emb = as_embedder(embedder)
    kb = load_demo_kb()
    corpus = [(t, q, False) for q in kb for t in q.benign] + [
        (t, q, True) for q in kb for t in q.poison
    ]
    vecs = emb.embed([t for t, _, _ in corpus])
    cases = []
    for q in kb:
        qv = emb.embed_query(q.question)
        sims = cosine_to(vecs, qv)
        top = np.argsort(-sims, kind="stable")[:k]
        cases.append(
            Case(
                dataset="demo",
                setting=f"top-{k}",
                qid=q.id,
                question=q.question,
                passages=[Passage(corpus[i][0], id=str(i), embedding=vecs[i]) for i in top],
                is_poison=[corpus[i][2] for i in top],
                is_gold=[
                    not corpus[i][2] and contains_answer(corpus[i][0], [q.correct_answer])
                    for i in top
                ],
                query_sim=sims[top],
                k=k,
                extra={"query_embedding": qv},
            )
        )
    return cases


def demo_table(embedder: Any = None, k: int = 8) -> tuple[list[dict[str, Any]], str]:
    """Every retrieval-level defense on the built-in poisoned knowledge base (no data needed)."""
    cases = demo_cases(embedder, k)
    defenses: dict[str, Defense] = {
        "RAGDefender": ragdefender_defense(),
        **{f"GRADA-{n}": d for n, d in grada_variants().items() if n != "none"},
    }
    rows = [{"defense": "none"} | summarize(run_defense(lambda c: None, cases))]
    rows += [{"defense": n} | summarize(run_defense(d, cases)) for n, d in defenses.items()]
    lines = [
        f"Built-in poisoned knowledge base: {len(cases)} questions, top {k} retrieved "
        "(5 poison passages per question in the store)",
        "",
        "| defense | poison share of the context | queries with any poison | answer passage kept "
        "| benign removed per query | median ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['defense']} | {r['poison_share']:.3f} | {r['any_poison']:.2f} | "
            f"{r['gold_kept']:.2f} | {r['benign_removed']:.2f} | {r['ms_p50']:.2f} |"
        )
    return rows, "\n".join(lines)
