"""``python -m benchmarks suite``: defenses side by side over datasets x attacks x poison counts.

For every question of a dataset, ``count`` poison passages written by an attack join the
question's benign passages; the union is ranked by query similarity (the packaged MiniLM unless
another embedder is given), the top ``m`` are retrieved, a defense filters or reranks them, and the
top ``n`` survivors by query similarity are the context (the GRADA setting: M = 10, n = 5).

* Datasets: ``demo`` (built in), ``realtimeqa``, ``ragdefender/<nq|msmarco|hotpotqa>`` (benign =
  the gold passages) and ``poisonedrag/<nq|msmarco|hotpotqa>`` (benign = the gold passages of the
  RAGDefender bundle with the same id when the data folder has it, else one passage stating the
  correct answer, written from a template).
* Attacks: ``poisonedrag`` (question + ". " + the dataset's poison texts), ``injection`` (the
  RobustRAG paper's repeated instruction to output the wrong answer), ``multi-answer`` (templated
  passages spread over up to three distinct wrong answers).
* Defenses: ``none``, every name of :mod:`ragdefense.defenses.registry` (``consensus``, the
  default; ``strict``, which is ``ragdefender``; ``grada`` (HRSIM), ``grada-bm25``,
  ``grada-ebd``, ``grada-hrsim-ebd``, ``grada-peel``, ``auto``), ``robustrag`` (with an LLM
  only) and any ``module:function`` callable.
* Metrics: poison share of the context, queries with any poison, answer passage in the context,
  poison removed, benign passages removed (false removals), p50 / p95 latency, errors; with an LLM,
  accuracy and attack success rate of the answer (substring match, as in the papers). Latency is
  the defense's alone, except for ``robustrag``, whose answer (all its LLM calls) is timed.
"""

from __future__ import annotations

import csv
import json
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from ragdefense.attacks import ATTACKS, DEFAULT_ATTACKS
from ragdefense.defenses.registry import names
from ragdefense.embedders import as_embedder, default_embedder
from ragdefense.llm import as_llm
from ragdefense.robustrag import ISOLATED_PROMPT, RobustRAG
from ragdefense.types import DefenseResult

from .cases import Case, attack_passages, suite_cases
from .datasets import QARecord, available_datasets, load_qa
from .report import cell, plot_rows, value
from .runner import (
    CaseDefense,
    CaseOutcome,
    answer_metrics,
    context_indices,
    mean_of,
    progress_bar,
    resolve_defense,
    run_case,
    summarize,
)

__all__ = [
    "ATTACKS",
    "DEFAULT_DEFENSES",
    "DEFENSES",
    "QARecord",
    "SuiteResult",
    "attack_passages",
    "load_qa",
    "resolve_defense",
    "run_suite",
    "suite_cases",
]

#: the defense names the suite knows (beside ``robustrag`` and ``module:function``)
DEFENSES = ("none", *names())
#: the defenses the suite runs unless told otherwise (``strict`` is ``ragdefender``'s preset:
#: named once)
DEFAULT_DEFENSES = ("none", "consensus", "ragdefender", "grada", "grada-bm25", "auto")


# ---- running ------------------------------------------------------------------------------------


def _context(case: Case, result: DefenseResult | None) -> list[str]:
    return [case.passages[i].text for i in context_indices(case, result)]


class _Runner:
    """Runs named defenses (and an optional LLM) on cases; built once per process."""

    def __init__(self, llm: Any = None) -> None:
        self.llm_spec = llm
        self._llm: Any = None
        self._defenses: dict[str, CaseDefense] = {}
        self._robust: Any = None

    def llm(self) -> Any:
        if self._llm is None and self.llm_spec is not None:
            self._llm = as_llm(None if self.llm_spec == "packaged" else self.llm_spec)
        return self._llm

    def run(self, spec: Any, case: Case) -> tuple[CaseOutcome, dict[str, float]]:
        if spec == "robustrag":
            return self._robustrag(case)
        key = spec if isinstance(spec, str) else repr(spec)
        if key not in self._defenses:
            self._defenses[key] = resolve_defense(spec)
        result, outcome = run_case(self._defenses[key], case)
        answer: dict[str, float] = {}
        if self.llm_spec is not None and outcome.error is None:
            prompt = ISOLATED_PROMPT.format(
                context="\n\n".join(_context(case, result)), query=case.question
            )
            text = self.llm().generate([prompt])[0].text or ""
            answer = answer_metrics(text, case.extra["answers"], case.extra["wrong_answer"])
        return outcome, answer

    def _robustrag(self, case: Case) -> tuple[CaseOutcome, dict[str, float]]:
        if self.llm_spec is None:
            raise ValueError("the robustrag defense needs an LLM (--llm)")
        if self._robust is None:
            self._robust = RobustRAG(llm=self.llm())
        # RobustRAG answers from the top-n retrieved passages; it filters nothing
        outcome = run_case(lambda c: None, case)[1]
        t0 = time.perf_counter()
        try:
            text = self._robust.answer(case.question, _context(case, None)).answer or ""
        except Exception as exc:  # recorded as this query's error
            outcome.error = f"{type(exc).__name__}: {exc}"[:300]
            return outcome, {}
        outcome.ms = (time.perf_counter() - t0) * 1000
        return outcome, answer_metrics(text, case.extra["answers"], case.extra["wrong_answer"])


_WORKER: _Runner | None = None


def _worker_init(llm: Any) -> None:
    global _WORKER
    _WORKER = _Runner(llm)


def _worker_run(spec: Any, cases: list[Case]) -> list[tuple[CaseOutcome, dict[str, float]]]:
    assert _WORKER is not None
    return [_WORKER.run(spec, c) for c in cases]


@dataclass
class SuiteResult:
    """Rows (one per dataset, attack, poison count and defense) and their Markdown report."""

    rows: list[dict[str, Any]]
    markdown: str

    def write(self, folder: str | Path, name: str = "suite") -> list[Path]:
        """Write ``<name>.md``, ``.json``, ``.csv`` and (with matplotlib) the two plots of
        :func:`plot_rows`; returns the paths."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / f"{name}.md", out / f"{name}.json", out / f"{name}.csv"]
        paths[0].write_text(self.markdown + "\n", encoding="utf-8")
        paths[1].write_text(json.dumps(self.rows, indent=1), encoding="utf-8")
        fields = list(dict.fromkeys(k for r in self.rows for k in r))
        with paths[2].open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(self.rows)
        return paths + plot_rows(self.rows, out / f"{name}.png")


def run_suite(
    folder: str | Path | None = None,
    datasets: Sequence[str] | None = None,
    attacks: Sequence[str] = DEFAULT_ATTACKS,
    counts: Sequence[int] = (1, 3, 5),
    defenses: Sequence[Any] = DEFAULT_DEFENSES,
    limit: int | None = None,
    m: int = 10,
    n: int = 5,
    seed: int = 0,
    jobs: int = 1,
    llm: Any = None,
    embedder: Any = None,
    progress: bool = True,
) -> SuiteResult:
    """Run the suite; see the module docstring.

    Args:
        folder: The data folder (``None``: only ``demo``).
        datasets: Names (default: every dataset found, see :func:`available_datasets`).
        attacks, counts: Attacks and poison passages per question.
        defenses: Names of :data:`DEFENSES`, ``"robustrag"``, ``"module:attr"`` strings, or
            callables / objects with ``defend`` (these must be picklable when ``jobs > 1``).
        limit: First ``limit`` questions of each dataset.
        m, n: Passages retrieved and passages in the context.
        seed: Seeds the choice of other questions' wrong answers in ``multi-answer``.
        jobs: Worker processes for the defense (and LLM) stage; embeddings are computed once, in
            this process. Results do not depend on it (latencies measured in parallel are noisier).
        llm: ``"packaged"`` (SmolLM2), any LLM :func:`ragdefense.as_llm` accepts, or ``None`` (no
            answer-level metrics; ``robustrag`` is then skipped).
    """
    datasets = list(datasets or available_datasets(folder))
    defenses = [d for d in defenses if llm is not None or d != "robustrag"]
    for d in defenses:  # fail on a bad name before any embedding work
        if d != "robustrag":
            resolve_defense(d)
    # the default model, with a cache of this run's own that keeps every text (RealtimeQA alone
    # has ~5,000); the shared default embedder's cache is left as it is
    emb = as_embedder(embedder) if embedder is not None else default_embedder().with_cache(1 << 16)
    records = {ds: load_qa(folder, ds, limit) for ds in datasets}  # bad data fails here
    plan = [(ds, attack) for ds in datasets for attack in attacks]
    cases: list[Case] = []
    for ds, attack in progress_bar(plan, "retrieval" if progress else None):
        cases += suite_cases(records[ds], attack, counts, emb, m, n, seed)
    names = [
        d if isinstance(d, str) else getattr(d, "__name__", type(d).__name__) for d in defenses
    ]
    results = _run_all(cases, list(defenses), jobs, llm, progress)
    rows = []
    for ds, attack, count in dict.fromkeys(
        (c.dataset, c.extra["attack"], int(c.setting)) for c in cases
    ):
        idx = [
            i
            for i, c in enumerate(cases)
            if (c.dataset, c.extra["attack"], int(c.setting)) == (ds, attack, count)
        ]
        for j, name in enumerate(names):
            outcomes = [results[j][i][0] for i in idx]
            answers = [results[j][i][1] for i in idx if results[j][i][1]]
            row: dict[str, Any] = {
                "dataset": ds,
                "attack": attack,
                "poison": count,
                "defense": name,
                "queries": len(idx),
            } | summarize(outcomes)
            for metric in ("accuracy", "asr"):
                if answers:
                    row[metric] = sum(a[metric] for a in answers) / len(answers)
            rows.append(row)
    return SuiteResult(rows, suite_markdown(rows, m, n, seed))


def _run_all(
    cases: list[Case], defenses: list[Any], jobs: int, llm: Any, progress: bool
) -> list[list[tuple[CaseOutcome, dict[str, float]]]]:
    total = len(cases) * len(defenses)
    bar = progress_bar(range(total), "suite" if progress else None, total)
    tick = bar.update if hasattr(bar, "update") else (lambda k: None)
    results: list[list[tuple[CaseOutcome, dict[str, float]]]] = []
    if jobs <= 1:
        runner = _Runner(llm)
        for spec in defenses:
            row = []
            for c in cases:
                row.append(runner.run(spec, c))
                tick(1)
            results.append(row)
    else:
        chunk = max(1, -(-len(cases) // (jobs * 4)))
        pieces = [cases[i : i + chunk] for i in range(0, len(cases), chunk)]
        with ProcessPoolExecutor(
            jobs, mp_context=get_context("spawn"), initializer=_worker_init, initargs=(llm,)
        ) as pool:
            futures = [[pool.submit(_worker_run, spec, p) for p in pieces] for spec in defenses]
            for spec_futures in futures:
                row = []
                for f in spec_futures:
                    part = f.result()
                    row += part
                    tick(len(part))
                results.append(row)
    if hasattr(bar, "close"):
        bar.close()
    return results


# ---- reporting ----------------------------------------------------------------------------------


def suite_markdown(rows: Sequence[dict[str, Any]], m: int = 10, n: int = 5, seed: int = 0) -> str:
    """The suite's report: one table per (dataset, attack), then latency and false removals."""
    names = list(dict.fromkeys(r["defense"] for r in rows))
    llm = any("accuracy" in r for r in rows)
    lines = [
        f"Top {m} retrieved, context of {n}; cells: poison share of the context / share of "
        "queries whose context holds a benign answer passage (a gold passage, or one stating a "
        "correct answer)"
        + ("; then accuracy / ASR of the LLM's answer" if llm else "")
        + f". Seed {seed}.",
    ]
    groups = dict.fromkeys((r["dataset"], r["attack"]) for r in rows)
    for ds, attack in groups:
        sub = [r for r in rows if (r["dataset"], r["attack"]) == (ds, attack)]
        lines += [
            "",
            f"**{ds} · {attack}** ({sub[0]['queries']} questions)",
            "",
            "| poison | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        ]
        for count in dict.fromkeys(r["poison"] for r in sub):
            cells = []
            for name in names:
                r = next(x for x in sub if x["poison"] == count and x["defense"] == name)
                text = cell(r)
                if llm:
                    text += "; " + value(r, "accuracy", 2) + " / " + value(r, "asr", 2)
                cells.append(text)
            lines.append(f"| {count} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| defense | median ms | p95 ms | benign removed per query | poison removed | errors |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        sub = [r for r in rows if r["defense"] == name and "ms_p50" in r]
        if not sub:
            errors = sum(r.get("errors", 0) for r in rows if r["defense"] == name)
            lines.append(f"| {name} | - | - | - | - | {errors} |")
            continue
        removed = {"poison_removed": mean_of([r["poison_removed"] for r in sub])}  # with poison
        lines.append(
            f"| {name} | {statistics.median(r['ms_p50'] for r in sub):.2f} | "
            f"{max(r['ms_p95'] for r in sub):.2f} | "
            f"{statistics.mean(r['benign_removed'] for r in sub):.2f} | "
            f"{value(removed, 'poison_removed', 3)} | "
            f"{sum(r.get('errors', 0) for r in rows if r['defense'] == name)} |"
        )
    return "\n".join(lines)
