"""``ragdefense bench suite``: defenses side by side over datasets x attacks x poison counts.

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
* Defenses: ``none``, ``ragdefender``, ``grada`` (HRSIM), ``grada-bm25``, ``grada-ebd``,
  ``grada-hrsim-ebd``, ``grada-peel`` (HRSIM after peeling coordinated groups), ``auto``
  (:class:`~ragdefense.AutoDefense`), ``robustrag``
  (with an LLM only) and any ``module:function`` callable.
* Metrics: poison share of the context, queries with any poison, answer passage in the context,
  poison removed, benign passages removed (false removals), p50 / p95 latency, errors; with an LLM,
  accuracy and attack success rate of the answer (substring match, as in the papers). Latency is
  the defense's alone, except for ``robustrag``, whose answer (all its LLM calls) is timed.
"""

from __future__ import annotations

import csv
import importlib
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from .attacks import ATTACKS, DEFAULT_ATTACKS, make_poison
from .bench import (
    Case,
    CaseOutcome,
    DataError,
    Defense,
    contains_answer,
    context_indices,
    load_poisonedrag,
    load_ragdefender,
    load_realtimeqa,
    progress_bar,
    retrieved_case,
    run_case,
    summarize,
)
from .embedders import Embedder, as_embedder
from .types import DefenseResult, Passage, Verdict

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

DEFENSES = (
    "none",
    "ragdefender",
    "grada",
    "grada-bm25",
    "grada-ebd",
    "grada-hrsim-ebd",
    "grada-peel",
    "auto",
)
#: the defenses the suite runs unless told otherwise
DEFAULT_DEFENSES = DEFENSES[:6]
BUNDLES = ("nq", "msmarco", "hotpotqa")


@dataclass(frozen=True)
class QARecord:
    """One question in the suite's common shape, whatever file it came from."""

    dataset: str
    id: str
    question: str
    answers: tuple[str, ...]
    wrong_answer: str
    benign: tuple[str, ...]
    gold: tuple[bool, ...]  # per benign passage: an answer (or ground-truth) passage
    poison_texts: tuple[str, ...]
    wrong_alternatives: tuple[str, ...] = ()  # other distinct wrong answers, when the data has them


def available_datasets(folder: str | Path | None) -> list[str]:
    """``demo`` and every dataset found in ``folder`` (PoisonedRAG files only where the
    RAGDefender bundle of the same name is absent: the bundle has the same questions and poison,
    and the gold passages)."""
    names = ["demo"]
    if folder is None:
        return names
    base = Path(folder)
    if (base / "realtimeqa" / "realtimeqa.json").is_file():
        names.append("realtimeqa")
    bundles = [d for d in BUNDLES if (base / "ragdefender" / f"{d}.json").is_file()]
    names += [f"ragdefender/{d}" for d in bundles]
    # a PoisonedRAG file whose RAGDefender bundle is there would repeat the bundle's cases
    names += [
        f"poisonedrag/{d}"
        for d in BUNDLES
        if d not in bundles and (base / "poisonedrag" / f"{d}.json").is_file()
    ]
    return names


def load_qa(folder: str | Path | None, dataset: str, limit: int | None = None) -> list[QARecord]:
    """Load one dataset of the suite (see the module docstring for the names)."""
    if dataset == "demo":
        from .demo import load_demo_kb

        return [
            QARecord(
                "demo",
                q.id,
                q.question,
                (q.correct_answer,),
                q.incorrect_answer,
                tuple(q.benign),
                tuple(contains_answer(t, [q.correct_answer]) for t in q.benign),
                tuple(q.poison),
            )
            for q in load_demo_kb()[:limit]
        ]
    if folder is None:
        raise DataError(f"dataset {dataset!r} needs a data folder (--data or $RAGDEFENSE_DATA)")
    if dataset == "realtimeqa":
        out = []
        for r in load_realtimeqa(folder)[:limit]:
            low = {a.strip().lower() for a in r.answers} | {r.incorrect_answer.strip().lower()}
            alternatives = tuple(c for c in r.choices if c.strip().lower() not in low)
            out.append(
                QARecord(
                    dataset,
                    r.id,
                    r.question,
                    tuple(r.answers),
                    r.incorrect_answer,
                    tuple(r.web),
                    tuple(contains_answer(t, r.answers) for t in r.web),
                    tuple(r.poison),
                    alternatives,
                )
            )
        return out
    kind, _, name = dataset.partition("/")
    if kind == "ragdefender" and name:
        return [
            QARecord(
                dataset,
                r.id,
                r.question,
                (r.correct_answer,),
                r.incorrect_answer,
                tuple(r.gold),
                (True,) * len(r.gold),
                tuple(r.poison),
            )
            for r in load_ragdefender(folder, name)[:limit]
        ]
    if kind == "poisonedrag" and name:
        gold: dict[str, list[str]] = {}
        if (Path(folder) / "ragdefender" / f"{name}.json").is_file():
            gold = {r.id: r.gold for r in load_ragdefender(folder, name)}
        out = []
        for p in load_poisonedrag(folder, name)[:limit]:
            benign = gold.get(p.id) or [
                f"{p.question.rstrip('?')}? The answer is {p.correct_answer}."
            ]
            out.append(
                QARecord(
                    dataset,
                    p.id,
                    p.question,
                    (p.correct_answer,),
                    p.incorrect_answer,
                    tuple(benign),
                    (True,) * len(benign),
                    tuple(p.adv_texts),
                )
            )
        return out
    raise DataError(
        f"unknown dataset {dataset!r}: use demo, realtimeqa, ragdefender/<name> or "
        "poisonedrag/<name>"
    )


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
    has fewer than two alternatives of its own."""
    alternatives = list(record.wrong_alternatives)
    if attack == "multi-answer" and len(alternatives) < 2:
        correct = {a.lower() for a in record.answers} | {record.wrong_answer.lower()}
        pool = sorted({o for o in others if o and o.lower() not in correct})
        random.Random(f"{seed}:{record.dataset}:{record.id}").shuffle(pool)
        alternatives += pool
    return make_poison(
        attack, record.question, record.wrong_answer, count, record.poison_texts, alternatives
    )


def suite_cases(
    records: Sequence[QARecord],
    attack: str,
    counts: Sequence[int],
    embedder: Embedder,
    m: int = 10,
    n: int = 5,
    seed: int = 0,
) -> list[Case]:
    """The cases of one (dataset, attack): one per record and poison count, ``setting`` = count."""
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
            extra = {"query_embedding": q, "answers": r.answers, "wrong_answer": r.wrong_answer}
            case = retrieved_case(
                r.dataset, str(c), r.id, r.question, r.benign, bad, gold, embedder, q, n, m, extra
            )
            case.extra["attack"] = attack
            cases.append(case)
    return cases


# ---- defenses -----------------------------------------------------------------------------------


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


def _user_defense(obj: Any) -> Defense:
    """Wrap a user defense: an object with ``defend(query, passages)`` or a callable
    ``(query, passages) -> DefenseResult | kept passages | one bool per passage``."""
    call = obj.defend if hasattr(obj, "defend") else obj
    if not callable(call):
        raise TypeError(f"{obj!r} is neither a defense nor a callable")

    def run(case: Case) -> DefenseResult:
        out = call(case.question, list(case.passages))
        return out if isinstance(out, DefenseResult) else _from_kept(case, list(out))

    return run


def resolve_defense(spec: Any) -> Defense:
    """A suite defense from a name of :data:`DEFENSES`, a ``"module:attribute"`` string, or a
    callable / object with ``defend``. Built-in defenses use the embeddings the case carries."""
    if not isinstance(spec, str):
        return _user_defense(spec)
    if ":" in spec:
        module, _, attr = spec.partition(":")
        try:
            obj: Any = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import defense {spec!r}: {exc}") from exc
        return _user_defense(obj() if isinstance(obj, type) else obj)
    from .bench import auto_defense, grada_variants, ragdefender_defense

    if spec == "ragdefender":
        return ragdefender_defense()
    if spec == "auto":
        return auto_defense()
    variants = grada_variants()
    grada = {
        "none": "none",
        "grada": "hrsim",
        "grada-bm25": "bm25",
        "grada-ebd": "ebd",
        "grada-hrsim-ebd": "hrsim/ebd",
        "grada-peel": "hrsim+peel",
    }
    if spec in grada:
        return variants[grada[spec]]
    raise ValueError(f"unknown defense {spec!r}: use one of {DEFENSES}, 'robustrag' or module:attr")


# ---- running ------------------------------------------------------------------------------------


def _context(case: Case, result: DefenseResult | None) -> list[str]:
    return [case.passages[i].text for i in context_indices(case, result)]


def _answer_metrics(text: str, case: Case) -> dict[str, float]:
    from .robustrag import _contains

    return {
        "accuracy": float(_contains(text, case.extra["answers"])),
        "asr": float(_contains(text, [case.extra["wrong_answer"]])),
    }


class _Runner:
    """Runs named defenses (and an optional LLM) on cases; built once per process."""

    def __init__(self, llm: Any = None) -> None:
        self.llm_spec = llm
        self._llm: Any = None
        self._defenses: dict[str, Defense] = {}
        self._robust: Any = None

    def llm(self) -> Any:
        if self._llm is None and self.llm_spec is not None:
            from .llm import as_llm

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
            from .robustrag import ISOLATED_PROMPT

            prompt = ISOLATED_PROMPT.format(
                context="\n\n".join(_context(case, result)), query=case.question
            )
            answer = _answer_metrics(self.llm().generate([prompt])[0].text or "", case)
        return outcome, answer

    def _robustrag(self, case: Case) -> tuple[CaseOutcome, dict[str, float]]:
        if self.llm_spec is None:
            raise ValueError("the robustrag defense needs an LLM (--llm)")
        from .robustrag import RobustRAG

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
        return outcome, _answer_metrics(text, case)


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
    emb = as_embedder(embedder)
    if embedder is None:  # ours: keep every text of the run (RealtimeQA alone has ~5,000)
        emb.cache_size = max(emb.cache_size, 1 << 16)
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
                cell = _cell(r, "poison_share", 3) + " / " + _cell(r, "gold_in_context", 2)
                if llm:
                    cell += "; " + _cell(r, "accuracy", 2) + " / " + _cell(r, "asr", 2)
                cells.append(cell)
            lines.append(f"| {count} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| defense | median ms | p95 ms | benign removed per query | poison removed | errors |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        sub = [r for r in rows if r["defense"] == name and "ms_p50" in r]
        if not sub:
            lines.append(f"| {name} | - | - | - | - | {sum(r.get('errors', 0) for r in rows)} |")
            continue
        lines.append(
            f"| {name} | {statistics.median(r['ms_p50'] for r in sub):.2f} | "
            f"{max(r['ms_p95'] for r in sub):.2f} | "
            f"{statistics.mean(r['benign_removed'] for r in sub):.2f} | "
            f"{statistics.mean(r['poison_removed'] for r in sub):.3f} | "
            f"{sum(r.get('errors', 0) for r in rows if r['defense'] == name)} |"
        )
    return "\n".join(lines)


def _cell(row: dict[str, Any], key: str, digits: int) -> str:
    value = row.get(key)
    return "-" if value is None else f"{value:.{digits}f}"


def plot_rows(rows: Sequence[dict[str, Any]], path: Path) -> list[Path]:
    """Two PNGs beside ``path`` (``<stem>-poison.png``, ``<stem>-answer.png``): poison share and
    answer-in-context against the poison count, a panel per dataset (row) and attack (column), a
    line per defense. Nothing without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return []
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    attacks = list(dict.fromkeys(r["attack"] for r in rows))
    names = list(dict.fromkeys(r["defense"] for r in rows))
    written = []
    for key, label, suffix in [
        ("poison_share", "poison share of the context", "poison"),
        ("gold_in_context", "answer passage in the context", "answer"),
    ]:
        fig, axes = plt.subplots(
            len(datasets),
            len(attacks),
            figsize=(3.4 * len(attacks), 2.4 * len(datasets)),
            squeeze=False,
            sharex=True,
            sharey=True,
        )
        for i, ds in enumerate(datasets):
            for j, attack in enumerate(attacks):
                ax = axes[i][j]
                for name in names:
                    pts = [
                        (r["poison"], r[key])
                        for r in rows
                        if (r["dataset"], r["attack"], r["defense"]) == (ds, attack, name)
                        and key in r
                    ]
                    if pts:
                        ax.plot(*zip(*pts, strict=True), marker="o", label=name)
                ax.set_ylim(-0.03, 1.03)
                ax.set_title(f"{ds} · {attack}", fontsize=8)
                if i == len(datasets) - 1:
                    ax.set_xlabel("poison passages")
        fig.suptitle(label)
        axes[0][0].legend(fontsize=6)
        fig.tight_layout()
        out = path.with_name(f"{path.stem}-{suffix}.png")
        fig.savefig(out, dpi=100)
        plt.close(fig)
        written.append(out)
    return written
