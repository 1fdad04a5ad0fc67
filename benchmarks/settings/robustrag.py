"""RobustRAG on RealtimeQA (top 10 retrieved, 0 and 1 poison) with an LLM: vanilla RAG against
keyword aggregation, secure decoding and majority vote; accuracy, attack success, certified
accuracy and wall time. Accuracy reads answers as the certificates do,
:func:`~ragdefense.text.gives_answer` (as whole words; an abstention gives none); attack
success with :func:`~ragdefense.text.names_answer` (a hedge naming the attacker's answer
counts)."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from ragdefense.llm import as_llm
from ragdefense.robustrag import ISOLATED_PROMPT, RobustRAG
from ragdefense.text import normalize

from ..cases import case_embedder, realtimeqa_cases
from ..datasets import load_realtimeqa
from ..report import markdown_table
from ..runner import answer_metrics, progress_bar

__all__ = ["robustrag_table"]


#: per (setting, metric): the values over the questions
Values = dict[tuple[str, str], list[float]]


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
    engines = {
        "keyword": RobustRAG(llm=model),
        "majority": RobustRAG(llm=model, aggregation="majority", max_new_tokens=8),
    }
    if model.supports_token_probs:
        engines["decoding"] = RobustRAG(llm=model, aggregation="decoding")
    records = load_realtimeqa(folder)[:limit]
    cases = realtimeqa_cases(records, [0, 1], case_embedder(embedder))
    by_id = {r.id: r for r in records}
    acc: Values = {}
    for case in progress_bar(cases, "robustrag" if progress else None):
        _measure(case, by_id[case.qid], model, engines, k_prime, acc)
    return _report(acc, len(records), type(model).__name__, k_prime)


def _measure(
    case: Any, rec: Any, model: Any, engines: dict[str, RobustRAG], k_prime: int, acc: Values
) -> None:
    """One case: vanilla RAG and each RobustRAG aggregation (answer, time, certification on
    the clean retrieval) into ``acc``."""
    s = case.setting

    def add(name: str, value: float) -> None:
        acc.setdefault((s, name), []).append(value)

    texts = [p.text for p in case.passages]
    wrong = normalize(rec.incorrect_answer)
    gold_letter = chr(ord("A") + int(rec.choice_answer)) if rec.choice_answer.isdigit() else ""
    t0 = time.perf_counter()
    [vanilla] = model.generate(
        [ISOLATED_PROMPT.format(context="\n\n".join(texts), query=case.question)]
    )
    add("vanilla ms", (time.perf_counter() - t0) * 1000)
    scored = answer_metrics(vanilla.text, rec.answers, rec.incorrect_answer)
    add("vanilla acc", scored["accuracy"])
    add("vanilla asr", scored["asr"])
    for name, engine in engines.items():
        if name == "majority" and not rec.choices:
            continue
        choices = rec.choices if name == "majority" else None
        t0 = time.perf_counter()
        answer = engine.answer(case.question, texts, choices=choices)
        add(f"{name} ms", (time.perf_counter() - t0) * 1000)
        if name == "majority":
            add("majority acc", answer.choice == gold_letter)
            # attack success only where the attacker's answer is one of the choices
            bad = [i for i, c in enumerate(rec.choices) if normalize(c) == wrong]
            if bad:
                add("majority asr", answer.choice == chr(ord("A") + bad[0]))
        else:
            scored = answer_metrics(answer.answer, rec.answers, rec.incorrect_answer)
            add(f"{name} acc", scored["accuracy"])
            add(f"{name} asr", scored["asr"])
        if s == "0p":  # certified accuracy: the clean retrieval, k' injected passages
            gold = gold_letter if name == "majority" else rec.answers
            t0 = time.perf_counter()
            cert = engine.certify(answer, k_prime, gold=gold).certificate
            if name == "keyword":
                add("keyword certify ms", (time.perf_counter() - t0) * 1000)
            add(f"{name} certified", bool(cert and cert.certified))


def _report(acc: Values, n: int, model_name: str, k_prime: int) -> tuple[list[dict[str, Any]], str]:
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
    lines = [f"RealtimeQA, first {n} questions, top-10 retrieved; LLM: {model_name}", ""]
    lines += markdown_table(header, table)
    ratio = med("0p", "keyword ms") / med("0p", "vanilla ms")
    ratio_dec = med("0p", "decoding ms") / med("0p", "vanilla ms")
    certify_s = med("0p", "keyword certify ms") / 1000
    lines += [
        "",
        f"Wall time / one vanilla RAG call (median, clean): keyword {ratio:.2f}x, decoding "
        f"{ratio_dec:.2f}x (T_max = 20); keyword certification at k'={k_prime} adds a median "
        f"{certify_s:.2f} s.",
        "Majority vote's ASR is over the questions one of whose choices is the attacker's answer "
        f"({len(acc.get(('1p', 'majority asr'), []))} of {n}); elsewhere it cannot win.",
    ]
    return rows, "\n".join(lines)
