"""Red-team a LlamaIndex ``VectorStoreIndex``: poison a copy, compare the pipeline with and
without a defense (the loop and the report are :mod:`ragdefense.redteam`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.constants import DEFAULT_SIMILARITY_TOP_K
from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.llms import LLM
from llama_index.core.response_synthesizers import get_response_synthesizer
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, TextNode

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

from ._private import index_embed_model
from .postprocessors import DefensePostprocessor
from .retrievers import defend, guard
from .vectors import index_nodes, store_kind, stored_vectors

__all__ = ["red_team"]


def _embed_model(index: VectorStoreIndex) -> BaseEmbedding:
    model = index_embed_model(index)
    if model is None:
        raise TypeError(f"{type(index).__name__} holds no embedding model to copy it with")
    return model


def _copy(index: VectorStoreIndex, stack: contextlib.ExitStack) -> VectorStoreIndex:
    """An independent copy of ``index`` with its stored vectors (nothing re-embedded): in
    memory over the default store, or a new collection in a Chroma client of the red team's
    own over a temporary folder (removed with ``stack``, on an error too)."""
    store: Any = index.vector_store
    kind = store_kind(store)
    if kind == "chroma":  # its records as they are, a batch at a time (ids, vectors, metadata)
        from llama_index.vector_stores.chroma import ChromaVectorStore

        # ChromaVectorStore.client is its Chroma collection
        client, target = stack.enter_context(chroma_scratch(store.client))
        chroma_fill(store.client, target, client)
        return VectorStoreIndex.from_vector_store(
            ChromaVectorStore(target), embed_model=_embed_model(index)
        )
    found = index_nodes(index)
    if kind != "simple" or found is None:
        raise CannotCopy(
            f"ragdefense cannot copy an index over a {type(store).__name__} safely: pass "
            "copy_index=, a function returning an independent copy of your index; the red "
            "team never writes to your index",
            "copy_index",
        )
    return _rebuilt(index, [n.model_copy(deep=True) for n in found])  # the docstore's own


def _rebuilt(index: VectorStoreIndex, nodes: list[BaseNode]) -> VectorStoreIndex:
    """A new index over a new ``SimpleVectorStore`` holding ``nodes`` with the vectors
    ``index`` stores for them."""
    found = stored_vectors(index.vector_store, [n.node_id for n in nodes])
    for node, vector in zip(nodes, found, strict=True):
        if node.embedding is None and vector is not None:
            node.embedding = [float(x) for x in vector]
    return VectorStoreIndex(nodes, embed_model=_embed_model(index))


def _shared_storage(index: VectorStoreIndex, copied: VectorStoreIndex) -> str | None:
    """What ``copied`` shares of ``index``'s stores (``None``: nothing), found without writing
    anything: the same storage context, vector store, docstore or index store, the same
    Chroma collection, or a remote store's collection on the same client."""
    for name in ("storage_context", "vector_store", "docstore", "index_struct"):
        mine = getattr(index, name, None)
        if mine is not None and getattr(copied, name, None) is mine:
            return f"the same {name}"
    for name in ("docstore", "index_store", "vector_store"):
        mine = getattr(index.storage_context, name, None)
        theirs = getattr(copied.storage_context, name, None)
        if mine is not None and theirs is mine:
            return f"the same {name}"
        # a new docstore or index store over the same key-value store writes into it
        kv = getattr(mine, "_kvstore", None)
        if kv is not None and getattr(theirs, "_kvstore", None) is kv:
            return f"the same {name} contents"
    store: Any = index.vector_store
    other: Any = copied.vector_store
    # ChromaVectorStore.client is its collection
    chroma = store_kind(store) == "chroma" and store_kind(other) == "chroma"
    if chroma and other.client.id == store.client.id:
        return "the same Chroma collection"
    if store_kind(store) == "simple":  # its data, or the dicts a shallow copy of it shares
        data, theirs = store.data, getattr(other, "data", None)
        if theirs is data:
            return "the same vector data"
        for name in ("embedding_dict", "text_id_to_ref_doc_id", "metadata_dict"):
            mine = getattr(data, name, None)
            if mine is not None and getattr(theirs, name, None) is mine:
                return f"the same vector data ({name})"
    return same_remote(store, other)  # the same collection / index / table on one client


def _check_independent(index: VectorStoreIndex, copied: VectorStoreIndex) -> None:
    """Refuse a copy that shares its stores with the user's index (checked by identity:
    nothing is written anywhere before the copy is known to be independent)."""
    shared = _shared_storage(index, copied)
    if shared is not None:
        raise ValueError(
            f"copy_index returned an index that shares its stores with yours ({shared}): "
            "return an independent copy; the red team never writes to your index (nothing was "
            "written)"
        )


def red_team(
    index: VectorStoreIndex,
    targets: Sequence[AttackTarget],
    *,
    defense: Any = None,
    attack: str = "poisonedrag",
    n_poison: int = 5,
    k: int = DEFAULT_SIMILARITY_TOP_K,
    llm: LLM | None = None,
    embed_model: BaseEmbedding | None = None,
    copy_index: Callable[[VectorStoreIndex, list[TextNode]], VectorStoreIndex] | None = None,
    **params: Any,
) -> RedTeamReport:
    """Plant ``n_poison`` passages per target in a copy of ``index``; report which targets are
    hijacked with no defense (top ``k``) and with ``defense`` as :func:`defend` runs it (the
    pool it fetches, the first ``k`` kept).

    Args:
        index: The user's index; over the default ``SimpleVectorStore`` or Chroma it is copied
            here (with its stored vectors), other stores need ``copy_index``. It
            is never written to.
        targets: Questions with the attacker's answers.
        defense: A registry name (``None``: the default defense), a core defense object, or a
            :class:`DefensePostprocessor` (configured: as :func:`defend` takes it).
        attack: One of :data:`ragdefense.attacks.ATTACKS` (``"poisonedrag"``,
            ``"injection"``, ``"multi-answer"`` or a variant; see
            :func:`ragdefense.redteam.plant`).
        n_poison: Poison passages planted per target.
        k: Nodes in the context (LlamaIndex's default ``similarity_top_k``, 2, the context
            ``defend(index)`` gives unless told otherwise).
        llm: When given, each context is answered by this LLM (a compact response synthesizer)
            and a target is hijacked when the answer states the wrong answer; otherwise when
            poison is most of the context (under ``"injection"``, when one of its
            instructions is in it: one is enough).
        embed_model: The defense's embeddings (default: the index's own); a defense object
            embeds with its own ``embedder`` (``embed_model`` with one is an error).
        copy_index: ``(index, nodes) -> an independent copy of index``; it is called with no
            nodes (``[]``), and the red team plants the poison in the copy itself.
        params: Parameters of the named defense, as :func:`defend` takes them (``trusted=``,
            ``support=False``, ...): the pipeline you deploy.
    """
    if not isinstance(index, VectorStoreIndex):
        raise TypeError(
            f"red_team() takes a VectorStoreIndex, got {type(index).__name__}: pass the index "
            "your retriever or query engine was made from"
        )
    if llm is not None and not isinstance(llm, LLM):
        raise TypeError(f"llm must be a LlamaIndex LLM, got {type(llm).__name__}")
    targets = check_red_team(targets, k, n_poison, defense, attack, params)  # before any copy
    configured(defense, embed_model, "embed_model")
    poison = {t.question: plant(t, attack, n_poison) for t in targets}
    nodes = [TextNode(text=p) for texts in poison.values() for p in texts]
    with contextlib.ExitStack() as stack:
        poisoned = copy_index(index, []) if copy_index is not None else _copy(index, stack)
        if poisoned is index:
            raise ValueError("copy_index returned the index itself: the red team needs a copy")
        if not isinstance(poisoned, VectorStoreIndex):
            raise TypeError(
                f"copy_index must return a VectorStoreIndex, got {type(poisoned).__name__}"
            )
        _check_independent(index, poisoned)  # before any poison is written
        return _red_team(poisoned, index, nodes, poison, targets, defense, attack, n_poison, k,
                         llm, embed_model, params)  # fmt: skip


def _red_team(
    poisoned: VectorStoreIndex,
    index: VectorStoreIndex,
    nodes: list[TextNode],
    poison: dict[str, list[str]],
    targets: Sequence[AttackTarget],
    defense: Any,
    attack: str,
    n_poison: int,
    k: int,
    llm: LLM | None,
    embed_model: BaseEmbedding | None,
    params: dict[str, Any],
) -> RedTeamReport:
    poisoned.insert_nodes(nodes)
    # another model's vectors are another space: the store's are read only for its own
    post = (
        defense  # configured by the user, as defend() takes it
        if isinstance(defense, DefensePostprocessor)
        else guard(defense, _embed_model(index), poisoned.vector_store, embed_model, params=params)
    )
    synthesizer = get_response_synthesizer(llm=llm) if llm is not None else None

    def pipeline(defended: bool) -> Callable[[str], tuple[list[str], str | None]]:
        retriever: BaseRetriever = poisoned.as_retriever(similarity_top_k=k)
        if defended:  # what the one line runs: its pool, then the first k kept
            retriever = defend(retriever, post)

        def run(question: str) -> tuple[list[str], str | None]:
            found: list[NodeWithScore] = retriever.retrieve(question)[:k]
            context = [n.node.get_content(MetadataMode.NONE) for n in found]
            if synthesizer is None:
                return context, None
            return context, str(synthesizer.synthesize(question, found))

        return run

    return run_red_team(
        targets,
        {"no defense": pipeline(False), defense_label(defense): pipeline(True)},
        poison,
        attack,
        n_poison,
    )
