"""Red-team a LangChain vector store: poison a copy, compare the pipeline with and without a
defense (the loop and the report are :mod:`ragdefense.redteam`)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.messages import BaseMessage
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore

from ragdefense.integration.adapter import configured
from ragdefense.integration.vectors import CannotCopy, chroma_fill, chroma_scratch, same_remote
from ragdefense.redteam import (
    AttackTarget,
    RedTeamReport,
    check_red_team,
    defense_label,
    plant,
    run_red_team,
)

from ._private import chroma_collection, faiss_documents, faiss_normalizes
from .retrievers import defend
from .vectors import store_kind

__all__ = ["red_team"]


def _copy(store: VectorStore, stack: contextlib.ExitStack) -> VectorStore:
    """An independent copy of ``store`` holding the same documents and vectors: in memory, or
    for Chroma in a client of the red team's own over a temporary folder (what it needs
    removed afterwards goes on ``stack``)."""
    kind = store_kind(store)
    if type(store) is InMemoryVectorStore:  # a subclass may keep its data elsewhere
        clone = InMemoryVectorStore(embedding=store.embeddings)
        clone.store = copy.deepcopy(store.store)
        return clone
    if kind == "chroma":
        return _copy_chroma(store, stack)
    if kind == "faiss":
        return _copy_faiss(store)
    raise CannotCopy(
        f"ragdefense cannot copy a {type(store).__name__} safely: pass copy_store=, a function "
        "returning an independent copy of your store (e.g. a new collection or index filled from "
        "yours); the red team never writes to your store",
        "copy_store",
    )


def _copy_chroma(store: Any, stack: contextlib.ExitStack) -> VectorStore:
    """A new collection in a Chroma client of the red team's own (removed with ``stack``, on an
    error too), filled in batches with the stored ids, texts, metadata and vectors (nothing
    re-embedded; the user's database is not touched)."""
    from langchain_chroma import Chroma

    if store.embeddings is None:
        raise TypeError(
            "this Chroma store has no LangChain embedding function (embedding_function=), so "
            "it cannot be searched by text: give it the model its vectors were made with"
        )
    source = chroma_collection(store)
    client, target = stack.enter_context(chroma_scratch(source))
    chroma_fill(source, target, client)
    return Chroma(client=client, collection_name=target.name, embedding_function=store.embeddings)


def _copy_faiss(store: Any) -> VectorStore:
    """A FAISS store over a clone of the index and a deep copy of its document store."""
    import faiss
    from langchain_community.docstore.in_memory import InMemoryDocstore

    if not isinstance(store.docstore, InMemoryDocstore):
        raise CannotCopy(
            f"ragdefense cannot copy a FAISS store over a {type(store.docstore).__name__} "
            "safely: pass copy_store=, a function returning an independent copy",
            "copy_store",
        )
    clone: VectorStore = type(store)(
        embedding_function=store.embedding_function,
        index=faiss.clone_index(store.index),
        docstore=InMemoryDocstore(copy.deepcopy(faiss_documents(store))),
        index_to_docstore_id=dict(store.index_to_docstore_id),
        relevance_score_fn=store.override_relevance_score_fn,
        normalize_L2=faiss_normalizes(store),
        distance_strategy=store.distance_strategy,
    )
    return clone


_IMMUTABLE = (str, bytes, int, float, bool, complex, tuple, frozenset, type(None))


def _shared_storage(store: Any, copied: Any) -> str | None:
    """What ``copied`` shares of ``store``'s storage (``None``: nothing), found without
    writing anything: the same Chroma collection; the same FAISS index, docstore or id map;
    the same ``InMemoryVectorStore`` dict; for any other store, a shallow copy (every mutable
    attribute the very same object)."""
    kind = store_kind(store)
    if kind == "chroma":
        same = (
            store_kind(copied) == "chroma"
            and chroma_collection(copied).id == chroma_collection(store).id
        )
        return "the same Chroma collection" if same else None
    mine_docs, their_docs = getattr(store, "docstore", None), getattr(copied, "docstore", None)
    inner = getattr(mine_docs, "_dict", None)
    if inner is not None and getattr(their_docs, "_dict", None) is inner:
        return "the same docstore contents"
    for name in ("store", "index", "docstore", "index_to_docstore_id"):
        mine, theirs = getattr(store, name, None), getattr(copied, name, None)
        if mine is not None and not isinstance(mine, _IMMUTABLE) and _same_object(mine, theirs):
            return f"the same {name!r}"
    remote = same_remote(store, copied)  # the same collection / index / table on one client
    if remote is not None:
        return remote
    mine, theirs = vars(store), (vars(copied) if hasattr(copied, "__dict__") else {})
    # a shallow copy: every attribute the same object (names and settings equal)
    if mine and all(
        (theirs.get(k) == v) if isinstance(v, _IMMUTABLE) else (theirs.get(k) is v)
        for k, v in mine.items()
    ):
        return "every attribute (a shallow copy)"
    return None


def _same_object(mine: Any, theirs: Any) -> bool:
    """One object, or two Python wrappers of one native object (a FAISS index wrapped again,
    e.g. by ``faiss.downcast_index``, is the same index)."""
    if theirs is mine:
        return True
    pointers = [getattr(x, "this", None) for x in (mine, theirs)]
    try:
        return pointers[0] is not None and int(pointers[0]) == int(pointers[1])  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def _check_independent(store: VectorStore, copied: VectorStore) -> None:
    """Refuse a copy that shares storage with the user's store (checked by identity: nothing
    is written anywhere before the copy is known to be independent)."""
    shared = _shared_storage(store, copied)
    if shared is not None:
        raise ValueError(
            f"copy_store returned a store that shares storage with yours ({shared}): return an "
            "independent copy, e.g. a new collection or index filled from yours; the red team "
            "never writes to your store (nothing was written)"
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
    embeddings: Embeddings | None = None,
    copy_store: Callable[[VectorStore], VectorStore] | None = None,
    **params: Any,
) -> RedTeamReport:
    """Plant ``n_poison`` passages per target in a copy of ``store``; report which targets are
    hijacked with no defense and with ``defense`` (via :func:`langchain_ragdefense.defend`).

    Args:
        store: The user's vector store; ``InMemoryVectorStore``, Chroma and FAISS are copied
            here (with their stored vectors), any other store needs
            ``copy_store``. It is never written to.
        targets: Questions with the attacker's answers.
        defense: What :func:`~langchain_ragdefense.defend` accepts.
        attack: One of :data:`ragdefense.attacks.ATTACKS` (``"poisonedrag"``,
            ``"injection"``, ``"multi-answer"`` or a variant; see
            :func:`ragdefense.redteam.plant`).
        n_poison: Poison passages planted per target.
        k: Documents in the context.
        chain: ``retriever -> Runnable`` building the user's chain around a retriever, asked
            with the question as a string, or as ``{"input", "question", "query"}`` when it
            takes a mapping (``create_retrieval_chain``); its output (its ``answer``,
            ``output`` or ``result`` when a mapping) is the answer, and a target is hijacked
            when the answer states a wrong answer. Without it, a target is hijacked when poison
            is most of the context (under ``"injection"``, when one of its instructions is
            in it: one is enough).
        embeddings: The defense's embeddings, as :func:`~langchain_ragdefense.defend` takes
            them (default: the store's own).
        copy_store: ``store -> an independent copy of it``, for stores copied nowhere else.
        params: Parameters of the named defense, as :func:`~langchain_ragdefense.defend`
            takes them (``trusted=``, ``support=False``, ...): the pipeline you deploy.
    """
    if isinstance(store, BaseRetriever):
        raise TypeError(
            f"red_team() takes the vector store, got a {type(store).__name__}: pass "
            "retriever.vectorstore (the red team builds the retrievers it compares, of k= each)"
        )
    targets = check_red_team(targets, k, n_poison, defense, attack, params)  # before any copy
    configured(defense, embeddings, "embeddings")
    with contextlib.ExitStack() as stack:
        poisoned = copy_store(store) if copy_store is not None else _copy(store, stack)
        if poisoned is store:
            raise ValueError("copy_store returned the store itself: the red team needs a copy")
        if not isinstance(poisoned, VectorStore):
            raise TypeError(
                f"copy_store must return a LangChain VectorStore, got {type(poisoned).__name__}"
            )
        _check_independent(store, poisoned)
        return _red_team(poisoned, targets, defense, attack, n_poison, k, chain, embeddings, params)


def _red_team(
    poisoned: VectorStore,
    targets: Sequence[AttackTarget],
    defense: Any,
    attack: str,
    n_poison: int,
    k: int,
    chain: Callable[[BaseRetriever], Runnable[Any, Any]] | None,
    embeddings: Embeddings | None,
    params: dict[str, Any],
) -> RedTeamReport:
    poison = {t.question: plant(t, attack, n_poison) for t in targets}
    poisoned.add_documents([Document(page_content=p) for texts in poison.values() for p in texts])
    plain = poisoned.as_retriever(search_kwargs={"k": k})
    # the one line
    base = poisoned.as_retriever(search_kwargs={"k": k})
    guarded = defend(base, defense, embeddings=embeddings, **params)

    def pipeline(retriever: BaseRetriever) -> Callable[[str], tuple[list[str], str | None]]:
        runnable = chain(retriever) if chain is not None else None

        def run(question: str) -> tuple[list[str], str | None]:
            if runnable is None:
                return [d.page_content for d in retriever.invoke(question)], None
            seen = _Retrieved()  # the context is what the chain's own retrieval returned
            answer = _ask(runnable, question, {"callbacks": [seen]})
            found = seen.documents if seen.runs else retriever.invoke(question)
            return [d.page_content for d in found], None if answer is None else _text(answer)

        return run

    return run_red_team(
        targets,
        {"no defense": pipeline(plain), defense_label(defense): pipeline(guarded)},
        poison,
        attack,
        n_poison,
    )


class _Retrieved(BaseCallbackHandler):
    """The documents a chain's retrievals returned, outermost runs only (a defended
    retriever's own fetch of its pool is a run inside its run), in order, each once."""

    def __init__(self) -> None:
        self.seen: set[UUID] = set()  # every retriever run
        self.runs: set[UUID] = set()  # those inside no other retriever run
        self.documents: list[Document] = []

    def on_retriever_start(
        self, serialized: Any, query: str, *, run_id: UUID, parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        if parent_run_id not in self.seen:  # a grandchild's parent is inside one too
            self.runs.add(run_id)
        self.seen.add(run_id)

    def on_retriever_end(
        self, documents: Sequence[Document], *, run_id: UUID, **kwargs: Any
    ) -> None:
        if run_id in self.runs:
            self.documents += [d for d in documents if d not in self.documents]


def _ask(runnable: Runnable[Any, Any], question: str, config: Any = None) -> Any:
    """The chain's output for ``question``: given as a mapping under the usual keys where the
    chain's input schema is an object (``create_retrieval_chain``'s ``{"input": ...}``), as a
    string where it is another type. Where it says none (a function without annotations), the
    string is tried first, then the mapping; when both fail, the string call's error is raised
    (the mapping call's is its context)."""
    keyed = {"input": question, "question": question, "query": question}
    try:
        kind = runnable.get_input_jsonschema().get("type")
    except Exception:  # a runnable whose schema cannot be built: ask as if it said none
        kind = None
    if kind == "object":
        return runnable.invoke(keyed, config)
    if kind is not None:
        return runnable.invoke(question, config)
    try:
        return runnable.invoke(question, config)
    except (TypeError, ValueError, KeyError) as first:
        try:
            return runnable.invoke(keyed, config)
        except Exception:
            raise first  # noqa: B904 - the string call's error; the mapping call's is its context


#: where a chain returning a mapping puts its answer: ``create_retrieval_chain``, agents and
#: chains of the ``output`` convention, ``RetrievalQA``
ANSWER_KEYS = ("answer", "output", "result")


def _said(output: Any) -> Any:
    """A message's text (its text blocks alone: a reasoning model's thinking, which may weigh
    the poison, is no answer), else the output's content, else the output."""
    return output.text if isinstance(output, BaseMessage) else getattr(output, "content", output)


def _text(output: Any) -> str | None:
    """The answer in a chain's output: a message's text, a mapping's answer key, or the
    output as a string (``None`` under the answer key: no answer). A mapping without an answer
    key is refused: read as a whole, it holds the retrieved documents, whose poison would be
    taken for the answer."""
    content = _said(output)
    if isinstance(content, Mapping):
        key = next((k for k in ANSWER_KEYS if k in content), None)
        if key is None:
            raise ValueError(
                f"the chain returned a mapping with keys {sorted(map(str, content))}, none of "
                f"{list(ANSWER_KEYS)}: end the chain with the answer (e.g. "
                "chain | itemgetter('your_key'))"
            )
        content = _said(content[key])
    return None if content is None else str(content)
