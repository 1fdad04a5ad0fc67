"""What the one-line defense adds to a real pipeline's latency, per vector store: the demo
knowledge base in each store (LangChain InMemory, Chroma, FAISS; LlamaIndex's default store and
Chroma, those installed), top 5 retrieved, median ms per query without a defense and through
the one line, ``defend(retriever)`` in either framework (the default defense, which fetches its
pool for the retriever's k of 5), and how many passages the defense embedded (0 where the
store's vectors are reused)."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

from ragdefense.data import load_demo_kb

from ..report import markdown_table

__all__ = ["stores_table"]


def _langchain(kind: str, folder: str) -> tuple[Callable[[str], Any], Callable[[str], Any], Any]:
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings

    from langchain_ragdefense import RagdefenseEmbeddings, defend

    class Counting(Embeddings):
        """The packaged MiniLM, counting the passages embedded."""

        def __init__(self) -> None:
            self.inner, self.passages = RagdefenseEmbeddings(), 0

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            self.passages += len(texts)
            return self.inner.embed_documents(texts)

        def embed_query(self, text: str) -> list[float]:
            return self.inner.embed_query(text)

    embeddings = Counting()
    docs = [Document(page_content=t) for q in load_demo_kb() for t in (*q.benign, *q.poison)]
    store: Any
    if kind == "InMemory":
        from langchain_core.vectorstores import InMemoryVectorStore

        store = InMemoryVectorStore.from_documents(docs, embeddings)
    elif kind == "Chroma":
        import chromadb
        from langchain_chroma import Chroma

        client = chromadb.PersistentClient(path=folder)
        store = Chroma.from_documents(docs, embeddings, client=client, collection_name="bench")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from langchain_community.vectorstores import FAISS
        store = FAISS.from_documents(docs, embeddings)
    retriever = store.as_retriever(search_kwargs={"k": 5})
    return retriever.invoke, defend(retriever).invoke, embeddings


def _llamaindex(kind: str, folder: str) -> tuple[Callable[[str], Any], Callable[[str], Any], Any]:
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.schema import TextNode

    from llama_index.postprocessor.ragdefense import RagdefenseEmbedding, defend

    embed = RagdefenseEmbedding()
    nodes = [TextNode(text=t) for q in load_demo_kb() for t in (*q.benign, *q.poison)]
    if kind == "Chroma":
        import chromadb
        from llama_index.vector_stores.chroma import ChromaVectorStore

        collection = chromadb.PersistentClient(path=folder).get_or_create_collection("bench")
        storage = StorageContext.from_defaults(vector_store=ChromaVectorStore(collection))
        index = VectorStoreIndex(nodes, storage_context=storage, embed_model=embed)
    else:
        index = VectorStoreIndex(nodes, embed_model=embed)
    retriever = index.as_retriever(similarity_top_k=5)
    return retriever.retrieve, defend(retriever).retrieve, None


PIPELINES = {
    ("LangChain", "InMemory"): _langchain,
    ("LangChain", "Chroma"): _langchain,
    ("LangChain", "FAISS"): _langchain,
    ("LlamaIndex", "SimpleVectorStore"): _llamaindex,
    ("LlamaIndex", "Chroma"): _llamaindex,
}


def _median_ms(run: Callable[[str], Any], questions: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        for q in questions:
            t0 = time.perf_counter()
            run(q)
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def stores_table(repeats: int = 5) -> tuple[list[dict[str, Any]], str]:
    """The latency the one-line defense adds, per framework and store (see the module)."""
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    questions = [q.question for q in load_demo_kb()]
    rows: list[dict[str, Any]] = []
    for (framework, kind), build in PIPELINES.items():
        with tempfile.TemporaryDirectory() as folder:
            try:
                plain, defended, counter = build(kind, folder)
            except ImportError as exc:  # that store is not installed
                rows.append({"framework": framework, "store": kind, "error": str(exc)})
                continue
            for q in questions:  # warm up: model loaded, caches as in a running service
                plain(q)
                defended(q)
            before = counter.passages if counter is not None else None
            base = _median_ms(plain, questions, repeats)
            with_defense = _median_ms(defended, questions, repeats)
            embedded = counter.passages - before if counter is not None else "-"
        rows.append(
            {
                "framework": framework,
                "store": kind,
                "undefended_ms": base,
                "defended_ms": with_defense,
                "added_ms": with_defense - base,
                "passages_embedded": embedded,
            }
        )
    table = [
        [r["framework"], r["store"], "-", "-", "-", r["error"]]
        if "error" in r
        else [
            r["framework"],
            r["store"],
            f"{r['undefended_ms']:.1f}",
            f"{r['defended_ms']:.1f}",
            f"{r['added_ms']:.1f}",
            r["passages_embedded"],
        ]
        for r in rows
    ]
    header = [
        "framework",
        "store",
        "undefended ms",
        "one line (default defense) ms",
        "added ms",
        "passages the defense embedded",
    ]
    lines = [
        f"Demo knowledge base, top 5 retrieved (the one line fetches its pool for them), "
        f"{len(questions)} questions x {repeats} "
        "(median ms per query, after a warm-up pass):",
        "",
        *markdown_table(header, table),
    ]
    return rows, "\n".join(lines)
