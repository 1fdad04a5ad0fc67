"""Bad input to the core's entry points: a clear error naming what is wrong, before any work,
or a documented safe behaviour (found by an independent review of the public API)."""

from __future__ import annotations

import json
import warnings
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ragdefense
from ragdefense import Passage
from ragdefense.auditing import AuditSettings, ListCorpus, audit
from ragdefense.auditing.corpus import read_queries
from ragdefense.auditing.workdir import Workdir
from ragdefense.defenses.quarantine import Quarantine
from ragdefense.embedders import embed_passages
from ragdefense.similarity import BM25, cosine_matrix
from ragdefense.types import DefenseInputError

from .conftest import bag_of_words


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"defenses": ["bogus"]}, ValueError, "unknown defense 'bogus'"),
        ({"defenses": "consensus"}, TypeError, r"defenses=\[name\]"),
        ({"index": "bogus"}, ValueError, "index must be one of"),
        ({"max_probes": 0}, ValueError, "max_probes"),
        ({"max_probes": -3}, ValueError, "max_probes"),
        ({"top_m": 5.5}, TypeError, "top_m must be a whole number"),
        ({"top_m": "5"}, TypeError, "top_m must be a whole number"),
        ({"part_size": 7.5}, TypeError, "part_size"),
        ({"neighbours": True}, TypeError, "neighbours"),
        ({"report_top": -1}, ValueError, "report_top"),
    ],
)
def test_audit_settings_are_checked_when_made(
    settings: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        AuditSettings(**settings)


def test_audit_with_an_unknown_defense_fails_before_touching_the_folder(tmp_path: Path) -> None:
    work = tmp_path / "audit"
    with pytest.raises(ValueError, match="unknown defense"):
        audit(["one chunk of text", "another chunk"], workdir=work, defenses=["bogus"])
    assert not work.exists() or not any(work.iterdir())


def test_list_corpus_refuses_vectors_that_are_not_one_row_per_chunk() -> None:
    with pytest.raises(ValueError, match="2-D array"):
        ListCorpus(["a b c", "d e f"], vectors=np.ones(2))
    with pytest.raises(ValueError, match="2-D array"):
        ListCorpus(["a b c", "d e f"], vectors=np.ones((2, 3, 4)))


def test_a_json_query_log_must_be_a_list(tmp_path: Path) -> None:
    one = tmp_path / "q.json"
    one.write_text(json.dumps("Who painted the Mona Lisa?"))
    with pytest.raises(ValueError, match="expected a list of queries, got str"):
        read_queries(one)
    latin = tmp_path / "q.txt"
    latin.write_bytes("Qui a peint la Joconde ? \xe9t\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match=r"q\.txt: not UTF-8"):
        read_queries(latin)


def test_a_damaged_manifest_says_so(tmp_path: Path) -> None:
    wd = Workdir(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"ragdefense_audit": 1, "params": []}))
    with pytest.raises(ValueError, match=r"manifest\.json: damaged.*fresh"):
        wd.start({"top_m": 10})


FINDING = {
    "id": "a",
    "text": "a planted text",
    "suspicious": True,
    "score": 0.9,
    "group": {"size": 3},
}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"score": None}, "score is None"),
        ({"group": [1, 2]}, "group size"),
        ({"group": {"size": None}}, "group size is None"),
        ({"group": {"size": 1e400}}, "group size is inf, not a whole number"),
        ({"group": {"size": 2.5}}, "group size is 2.5, not a whole number"),
        ({"text": None}, "text is not a string"),
    ],
)
def test_a_report_with_odd_fields_is_refused(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Quarantine.from_report({"findings": [FINDING | change]})


def test_a_report_reads_where_an_odd_field_decides_nothing() -> None:
    """A list as a lone chunk's source is no condemned source; a finding not flagged is not
    read further."""
    alone = FINDING | {"id": "b", "source": ["a"], "group": {"size": 1}}
    unflagged = FINDING | {"id": "c", "suspicious": False, "score": None, "text": "honest"}
    quarantine = Quarantine.from_report({"findings": [FINDING, alone, unflagged]})
    assert quarantine.ids == frozenset({"a"})


def test_quarantine_errors_name_the_callers_position() -> None:
    def trusted(metadata: dict[str, Any]) -> bool:
        if metadata.get("bad"):
            raise RuntimeError("boom")
        return False

    quarantine = Quarantine.from_report(
        {"findings": [FINDING]}, ragdefense.defense("consensus", trusted=trusted)
    )
    passages = [Passage("a planted text"), Passage("x"), Passage("y", metadata={"bad": 1})]
    with pytest.warns(UserWarning, match="judged as untrusted"):  # one failing: untrusted
        result = quarantine.defend("who?", [*passages, Passage("z")])
    assert list(result.estimates["trust_unread"]) == [2]  # the caller's position
    assert "passage 2's metadata" in result.estimates["trust_unread"][2]
    bad = [Passage(t, metadata={"bad": 1}) for t in ("x", "y", "w")]
    with pytest.raises(DefenseInputError, match="passage 1's metadata"):  # failing on all
        quarantine.defend("who?", [passages[0], *bad])


def test_grada_refuses_a_bm25_that_is_not_one() -> None:
    with pytest.raises(TypeError, match="bm25 must be"):
        ragdefense.defense("grada", bm25=1.5)
    assert ragdefense.defense("grada", bm25=BM25(k1=1.2)).bm25.k1 == 1.2


@pytest.mark.parametrize("scale", [1e200, 1e-300])
def test_embeddings_of_any_finite_magnitude_keep_their_direction(scale: float) -> None:
    rng = np.random.default_rng(0)
    emb, q = rng.normal(size=(6, 8)), rng.normal(size=8)
    texts = [f"passage {i} about something" for i in range(6)]
    expected = ragdefense.defense().defend_embeddings("q?", texts, emb, q)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow on the way
        got = ragdefense.defense().defend_embeddings("q?", texts, emb * scale, q * scale)
    assert [v.score for v in got.verdicts] == pytest.approx([v.score for v in expected.verdicts])
    assert any(abs(v.score) > 0.1 for v in got.verdicts)


def test_blank_texts_are_copies_unless_their_embeddings_differ() -> None:
    """A blank chunk embeds like any other blank chunk: a copy. Passages without text that
    carry embeddings (an image's node) are copies only where those are equal."""
    from ragdefense.defenses.pool import distinct

    assert distinct([Passage(t) for t in ["", "  ", "\n", "Paris"]]) == ([0, 3], {0: [1, 2]})
    images = [Passage("", embedding=[1.0, 0.0]), Passage(" ", embedding=[0.0, 1.0])]
    assert distinct([*images, Passage("", embedding=[1.0, 0.0])]) == ([0, 1], {0: [2]})


def test_one_text_shown_differently_is_no_copy() -> None:
    """A text the generator is shown with other metadata beside it (``Passage.shown``) is not
    a copy of the bare text: a copy would stand for it, and what the generator reads of the
    two differs."""
    from ragdefense.defenses.pool import distinct

    text = "The Pacific is the largest ocean."
    payload = Passage(text, shown="summary: the Atlantic is the largest\n\n" + text)
    honest = [Passage(text), Passage(text.upper(), shown=None)]
    assert distinct([payload, *honest]) == ([0, 1], {1: [2]})
    assert distinct([payload, Passage(text, shown=payload.shown)]) == ([0], {0: [1]})


def test_blank_texts_given_their_embeddings_are_copies_only_where_those_are_equal() -> None:
    """Embeddings given beside the passages (``embeddings=``) tell blank passages apart as
    carried ones do: eight image nodes with eight vectors are eight passages, not one."""
    images = [Passage("") for _ in range(8)]
    vectors = np.eye(8) + 0.05
    for name in ("consensus", "auto", "grada-peel"):
        guard = ragdefense.defense(name, embedder=lambda t: [[1.0] * 8] * len(t))
        result = guard.defend_embeddings("q?", images, vectors, np.ones(8))
        assert not any("a copy of passage" in v.reason for v in result.verdicts), name
    copies = np.vstack([vectors[:4], vectors[:4]])  # and equal vectors are copies
    result = ragdefense.defense().defend_embeddings("q?", images, copies, np.ones(8))
    assert result.estimates["copies"] == {i: [i + 4] for i in range(4)}


@pytest.mark.parametrize("name", ["consensus", "auto", "grada-ebd", "strict"])
@pytest.mark.parametrize(
    ("passages", "embeddings", "query_embedding", "match"),
    [
        (2, np.ones((2, 4)), [np.nan] * 4, "query_embedding contains NaN"),
        (2, np.ones((7, 4)), None, r"shape \(7, 4\), expected \(2, d\)"),
        (1, np.ones((1, 4)), [np.nan] * 4, "query_embedding contains NaN"),
        (2, np.full((2, 4), "1"), None, "must be real numbers"),
        (2, [[10**400] * 4] * 2, None, "not a numeric matrix"),
    ],
)
def test_given_embeddings_are_checked_whatever_the_pools_size(
    name: str, passages: int, embeddings: Any, query_embedding: Any, match: str
) -> None:
    """A pool too small to judge is still no reason to take bad input: the same error as for
    a large pool (a vector too large for a float is named, not an ``OverflowError``)."""
    guard = ragdefense.defense(name, embedder=lambda t: [[1.0] * 4] * len(t))
    texts = [f"passage {i}" for i in range(passages)]
    with pytest.raises(DefenseInputError, match=match):
        guard.defend_embeddings("q?", texts, embeddings, query_embedding)


def test_every_defense_takes_embeddings_none_and_an_empty_pool() -> None:
    """``embeddings=None`` means "those the passages carry" for every defense, and an empty
    pool may come with ``[]``, and with the query's embedding."""
    passages = [Passage(f"text {i}", embedding=np.eye(5)[i]) for i in range(5)]

    def embed(texts: list[str]) -> Any:
        return np.ones((len(texts), 5))

    inner = ragdefense.defense("consensus", embedder=embed)
    for guard in [
        *(ragdefense.defense(n, embedder=embed) for n in ("consensus", "auto", "strict")),
        Quarantine.from_report({"findings": [FINDING]}, inner),
    ]:
        result = guard.defend_embeddings("q?", passages, None, np.ones(5))
        assert len(result.verdicts) == 5
        assert guard.defend_embeddings("q?", [], []).verdicts == ()
        assert guard.defend_embeddings("q?", [], [], np.ones(5)).verdicts == ()
        assert guard.defend_embeddings("q?", [], None, np.ones(5)).verdicts == ()


def test_a_quarantine_says_grada_ranks_in_the_callers_numbering_and_scores_json() -> None:
    passages = ["a planted text", "Hamlet was written by Shakespeare.", "Hamlet is a play."]
    quarantine = Quarantine.from_report({"findings": [FINDING]}, ragdefense.defense("grada"))
    result = quarantine.defend("who wrote hamlet?", passages)
    assert "(was 2)" in result.verdicts[1].reason and "(was 3)" in result.verdicts[2].reason
    assert json.dumps(result.to_dict(), allow_nan=False)
    assert result.to_dict()["verdicts"][0]["score"] is None


def test_a_missing_embedder_package_is_named_before_any_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Without sentence-transformers, the default embedder is refused when made (an
    ``ImportError`` naming the install command), and the CLI says so before any work."""
    import importlib.util

    from ragdefense.cli import main
    from ragdefense.embedders import SentenceTransformerEmbedder

    real = importlib.util.find_spec

    def hidden(name: str, *args: Any) -> Any:
        return None if name == "sentence_transformers" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", hidden)
    with pytest.raises(ImportError, match=r"pip install 'ragdefense\[embeddings\]'"):
        SentenceTransformerEmbedder()
    chunks = tmp_path / "kb.jsonl"
    chunks.write_text('{"id": "1", "text": "one chunk of text"}\n')
    work = tmp_path / "audit"
    for argv in (["demo"], ["audit", str(chunks), "--workdir", str(work)]):
        assert main(argv) == 2
        assert "ragdefense[embeddings]" in capsys.readouterr().err
    assert not work.exists()


_NAN = float("nan")
_SMALL_POOLS = {
    "one passage": ("who?", [Passage("a", embedding=[_NAN, 0.0])]),
    "two passages": ("who?", [Passage("a", embedding=[1.0, 0.0]), Passage("b", embedding="x")]),
    "copies of one": ("who?", [Passage("a", embedding=[_NAN, 0.0])] * 3),
    "a blank query": ("  ", [Passage(f"t{i}", embedding=[1.0, _NAN]) for i in range(8)]),
    "sizes differ": ("who?", [Passage("a", embedding=[1.0, 0.0]), Passage("b", embedding=[1.0])]),
}


@pytest.mark.parametrize("pool", sorted(_SMALL_POOLS))
@pytest.mark.parametrize("name", ["consensus", "strict", "grada", "grada-ebd", "auto"])
def test_bad_carried_embeddings_fail_whatever_the_pool(name: str, pool: str) -> None:
    """Embeddings the passages carry are checked where the defense has too few passages (or
    only copies, or a blank query) to use them, as given ones are: a store returning NaN
    vectors fails on the first query, not on the first long one."""
    query, passages = _SMALL_POOLS[pool]
    toy = lambda texts: [[1.0, 0.0]] * len(texts)  # noqa: E731
    with pytest.raises(DefenseInputError, match=r"passage [01]"):
        ragdefense.defense(name, embedder=toy).defend(query, passages)


@pytest.mark.parametrize("scale", [1e-42, 1e-300, 3e-22, 1e-18, 1e20, 1e200])
def test_carried_embeddings_of_any_magnitude_keep_their_direction(scale: float) -> None:
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(8, 6))
    vectors[5:] = vectors[5] + 0.01 * rng.normal(size=(3, 6))  # a tight group of three
    texts = [f"passage {i} on a topic" for i in range(8)]
    toy = lambda texts: [[1.0] * 6] * len(texts)  # noqa: E731
    for name in ("consensus", "grada-ebd"):
        defense = ragdefense.defense(name, embedder=toy)
        pairs = list(zip(texts, vectors, strict=True))
        plain = defense.defend("q?", [Passage(t, embedding=v) for t, v in pairs])
        scaled = defense.defend("q?", [Passage(t, embedding=v * scale) for t, v in pairs])
        assert scaled.kept_indices == plain.kept_indices
    carried = embed_passages([Passage(t, embedding=v * scale) for t, v in pairs])
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    np.testing.assert_allclose(cosine_matrix(carried), unit @ unit.T, atol=1e-5)


def test_bm25_without_saturation_scores_and_bad_settings_are_named() -> None:
    """k1 = 0 (term presence only) is a valid BM25: finite scores, not 0 / 0 for the terms a
    text lacks; a setting that is no finite number is named."""
    scores, q = BM25(k1=0.0).matrices(["red apple pie", "green apple", "blue sky"], "apple pie")
    assert np.isfinite(scores).all() and q is not None and np.isfinite(q).all()
    assert scores[0, 1] > 0 and q[0] > q[1] > q[2] == 0
    ranked = ragdefense.defense("grada", bm25=BM25(k1=0.0)).defend("apple?", ["a", "b", "a b"])
    assert np.isfinite([v.score for v in ranked.verdicts]).all()
    for bad in (float("nan"), float("inf"), "1.5", True):
        with pytest.raises(TypeError, match="k1 must be a finite number"):
            BM25(k1=bad)  # type: ignore[arg-type]


def test_a_trust_predicate_reads_metadata_holding_what_cannot_be_copied() -> None:
    """A value that cannot be copied (a lock, a client) is handed as it is; the rest are
    copies, so the predicate cannot change the caller's metadata."""
    import threading

    seen: list[Any] = []

    def reviewed(metadata: dict[str, Any]) -> bool:
        seen.append(metadata["lock"])
        metadata["tags"].append("x")
        return bool(metadata.get("reviewed"))

    lock = threading.Lock()
    passages = [
        Passage(f"text {i}", metadata={"lock": lock, "tags": [], "reviewed": i == 0})
        for i in range(4)
    ]
    result = ragdefense.defense("consensus", embedder=bag_of_words, trusted=reviewed).defend(
        "q?", passages
    )
    assert result.estimates["trusted"] == [0] and seen[0] is lock
    assert all(p.metadata["tags"] == [] for p in passages)


@pytest.mark.parametrize("k1", [Fraction(3, 2), 10**400, 1e308, -1.0])
def test_bm25_takes_any_real_k1_it_can_compute_with(k1: Any) -> None:
    """A fraction is a number like any other; one beyond float, or so large the scores
    overflow, is refused by name, not by numpy."""
    if k1 == Fraction(3, 2):
        scores, _ = BM25(k1=k1).matrices(["red apple", "green apple"])
        assert np.isfinite(scores).all() and BM25(k1=k1).k1 == 1.5
        return
    with pytest.raises((TypeError, ValueError), match="k1"):
        BM25(k1=k1)


def test_a_non_string_shown_is_refused_and_an_id_of_any_type_writes_as_json() -> None:
    """``Passage.shown`` is text or nothing (it is compared as the text is); an id that is
    not a string or number (a UUID, as some stores give) is its string in ``to_dict``."""
    import uuid

    with pytest.raises(DefenseInputError, match="passage 1: shown must be str or None, got int"):
        ragdefense.defense().defend("q?", [Passage("a"), Passage("b", shown=5)])  # type: ignore[arg-type]
    key = uuid.UUID(int=7)
    result = ragdefense.defense("strict").defend("q?", [Passage("a", id=key), "b", "c"])  # type: ignore[arg-type]
    assert json.loads(json.dumps(result.to_dict()))["verdicts"][0]["id"] == str(key)
