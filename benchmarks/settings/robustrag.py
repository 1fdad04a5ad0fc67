"""RobustRAG on RealtimeQA (top 10 retrieved, 0 and 1 poison) with an LLM: vanilla RAG against
keyword aggregation, secure decoding and majority vote; accuracy, attack success, certified
accuracy and wall time."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from ragdefense.embedders import as_embedder
from ragdefense.llm import as_llm
from ragdefense.robustrag import ISOLATED_PROMPT, RobustRAG
from ragdefense.text import contains_answer

from ..cases import realtimeqa_cases
from ..datasets import load_realtimeqa
from ..report import markdown_table
from ..runner import progress_bar

__all__ = ["robustrag_table"]


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
        gold_letter = chr(ord("A") + int(rec.choice_answer)) if rec.choice_answer.isdigit() else ""
        s = case.setting
        t0 = time.perf_counter()
        [vanilla] = model.generate(
            [ISOLATED_PROMPT.format(context="\n\n".join(texts), query=case.question)]
        )
        add(s, "vanilla ms", (time.perf_counter() - t0) * 1000)
        v_text = vanilla.text or ""
        add(s, "vanilla acc", contains_answer(v_text, rec.answers))
        add(s, "vanilla asr", contains_answer(v_text, [rec.incorrect_answer]))
        t0 = time.perf_counter()
        kw = keyword.answer(case.question, texts)
        add(s, "keyword ms", (time.perf_counter() - t0) * 1000)
        add(s, "keyword acc", contains_answer(kw.answer, rec.answers))
        add(s, "keyword asr", contains_answer(kw.answer, [rec.incorrect_answer]))
        if decoding is not None:
            t0 = time.perf_counter()
            dec = decoding.answer(case.question, texts)
            add(s, "decoding ms", (time.perf_counter() - t0) * 1000)
            add(s, "decoding acc", contains_answer(dec.answer, rec.answers))
            add(s, "decoding asr", contains_answer(dec.answer, [rec.incorrect_answer]))
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
    ]
    table = []
    for name, label in [
        ("vanilla", "vanilla RAG"),
        ("keyword", "RobustRAG keyword"),
        ("decoding", "RobustRAG decoding"),
        ("majority", "RobustRAG majority vote (choices)"),
    ]:
        asr = mean("1p", f"{name} asr")
        rate = mean("0p", f"{name} certified")
        table.append(
            [
                label,
                f"{mean('0p', f'{name} acc'):.2f}",
                f"{mean('1p', f'{name} acc'):.2f}",
                "-" if asr != asr else f"{asr:.2f}",
                "-" if rate != rate else f"{rate:.2f}",
                f"{med('0p', f'{name} ms') / 1000:.2f}",
            ]
        )
    header = [
        "",
        "accuracy (clean)",
        "accuracy (1 poison)",
        "ASR (1 poison)",
        f"certified accuracy k'={k_prime}",
        "median s per query",
    ]
    lines += markdown_table(header, table)
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
