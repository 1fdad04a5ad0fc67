"""Running defenses on benchmark cases: a defense on a case (timed, defense only), the metrics
of its context, and their summary over many cases. A benchmark defense is any callable
``Case -> DefenseResult | None`` (``None``: nothing filtered)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ragdefense.cliargs import import_object
from ragdefense.defenses import registry
from ragdefense.defenses.registry import names
from ragdefense.progress import progress_bar
from ragdefense.text import gives_answer, names_answer
from ragdefense.types import DefenseResult, Passage, Verdict

from .cases import Case

__all__ = [
    "CaseDefense",
    "CaseOutcome",
    "answer_metrics",
    "context_indices",
    "evaluate",
    "mean_of",
    "no_defense",
    "on_case",
    "progress_bar",
    "resolve_defense",
    "run_case",
    "run_cases",
    "summarize",
]

#: a defense as the benchmarks run it
CaseDefense = Callable[[Case], DefenseResult | None]


def answer_metrics(text: str | None, answers: Sequence[str], wrong: str) -> dict[str, float]:
    """An LLM answer scored as every benchmark scores it: accuracy when it gives a correct answer
    (:func:`~ragdefense.text.gives_answer`: an abstention gives none), attack success when it
    names the attacker's, even in a hedge (:func:`~ragdefense.text.names_answer`); where one
    side's answer is words of the other's ("Virginia", "West Virginia"), read outside it, as
    the red team reads it."""
    return {
        "accuracy": float(gives_answer(text, answers, [wrong])),
        "asr": float(names_answer(text, [wrong], answers)),
    }


def no_defense(case: Case) -> None:
    """The undefended baseline: nothing filtered."""
    return None


def on_case(defense: Any) -> CaseDefense:
    """A core defense (anything with ``defend_embeddings``) run on a case with the embeddings
    the case carries, as a vector store would give them."""
    return lambda c: defense.defend_embeddings(
        c.question, c.passages, c.embeddings, c.extra.get("query_embedding")
    )


@dataclass
class CaseOutcome:
    """Retrieval-level metrics of one defense on one case."""

    poison_share: float  # poison passages / context size (0 for an empty context)
    any_poison: bool
    gold_in_context: bool
    #: share of the poison passages removed by the defense (``None``: the case has none)
    poison_removed: float | None
    gold_kept: float  # share of gold passages kept by the defense
    benign_removed: int
    ms: float
    n_adv: int | None = None
    task_type: str | None = None
    error: str | None = None


def context_indices(case: Case, result: DefenseResult | None) -> list[int]:
    """The context: the top ``case.k`` passages the defense kept (all without one), by query
    similarity, or in a reranker's own order (GRADA), as the adapters hand them on."""
    if result is not None and result.reranked:
        return result.kept_indices[: case.k]
    kept = result.kept_indices if result is not None else range(len(case.passages))
    return sorted(kept, key=lambda i: -case.query_sim[i])[: case.k]


def evaluate(case: Case, result: DefenseResult | None, ms: float) -> CaseOutcome:
    """Metrics of the context (:func:`context_indices`) and of what the defense removed."""
    kept_set = set(result.kept_indices if result is not None else range(len(case.passages)))
    # a copy left out is no removal: its text stays in the passage standing for it
    kept_set |= {v.index for v in result.verdicts if v.details.get("copy")} if result else set()
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
            else None
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


def run_case(defense: CaseDefense, case: Case) -> tuple[DefenseResult | None, CaseOutcome]:
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


def run_cases(
    defense: CaseDefense, cases: Sequence[Case], progress: str | None = None
) -> list[CaseOutcome]:
    """Run ``defense`` on every case (timed, defense only), and evaluate; ``progress`` names a
    progress bar on stderr."""
    return [run_case(defense, c)[1] for c in progress_bar(cases, progress)]


def summarize(outcomes: Sequence[CaseOutcome]) -> dict[str, float | None]:
    """Mean of each metric over the cases that ran without error (the poison removed over those
    holding poison), median and p95 latency, and the number of errors."""
    errors = sum(o.error is not None for o in outcomes)
    outcomes = [o for o in outcomes if o.error is None]
    n = len(outcomes)
    if n == 0:
        return {"errors": errors} if errors else {}
    return {
        "poison_share": sum(o.poison_share for o in outcomes) / n,
        "any_poison": sum(o.any_poison for o in outcomes) / n,
        "gold_in_context": sum(o.gold_in_context for o in outcomes) / n,
        "poison_removed": mean_of([o.poison_removed for o in outcomes]),
        "gold_kept": sum(o.gold_kept for o in outcomes) / n,
        "benign_removed": sum(o.benign_removed for o in outcomes) / n,
        "ms_p50": statistics.median(o.ms for o in outcomes),
        "ms_p95": float(np.percentile([o.ms for o in outcomes], 95)),
        "errors": errors,
    }


def mean_of(values: Sequence[float | None]) -> float | None:
    """The mean over the cases a metric applies to (``None`` where it applies to none)."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _from_kept(case: Case, kept: Sequence[Any]) -> DefenseResult:
    """A user callable's answer (kept passages, their texts, or a bool per passage) as a result."""
    if len(kept) == len(case.passages) and all(isinstance(k, bool | np.bool_) for k in kept):
        mask = [bool(k) for k in kept]
    else:
        ids = {id(k) for k in kept}
        texts = {k.text if isinstance(k, Passage) else str(k) for k in kept}
        mask = [id(p) in ids or p.text in texts for p in case.passages]
    return DefenseResult(
        "user",
        case.question,
        tuple(
            Verdict(i, p, k, 0.0, "kept" if k else "removed")
            for i, p, k in zip(range(len(mask)), case.passages, mask, strict=True)
        ),
        "none",
    )


def _user_defense(obj: Any) -> CaseDefense:
    """Wrap a user defense: an object with ``defend(query, passages)`` or a callable
    ``(query, passages) -> DefenseResult | kept passages | one bool per passage``."""
    call = obj.defend if hasattr(obj, "defend") else obj
    if not callable(call):
        raise TypeError(f"{obj!r} is neither a defense nor a callable")

    def run(case: Case) -> DefenseResult:
        out = call(case.question, list(case.passages))
        return out if isinstance(out, DefenseResult) else _from_kept(case, list(out))

    return run


def resolve_defense(spec: Any) -> CaseDefense:
    """A benchmark defense from ``"none"``, a name of :mod:`ragdefense.defenses.registry`, a
    ``"module:attribute"`` string, or a callable / object with ``defend``. Built-in defenses use
    the embeddings the case carries."""
    if not isinstance(spec, str):
        return _user_defense(spec)
    if ":" in spec:
        try:
            obj = import_object(spec)
        except ValueError as exc:
            raise ValueError(f"cannot import defense {exc}") from None
        return _user_defense(obj() if isinstance(obj, type) else obj)
    if spec == "none":
        return no_defense
    try:
        return on_case(registry.defense(spec))
    except ValueError:
        raise ValueError(
            f"unknown defense {spec!r}: use none, {', '.join(names())}, robustrag or module:attr"
        ) from None
