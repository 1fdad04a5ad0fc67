"""The vectors a store already holds for the retrieved documents, read through an adapter's
lookup, so that a defense does not embed them again."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "CannotCopy",
    "chroma_copy_settings",
    "chroma_fill",
    "chroma_scratch",
    "same_remote",
    "stored_vectors",
]

logger = logging.getLogger("ragdefense")


class CannotCopy(TypeError):
    """The red team cannot copy a store or index safely by itself: the caller passes a copy
    function as ``keyword`` (``copy_store`` / ``copy_index``), which the command line cannot."""

    def __init__(self, message: str, keyword: str) -> None:
        super().__init__(message)
        self.keyword = keyword


#: the store types already reported as unreadable: the log says so once per type and process
_SAID: set[str] = set()


def stored_vectors(
    store: Any,
    ids: Sequence[str | None],
    lookup: Callable[[Any, list[str]], Mapping[str, Any] | None],
) -> list[Any | None]:
    """One stored vector per id (``None`` for a missing id or vector): ``lookup(store, ids)``
    is the adapter's reader for the stores it knows, returning ``None`` for a store it does not.
    Where no vector can be read the defense embeds the passages itself, and a warning says so
    once per store type."""
    ids = [i if isinstance(i, str) else None for i in ids]  # an id no store holds: embedded
    wanted = list(dict.fromkeys(i for i in ids if i))  # a store may refuse an id twice
    if not wanted:  # documents without ids (a parent-document retriever's): nothing to read
        return [None] * len(ids)
    try:
        found = lookup(store, wanted)
        why = "it is not one whose vectors ragdefense can read"
    except Exception as exc:  # a store that cannot answer: embed instead
        found, why = None, f"reading its vectors failed ({type(exc).__name__}: {exc})"
    if found is None:
        name = type(store).__name__
        if name not in _SAID:
            _SAID.add(name)
            logger.warning("%s: the defense embeds the retrieved passages itself: %s", name, why)
        return [None] * len(ids)
    return [found.get(i) if i else None for i in ids]


def chroma_copy_settings(collection: Any) -> dict[str, Any]:
    """What a copy of a Chroma ``collection`` is created with to rank as it does: its metadata
    and, where its distance is set in its configuration (not in the metadata's ``hnsw:space``),
    that distance (a copy made without it measures L2)."""
    metadata = collection.metadata
    settings: dict[str, Any] = {"metadata": metadata}
    if isinstance(metadata, Mapping) and "hnsw:space" in metadata:
        return settings
    configuration = getattr(collection, "configuration", None)
    hnsw = configuration.get("hnsw") if isinstance(configuration, Mapping) else None
    space = hnsw.get("space") if isinstance(hnsw, Mapping) else None
    if isinstance(space, str):
        settings["configuration"] = {"hnsw": {"space": space}}
    return settings


@contextlib.contextmanager
def chroma_scratch(source: Any) -> Iterator[tuple[Any, Any]]:
    """``(client, collection)``: a new Chroma collection created like ``source``
    (:func:`chroma_copy_settings`) in a client of its own over a temporary folder, closed and
    removed on exit, on an error too. Nothing process-wide is used: Chroma's in-memory clients
    share one system per process, which refuses clients of other settings (an app's
    ``EphemeralClient(settings=...)`` before or after would fail) and lists every collection
    made there."""
    import chromadb

    folder = tempfile.mkdtemp(prefix="ragdefense-chroma-")
    client = None
    try:
        client = chromadb.PersistentClient(path=folder)
        name = f"ragdefense-redteam-{uuid.uuid4().hex}"
        yield client, client.create_collection(name, **chroma_copy_settings(source))
    finally:
        with contextlib.suppress(Exception):
            _release(client)
        shutil.rmtree(folder, ignore_errors=True)


def chroma_fill(source: Any, target: Any, client: Any) -> None:
    """Copy every record of the Chroma collection ``source`` (ids, vectors, texts, metadata)
    into ``target`` of ``client``, a batch at a time: one read of every record at once passes
    SQLite's limit on a query's variables (tens of thousands of records)."""
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


def _release(client: Any) -> None:
    """Stop a Chroma client's system and forget it: ``close()`` where chromadb has it; before
    it, the process-wide table of systems kept the client's (its files open, its data in
    memory) until the process ended."""
    if client is None:
        return
    close = getattr(client, "close", None)
    if close is not None:
        close()
        return
    from chromadb.api.shared_system_client import SharedSystemClient

    system = SharedSystemClient._identifier_to_system.pop(client._identifier, None)
    if system is not None:
        system.stop()


#: attributes naming where a remote store keeps its data (LangChain's and LlamaIndex's stores)
REMOTE_NAMES = (
    "collection_name",
    "_collection_name",
    "index_name",
    "_index_name",
    "namespace",
    "_namespace",
    "table_name",
    "_table_name",
)


def _attributes(store: Any) -> dict[str, Any]:
    """A store's attributes: its ``__dict__`` and, for a pydantic model (LlamaIndex's stores),
    its private attributes too (a client is often one)."""
    found = dict(vars(store)) if hasattr(store, "__dict__") else {}
    found.update(getattr(store, "__pydantic_private__", None) or {})
    return found


def same_remote(store: Any, copied: Any) -> str | None:
    """Whether ``copied`` names the collection, index, namespace or table ``store`` keeps its
    data in, on the same client: a red team's "copy" of a remote store that would write into
    the user's (``None``: it does not)."""
    mine, theirs = _attributes(store), _attributes(copied)
    for name in REMOTE_NAMES:
        named = mine.get(name) not in (None, "")  # a store of no name names nothing
        if named and mine[name] == theirs.get(name) and _same_client(mine, theirs):
            return f"the same {name} ({mine[name]!r}) on the same client"
    return None


def _same_client(mine: dict[str, Any], theirs: dict[str, Any]) -> bool:
    """Whether two stores talk to one server: the same client object, clients that say the
    same address, or clients one of which says none (a Qdrant or Postgres client keeps its
    address inside: nothing tells them apart, and the same name is taken as the same data)."""
    for key in ("client", "_client"):
        a, b = mine.get(key), theirs.get(key)
        if a is not None and b is not None:
            if a is b:
                return True
            addresses = [
                tuple(str(getattr(c, attr, "")) for attr in ("host", "url", "uri", "_host", "port"))
                for c in (a, b)
            ]
            return addresses[0] == addresses[1] or not (any(addresses[0]) and any(addresses[1]))
    for key in _WHERE:  # no client: a store that says where its data lives
        a, b = mine.get(key), theirs.get(key)
        if a is not None and b is not None and _place(a) != _place(b):
            return False
    return True  # nothing tells them apart: the same name is taken as the same data


def _place(where: Any) -> str:
    """A store's location written one way: a path made absolute and normal, an address
    without its trailing slash (one place written two ways must not pass for two)."""
    text = str(where).strip()
    if "://" in text:
        return text.rstrip("/").lower()
    return os.path.normcase(os.path.abspath(os.path.expanduser(text)))


#: a store's own attributes saying where its data lives, where it holds no client
_WHERE = ("uri", "_uri", "url", "_url", "host", "_host", "path", "_path", "persist_dir",
          "_persist_dir", "connection_string", "_connection_string")  # fmt: skip
