"""Red-team a LangChain vector store: poison a copy, compare the pipeline with and without a
defense (the loop and the report are :mod:`ragdefense.redteam`)."""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore

from ragdefense.redteam import AttackTarget, RedTeamReport, defense_label, plant, run_red_team

from .retrievers import defend
from .vectors import store_kind

__all__ = ["red_team"]


def _copy(store: VectorStore) -> VectorStore:
    """An independent in-memory copy of ``store`` holding the same documents and vectors."""
    kind = store_kind(store)
    if type(store) is InMemoryVectorStore:  # a subclass may keep its data elsewhere
        clone = InMemoryVectorStore(embedding=store.embeddings)
        clone.store = copy.deepcopy(store.store)
        return clone
    if kind == "chroma":
        return _copy_chroma(store)
    if kind == "faiss":
        return _copy_faiss(store)
    raise TypeError(
        f"ragdefense cannot copy a {type(store).__name__} safely: pass copy_store=, a function "
        "returning an independent copy of your store (e.g. a new collection or index filled from "
        "yours); the red team never writes to your store"
    )


def _copy_chroma(store: Any) -> VectorStore:
    """A new collection in an in-memory Chroma client, filled in batches with the stored ids,
    texts, metadata and vectors (nothing re-embedded; the user's database is not touched)."""
    import chromadb
    from langchain_chroma import Chroma

    source = store._collection  # langchain-chroma keeps its Chroma collection here
    client = chromadb.EphemeralClient()
    name = f"ragdefense-redteam-{uuid.uuid4().hex}"
    target = client.create_collection(name, metadata=source.metadata)
    ids = source.get(include=[])["ids"]
    batch = min(1000, client.get_max_batch_size())
    for start in range(0, len(ids), batch):
        got = source.get(
            ids=ids[start : start + batch], include=["embeddings", "documents", "metadatas"]
        )
        target.add(
            ids=got["ids"],
            embeddings=got["embeddings"],
            documents=got["documents"],
            metadatas=got["metadatas"],
        )
    return Chroma(client=client, collection_name=name, embedding_function=store.embeddings)


def _copy_faiss(store: Any) -> VectorStore:
    """A FAISS store over a clone of the index and a deep copy of its document store."""
    import faiss
    from langchain_community.docstore.in_memory import InMemoryDocstore

    if not isinstance(store.docstore, InMemoryDocstore):
        raise TypeError(
            f"ragdefense cannot copy a FAISS store over a {type(store.docstore).__name__} "
            "safely: pass copy_store=, a function returning an independent copy"
        )
    clone: VectorStore = type(store)(
        embedding_function=store.embedding_function,
        index=faiss.clone_index(store.index),
        docstore=InMemoryDocstore(copy.deepcopy(store.docstore._dict)),
        index_to_docstore_id=dict(store.index_to_docstore_id),
        relevance_score_fn=store.override_relevance_score_fn,
        normalize_L2=store._normalize_L2,
        distance_strategy=store.distance_strategy,
    )
    return clone


def _holds(store: VectorStore, doc_id: str, text: str) -> bool:
    """Whether ``store`` holds the document ``doc_id`` (by id where the store can tell, else by
    searching its text)."""
    try:
        return any(d.id == doc_id for d in store.get_by_ids([doc_id]))
    except NotImplementedError:
        return any(d.page_content == text for d in store.similarity_search(text, k=1))


def _check_independent(store: VectorStore, copied: VectorStore) -> None:
    """Write a probe document to the copy and make sure the user's store did not get it (a
    shallow copy shares its storage); the probe is removed again either way."""
    probe_id = f"ragdefense-probe-{uuid.uuid4().hex}"
    text = f"ragdefense red-team probe {probe_id}"
    copied.add_documents([Document(page_content=text, id=probe_id)], ids=[probe_id])
    leaked = _holds(store, probe_id, text)
    copied.delete([probe_id])
    if leaked:
        with contextlib.suppress(Exception):  # leave the user's store as it was
            store.delete([probe_id])
        raise ValueError(
            "copy_store returned a store that shares storage with yours (a document written to "
            "the copy appeared in your store): return an independent copy, e.g. a deep copy or "
            "a new collection; the red team never writes to your store"
        )


def red_team(
    store: VectorStore,
    targets: Sequence[AttackTarget],
    *,
    defense: Any = None,
    attack: str = "poisonedrag",
    n_poison: int = 5,
    k: int = 4,
    chain: Callable[[BaseRetriever], Runnable[Any, Any]] | None = None,
    copy_store: Callable[[VectorStore], VectorStore] | None = None,
) -> RedTeamReport:
    """Plant ``n_poison`` passages per target in a copy of ``store``; report which targets are
    hijacked with no defense and with ``defense`` (via :func:`langchain_ragdefense.defend`).

    Args:
        store: The user's vector store; ``InMemoryVectorStore``, Chroma and FAISS are copied
            here (with their stored vectors, into memory), any other store needs
            ``copy_store``. It is never written to.
        targets: Questions with the attacker's answers.
        defense: What :func:`~langchain_ragdefense.defend` accepts.
        attack: One of :data:`ragdefense.attacks.ATTACKS` (``"poisonedrag"``,
            ``"injection"``, ``"multi-answer"`` or a variant).
        k: Documents in the context.
        chain: ``retriever -> Runnable`` building the user's chain around a retriever; its output
            (as a string) is the answer, and a target is hijacked when the answer states the
            wrong answer. Without it, a target is hijacked when poison reaches the context.
    """
    poisoned = (copy_store or _copy)(store)
    if poisoned is store:
        raise ValueError("copy_store returned the store itself: the red team needs a copy")
    _check_independent(store, poisoned)
    poison = {t.question: plant(t, attack, n_poison) for t in targets}
    poisoned.add_documents([Document(page_content=p) for texts in poison.values() for p in texts])
    plain = poisoned.as_retriever(search_kwargs={"k": k})
    guarded = defend(poisoned.as_retriever(search_kwargs={"k": 2 * k}), defense, k=k)

    def pipeline(retriever: BaseRetriever) -> Callable[[str], tuple[list[str], str | None]]:
        runnable = chain(retriever) if chain is not None else None

        def run(question: str) -> tuple[list[str], str | None]:
            context = [d.page_content for d in retriever.invoke(question)]
            answer = runnable.invoke(question) if runnable is not None else None
            return context, None if answer is None else _text(answer)

        return run

    return run_red_team(
        targets,
        {"no defense": pipeline(plain), defense_label(defense): pipeline(guarded)},
        poison,
        attack,
        n_poison,
    )


def _text(output: Any) -> str:
    content = getattr(output, "content", output)
    if isinstance(content, dict):
        content = content.get("answer", content.get("output", content))
    return str(content)
