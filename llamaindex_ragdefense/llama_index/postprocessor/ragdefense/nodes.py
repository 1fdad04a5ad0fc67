"""A retrieved LlamaIndex node as the core reads it: a :class:`ragdefense.Passage` with the
node's text, and what the generator is shown beside it (``Passage.shown``), so that two nodes
the LLM reads differently are never judged copies of one another; and the node handed back,
a copy carrying its verdict (:func:`tagged`)."""

from __future__ import annotations

from hashlib import sha256
from typing import Any

from llama_index.core.schema import BaseNode, ImageNode, MetadataMode, NodeWithScore, QueryBundle

from ragdefense import Passage, QueryInputError
from ragdefense.integration.records import METADATA_KEY, copied, tagged_metadata
from ragdefense.provenance import SOURCE_KEYS

from .vectors import with_document

__all__ = ["node_passage", "query_text", "shown", "tagged"]

#: the media a multimodal ``Node`` holds beside its text
_RESOURCES = ("image_resource", "audio_resource", "video_resource")
#: metadata saying where and when a node was stored, not what it says: one page ingested twice
#: (two folders, two dates) is still one text to the LLM
_STORED = (*SOURCE_KEYS, "creation_date", "last_modified_date", "last_accessed_date", "file_size",
           "file_type")  # fmt: skip


def shown(node: BaseNode) -> str | None:
    """What the generator is shown of ``node`` beyond its text, ``None`` where nothing is: its
    content with the metadata the LLM reads (``MetadataMode.LLM``: an attacker's copy of an
    honest page with a ``summary`` field added is another passage to the LLM) but where and
    when it was stored (its source, file and dates: provenance counts sources), and what
    identifies its media (an image's path, URL or data), so that distinct images are not
    copies, captioned alike or not, while identical ones still are; a node with neither text
    nor media is its own hash."""
    plain = node.get_content(metadata_mode=MetadataMode.NONE)
    parts = []
    hidden = [*node.excluded_llm_metadata_keys, *_STORED]
    seen = node.model_copy(update={"excluded_llm_metadata_keys": hidden}).get_content(
        metadata_mode=MetadataMode.LLM
    )
    if seen != plain:
        parts.append(seen)
    media = _media(node)
    if media is not None or not plain.strip():
        parts.append(f"{type(node).__name__} {media or node.hash}")
    return "\n".join(parts) or None


def _media(node: BaseNode) -> str | None:
    """What identifies a node's media (``None``: it holds none): an ``ImageNode``'s image data
    (one image stored under two paths is one), else its hash (of its path, URL and caption),
    a multimodal ``Node``'s resources' hashes."""
    if isinstance(node, ImageNode):
        if node.image:
            return sha256(node.image.encode("utf-8", "surrogatepass")).hexdigest()
        return node.hash if node.image_path or node.image_url else None
    found = [getattr(node, name, None) for name in _RESOURCES]
    hashes = [f"{name} {r.hash}" for name, r in zip(_RESOURCES, found, strict=True) if r]
    return "; ".join(hashes) or None


def node_passage(nws: NodeWithScore, embedding: Any) -> Passage:
    """The passage the core judges for ``nws``: its text without metadata (what the defenses
    compare), its id, score, metadata with its document id, ``embedding`` (``None``: the
    defense embeds the text) and what the LLM is shown of it (:func:`shown`)."""
    node = nws.node
    return Passage(
        node.get_content(metadata_mode=MetadataMode.NONE),
        id=node.node_id,
        score=nws.score,
        metadata=with_document(node),
        embedding=embedding,
        shown=shown(node),
    )


#: a ``Node``'s media (its text among them): objects a later step may edit in place
_EDITABLE = ("text_resource", "image_resource", "audio_resource", "video_resource")


def tagged(nws: NodeWithScore, record: dict[str, Any], score: float | None) -> NodeWithScore:
    """A copy of the node with ``record`` in its metadata, hidden from the LLM and embedder; its
    embedding, relationships and media resources (a ``Node``'s text, image, audio, video) are
    copies too, so that a later step editing the returned node leaves the caller's alone."""
    node = nws.node
    update: dict[str, Any] = {"metadata": tagged_metadata(node.metadata, record)}
    for attr in ("excluded_llm_metadata_keys", "excluded_embed_metadata_keys"):
        keys = list(getattr(node, attr, []) or [])
        update[attr] = keys if METADATA_KEY in keys else [*keys, METADATA_KEY]
    for name in ("embedding", "text_embedding"):  # an ImageNode's text has a vector too
        if getattr(node, name, None) is not None:
            update[name] = list(getattr(node, name))
    # each relation copied alone: one holding what cannot be copied leaves the others copies
    update["relationships"] = {kind: copied(info) for kind, info in node.relationships.items()}
    for name in _EDITABLE:
        if getattr(node, name, None) is not None:
            update[name] = copied(getattr(node, name))
    return NodeWithScore(node=node.model_copy(update=update), score=score)


def query_text(query_bundle: QueryBundle | None) -> str:
    """The query's text; where ``query_str`` is blank, the strings the retriever embedded
    for it (``custom_embedding_strs``): the passages were fetched for those."""
    if query_bundle is None:
        raise ValueError("a defense needs the query: call with query_bundle / query_str")
    if isinstance(query_bundle, str):  # postprocess_nodes(nodes, "...") read it as a bundle
        raise TypeError(
            "pass a query string as query_str=: postprocess_nodes(nodes, query_str=...)"
        )
    query = getattr(query_bundle, "query_str", None)
    if not isinstance(query_bundle, QueryBundle) or not isinstance(query, str):
        raise QueryInputError(f"the query must be a QueryBundle or a str, got {query_bundle!r}")
    if not query.strip() and query_bundle.custom_embedding_strs:
        strs = query_bundle.custom_embedding_strs
        query = " ".join(s for s in strs if isinstance(s, str) and s.strip())
    return query
