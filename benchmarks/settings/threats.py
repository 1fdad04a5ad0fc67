"""``python -m benchmarks threats``: the "Choose your threat model" table: each way of running the
default (text only, with sources, with trusted sources) and the ``"strict"`` mode, against
clean retrieval, a minority of poison, and a poisoned majority with and without provenance.

Provenance comes from the data: RealtimeQA's web results carry their link (counted per host);
the RAGDefender bundles' gold passages are each their own source. Planted passages come from
``S`` attacker hosts (``attacker-1.example`` ...), round robin. Scenarios:

* clean: RealtimeQA top 10, context 5, no poison; and the same with its 8 best-ranked results
  joined as one document (one source filling most of the pool); and one store of every benign
  passage, each question's pool of 8 (what the one line fetches) at each framework's default k
  (:mod:`~benchmarks.settings.onestore`, also with one planted passage per question);
* minority: RealtimeQA with 1 / 3 / 5 poison ranked among the web results, top 10, context 5;
* majority, no sources: the RAGDefender setting (gold + poison at 1x-6x, every passage
  retrieved, context 5 NQ / 2 others), without metadata whatever the row;
* majority, one source: RealtimeQA's top 3 web results + 5 planted passages (a poisoned top 8,
  whatever their rank), context 5, the poison from one host;
* the curve: the same with the poison from S = 1, 2, 3, 5 hosts, and into the top 10;
* majority, gold sources: the RAGDefender setting with each gold passage its own source (a host
  of its own) and the poison from S = 1 or 2 attacker hosts, split by whether the gold has more
  independent sources than the attacker, as many (a tie), or fewer.

Trusted rows trust the two top-ranked web results (RealtimeQA) and the gold passages (the
RAGDefender setting); the trusted row's poisoned majority is also shown bundle by bundle and
ratio by ratio, with its worst held-out family. Families:
:data:`~benchmarks.settings.default.TUNING` and :data:`~benchmarks.settings.default.HELD_OUT`;
cells show the tuning family ``poisonedrag`` and the mean over the held-out ones; a last
table shows every tuning family on its own.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragdefense.defenses import registry
from ragdefense.embedders import Embedder

from ..cases import (
    RAGDEFENDER_BASE,
    RAGDEFENDER_K,
    Case,
    attack_passages,
    case_embedder,
    provenance_case,
)
from ..datasets import QARecord, load_qa
from ..report import markdown_table
from ..runner import CaseDefense, no_defense, on_case, run_cases, summarize
from .default import HELD_OUT, TUNING
from .onestore import (
    CLEAN,
    PLANTED,
    STORE_CONTEXTS,
    STORE_DATASETS,
    store_groups,
    store_lines,
    store_setting,
)

__all__ = ["THREAT_ROWS", "threats_table"]

#: rows of the table: label -> (defense name, params, whether cases carry sources / trust)
THREAT_ROWS: dict[str, tuple[str, dict[str, Any], str]] = {
    "none": ("none", {}, "plain"),
    "default (text only)": ("consensus", {}, "plain"),
    "default with sources": ("consensus", {}, "sources"),
    "default, trusted sources": (
        "consensus",
        {"trusted": lambda m: bool(m.get("trusted"))},
        "trusted",
    ),
    "strict": ("strict", {}, "plain"),
}


#: the rows of the gold-as-sources table
GOLD_ROWS = ("none", "default (text only)", "default with sources")
#: the default's rows (the table of every tuning family on its own)
DEFAULT_ROWS = ("default (text only)", "default with sources", "default, trusted sources")


def _family_poison(records: Sequence[QARecord], family: str, count: int) -> dict[str, list[str]]:
    others = [r.wrong_answer for r in records]
    return {r.id: attack_passages(r, family, count, others) for r in records}


def _cases(
    folder: Path, families: Sequence[str], limit: int | None, embedder: Embedder
) -> dict[tuple[str, str, str, str], list[Case]]:
    """(scenario, setting, family, kind) -> cases."""
    out: dict[tuple[str, str, str, str], list[Case]] = {}

    def add(scenario: str, setting: str, family: str, found: dict[str, Case]) -> None:
        for kind, case in found.items():
            out.setdefault((scenario, setting, family, kind), []).append(case)

    rt = load_qa(folder, "realtimeqa", limit)
    embedder.embed([t for r in rt for t in r.benign])
    for r in rt:
        add("clean", "0p", "-", provenance_case(r, [], embedder, benign_top=10, k=5))
        found = provenance_case(r, [], embedder, benign_top=10, k=5, one_document=8)
        add("clean", "one document", "-", found)
    for family in families:
        for count in (1, 3, 5):
            poison = _family_poison(rt, family, count)
            for r in rt:
                found = provenance_case(r, poison[r.id], embedder, benign_top=None, k=5, m=10)
                add("minority", f"{count}p", family, found)
        poison = _family_poison(rt, family, 5)
        for hosts in (1, 2, 3, 5):
            for top in (8, 10):
                for r in rt:
                    found = provenance_case(
                        r, poison[r.id], embedder, benign_top=top - 5, k=5, hosts=hosts
                    )
                    add("majority+sources", f"top {top}, S={hosts}", family, found)
    store = list(rt)
    for ds in ("nq", "msmarco", "hotpotqa"):
        records = load_qa(folder, f"ragdefender/{ds}", limit)
        store += records
        for family in families:
            for ratio in (1, 2, 4, 6):
                poison = _family_poison(records, family, RAGDEFENDER_BASE[ds] * ratio)
                for hosts in (1, 2):
                    for r in records:
                        found = provenance_case(
                            r, poison[r.id], embedder, benign_top=None, k=RAGDEFENDER_K[ds],
                            hosts=hosts,
                        )  # fmt: skip
                        if hosts == 1:
                            add("majority", f"{ds} {ratio}x", family, found)
                        # gold passages, each its own source, against S attacker sources
                        # pooled over bundles and ratios: a cell weighs every case alike
                        setting = f"S={hosts}, {_sides(sum(r.gold), hosts)}"
                        pair = {kind: found[kind] for kind in ("plain", "sources")}
                        add("majority, gold sources", setting, family, pair)
    return out | store_groups(store, embedder, families, lambda rs, f: _family_poison(rs, f, 1))


def _sides(gold_sources: int, attacker_sources: int) -> str:
    """How the gold's independent sources compare with the attacker's."""
    if gold_sources > attacker_sources:
        return "more gold sources"
    return "a tie" if gold_sources == attacker_sources else "more attacker sources"


def _defense(name: str, params: dict[str, Any]) -> CaseDefense:
    return no_defense if name == "none" else on_case(registry.defense(name, **params))


def threats_table(
    folder: str | os.PathLike[str],
    families: Sequence[str] = (*TUNING, *HELD_OUT),
    limit: int | None = None,
    embedder: Any = None,
) -> tuple[list[dict[str, Any]], str]:
    """Every row of :data:`THREAT_ROWS` on every scenario; the table and the S curve."""
    emb = case_embedder(embedder)
    groups = _cases(Path(folder), families, limit, emb)
    rows: list[dict[str, Any]] = []
    by: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for label, (name, params, kind) in THREAT_ROWS.items():
        defense = _defense(name, params)
        for (scenario, setting, family, k), cases in groups.items():
            # the RAGDefender setting is "without sources", except for trusting the gold (its
            # cases with the gold as sources are a scenario of their own)
            if k != ("plain" if scenario == "majority" and kind == "sources" else kind):
                continue
            if scenario == "majority, gold sources" and label not in GOLD_ROWS:
                continue  # not in its table
            row: dict[str, Any] = {
                "row": label,
                "scenario": scenario,
                "setting": setting,
                "family": family,
            }
            row |= summarize(run_cases(defense, cases)) | {"cases": len(cases)}
            rows.append(row)
            by[(label, scenario, setting, family)] = row
    errors = error_lines(rows)
    return rows, "\n".join([*_render(by, families), *([""] if errors else []), *errors])


def error_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """A line per row whose defense raised on some cases: those cases are left out of every
    mean (:func:`~benchmarks.runner.summarize`), which no cell shows."""
    return [
        f"Errors: {r['errors']} of {r['cases']} cases of {r['row']}, {r['scenario']}, "
        f"{r['setting']}, {r['family']} (left out of its cells)."
        for r in rows
        if r.get("errors")
    ]


def _mean(
    by: dict[Any, dict[str, Any]], keys: list[tuple[str, str, str, str]], field: str
) -> float:
    found = [by[k][field] for k in keys if k in by and field in by[k]]
    return statistics.fmean(found) if found else float("nan")


def _cell(
    by: dict[Any, dict[str, Any]],
    label: str,
    scenario: str,
    settings: list[str],
    family: str | Sequence[str],
) -> str:
    fams = [family] if isinstance(family, str) else list(family)
    keys = [(label, scenario, s, f) for s in settings for f in fams]
    if not any(k in by for k in keys):
        return "-"  # no case of this kind (e.g. more attacker sources than gold at S = 1)
    return f"{_mean(by, keys, 'poison_share'):.3f} / {_mean(by, keys, 'gold_in_context'):.2f}"


def _render(by: dict[Any, dict[str, Any]], families: Sequence[str]) -> list[str]:
    held = [f for f in families if f not in TUNING]
    tuning = [f for f in families if f in TUNING]
    majority = [f"{d} {r}x" for d in ("nq", "msmarco", "hotpotqa") for r in (1, 2, 4, 6)]
    one = ["top 8, S=1"]
    stored = [store_setting(d, STORE_CONTEXTS[0]) for d in STORE_DATASETS]
    table = []
    for label in THREAT_ROWS:
        clean = by.get((label, "clean", "0p", "-"), {})
        joined = by.get((label, "clean", "one document", "-"), {})
        ms = [
            by[k]["ms_p50"]
            for k in by
            if k[0] == label
            and k[1] not in ("majority, gold sources", CLEAN, PLANTED)
            and "ms_p50" in by[k]
        ]
        table.append(
            [
                label,
                f"{clean.get('gold_in_context', float('nan')):.2f}",
                f"{joined.get('gold_in_context', float('nan')):.2f}",
                f"{_mean(by, [(label, CLEAN, st, '-') for st in stored], 'gold_in_context'):.2f}",
                _cell(by, label, PLANTED, stored, TUNING[0]),
                *(_cell(by, label, "minority", [f"{c}p"], TUNING[0]) for c in (1, 3, 5)),
                _cell(by, label, "minority", ["1p", "3p", "5p"], held),
                _cell(by, label, "majority", majority, TUNING[0]),
                _cell(by, label, "majority", majority, held),
                _cell(by, label, "majority+sources", one, TUNING[0]),
                _cell(by, label, "majority+sources", one, held),
                f"{statistics.median(ms):.2f}" if ms else "",
            ]
        )
    header = [
        "row",
        "clean answer",
        "clean, one document",
        "clean, one store",
        "one store, 1 planted",
        "minority 1p",
        "minority 3p",
        "minority 5p",
        "minority, held out",
        "majority, no sources",
        "majority, no sources, held out",
        "majority, one source",
        "majority, one source, held out",
        "median ms",
    ]
    curve = []
    for label in ("none", "default (text only)", "default with sources"):
        for top in (8, 10):
            cells = [
                _cell(by, label, "majority+sources", [f"top {top}, S={s}"], fams)
                for s in (1, 2, 3, 5)
                for fams in ([TUNING[0]], held)
            ]
            curve.append([label, f"top {top}", *cells])
    curve_header = ["row", "pool"] + [
        f"S={s}{' held out' if h else ''}" for s in (1, 2, 3, 5) for h in (False, True)
    ]
    sides = ("more gold sources", "a tie", "more attacker sources")
    gold = [
        [
            label,
            side,
            *(
                _cell(by, label, "majority, gold sources", [f"S={s}, {side}"], fams)
                for s in (1, 2)
                for fams in ([TUNING[0]], held)
            ),
        ]
        for label in GOLD_ROWS
        for side in sides
    ]
    key = ("default with sources", "majority, gold sources")
    cases = "; ".join(
        f"S={s}: "
        + " / ".join(
            str(by.get((*key, f"S={s}, {side}", TUNING[0]), {}).get("cases", 0)) for side in sides
        )
        for s in (1, 2)
    )
    trusted = []
    row, scenario = "default, trusted sources", "majority"
    for setting in majority:  # the trusted row cell by cell: every bundle and ratio
        share = {f: by.get((row, scenario, setting, f), {}).get("poison_share", -1.0) for f in held}
        worst = max(held, key=share.__getitem__, default=None)
        trusted.append(
            [
                setting,
                _cell(by, row, scenario, [setting], TUNING[0]),
                _cell(by, row, scenario, [setting], held),
                f"{worst}: {_cell(by, row, scenario, [setting], worst)}" if worst else "-",
            ]
        )
    trusted_header = ["bundle", TUNING[0], "held out", "worst held-out family"]
    # every tuning family on its own: where the tables above show PoisonedRAG's wording only
    by_family = [
        [
            label,
            family,
            *(_cell(by, label, "minority", [f"{c}p"], family) for c in (1, 3, 5)),
            _cell(by, label, "majority", majority, family),
            *(
                _cell(by, label, "majority+sources", [f"top {top}, S={s}"], family)
                for top, s in ((8, 1), (10, 1), (8, 2))
            ),
        ]
        for label in DEFAULT_ROWS
        for family in tuning
    ]
    family_header = ["row", "family", "minority 1p", "minority 3p", "minority 5p"]
    family_header += ["majority, no sources", "top 8, S=1", "top 10, S=1", "top 8, S=2"]
    gold_header = ["row", "gold sources against attacker sources"] + [
        f"S={s}{' held out' if h else ''}" for s in (1, 2) for h in (False, True)
    ]
    removed = ", ".join(
        f"{label} {by[(label, 'clean', '0p', '-')]['benign_removed']:.1f}"
        for label in THREAT_ROWS
        if "benign_removed" in by.get((label, "clean", "0p", "-"), {})
    )
    return [
        "Choose your threat model (cells: poison share of the context / share of queries whose "
        f"context holds an answer; tuning family {TUNING[0]}, held out: {', '.join(held)}):",
        "",
        *markdown_table(header, table),
        "",
        "Passages removed per clean question (of the 10 retrieved; the context takes the next "
        f"ones in their place): {removed}. In the trusted row the poisoned majority's "
        "passages carry sources (trust is given by source): each gold passage its own, the "
        "planted ones one attacker host's. Minority columns: 1 / 3 / 5 passages planted among "
        "a question's web results, the top 10 by query similarity retrieved: the planted "
        "passages compete for it (PoisonedRAG's, which open with the question, nearly all reach "
        "it; reworded families fewer, so a held-out cell measures retrieval too).",
        "",
        *store_lines(by, list(THREAT_ROWS), lambda *a: _cell(by, *a), TUNING[0], held),
        "",
        "Five planted passages from S attacker sources among RealtimeQA's top web results "
        "(a poisoned top 8, and 5 of a top 10):",
        "",
        *markdown_table(curve_header, curve),
        "",
        "The RAGDefender setting (a poisoned majority) with the gold passages trusted, each "
        "its own source, and the planted ones from one attacker host, cell by cell (context 5 "
        "NQ / 2 others):",
        "",
        *markdown_table(trusted_header, trusted),
        "",
        "The RAGDefender setting (a poisoned majority) with each gold passage its own source and "
        "the planted passages from S attacker sources, by how many independent sources each "
        "side has (NQ holds 1-3 gold passages, MS MARCO 1 but for one question, HotpotQA 2; a "
        "cell pools the bundles and ratios where that side occurs):",
        "",
        *markdown_table(gold_header, gold),
        "",
        "Every tuning family on its own (the tables above show the tuning family "
        f"{TUNING[0]} only; the majority with sources: five planted passages among the top "
        "web results, from S attacker sources):",
        "",
        *markdown_table(family_header, by_family),
        "",
        f"Cases per family (more gold sources / a tie / more attacker sources): {cases}. Some "
        "rules were kept after their held-out numbers were seen: the documents quoting the "
        "question and each text once in the context (every row), a source judged on the "
        "passages an earlier step removed (the rows with sources). The held-out columns are "
        "not fully held out (see what was looked at).",
    ]
