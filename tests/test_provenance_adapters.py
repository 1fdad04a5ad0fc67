"""Provenance through both frameworks: the default reads the source keys their own loaders and
readers write (LangChain ``TextLoader`` -> ``metadata["source"]``; LlamaIndex
``SimpleDirectoryReader`` -> ``file_path``; a node's ``ref_doc_id``), ``trusted=`` reaches the
core, and ``defend()`` fetches a pool of at least 2k and the defense's floor, returning k."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core import Document as LIDocument
from llama_index.core import SimpleDirectoryReader, VectorStoreIndex
from llama_index.core.schema import QueryBundle

from langchain_ragdefense import RagdefenseEmbeddings
from langchain_ragdefense import defend as lc_defend
from llama_index.postprocessor.ragdefense import ConsensusPostprocessor, RagdefenseEmbedding
from llama_index.postprocessor.ragdefense import defend as li_defend

TOPICS = [
    "The Pacific Ocean is the largest ocean on Earth by area.",
    "The Pacific covers about a third of the surface of the planet.",
    "Oceanographers measure the Pacific as the deepest ocean basin.",
    "The Mariana Trench lies in the western Pacific Ocean.",
    "The Atlantic Ocean is the second largest ocean on Earth.",
    "Ocean currents in the Pacific shape the climate of the coasts.",
    "The largest ocean, the Pacific, borders Asia and the Americas.",
    "Many islands of the Pacific Ocean are volcanic in origin.",
    "Coral reefs of the Pacific are among the largest on Earth.",
    "Sailors crossed the Pacific Ocean in the sixteenth century.",
]
QUERY = "What is the largest ocean on Earth?"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for i, text in enumerate(TOPICS):
        (tmp_path / f"note_{i}.txt").write_text(text, encoding="utf-8")
    return tmp_path


def _reasons(metadata: list[dict[str, Any]]) -> list[str]:
    return [m["ragdefense"]["reason"] for m in metadata]


def test_langchain_loader_sources_reach_the_default(folder: Path, toy_embedder: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.document_loaders import TextLoader

    docs = [d for p in sorted(folder.glob("*.txt")) for d in TextLoader(str(p)).load()]
    assert all(d.metadata["source"].endswith(".txt") for d in docs)  # what the loader writes
    store = InMemoryVectorStore.from_documents(docs, RagdefenseEmbeddings(toy_embedder))
    kept = lc_defend(store.as_retriever()).invoke(QUERY)
    assert kept and all(
        f"(source '{d.metadata['source']}'" in r
        for d, r in zip(kept, _reasons([d.metadata for d in kept]), strict=True)
    )
    trusted = str(folder / "note_0.txt")
    kept = lc_defend(store.as_retriever(), trusted={trusted}).invoke(QUERY)
    assert any("trusted" in r for r in _reasons([d.metadata for d in kept]))
    with pytest.raises(TypeError, match="no parameter 'bogus'"):
        lc_defend(store.as_retriever(), bogus=1)


def test_langchain_defend_fetches_twice_k_and_the_floor(toy_embedder: Any) -> None:
    store = InMemoryVectorStore(RagdefenseEmbeddings(toy_embedder))
    store.add_texts(TOPICS * 3)
    asked: list[int] = []
    original = type(store).similarity_search

    def spy(self: Any, query: str, k: int = 4, **kwargs: Any) -> Any:
        asked.append(k)
        return original(self, query, k=k, **kwargs)

    type(store).similarity_search = spy  # type: ignore[method-assign]
    try:
        assert len(lc_defend(store.as_retriever()).invoke(QUERY)) <= 4
        assert asked[-1] == 8  # as_retriever()'s 4: 2k, which is also the floor
        docs = lc_defend(store.as_retriever(search_kwargs={"k": 6})).invoke(QUERY)
        assert asked[-1] == 12 and len(docs) <= 6
        lc_defend(store.as_retriever(search_kwargs={"k": 2})).invoke(QUERY)
        assert asked[-1] == 8  # 2k = 4 is below the floor of 8
    finally:
        type(store).similarity_search = original  # type: ignore[method-assign]


def test_llamaindex_reader_sources_reach_the_default(folder: Path, toy_embedder: Any) -> None:
    documents = SimpleDirectoryReader(str(folder)).load_data()
    assert all("file_path" in d.metadata for d in documents)  # what the reader writes
    embed = RagdefenseEmbedding(toy_embedder)
    index = VectorStoreIndex.from_documents(documents, embed_model=embed)
    nodes = index.as_retriever(similarity_top_k=10).retrieve(QUERY)
    out = ConsensusPostprocessor(embed_model=embed).postprocess_nodes(
        nodes, query_bundle=QueryBundle(QUERY)
    )
    assert out and all(
        f"(source '{n.node.metadata['file_path']}'" in n.node.metadata["ragdefense"]["reason"]
        for n in out
    )
    # a document without a reader's metadata: its nodes count as one source, its ref_doc_id
    plain = VectorStoreIndex.from_documents(
        [LIDocument(text=t, doc_id=f"doc-{i}") for i, t in enumerate(TOPICS)], embed_model=embed
    )
    retrieved = plain.as_retriever(similarity_top_k=10).retrieve(QUERY)
    out = ConsensusPostprocessor(embed_model=embed).postprocess_nodes(
        retrieved, query_bundle=QueryBundle(QUERY)
    )
    assert out and all(
        f"(source '{n.node.ref_doc_id}'" in n.node.metadata["ragdefense"]["reason"] for n in out
    )
    assert all("ragdefense" not in n.node.metadata for n in retrieved)  # the caller's untouched


def test_llamaindex_defend_fetches_twice_k_and_the_floor(toy_embedder: Any) -> None:
    embed = RagdefenseEmbedding(toy_embedder)
    index = VectorStoreIndex.from_documents(
        [LIDocument(text=t) for t in TOPICS * 2], embed_model=embed
    )
    defended = li_defend(index)
    assert (defended.k, defended.fetch_k) == (2, 8)  # LlamaIndex's top 2: the floor of 8
    assert len(defended.retrieve(QUERY)) <= 2
    trusted_id = index.as_retriever(similarity_top_k=1).retrieve(QUERY)[0].node.ref_doc_id
    wide = li_defend(index.as_retriever(similarity_top_k=6), trusted={trusted_id})
    assert (wide.k, wide.fetch_k) == (6, 12)
    found = wide.retrieve(QUERY)
    assert any(n.node.metadata["ragdefense"]["trusted"] for n in found)  # trust reached the core
    with pytest.raises(TypeError, match="no parameter 'bogus'"):
        li_defend(index, bogus=1)


def test_trusted_is_a_typed_field_of_both_consensus_adapters(toy_embedder: Any) -> None:
    """``ConsensusCompressor(trusted=...)`` and ``ConsensusPostprocessor(trusted=...)``: a set
    is stored as a sorted list (so that the postprocessor serializes), a predicate as it is; the
    core trusts what the field names, and a ``params`` entry cannot silently compete with it."""
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode
    from pydantic import ValidationError

    from langchain_ragdefense import ConsensusCompressor

    sources = [f"site-{i}.org" for i in range(len(TOPICS))]
    docs = [Document(t, metadata={"source": s}) for t, s in zip(TOPICS, sources, strict=True)]
    compressor = ConsensusCompressor(
        embeddings=RagdefenseEmbeddings(toy_embedder), trusted={"site-4.org", "site-0.org"}
    )
    assert compressor.trusted == ["site-0.org", "site-4.org"]
    assert compressor.core.trusted == ["site-0.org", "site-4.org"]
    kept = compressor.compress_documents(docs, QUERY)
    marked = {d.metadata["source"] for d in kept if d.metadata["ragdefense"]["trusted"]}
    assert marked == {"site-0.org", "site-4.org"}  # both kept, and kept as trusted
    with pytest.raises(TypeError, match="trusted: a field of ConsensusCompressor"):
        ConsensusCompressor(params={"trusted": ["site-1.org"]})
    with pytest.raises(ValidationError):
        ConsensusCompressor(trusted="site-4.org")  # one string is not a collection of sources

    embed = RagdefenseEmbedding(toy_embedder)
    nodes = [
        NodeWithScore(node=TextNode(text=t, id_=f"n{i}", metadata={"source": s}), score=1 - i / 20)
        for i, (t, s) in enumerate(zip(TOPICS, sources, strict=True))
    ]
    by_rule = ConsensusPostprocessor(
        embed_model=embed, trusted=lambda meta: meta.get("source") == "site-4.org"
    )
    out = by_rule.postprocess_nodes(nodes, query_bundle=QueryBundle(QUERY))
    assert [n.node.id_ for n in out if n.node.metadata["ragdefense"]["trusted"]] == ["n4"]
    listed = ConsensusPostprocessor(embed_model=embed, trusted={"site-4.org"})
    back = ConsensusPostprocessor.from_json(listed.to_json(), embed_model=embed)
    assert back.trusted == ["site-4.org"] and back.core.trusted == ["site-4.org"]


def test_the_audit_reads_the_sources_the_default_reads(
    folder: Path, toy_embedder: Any, tmp_path: Path
) -> None:
    """The audit counts sources with the per-query default's rules, from each framework's own
    metadata: a loader's ``source``, a reader's ``file_path``, a node's ``ref_doc_id``."""
    from ragdefense.auditing import audit

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.document_loaders import TextLoader

    docs = [d for p in sorted(folder.glob("*.txt")) for d in TextLoader(str(p)).load()]
    store = InMemoryVectorStore.from_documents(docs, RagdefenseEmbeddings(toy_embedder))
    embed = RagdefenseEmbedding(toy_embedder)
    read = VectorStoreIndex.from_documents(
        SimpleDirectoryReader(str(folder)).load_data(), embed_model=embed
    )
    plain = VectorStoreIndex.from_documents(
        [LIDocument(text=t, doc_id=f"doc-{i}") for i, t in enumerate(TOPICS)], embed_model=embed
    )
    expected = {
        "langchain": {str(folder / f"note_{i}.txt") for i in range(len(TOPICS))},
        "reader": {str(folder / f"note_{i}.txt") for i in range(len(TOPICS))},
        "ref_doc_id": {f"doc-{i}" for i in range(len(TOPICS))},
    }
    for name, kb in (("langchain", store), ("reader", read), ("ref_doc_id", plain)):
        report = audit(kb, embedder=toy_embedder, workdir=tmp_path / name)
        assert {f.source for f in report.findings} == expected[name], name
        assert report.stats["sources"] == len(TOPICS)


def test_a_trusted_folder_given_as_the_reader_was_trusts_its_nodes(
    tmp_path: Path, toy_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A LlamaIndex reader given the relative folder ``kb/handbook`` writes absolute
    ``file_path``s; ``trusted={"kb/handbook"}`` named the folder as the reader was given it and
    trusted none of its nodes. A relative entry is also read from the working folder."""
    handbook, uploads = tmp_path / "kb" / "handbook", tmp_path / "kb" / "uploads"
    for where, texts in ((handbook, TOPICS[:3]), (uploads, TOPICS[3:])):
        where.mkdir(parents=True)
        for i, text in enumerate(texts):
            (where / f"note_{i}.txt").write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    documents = SimpleDirectoryReader("kb", recursive=True).load_data()
    assert all(Path(d.metadata["file_path"]).is_absolute() for d in documents)
    embed = RagdefenseEmbedding(toy_embedder)
    nodes = (
        VectorStoreIndex.from_documents(documents, embed_model=embed)
        .as_retriever(similarity_top_k=10)
        .retrieve(QUERY)
    )
    for entry in ("kb/handbook", "./kb/handbook/", str(handbook)):
        post = ConsensusPostprocessor(embed_model=embed, trusted={entry})
        out = post.postprocess_nodes(nodes, query_bundle=QueryBundle(QUERY))
        trusted = {
            n.node.metadata["file_path"]
            for n in out
            if "', trusted)" in n.node.metadata["ragdefense"]["reason"]
        }
        assert trusted == {str(handbook / f"note_{i}.txt") for i in range(3)}, entry
