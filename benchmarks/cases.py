"""Benchmark cases: a question's passages retrieved by query similarity, with ground-truth labels
and their embeddings, for each benchmark setting (RAGDefender's, GRADA's RealtimeQA top 10, the
demo knowledge base, the suite's datasets x attacks)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ragdefense.attacks import make_poison, poisonedrag
from ragdefense.cases import Case, demo_cases
from ragdefense.defenses import registry
from ragdefense.embedders import Embedder, as_embedder
from ragdefense.integration.retrieval import pool_size
from ragdefense.similarity import cosine_to, unit_rows
from ragdefense.text import contains_answer, normalize, split_sentences
from ragdefense.types import Passage

from .datasets import QARecord

__all__ = [
    "RAGDEFENDER_BASE",
    "RAGDEFENDER_K",
    "Case",
    "attack_passages",
    "case_embedder",
    "demo_cases",
    "one_line_pool",
    "provenance_case",
    "ragdefender_cases",
    "realtimeqa_cases",
    "retrieved_case",
    "store_cases",
    "suite_cases",
]


def case_embedder(embedder: Any = None) -> Embedder:
    """``embedder`` (anything :func:`~ragdefense.as_embedder` takes) with a cache that holds
    every case's texts: each is embedded once per run, as one batch or case by case."""
    return as_embedder(embedder).with_cache(200_000)


#: the RAGDefender setting: poison per gold passage at ratio 1x, and the context size
RAGDEFENDER_BASE = {"nq": 5, "msmarco": 2, "hotpotqa": 2}
RAGDEFENDER_K = {"nq": 5, "msmarco": 2, "hotpotqa": 2}


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


def ragdefender_cases(
    records: Sequence[QARecord], dataset: str, ratios: Iterable[int], embedder: Embedder
) -> list[Case]:
    """The RAGDefender setting: R = gold passages + N poison passages (``question + ". " +
    text``), N = ratio x base (5 for NQ, 2 for MS MARCO and HotpotQA), ordered by query
    similarity; the top k survivors (5 for NQ, else 2) are the context."""
    ratios = list(ratios)
    base = RAGDEFENDER_BASE.get(dataset, 2)
    k = RAGDEFENDER_K.get(dataset, 2)
    texts: list[str] = []
    for r in records:
        texts += list(r.benign) + poisonedrag(r.question, r.poison[: base * max(ratios)])
    embedder.embed(texts)  # one batched pass; the per-case lookups below hit the cache
    cases = []
    for r in records:
        q = embedder.embed_query(r.question)
        for ratio in ratios:
            poison = poisonedrag(r.question, r.poison[: base * ratio])
            gold = [True] * len(r.benign) + [False] * len(poison)
            cases.append(
                retrieved_case(
                    dataset, f"{ratio}x", r.id, r.question, r.benign, poison, gold, embedder, q, k
                )
            )
    return cases


def realtimeqa_cases(
    records: Sequence[QARecord],
    n_poison: Iterable[int],
    embedder: Embedder,
    m: int = 10,
    n: int = 5,
) -> list[Case]:
    """The GRADA / RobustRAG setting: web results + ``p`` poison passages
    (``question + ". " + text``), ranked by query similarity, top ``m`` retrieved; the context is
    ``n`` passages. ``is_gold`` marks the web results containing a correct answer string (a
    planted passage is never gold, even where a short answer's string occurs in it)."""
    n_poison = list(n_poison)
    texts: list[str] = []
    for r in records:
        texts += list(r.benign) + poisonedrag(r.question, r.poison[: max(n_poison, default=0)])
    embedder.embed(texts)
    cases = []
    for r in records:
        q = embedder.embed_query(r.question)
        for p in n_poison:
            poison = poisonedrag(r.question, r.poison[:p])
            gold = list(r.gold) + [False] * len(poison)
            cases.append(
                retrieved_case(
                    "realtimeqa",
                    f"{p}p",
                    r.id,
                    r.question,
                    r.benign,
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


def attack_passages(
    record: QARecord,
    attack: str,
    count: int,
    others: Sequence[str] = (),
    seed: int = 0,
) -> list[str]:
    """``count`` poison passages of ``attack`` against ``record`` (:func:`ragdefense.attacks.
    make_poison`; fewer for ``poisonedrag`` when the data has fewer poison texts). ``others``:
    wrong answers of other questions, from which ``multi-answer`` draws (seeded) when the record
    has fewer than two alternatives of its own. ``dispersed`` hides the claims in the record's
    benign passages, lowest ranked first, with the sentences stating a correct answer removed."""
    alternatives = list(record.wrong_alternatives)
    hosts: list[str] = []
    if attack == "dispersed":
        for text in reversed(record.benign):
            kept = [s for s in split_sentences(text) if not contains_answer(s, record.answers)]
            if kept:
                hosts.append(" ".join(kept))
    if attack == "multi-answer" and len(alternatives) < 2:
        taken = {normalize(a) for a in record.answers} | {normalize(record.wrong_answer)}
        pool = sorted({o for o in others if o and normalize(o) not in taken})
        random.Random(f"{seed}:{record.dataset}:{record.id}").shuffle(pool)
        alternatives += pool
    return make_poison(
        attack, record.question, record.wrong_answer, count, record.poison, alternatives, hosts
    )


def suite_cases(
    records: Sequence[QARecord],
    attack: str,
    counts: Sequence[int],
    embedder: Embedder,
    m: int | None = 10,
    n: int = 5,
    seed: int = 0,
) -> list[Case]:
    """The cases of one (dataset, attack): one per record and poison count, ``setting`` = count;
    the top ``m`` by query similarity are retrieved (``None``: all)."""
    others = [r.wrong_answer for r in records]
    poison = {
        (r.id, c): attack_passages(r, attack, c, others, seed) for r in records for c in counts
    }
    embedder.embed([t for r in records for t in r.benign] + [t for p in poison.values() for t in p])
    cases = []
    for r in records:
        q = embedder.embed_query(r.question)
        for c in counts:
            bad = poison[(r.id, c)]
            gold = list(r.gold) + [False] * len(bad)
            extra = {
                "query_embedding": q,
                "answers": r.answers,
                "wrong_answer": r.wrong_answer,
                "attack": attack,
            }
            cases.append(
                retrieved_case(
                    r.dataset,
                    str(c),
                    r.id,
                    r.question,
                    r.benign,
                    bad,
                    gold,
                    embedder,
                    q,
                    n,
                    m,
                    extra,
                )
            )
    return cases


def _attacker(j: int, hosts: int) -> str:
    return f"https://attacker-{j % hosts + 1}.example/post/{j}"


def provenance_case(
    record: QARecord,
    poison: Sequence[str],
    embedder: Embedder,
    *,
    benign_top: int | None,
    k: int,
    m: int | None = None,
    hosts: int = 1,
    trusted_top: int = 2,
    one_document: int = 0,
    setting: str = "",
) -> dict[str, Case]:
    """One question as three cases ``plain`` / ``sources`` / ``trusted``: its benign passages
    (the top ``benign_top`` by query similarity, all when ``None``) and ``poison`` ranked
    together, the top ``m`` retrieved (all when ``None``), context ``k``. ``sources`` carry
    ``metadata["source"]`` (the record's links, or one source per gold passage; the poison
    from ``hosts`` attacker hosts);
    ``trusted`` also marks the ``trusted_top`` best-ranked benign passages (RealtimeQA) or the
    gold passages (``metadata["trusted"]``). ``one_document``: that many of the best-ranked
    benign passages are chunks of one document (one source)."""
    q = embedder.embed_query(record.question)
    benign = list(record.benign)
    links = list(record.sources) or [
        f"https://gold-{i}.{record.dataset.replace('/', '-')}.example/" for i in range(len(benign))
    ]
    if benign_top is not None and benign:
        sims = embedder.embed(benign) @ q
        order = np.argsort(-sims, kind="stable")[:benign_top]
        benign = [benign[i] for i in order]
        links = [links[i] for i in order]
        gold = [record.gold[i] for i in order]
    else:
        gold = list(record.gold)
    flags = gold + [False] * len(poison)
    base = retrieved_case(
        record.dataset,
        setting,
        record.id,
        record.question,
        benign,
        poison,
        flags,
        embedder,
        q,
        k,
        m,
        {"answers": record.answers},
    )
    # the retrieved benign passages, best-ranked first (the case is ordered by query similarity)
    ranked = [p.id for p, bad in zip(base.passages, base.is_poison, strict=True) if not bad]
    # trusted: the best-ranked web results, or every gold passage
    trusted_ids = set(ranked[:trusted_top]) if record.sources else set(ranked)
    joined = set(ranked[:one_document])

    def source(p: Passage) -> str:
        i = int(p.id or 0)
        if p.id in joined:
            return "uploads/web-results-joined.pdf"
        return links[i] if i < len(benign) else _attacker(i - len(benign), hosts)

    return _kinds(base, source, lambda p: p.id in trusted_ids)


def _kinds(
    base: Case, source: Callable[[Passage], str], trusted: Callable[[Passage], bool]
) -> dict[str, Case]:
    """``base`` as the three kinds: ``plain`` as it is, ``sources`` with each passage's
    ``metadata["source"]``, ``trusted`` with ``metadata["trusted"]`` too where ``trusted``."""
    out = {"plain": base}
    for kind in ("sources", "trusted"):
        passages = []
        for p in base.passages:
            meta: dict[str, Any] = {"source": source(p)}
            if kind == "trusted" and trusted(p):
                meta["trusted"] = True
            passages.append(replace(p, metadata=meta))
        out[kind] = replace(base, passages=passages, extra=dict(base.extra))
    return out


def one_line_pool(k: int) -> int:
    """The pool ``defend()`` fetches for a retriever of ``k`` with the default defense."""
    return pool_size(registry.defense(registry.DEFAULT_DEFENSE), k)


def store_cases(
    records: Sequence[QARecord],
    embedder: Embedder,
    k: int = 4,
    pool: int | None = None,
    planted: Mapping[tuple[str, str], Sequence[str]] | None = None,
) -> dict[str, list[Case]]:
    """Clean retrieval from one store holding every benign passage of ``records`` (copies
    once): each question retrieves its top ``pool`` from the whole store (``None``: what the
    one line fetches, :func:`one_line_pool`), context ``k``. A question's answers are its own
    answer passages (a bundle's gold passages, the RealtimeQA results that hold an answer;
    another question's passage holding a short answer string does not count). As
    :func:`provenance_case`, three kinds: ``plain``, ``sources`` (web results their link, each
    gold passage its own) and ``trusted`` (``sources`` with the bundles' passages trusted, the
    web results not). ``planted``: per question ``(dataset, id)``, passages planted in the same
    store (every question's at once, from one attacker host; any of them in a pool is poison,
    but a planted text equal to a benign one, which stays benign)."""
    texts: list[str] = []
    links: list[str] = []
    reference: list[bool] = []  # a bundle's passage (the store's reference part), not the web's
    seen: dict[str, int] = {}
    for r in records:
        for j, text in enumerate(r.benign):
            if text.strip() and text not in seen:
                seen[text] = len(texts)
                texts.append(text)
                links.append(r.sources[j] if r.sources else f"https://gold-{len(texts)}.example/")
                reference.append(not r.sources)
    benign = len(texts)
    extra = [t for r in records for t in (planted or {}).get((r.dataset, r.id), ()) if t.strip()]
    for j, text in enumerate(extra):
        seen.setdefault(text, len(texts))  # a planted text also found benign stays benign
        if seen[text] == len(texts):
            texts.append(text)
            links.append(_attacker(j, 1))
            reference.append(False)
    emb = np.asarray(embedder.embed(texts), dtype=float)
    unit = unit_rows(emb)
    out: dict[str, list[Case]] = {"plain": [], "sources": [], "trusted": []}
    pool = one_line_pool(k) if pool is None else pool
    for r in records:
        q = np.asarray(embedder.embed_query(r.question), dtype=float)
        qs = unit @ (q / np.linalg.norm(q))
        top = np.argsort(-qs, kind="stable")[:pool]
        gold = {seen[t] for t, g in zip(r.benign, r.gold, strict=True) if g and t in seen}
        is_gold = [int(i) in gold for i in top]
        base = Case(
            dataset=r.dataset,
            setting=f"store, context {k}",
            qid=r.id,
            question=r.question,
            passages=[Passage(texts[i], id=str(i), embedding=emb[i]) for i in top],
            is_poison=[int(i) >= benign for i in top],
            is_gold=is_gold,
            query_sim=qs[top],
            k=k,
            extra={"query_embedding": q, "answers": r.answers},
        )
        found = _kinds(base, lambda p: links[int(p.id or 0)], lambda p: reference[int(p.id or 0)])
        for kind, case in found.items():
            out[kind].append(case)
    return out
