"""Benchmark data: the one record type (:class:`QARecord`) and the loaders of every data file
(the RAGDefender bundle, PoisonedRAG's release, RealtimeQA) and of the suite's datasets."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from ragdefense.data import QARecord
from ragdefense.text import contains_answer, normalize

__all__ = [
    "BUNDLES",
    "DataError",
    "QARecord",
    "available_datasets",
    "data_dir",
    "load_poisonedrag",
    "load_qa",
    "load_ragdefender",
    "load_realtimeqa",
]

BUNDLES = ("nq", "msmarco", "hotpotqa")


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


def load_ragdefender(folder: str | os.PathLike[str], dataset: str) -> list[QARecord]:
    """Load ``<folder>/ragdefender/<dataset>.json`` (or ``<folder>/<dataset>.json``); poison =
    ``adv_texts + extra_adv_texts_gpt4`` in file order, every gold passage an answer passage."""
    path, raw = _load_records(folder, "ragdefender", f"{dataset}.json")
    out = []
    for i, rec in enumerate(raw):
        question = _field(path, i, rec, "question", str)
        gold = [str(t) for t in _field(path, i, rec, "gold_passages", list)]
        adv = _field(path, i, rec, "adv_texts", list)
        extra = rec.get("extra_adv_texts_gpt4", []) if isinstance(rec, dict) else []
        out.append(
            QARecord(
                f"ragdefender/{dataset}",
                str(rec.get("id", i)),
                question,
                (str(rec.get("correct answer", "")),),
                str(rec.get("incorrect answer", "")),
                tuple(gold),
                (True,) * len(gold),
                tuple(str(t) for t in list(adv) + list(extra)),
            )
        )
    return out


def load_poisonedrag(folder: str | os.PathLike[str], dataset: str) -> list[QARecord]:
    """Load ``<folder>/poisonedrag/<dataset>.json`` (a dict id -> record); no benign passages."""
    path, raw = _load_records(folder, "poisonedrag", f"{dataset}.json", kind=dict)
    out = []
    for i, (key, rec) in enumerate(raw.items()):
        out.append(
            QARecord(
                f"poisonedrag/{dataset}",
                str(key),
                _field(path, i, rec, "question", str),
                (str(_field(path, i, rec, "correct answer", (str, int, float))),),
                str(_field(path, i, rec, "incorrect answer", (str, int, float))),
                poison=tuple(str(t) for t in _field(path, i, rec, "adv_texts", list)),
            )
        )
    return out


def load_realtimeqa(folder: str | os.PathLike[str]) -> list[QARecord]:
    """Load ``<folder>/realtimeqa/realtimeqa.json`` (or ``<folder>/realtimeqa.json``): benign =
    the web results as ``title\\ntext`` in search-rank order (title-only results skipped), gold =
    those containing a correct answer; the multiple-choice options other than the correct and
    the attacker's answers are the wrong alternatives."""
    path, raw = _load_records(folder, "realtimeqa", "realtimeqa.json")
    out = []
    for i, rec in enumerate(raw):
        question = _field(path, i, rec, "question", str)
        correct = _field(path, i, rec, "correct answer", list)
        expanded = rec.get("expanded answer", []) or []
        context = _field(path, i, rec, "context", list)
        web, links = [], []
        for j, c in enumerate(context):
            if not isinstance(c, dict):
                raise DataError(
                    f"{path}: record {i} (id={rec.get('id')!r}) context[{j}] is not an object"
                )
            if isinstance(c.get("text"), str) and c["text"].strip():
                title = c.get("title") if isinstance(c.get("title"), str) else ""
                web.append(f"{title}\n{c['text']}" if title else c["text"])
                links.append(str(c.get("link") or ""))
        answers = tuple(str(a) for a in list(correct) + list(expanded))
        wrong = str(_field(path, i, rec, "incorrect answer", (str, int, float)))
        choices = tuple(str(c) for c in rec.get("choices", []))
        taken = {normalize(a) for a in answers} | {normalize(wrong)}
        out.append(
            QARecord(
                "realtimeqa",
                str(rec.get("id", i)),
                question,
                answers,
                wrong,
                tuple(web),
                tuple(contains_answer(t, answers) for t in web),
                tuple(str(t) for t in _field(path, i, rec, "incorrect_context", list)),
                tuple(c for c in choices if normalize(c) not in taken),
                choices,
                str(rec.get("choices answer", "")),
                tuple(links),
            )
        )
    return out


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
    names += [
        f"poisonedrag/{d}"
        for d in BUNDLES
        if d not in bundles and (base / "poisonedrag" / f"{d}.json").is_file()
    ]
    return names


def load_qa(folder: str | Path | None, dataset: str, limit: int | None = None) -> list[QARecord]:
    """Load one dataset of the suite: ``demo``, ``realtimeqa``, ``ragdefender/<name>`` or
    ``poisonedrag/<name>`` (benign = the gold passages of the RAGDefender bundle with the same id
    when the folder has it, else one passage stating the correct answer, from a template)."""
    if dataset == "demo":  # its planted passages open with their question: a record's do not
        from ragdefense.data import load_demo_kb

        return [
            replace(r, poison=tuple(p.removeprefix(r.question).strip() for p in r.poison))
            for r in load_demo_kb()[:limit]
        ]
    if folder is None:
        raise DataError(f"dataset {dataset!r} needs a data folder (--data or $RAGDEFENSE_DATA)")
    if dataset == "realtimeqa":
        return load_realtimeqa(folder)[:limit]
    kind, _, name = dataset.partition("/")
    if kind == "ragdefender" and name:
        return load_ragdefender(folder, name)[:limit]
    if kind == "poisonedrag" and name:
        gold: dict[str, tuple[str, ...]] = {}
        if (Path(folder) / "ragdefender" / f"{name}.json").is_file():
            gold = {r.id: r.benign for r in load_ragdefender(folder, name)}
        out = []
        for p in load_poisonedrag(folder, name)[:limit]:
            benign = gold.get(p.id) or (
                f"{p.question.rstrip('?')}? The answer is {p.correct_answer}.",
            )
            out.append(replace(p, benign=benign, gold=(True,) * len(benign)))
        return out
    raise DataError(
        f"unknown dataset {dataset!r}: use demo, realtimeqa, ragdefender/<name> or "
        "poisonedrag/<name>"
    )
