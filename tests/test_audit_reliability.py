"""The audit's inputs and folder kept whole: each defense keeps its own flags, one audit at a
time in a working folder, query logs split at line ends only, chunks refused by name where they
could not be stored or searched, reports written whole, parts cached per audit."""

from __future__ import annotations

import json
import os
import socket
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragdefense import CallableEmbedder
from ragdefense.auditing import AuditSettings, ListCorpus, audit, read_queries
from ragdefense.auditing.corpus import Batch
from ragdefense.auditing.naming import defense_names
from ragdefense.auditing.report import BLANK
from ragdefense.auditing.workdir import Workdir, part_texts
from ragdefense.types import DefenseResult, Verdict, to_passages
from tests.conftest import bag_of_words
from tests.test_audit import toy_corpus

QUERIES = ["Who made the quantum toaster question 0?", "What is the moon made of?"]


class Drop:
    """Removes every passage, or none: two of them differ only in their settings."""

    name = "drop"
    pool_factor = 1
    min_pool = 2
    min_passages = 2

    def __init__(self, everything: bool) -> None:
        self.everything = everything

    def defend(self, query: str, passages: Any) -> DefenseResult:
        given = to_passages(passages)
        why = "removed: dropped" if self.everything else "kept"
        verdicts = tuple(Verdict(i, p, not self.everything, 0.0, why) for i, p in enumerate(given))
        return DefenseResult(self.name, query, verdicts, "score")

    def defend_embeddings(self, query: str, passages: Any, *_: Any) -> DefenseResult:
        return self.defend(query, passages)


def _audit(tmp_path: Path, defenses: list[Any], name: str = "w") -> Any:
    texts, ids, _ = toy_corpus()
    return audit(
        ListCorpus(texts, ids),
        AuditSettings(defenses=defenses, part_size=32),
        queries=QUERIES,
        workdir=tmp_path / name,
        embedder=CallableEmbedder(bag_of_words),
    )


def test_two_defenses_of_one_class_keep_their_own_flags(tmp_path: Path) -> None:
    """The first defense's flags are the evidence: two objects of one class are two names
    (``Drop``, ``Drop#2``), never one overwriting the other's flags."""
    assert defense_names(["consensus", "consensus", "grada"]) == [
        "consensus",
        "consensus#2",
        "grada",
    ]
    flagging = _audit(tmp_path, [Drop(True), Drop(False)], "a")
    silent = _audit(tmp_path, [Drop(False), Drop(True)], "b")
    assert flagging.stats["defenses"] == silent.stats["defenses"] == ["Drop", "Drop#2"]
    assert flagging.stats["flagged_at_least_once"] > 0
    assert silent.stats["flagged_at_least_once"] == 0


def test_a_second_audit_in_a_folder_in_use_is_refused(tmp_path: Path) -> None:
    """While an audit holds its working folder, another given the same folder stops at once,
    having touched nothing; once the first ends, the folder is free."""
    folder = tmp_path / "w"
    with Workdir(folder).held():
        before = sorted(os.listdir(folder))
        with pytest.raises(ValueError, match="another audit is running in this working folder"):
            _audit(tmp_path, ["consensus"])
        assert sorted(os.listdir(folder)) == before
    assert _audit(tmp_path, ["consensus"]).stats["chunks"] > 0


def test_a_folder_that_cannot_be_locked_is_audited_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """NFS refuses a folder's lock (EBADF): the audit runs, unlocked, and says so."""
    import errno
    import fcntl

    def refused(fd: int, operation: int) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", refused)
    assert _audit(tmp_path, ["consensus"]).stats["chunks"] > 0
    assert "the working folder cannot be locked (Bad file descriptor)" in caplog.text


def test_query_logs_split_at_line_ends_only(tmp_path: Path) -> None:
    """A question holding U+2028 or a form feed is one question (JSON lines written with
    ``ensure_ascii=False`` hold them raw); a byte-order mark is not part of the first."""
    asked = ["What is 5\u20286?", "Who wrote\x0cthis?"]
    lines = tmp_path / "q.jsonl"
    lines.write_text(
        "\ufeff" + "\r\n".join(json.dumps({"question": q}, ensure_ascii=False) for q in asked),
        encoding="utf-8",
    )
    assert read_queries(lines) == asked
    plain = tmp_path / "q.txt"
    plain.write_text("\ufeff" + "\n".join(asked) + "\n", encoding="utf-8")
    assert read_queries(plain) == asked


@pytest.mark.parametrize(
    ("ids", "texts", "titles", "vectors", "message"),
    [
        ([7], ["t"], [""], None, "has an id of type int"),
        (["a\ud800"], ["t"], [""], None, "its id is not valid Unicode"),
        (["a"], ["t"], ["\udfff"], None, "its title is not valid Unicode"),
        (["a"], ["t"], [""], np.array([[1e39, 0.0]]), "its stored vector is not finite"),
        (["a", "b"], ["t", "u"], ["", ""], np.array([[1.0, 0], [np.nan, 0]]), "'b'"),
    ],
)
def test_a_chunk_that_could_not_be_stored_or_searched_is_refused_by_name(
    ids: list[Any], texts: list[str], titles: list[str], vectors: Any, message: str
) -> None:
    """A store reader's batch is checked as a file's chunks are: string ids, valid Unicode,
    finite vectors once stored as float32 (a broken vector would leave its chunk out of every
    search without a word)."""
    with pytest.raises(ValueError, match=message):
        Batch(ids, texts, titles, vectors)


def test_a_report_is_written_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each report file is written beside itself and renamed: a write that fails leaves the
    last complete report (a quarantine reading it meanwhile never sees half of one)."""
    report = _audit(tmp_path, ["consensus"])
    out = tmp_path / "out"
    report.write(out, formats=("json", "csv"))
    kept = (out / "report.json").read_bytes()

    def broken(path: Path, fmt: str) -> None:
        path.write_text("{ half", encoding="utf-8")
        raise OSError("disk full")

    monkeypatch.setattr(type(report), "_write", lambda self, path, fmt: broken(path, fmt))
    with pytest.raises(OSError, match="disk full"):
        report.write(out, formats=("json",))
    assert (out / "report.json").read_bytes() == kept
    assert sorted(p.name for p in out.iterdir()) == ["report.csv", "report.json"]
    # written as open() writes files: readable by others where the umask lets them
    umask = os.umask(0o022)
    os.umask(umask)
    assert (out / "report.csv").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_part_is_read_again_for_another_audit_even_at_one_file_identity(tmp_path: Path) -> None:
    """A fresh audit may write a part of the same size over the same inode within one clock
    tick: the cache of part texts is keyed by the audit's run too."""
    wd = Workdir(tmp_path / "w")
    wd.start({"p": 1})
    wd.write_json("chunks/00000.json", {"ids": ["a"], "texts": ["old"], "titles": [""]})
    path = wd.path / "chunks" / "00000.json"
    assert part_texts(wd, 0)["texts"] == ["old"]
    stat = path.stat()
    with path.open("r+b") as f:  # in place: same inode, same size
        f.write(path.read_bytes().replace(b"old", b"new"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    manifest = wd.read_json("manifest.json")
    wd.write_json("manifest.json", manifest | {"run": "another"})
    assert part_texts(Workdir(wd.path), 0)["texts"] == ["new"]


def test_a_faiss_store_missing_a_document_is_refused_by_name() -> None:
    """LangChain's FAISS docstore answers a missing id with a message string: the reader
    names the document instead of failing on the string."""
    from langchain_community.vectorstores import FAISS
    from langchain_core.documents import Document

    from langchain_ragdefense import RagdefenseEmbeddings

    texts, ids, _ = toy_corpus()
    docs = [Document(t, id=i) for t, i in zip(texts[:12], ids[:12], strict=True)]
    store = FAISS.from_documents(docs, RagdefenseEmbeddings(CallableEmbedder(bag_of_words)))
    del store.docstore._dict[store.index_to_docstore_id[4]]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="vector of document 'b0-4' has no document"):
        audit(store, embedder=CallableEmbedder(bag_of_words))


def test_a_knowledge_base_file_may_open_with_a_byte_order_mark(tmp_path: Path) -> None:
    """Windows tools write UTF-8 with a byte-order mark: it is not part of the first record;
    the suffix is read as the query log's is (any case, ``.ndjson`` too)."""
    from ragdefense.auditing import FileCorpus

    rows = [json.dumps({"id": f"c{i}", "text": f"chunk {i}"}) for i in range(3)]
    for name in ("kb.jsonl", "KB.JSONL", "kb.ndjson"):  # JSON lines however the suffix is written
        path = tmp_path / name
        path.write_text("\ufeff" + "\n".join(rows), encoding="utf-8")
        (batch,) = FileCorpus(path).batches(8)
        assert batch.ids == ["c0", "c1", "c2"]


def test_an_audit_killed_between_two_notes_of_its_probes_resumes_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe stage records its probes' count, then that it is done: killed between the
    two, a resumed audit writes the stage again and reports how many probes it ran."""
    real = Workdir.note
    seen: list[str] = []

    def killed(self: Workdir, key: str, value: Any) -> None:
        if key in ("probes", "probe_parts"):
            seen.append(key)
            if len(seen) == 2:
                raise KeyboardInterrupt
        real(self, key, value)

    monkeypatch.setattr(Workdir, "note", killed)
    with pytest.raises(KeyboardInterrupt):
        _audit(tmp_path, ["consensus"])
    monkeypatch.setattr(Workdir, "note", real)
    assert _audit(tmp_path, ["consensus"]).stats["probes"] == len(QUERIES)


def test_a_chroma_record_without_a_document_is_refused_by_both_readers() -> None:
    """A record holding a vector but no document (written by another tool) is named by the
    LlamaIndex reader as by the LangChain one, never audited as an empty text."""
    import chromadb
    from langchain_chroma import Chroma
    from llama_index.core import VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.vector_stores.chroma import ChromaVectorStore

    from langchain_ragdefense import RagdefenseEmbeddings

    texts, ids, _ = toy_corpus()
    collection = chromadb.EphemeralClient().get_or_create_collection("no-document")
    vectors = bag_of_words(texts[:6]).tolist()
    collection.add(ids=ids[:6], documents=texts[:6], embeddings=vectors)
    collection.add(ids=["bare"], embeddings=[bag_of_words(["x y z"])[0].tolist()])
    index = VectorStoreIndex.from_vector_store(
        ChromaVectorStore(chroma_collection=collection), embed_model=MockEmbedding(embed_dim=8)
    )
    store = Chroma(
        client=chromadb.EphemeralClient(),
        collection_name="no-document",
        embedding_function=RagdefenseEmbeddings(CallableEmbedder(bag_of_words)),
    )
    for knowledge_base in (index, store):
        with pytest.raises(ValueError, match="'bare' has no text string"):
            audit(knowledge_base, embedder=CallableEmbedder(bag_of_words))


def _verdicts(report: Any) -> list[tuple[str, float, bool]]:
    return [(f.id, round(f.score, 9), f.suspicious) for f in report.findings]


def test_a_fresh_start_stopped_while_clearing_is_cleared_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clearing removed the manifest first: stopped after that, the folder held an audit's
    parts without a manifest, refused by every later start ("holds no audit"), --fresh too."""
    import ragdefense.auditing.workdir as workdir

    first = _verdicts(_audit(tmp_path, ["consensus"]))
    real = workdir.shutil.rmtree

    def stopped(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(workdir.shutil, "rmtree", stopped)
    texts, ids, _ = toy_corpus()
    with pytest.raises(KeyboardInterrupt):
        audit(ListCorpus(texts, ids), AuditSettings(defenses=["consensus"], part_size=32),
              queries=QUERIES, workdir=tmp_path / "w", embedder=CallableEmbedder(bag_of_words),
              fresh=True)  # fmt: skip
    monkeypatch.setattr(workdir.shutil, "rmtree", real)
    assert (tmp_path / "w" / "manifest.json").exists()
    assert _verdicts(_audit(tmp_path, ["consensus"])) == first


def test_a_routed_audit_stopped_before_its_first_suspects_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recheck round was noted before the suspects were written: stopped between the
    two, a resumed audit rechecked a list that did not exist and asked to start over."""
    texts, ids, _ = toy_corpus()

    def routed(name: str) -> Any:
        return audit(ListCorpus(texts, ids), AuditSettings(part_size=32, shards=3, route=2),
                     workdir=tmp_path / name, embedder=CallableEmbedder(bag_of_words))  # fmt: skip

    real = Workdir.write_array

    def stopped(self: Workdir, name: str, array: Any) -> None:
        if name == "route/suspects.npy":
            raise KeyboardInterrupt
        real(self, name, array)

    monkeypatch.setattr(Workdir, "write_array", stopped)
    with pytest.raises(KeyboardInterrupt):
        routed("stopped")
    monkeypatch.setattr(Workdir, "write_array", real)
    assert _verdicts(routed("stopped")) == _verdicts(routed("whole"))


def test_blank_chunks_are_never_suspicious_nor_condemn_their_file(tmp_path: Path) -> None:
    """Empty pages (blank chunks) a store embedded alike were a planted set, and condemned the
    file they came from with its honest pages. A blank chunk has no direction: it is no
    neighbour, no group, no suspect, and its stored vector may be zeros."""
    texts, ids, planted = toy_corpus()
    vectors = np.asarray(bag_of_words(texts), dtype=np.float32)
    blank = np.full((8, vectors.shape[1]), 0.3, dtype=np.float32)  # the store's "" embedding
    blank[-1] = 0.0  # or none
    metadata = [{"source": "scan.pdf" if i < 4 else f"doc{i}.pdf"} for i in range(len(ids))]
    corpus = ListCorpus(
        [*texts, *["", " "] * 4],
        [*ids, *[f"empty-{i}" for i in range(8)]],
        None,
        np.vstack([vectors, blank]),
        [*metadata, *[{"source": "scan.pdf"}] * 8],
    )
    report = audit(corpus, workdir=tmp_path / "w", embedder=CallableEmbedder(bag_of_words),
                   report_top=len(corpus.ids))  # fmt: skip
    assert {f.id for f in report.suspicious} == planted
    assert not report.stats["suspect_sources"]
    empty = [f for f in report.findings if f.id.startswith("empty-")]
    assert len(empty) == 8 and all(f.score == 0 and BLANK in f.reasons for f in empty)


def test_stored_vectors_of_zeros_and_deep_json_are_refused_by_name(tmp_path: Path) -> None:
    """A zero vector (an embedding that failed) was taken and its chunk could never be
    flagged; JSON nested past Python's recursion limit crashed the reader with a traceback."""
    texts, ids, _ = toy_corpus()
    vectors = np.asarray(bag_of_words(texts), dtype=np.float32)
    vectors[3] = 0.0
    with pytest.raises(ValueError, match=f"chunk '{ids[3]}': its stored vector is all zeros"):
        audit(ListCorpus(texts, ids, vectors=vectors), workdir=tmp_path / "w",
              embedder=CallableEmbedder(bag_of_words))  # fmt: skip
    deep = "[" * 100_000 + "]" * 100_000
    kb = tmp_path / "kb.jsonl"
    kb.write_text(json.dumps({"id": "a", "text": "x"}) + "\n" + deep + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"kb\.jsonl:2: JSON nested too deep"):
        audit(kb, workdir=tmp_path / "w2", embedder=CallableEmbedder(bag_of_words))
    log = tmp_path / "queries.json"
    log.write_text(deep, encoding="utf-8")
    with pytest.raises(ValueError, match=r"queries\.json: JSON nested too deep"):
        read_queries(log)


def test_numbers_past_4300_digits_ids_that_are_no_id_and_odd_arguments_are_named(
    tmp_path: Path,
) -> None:
    """A number past Python's 4,300 digits failed the reader without a file or line, metadata
    nested too deep in a JSON string raised RecursionError, an id that is a list or a bool
    became its repr (an id the store does not have), and an engine or a query log of the
    wrong type failed inside the work."""
    embedder = CallableEmbedder(bag_of_words)
    kb = tmp_path / "kb.jsonl"
    huge = json.dumps({"id": "a", "text": "x y"}) + '\n{"id": 1' + "0" * 5000 + ', "text": "z"}\n'
    kb.write_text(huge, encoding="utf-8")
    with pytest.raises(ValueError, match=r"kb\.jsonl:2: not JSON \(a number past 4,300 digits\)"):
        audit(kb, workdir=tmp_path / "w1", embedder=embedder)
    log = tmp_path / "queries.json"
    log.write_text("[" + "1" * 5000 + "]", encoding="utf-8")
    with pytest.raises(ValueError, match=r"queries\.json: not JSON .*\(a number past 4,300"):
        read_queries(log)
    for rid in ([1, 2], {"a": 1}, True):
        kb.write_text(json.dumps({"id": rid, "text": "x y"}) + "\n", encoding="utf-8")
        with pytest.raises(ValueError, match=r"record 1's id .* is no string or number"):
            audit(kb, workdir=tmp_path / "w2", embedder=embedder, fresh=True)
    deep = {"id": "a", "text": "x y z", "metadata": "[" * 100_000 + "]" * 100_000}
    kb.write_text(json.dumps(deep) + "\n" + json.dumps({"id": "b", "text": "y z w"}) + "\n")
    assert audit(kb, workdir=tmp_path / "w3", embedder=embedder).stats["chunks"] == 2
    for engine in (None, 5):
        with pytest.raises(TypeError, match="engine must be 'local', 'ray' or an object"):
            audit(["a b c"], engine=engine, workdir=tmp_path / "w4")  # type: ignore[arg-type]
    assert not (tmp_path / "w4").exists()
    for queries in (5, b"apple", {"q1": "apple?"}):
        with pytest.raises(TypeError, match="queries must be a list of questions or a file"):
            read_queries(queries)  # type: ignore[arg-type]


def test_numpy_integers_are_settings_as_ints(tmp_path: Path) -> None:
    """``top_m=np.int64(5)`` passed the checks, then the manifest could not be written."""
    settings = AuditSettings(top_m=np.int64(5), part_size=np.int32(32), shards=np.int64(1))
    assert type(settings.top_m) is int and type(settings.shards) is int
    texts, ids, _ = toy_corpus()
    report = audit(ListCorpus(texts, ids), settings, workdir=tmp_path / "w",
                   embedder=CallableEmbedder(bag_of_words))  # fmt: skip
    assert report.stats["chunks"] == len(texts)


class DefendOnly(Drop):
    """A defense with ``defend()`` alone: what :class:`~ragdefense.types.Defense` asks for."""

    defend_embeddings = None  # type: ignore[assignment]


def test_a_defense_with_defend_only_is_audited_with(tmp_path: Path) -> None:
    """The probes' step called ``defend_embeddings`` on every defense: one with ``defend()``
    alone failed after the whole embedding and search; an object that is no defense is
    refused when the settings are made."""
    report = _audit(tmp_path, [DefendOnly(True)])
    assert report.stats["flagged_at_least_once"] > 0
    for spec in (None, object()):
        with pytest.raises(TypeError, match="neither a name nor a defense"):
            AuditSettings(defenses=[spec])


def test_scoring_is_checked_when_made_and_written_as_json(tmp_path: Path) -> None:
    """``AuditSettings.scoring`` was used as given: a dict or a string threshold failed at
    the report, after the whole run, and a numpy float made ``report.json`` unwritable."""
    from ragdefense.auditing.evidence import Scoring

    for scoring, error in (
        ({"threshold": 0.3}, TypeError),
        (Scoring(threshold="0.3"), TypeError),  # type: ignore[arg-type]
        (Scoring(threshold=None), TypeError),  # type: ignore[arg-type]
        (Scoring(threshold=float("nan")), ValueError),
        (Scoring(wide_threshold=-1.0), ValueError),
        (Scoring(min_group=1), ValueError),
        (Scoring(max_group=2.5), TypeError),  # type: ignore[arg-type]
        (Scoring(threshold=0), ValueError),  # every chunk suspicious
        (Scoring(probe_weight=3.0), ValueError),  # scores below 0: none found
        (Scoring(group_similarity=1.5), ValueError),  # no group: a quarantine holding nothing
        (Scoring(victim_share=3.0), ValueError),
    ):
        with pytest.raises(error, match="scoring"):
            AuditSettings(scoring=scoring)  # type: ignore[arg-type]
    # a neighbour list too short for a group: isolation 0 for every chunk, silently
    with pytest.raises(ValueError, match=r"neighbours must be >= scoring.min_group \+ 1 \(4\)"):
        AuditSettings(neighbours=2, wide_neighbours=0)
    with pytest.raises(ValueError, match=r"\(12\), got 10"):
        AuditSettings(scoring=Scoring(min_group=11))
    settings = AuditSettings(scoring=Scoring(threshold=np.float32(0.25), min_group=np.int64(3)))
    assert settings.scoring is not None and type(settings.scoring.threshold) is float
    assert type(settings.scoring.min_group) is int
    texts, ids, _ = toy_corpus()
    report = audit(ListCorpus(texts, ids), settings, workdir=tmp_path / "w",
                   embedder=CallableEmbedder(bag_of_words))  # fmt: skip
    report.write(tmp_path / "out", ["json"])
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["stats"]["scoring"]["threshold"] == 0.25


def test_parquet_map_metadata_is_read_and_odd_metadata_refused(tmp_path: Path) -> None:
    """A Parquet ``map<string, string>`` column (Spark, Delta) came back as key-value pairs and
    was dropped without a word, turning provenance off; a JSON record's metadata that is no
    object was dropped too."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from ragdefense.auditing.corpus import as_corpus

    meta = pa.array(
        [[("source", "a.pdf")], [("source", "b.pdf")]], pa.map_(pa.string(), pa.string())
    )
    path = tmp_path / "kb.parquet"
    pq.write_table(pa.table({"id": ["1", "2"], "text": ["one", "two"], "metadata": meta}), path)
    batch = next(iter(as_corpus(path).batches(8)))
    assert batch.metadata == [{"source": "a.pdf"}, {"source": "b.pdf"}]
    odd = tmp_path / "kb.jsonl"
    odd.write_text('{"id": "1", "text": "one", "metadata": [["source", "a.pdf"]]}\n')
    with pytest.raises(ValueError, match="chunk '1': metadata must be an object"):
        next(iter(as_corpus(odd).batches(8)))


def test_a_corpus_is_told_apart_whatever_its_texts_hold() -> None:
    """The fingerprint and the part digest joined ids and texts with NUL: two corpora whose
    texts hold one (PDF extraction writes them) read as one, and a resume would reuse the other's
    parts; a missing text became the word "None"."""
    from ragdefense.auditing.workdir import part_digest

    one = ListCorpus(["x\0y", "z"], ["a", "b"])
    other = ListCorpus(["y", "z"], ["a", "b\0x"])
    assert one.fingerprint() != other.fingerprint()
    assert part_digest(one.ids, one.texts, ["", ""], None) != part_digest(
        other.ids, other.texts, ["", ""], None
    )
    with pytest.raises(ValueError, match="has no text string"):
        ListCorpus(["Real passage.", None])  # type: ignore[list-item]
    from ragdefense.auditing.settings import queries_mark

    assert queries_mark(["a\0b", "c"]) != queries_mark(["a", "b\0c"])  # and a query log


def test_probes_are_embedded_as_queries_in_one_call_per_part(tmp_path: Path) -> None:
    """A model that embeds queries apart (``encode_query``) had every probe embedded alone:
    one model call per probe, a million for a million chunks (a review of the diff)."""
    from ragdefense import SentenceTransformerEmbedder

    class Model:
        """``encode_query`` / ``encode_document`` as sentence-transformers 5 has them."""

        def __init__(self) -> None:
            self.calls = {"encode_query": 0, "encode_document": 0}

        def _side(self, side: str, texts: list[str], **_: Any) -> np.ndarray:
            self.calls[side] += 1
            return np.asarray(bag_of_words(texts)) + (0.01 if side == "encode_query" else 0.0)

        def encode_query(self, texts: list[str], **kw: Any) -> np.ndarray:
            return self._side("encode_query", texts, **kw)

        def encode_document(self, texts: list[str], **kw: Any) -> np.ndarray:
            return self._side("encode_document", texts, **kw)

    model = Model()
    texts, ids, _ = toy_corpus()
    settings = AuditSettings(part_size=64)
    audit(ListCorpus(texts, ids), settings, workdir=tmp_path / "w",
          embedder=SentenceTransformerEmbedder(model))  # fmt: skip
    parts = -(-len(texts) // 64)
    assert 0 < model.calls["encode_query"] <= parts + 1 < len(texts)  # + the model's mark


# ------------------------------------------------ from an independent review of the audit CLI


def _kb_file(tmp_path: Path) -> Path:
    texts, ids, _ = toy_corpus()
    kb = tmp_path / "kb.jsonl"
    vectors = bag_of_words(texts)
    kb.write_text(
        "".join(
            json.dumps({"id": i, "text": t, "embedding": v.tolist()}) + "\n"
            for i, t, v in zip(ids, texts, vectors, strict=True)
        )
    )
    (tmp_path / "mymodel.py").write_text(
        "from tests.conftest import bag_of_words\nembed = bag_of_words\n"
    )
    return kb


def test_the_cli_says_in_one_line_when_the_report_or_the_run_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report that cannot be written (a folder in its place) and a store failing as it is
    read are one line each, exit code 1, no traceback; the report files are written together
    or not at all (an earlier run's stay whole, none mixed with this run's)."""
    from ragdefense.cli import main

    kb = _kb_file(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = ["audit", str(kb), "--embedder", "mymodel:embed", "--quiet", "--format", "md,csv"]
    assert main([*run, "--workdir", str(tmp_path / "w")]) == 0
    kept = (tmp_path / "w" / "report.md").read_bytes()
    (tmp_path / "w" / "report.csv").unlink()
    (tmp_path / "w" / "report.csv").mkdir()  # a folder where the report goes
    capsys.readouterr()
    assert main([*run, "--workdir", str(tmp_path / "w")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write the report") and err.count("\n") == 1
    assert (tmp_path / "w" / "report.md").read_bytes() == kept
    assert not [p for p in (tmp_path / "w").iterdir() if p.name.startswith(".report")]
    (tmp_path / "failing.py").write_text(
        "from ragdefense.auditing import Batch\n"
        "class Failing:\n"
        "    def fingerprint(self): return 'failing'\n"
        "    def batches(self, size):\n"
        "        yield Batch(['a', 'b', 'c'], ['x y z', 'y z w', 'z w v'], ['', '', ''])\n"
        "        raise RuntimeError('chromadb: database is locked')\n"
        "store = Failing()\n"
    )
    failing = ["audit", "failing:store", "--embedder", "mymodel:embed", "--quiet"]
    assert main([*failing, "--workdir", str(tmp_path / "f")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the audit failed: RuntimeError: chromadb: database is locked")
    assert err.endswith("(at failing.py:6)\n") and err.count("\n") == 1  # where it was raised
    for n, error in enumerate(("OSError", "ConnectionResetError", "FileNotFoundError")):
        (tmp_path / f"oserror{n}.py").write_text(  # an OSError past the checks fails the run
            (tmp_path / "failing.py").read_text().replace("RuntimeError", error)
        )
        oserror = ["audit", f"oserror{n}:store", "--embedder", "mymodel:embed", "--quiet"]
        assert main([*oserror, "--workdir", str(tmp_path / f"o{n}")]) == 1
        assert capsys.readouterr().err.startswith(f"error: the audit failed: {error}: chromadb")
    missing_log = [*run, "--queries", str(tmp_path / "none.txt")]  # an input: usage, exit 2
    assert main([*missing_log, "--workdir", str(tmp_path / "q")]) == 2
    assert "no query log at" in capsys.readouterr().err
    if find_spec("ray") is not None:  # a cluster nothing answers at: usage, before any work
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        ray = [
            "--engine",
            "ray",
            "--address",
            f"127.0.0.1:{port}",
            "--workdir",
            str(tmp_path / "r"),
        ]
        assert main([*run, *ray]) == 2
        assert "cannot reach the Ray cluster" in capsys.readouterr().err
        assert not (tmp_path / "r").exists()
    assert main(["attack", "--store", " "]) == 2
    assert "--store is empty" in capsys.readouterr().err


def test_a_resumed_audit_tells_a_model_embedding_queries_otherwise(tmp_path: Path) -> None:
    """An asymmetric model with another query prefix embeds the probes otherwise: resuming
    with it is refused (its probes' vectors would have been reused)."""

    class Prefixed(CallableEmbedder):
        def __init__(self, prefix: str) -> None:
            super().__init__(bag_of_words, query_fn=lambda q: bag_of_words([prefix + q])[0])

    texts, ids, _ = toy_corpus()
    settings = AuditSettings(part_size=32)
    audit(ListCorpus(texts, ids), settings, workdir=tmp_path / "w", embedder=Prefixed(""))
    with pytest.raises(ValueError, match="other parameters"):
        audit(
            ListCorpus(texts, ids), settings, workdir=tmp_path / "w", embedder=Prefixed("query: ")
        )


def test_stored_vectors_of_another_width_are_refused_before_any_work(tmp_path: Path) -> None:
    """Stored vectors of another width than the embedder's are refused before a part is
    written (after a whole read and the probes' embedding, and the advised rerun was refused);
    vectors of two widths in one knowledge base are refused by chunk, across batches and in a
    store's own lists, before the search."""
    texts, ids, _ = toy_corpus()
    vectors = bag_of_words(texts)
    narrow = CallableEmbedder(lambda t: bag_of_words(t, dim=128))
    with pytest.raises(ValueError, match="256 dimensions, the embedder's 128"):
        audit(ListCorpus(texts, ids, vectors=vectors), workdir=tmp_path / "w", embedder=narrow)
    assert not list((tmp_path / "w").glob("**/*.npy"))
    right = CallableEmbedder(bag_of_words)
    with pytest.warns(UserWarning, match="starting over"):  # nothing was written: no refusal
        done = audit(
            ListCorpus(texts, ids, vectors=vectors), workdir=tmp_path / "w", embedder=right
        )
    assert done.findings

    class TwoModels:
        def fingerprint(self) -> str:
            return "two models"

        def batches(self, size: int) -> Any:
            yield Batch(ids[:3], texts[:3], [""] * 3, vectors[:3])
            yield Batch(ids[3:6], texts[3:6], [""] * 3, bag_of_words(texts[3:6], dim=64))

    with pytest.raises(ValueError, match=f"chunk {ids[3]!r}: its stored vector has 64 numbers"):
        audit(TwoModels(), workdir=tmp_path / "t", embedder=right)
    rows = [list(vectors[0]), list(vectors[1][:64])]
    with pytest.raises(ValueError, match=f"chunk {ids[1]!r}: its stored vector has 64 numbers"):
        Batch(ids[:2], texts[:2], ["", ""], rows)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"chunk {ids[1]!r}: its stored vector is not a row"):
        Batch(ids[:2], texts[:2], ["", ""], [rows[0], None])  # type: ignore[arg-type]
    # a first part too small to compare the model by (fewer than 3 texts): its width still is
    with pytest.raises(ValueError, match="256 dimensions, the embedder's 128"):
        audit(
            ListCorpus(texts, ids, vectors=vectors),
            AuditSettings(part_size=2),
            workdir=tmp_path / "small",
            embedder=narrow,
        )
    assert not list((tmp_path / "small").glob("**/*.npy"))


def test_the_markdown_report_escapes_html_from_chunk_text(tmp_path: Path) -> None:
    """A chunk's text reaches the Markdown report as text: an attacker's ``<img onerror>``
    would run where the report is rendered with HTML (MkDocs, a notebook)."""
    texts, ids, _ = toy_corpus()
    texts[-1] = "<img src=x onerror=alert(1)> " + texts[-1]
    report = audit(
        ListCorpus(texts, ids), workdir=tmp_path / "w", embedder=CallableEmbedder(bag_of_words)
    )
    shown = report.to_markdown(top=len(texts))
    assert "<img" not in shown and "&lt;img src=x onerror=alert(1)&gt;" in shown
    import markdown  # MkDocs' renderer: a link in chunk text stays text

    texts[-1] = "Click [the answer](javascript:alert(1)) " + texts[-1]
    report = audit(
        ListCorpus(texts, ids), workdir=tmp_path / "l", embedder=CallableEmbedder(bag_of_words)
    )
    rendered = markdown.markdown(report.to_markdown(top=len(texts)), extensions=["tables"])
    assert "javascript:alert(1)" in rendered and "<a " not in rendered


def test_a_query_log_or_a_source_that_is_not_valid_unicode_fails_early_or_is_escaped(
    tmp_path: Path,
) -> None:
    """A lone surrogate in a query log failed with a bare ``UnicodeEncodeError`` once the whole
    knowledge base was embedded; in a chunk's source, when its part was written."""
    with pytest.raises(ValueError, match="query log item 2: its question is not valid Unicode"):
        read_queries(["What is the moon made of?", "who made the toaster \ud800?"])
    texts, ids, _ = toy_corpus()
    sources = [
        {"source": "up\ud800load.pdf" if n == 0 else f"site{n % 7}.org"} for n in range(len(ids))
    ]
    report = audit(
        ListCorpus(texts, ids, metadata=sources),
        AuditSettings(part_size=32),
        workdir=tmp_path / "w",
        embedder=CallableEmbedder(bag_of_words),
    )
    assert report.stats["chunks"] == len(texts)
    assert {f.id: f.source for f in report.findings}[ids[0]] == "up&#55296;load.pdf"  # escaped
    from ragdefense.provenance import source_of  # and read alike at query time (a quarantine)
    from ragdefense.types import Passage

    assert source_of(Passage("x", metadata=sources[0])) == "up&#55296;load.pdf"


def test_empty_batches_of_a_corpus_are_skipped(tmp_path: Path) -> None:
    """An empty batch (a store's page emptied while it was read) was taken for a part: first,
    the stored vectors "had 0 dimensions"; later, NumPy failed building the index."""
    texts, ids, _ = toy_corpus()

    class Gappy:
        def batches(self, size: int) -> Any:
            for start in range(0, len(texts), size):
                yield Batch([], [], [])  # embedded by the audit: no width of its own
                stop = start + size
                yield Batch(ids[start:stop], texts[start:stop], [""] * len(ids[start:stop]))

        def fingerprint(self) -> str:
            return "gappy"

    report = audit(Gappy(), AuditSettings(part_size=32), workdir=tmp_path / "w",
                   embedder=CallableEmbedder(bag_of_words))  # fmt: skip
    assert report.stats["chunks"] == len(texts)


def test_a_fresh_audit_never_reuses_the_last_one_s_defenses(tmp_path: Path) -> None:
    """Defenses were kept per process by folder and name: a fresh audit in the same folder with
    a defense whose name hides its settings ran the last audit's object, and every audit's
    defenses (their models) stayed alive for the life of the process."""
    from ragdefense.auditing import steps

    first = _audit(tmp_path, [Drop(False)])
    texts, ids, _ = toy_corpus()
    again = audit(
        ListCorpus(texts, ids),
        AuditSettings(defenses=[Drop(True)], part_size=32),
        queries=QUERIES,
        workdir=tmp_path / "w",
        embedder=CallableEmbedder(bag_of_words),
        fresh=True,
    )
    assert first.stats["flagged_at_least_once"] == 0
    assert again.stats["flagged_at_least_once"] > 0
    assert sum(k[0] == "defenses" for k in steps._CACHE if isinstance(k, tuple)) == 1


def test_a_llamaindex_store_failing_as_its_vectors_are_read_fails_the_audit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its vectors were read as the per-query defense reads them, where a failing store means
    "embed instead": the audit went on with the audit's own vectors for that part, and every
    resume then found the knowledge base changed."""
    from llama_index.core import VectorStoreIndex
    from llama_index.core.schema import TextNode

    from llama_index.postprocessor.ragdefense import RagdefenseEmbedding
    from llama_index.postprocessor.ragdefense import vectors as li_vectors

    nodes = [TextNode(text=f"a stored passage on topic {i}", id_=f"n{i}") for i in range(6)]
    embed = RagdefenseEmbedding(CallableEmbedder(bag_of_words))
    corpus = li_vectors.IndexCorpus(VectorStoreIndex(nodes, embed_model=embed))
    assert all(b.vectors is not None for b in corpus.batches(4))  # read from the store

    def failing(store: Any, ids: list[str], with_texts: bool = False) -> Any:
        raise ConnectionError("the store went away")

    monkeypatch.setattr(li_vectors, "_lookup", failing)
    with pytest.raises(ConnectionError, match="went away"):
        list(corpus.batches(4))


def test_working_files_take_the_umasks_mode_and_six_digit_parts_are_the_audits(
    tmp_path: Path,
) -> None:
    """Every working file was owner-only (mkstemp's 0600): another user (a Ray worker, a
    second operator resuming) could read the report but not the parts. A damaged folder with
    a part numbered past 99999 was taken for a folder holding no audit, fresh=True refused."""
    from ragdefense.auditing.workdir import Workdir

    old = os.umask(0o022)
    try:
        Workdir(tmp_path / "m").write_json("manifest.json", {})
    finally:
        os.umask(old)
    assert (tmp_path / "m" / "manifest.json").stat().st_mode & 0o777 == 0o644
    folder = tmp_path / "w"
    (folder / "chunks").mkdir(parents=True)
    (folder / "manifest.json").write_text('{"params": {"top')  # cut short
    for name in ("00000.json", "100000.json"):
        (folder / "chunks" / name).write_text("[]")
    with pytest.raises(ValueError, match="damaged"):
        _audit(tmp_path, ["consensus"])
    texts, ids, _ = toy_corpus()
    audit(ListCorpus(texts, ids), AuditSettings(defenses=["consensus"], part_size=32),
          workdir=folder, embedder=CallableEmbedder(bag_of_words), fresh=True)  # fmt: skip
    assert not (folder / "chunks" / "100000.json").exists()


def test_chunk_metadata_that_is_no_mapping_is_refused(tmp_path: Path) -> None:
    """A list of source strings given as metadata was read as "no source" for every chunk:
    provenance off, silently."""
    texts, ids, _ = toy_corpus()
    sources = [f"uploads/f{i % 5}.pdf" for i in range(len(texts))]
    with pytest.raises(ValueError, match=r"chunk 'b0-0': metadata 'uploads/f0.pdf' is no mapping"):
        audit(ListCorpus(texts, ids, metadata=sources), workdir=tmp_path / "w",  # type: ignore[arg-type]
              embedder=CallableEmbedder(bag_of_words))  # fmt: skip
    from ragdefense.auditing import Batch

    held = np.array([{"source": "a.pdf"}], dtype=object)  # a column of a frame, say
    assert Batch(["c"], ["t"], [""], None, held).metadata is held
    given = [{"source": s} if i % 2 else None for i, s in enumerate(sources)]
    report = audit(ListCorpus(texts, ids, metadata=given), workdir=tmp_path / "m",
                   embedder=CallableEmbedder(bag_of_words))  # fmt: skip
    assert report.stats["sources"] == 5


def test_a_chroma_page_emptied_while_the_audit_reads_it_is_an_empty_batch(tmp_path: Path) -> None:
    """Its vectors were asked for no ids, which Chroma refuses: the audit failed where an
    emptied page is skipped."""
    import chromadb
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.schema import TextNode
    from llama_index.vector_stores.chroma import ChromaVectorStore

    from llama_index.postprocessor.ragdefense import RagdefenseEmbedding
    from llama_index.postprocessor.ragdefense.vectors import IndexCorpus

    collection = chromadb.PersistentClient(path=str(tmp_path)).create_collection("knowledge")
    nodes = [TextNode(text=f"passage {i} on a topic", id_=f"n{i}") for i in range(8)]
    index = VectorStoreIndex(
        nodes,
        storage_context=StorageContext.from_defaults(
            vector_store=ChromaVectorStore(chroma_collection=collection)
        ),
        embed_model=RagdefenseEmbedding(CallableEmbedder(bag_of_words)),
    )
    read = []
    for batch in IndexCorpus(index).batches(4):
        read.append(batch.ids)
        if len(read) == 1:  # the live store shrinks while it is read
            collection.delete(ids=[f"n{i}" for i in range(4, 8)])
    assert read == [[f"n{i}" for i in range(4)], []]
