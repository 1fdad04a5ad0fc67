"""Smoke test of the three wheels, run inside a fresh virtual environment that holds them and
their dependencies only (``.ci/smoke.sh``): each distribution imports from the environment, ships
every module of its folder, and defends in one line in its framework.

Usage: python smoke.py REPO_ROOT
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

REPO = Path(sys.argv[1]).resolve()
SITE = Path(sysconfig.get_paths()["purelib"]).resolve()
# distribution folder -> the package folder inside it
PACKAGES = {
    "ragdefense": REPO / "core" / "ragdefense",
    "langchain_ragdefense": REPO / "langchain_ragdefense" / "langchain_ragdefense",
    "llama_index.postprocessor.ragdefense": REPO
    / "llamaindex_ragdefense"
    / "llama_index"
    / "postprocessor"
    / "ragdefense",
}


def check_installed_alone() -> None:
    import importlib

    for name, source in PACKAGES.items():
        module = importlib.import_module(name)
        where = Path(module.__file__ or "").resolve().parent
        assert where.is_relative_to(SITE), f"{name} imported from {where}, not the environment"
        shipped = {p.relative_to(where) for p in where.rglob("*") if p.suffix in {".py", ".json"}}
        wanted = {
            p.relative_to(source)
            for p in source.rglob("*")
            if p.suffix in {".py", ".json"} and "__pycache__" not in p.parts
        }
        assert wanted <= shipped, f"{name}: missing from the wheel: {sorted(wanted - shipped)}"
        print(f"ok  {name} {getattr(module, '__version__', '')} ({len(shipped)} files)")


def check_langchain() -> None:
    from langchain_core.documents import Document
    from langchain_core.vectorstores import InMemoryVectorStore

    from langchain_ragdefense import RagdefenseEmbeddings, defend
    from ragdefense.data import demo_documents, load_demo_kb

    kb = load_demo_kb()
    # metadata["source"] as loaders write it: the planted passages come from one upload
    docs = [Document(text, metadata=meta) for text, meta in demo_documents()]
    store = InMemoryVectorStore.from_documents(docs, RagdefenseEmbeddings())
    question = kb[0].question
    plain = store.as_retriever().invoke(question)
    defended = defend(store.as_retriever()).invoke(question)
    before = sum(d.metadata["poison"] for d in plain)
    after = sum(d.metadata["poison"] for d in defended)
    assert defended and after < before, (before, after)
    assert all(d.metadata["ragdefense"]["kept"] for d in defended)
    print(f"ok  LangChain defend(): poison in context {before} -> {after}")


def check_llamaindex() -> None:
    from llama_index.core import VectorStoreIndex
    from llama_index.core.schema import TextNode

    from llama_index.postprocessor.ragdefense import RAGDefenderPostprocessor, RagdefenseEmbedding
    from ragdefense.data import load_demo_kb

    kb = load_demo_kb()
    nodes = [TextNode(text=t, metadata={"poison": False}) for q in kb for t in q.benign]
    nodes += [TextNode(text=t, metadata={"poison": True}) for q in kb for t in q.poison]
    embed = RagdefenseEmbedding()
    index = VectorStoreIndex(nodes, embed_model=embed)
    question = kb[0].question
    plain = index.as_retriever(similarity_top_k=8).retrieve(question)
    defended = RAGDefenderPostprocessor(embed_model=embed).postprocess_nodes(
        plain, query_str=question
    )
    before = sum(n.node.metadata["poison"] for n in plain)
    after = sum(n.node.metadata["poison"] for n in defended)
    assert defended and after < before, (before, after)
    print(f"ok  LlamaIndex RAGDefenderPostprocessor: poison in context {before} -> {after}")


if __name__ == "__main__":
    check_installed_alone()
    check_langchain()
    check_llamaindex()
