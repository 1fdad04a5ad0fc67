"""What an audit reads: a knowledge base as batches of chunks ``(ids, texts, titles, vectors,
metadata)``, from files (JSONL / Parquet), memory, or a framework's store (read by the
adapters), and the probe questions of a query log.

Everything here streams a batch at a time: the texts and vectors held are bounded by the batch
size; a file's reader also keeps every id it has read, to refuse a repeated one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .space import check_stored

__all__ = [
    "Batch",
    "Corpus",
    "FileCorpus",
    "ListCorpus",
    "as_corpus",
    "fingerprint",
    "read_queries",
]


@dataclass(frozen=True)
class Batch:
    """Consecutive chunks of a knowledge base.

    Attributes:
        ids: The chunks' ids, as the store knows them.
        texts: Their texts.
        titles: A title per chunk (``""`` when the source has none): probes are derived from it.
        vectors: The stored vectors (``n x d``), or ``None`` when the audit must embed the texts.
        metadata: Each chunk's metadata as the store holds it, or ``None`` when it has none: the
            audit reads each chunk's source from it (as the per-query defenses do).
    """

    ids: list[str]
    texts: list[str]
    titles: list[str]
    vectors: np.ndarray | None = None
    metadata: Sequence[Mapping[str, Any] | None] | None = None

    def __post_init__(self) -> None:
        n = len(self.ids)
        if len(self.texts) != n or len(self.titles) != n:
            raise ValueError(f"a batch needs as many texts and titles as ids ({n})")
        if self.vectors is not None and len(self.vectors) != n:
            raise ValueError(f"a batch has {n} ids but {len(self.vectors)} vectors")
        if self.metadata is not None and len(self.metadata) != n:
            raise ValueError(f"a batch has {n} ids but {len(self.metadata)} metadata entries")
        bad = next((i for i, v in enumerate(self.ids) if not isinstance(v, str)), None)
        if bad is not None:
            raise ValueError(
                f"chunk {bad + 1} of the batch has an id of type {type(self.ids[bad]).__name__}"
                f" ({self.ids[bad]!r}): ids are strings"
            )
        meta = () if self.metadata is None else self.metadata  # sources come from mappings
        bad = next((i for i, m in enumerate(meta) if not isinstance(m, Mapping | None)), None)
        if bad is not None:
            raise ValueError(f"chunk {self.ids[bad]!r}: metadata {meta[bad]!r:.60} is no mapping")
        for field, values in (("text", self.texts), ("title", self.titles)):
            bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
            if bad is not None:  # e.g. a store record holding a vector but no document
                raise ValueError(
                    f"chunk {self.ids[bad]!r} has no {field} string (got "
                    f"{type(values[bad]).__name__}): give every chunk a text ('' for none)"
                )
        rows = zip(self.ids, self.texts, self.titles, strict=True)
        for i, row in enumerate(rows):  # each is written to the working folder
            for field, value in zip(("id", "text", "title"), row, strict=True):
                if not value.isascii():  # ASCII is valid; else say which chunk is not
                    _check_text(value, f"chunk {i + 1} of the batch ({row[0]!r})", field)
        if self.vectors is not None:
            check_stored(self.ids, self.vectors, self.texts)


@runtime_checkable
class Corpus(Protocol):
    """A knowledge base an audit can read: batches of chunks, always in the same order."""

    def batches(self, size: int) -> Iterator[Batch]:
        """The chunks, ``size`` at a time (the last batch may be smaller)."""
        ...


def fingerprint(corpus: Corpus) -> str:
    """What a resumed audit checks it is reading the same knowledge base: the corpus's own
    ``fingerprint()`` where it has one, else its type."""
    own = getattr(corpus, "fingerprint", None)
    return str(own()) if callable(own) else type(corpus).__name__


def _check_text(text: str, where: str, field: str = "text") -> None:
    """``ValueError`` naming the chunk when ``text`` is not valid Unicode (a lone surrogate, as
    a broken export holds): it could be neither stored nor reported."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{where}: its {field} is not valid Unicode (a lone surrogate at character "
            f"{exc.start}): fix the export"
        ) from None


def _finite(vector: Any) -> bool:
    try:
        arr = np.asarray(vector, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return arr.ndim == 1 and arr.size > 0 and bool(np.isfinite(arr).all())


def _vectors(rows: Sequence[Any]) -> np.ndarray | None:
    if not rows or any(r is None for r in rows):
        return None
    return np.asarray(rows, dtype=np.float32)


class ListCorpus:
    """A knowledge base held in memory: texts, with optional ids, titles, vectors and metadata
    (a mapping per chunk, e.g. ``{"source": "uploads/q3.pdf"}``)."""

    def __init__(
        self,
        texts: Sequence[str],
        ids: Sequence[str] | None = None,
        titles: Sequence[str] | None = None,
        vectors: Any = None,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> None:
        self.texts = [t if t is None else str(t) for t in texts]  # None: refused below
        self.ids = [str(i) for i in ids] if ids is not None else [str(i) for i in range(len(texts))]
        self.titles = [str(t or "") for t in titles] if titles is not None else [""] * len(texts)
        try:
            self.vectors = None if vectors is None else np.asarray(vectors, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"vectors: not one row of numbers per chunk, all one size ({exc})"
            ) from None
        self.metadata = None if metadata is None else list(metadata)
        if len(set(self.ids)) != len(self.ids):
            raise ValueError("chunk ids must be unique")
        if self.vectors is not None and self.vectors.ndim != 2:
            shape = self.vectors.shape
            raise ValueError(f"vectors: one row per chunk expected (a 2-D array), got {shape}")
        if self.vectors is not None and not np.isfinite(self.vectors).all():
            bad = sorted({int(i) for i in np.argwhere(~np.isfinite(self.vectors))[:, 0]})[:5]
            raise ValueError(f"the vectors of chunk(s) {bad} hold NaN or infinite values")
        Batch(self.ids, self.texts, self.titles, self.vectors, self.metadata)  # lengths, texts

    def fingerprint(self) -> str:
        """Size and a hash of the ids and texts."""
        digest = hashlib.sha256(json.dumps([self.ids, self.texts]).encode()).hexdigest()
        return f"{len(self.texts)} chunks {digest[:16]}"

    def batches(self, size: int) -> Iterator[Batch]:
        for start in range(0, len(self.texts), size):
            part = slice(start, start + size)
            vectors = None if self.vectors is None else self.vectors[part]
            meta = None if self.metadata is None else self.metadata[part]
            yield Batch(self.ids[part], self.texts[part], self.titles[part], vectors, meta)


def unique_ids(batches: Iterable[Batch]) -> Iterator[Batch]:
    """``batches`` but empty ones, refused at the first id read twice (reports name ids)."""
    seen: dict[str, int] = {}  # id -> the batch it was first read in; empty batches skipped
    for part, batch in enumerate(b for b in batches if b.ids):  # (a store's page emptied)
        for chunk_id in batch.ids:
            if chunk_id in seen:
                raise ValueError(
                    f"two chunks have the id {chunk_id!r} (parts {seen[chunk_id]} and {part}): "
                    "a report names chunks by id, so every id must be unique"
                )
            seen[chunk_id] = part
        yield batch


def _parquet() -> Any:
    """``pyarrow.parquet``, or an ``ImportError`` naming the install."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            "reading Parquet needs pyarrow: pip install 'ragdefense[audit]' (or pyarrow)"
        ) from None
    return pq


class FileCorpus:
    """Chunks from a JSONL or Parquet file: one record per chunk with ``id`` and ``text``,
    optionally ``title``, ``embedding`` (a list of floats: used instead of embedding) and
    ``metadata`` (an object); any other field (``source``, ``url`` ...) counts as metadata too.

    Parquet is read a row group at a time (needs ``pyarrow``); JSONL a line at a time.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no knowledge base file at {self.path}")
        self.parquet = self.path.suffix.lower() == ".parquet"  # .JSONL, .ndjson are JSON lines
        if not self.parquet and self.path.suffix.lower() not in (".jsonl", ".ndjson"):
            raise ValueError(
                f"{self.path}: expected a .jsonl (.ndjson) or .parquet file of {{id, text}}"
            )
        if self.parquet:
            _parquet()  # before any work: a missing pyarrow is a one-line error

    def fingerprint(self) -> str:
        """Size and a hash of the file's bytes: the same content resumes, wherever it lies and
        whenever it was last written (a copy, a ``touch``); other content does not."""
        digest = hashlib.sha256()
        with self.path.open("rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        return f"{self.path.stat().st_size} bytes {digest.hexdigest()[:16]}"

    def _records(self) -> Iterator[dict[str, Any]]:
        if self.parquet:
            try:
                parts = _parquet().ParquetFile(self.path).iter_batches(batch_size=4096)
                for record_batch in parts:
                    yield from record_batch.to_pylist(maps_as_pydicts="lossy")  # map: dict
            except Exception as exc:  # pyarrow's, on a damaged file
                raise ValueError(f"{self.path}: not a readable Parquet file ({exc})") from None
            return
        with self.path.open("rb") as f:
            for line_no, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")  # a BOM first
                except UnicodeDecodeError as exc:
                    raise ValueError(
                        f"{self.path}:{line_no}: not UTF-8 (byte {exc.start + 1} of the line)"
                    ) from None
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as exc:  # a number past 4,300 digits is no JSONDecodeError
                    why = getattr(exc, "msg", "a number past 4,300 digits")
                    raise ValueError(f"{self.path}:{line_no}: not JSON ({why})") from None
                except RecursionError:
                    raise ValueError(f"{self.path}:{line_no}: JSON nested too deep") from None
                if not isinstance(record, dict):
                    raise ValueError(f"{self.path}:{line_no}: expected an object with id and text")
                yield record

    def batches(self, size: int) -> Iterator[Batch]:
        rows: list[dict[str, Any]] = []
        seen: dict[str, int] = {}
        dims: dict[str, int] = {}
        for n, record in enumerate(self._records()):
            if "text" not in record or not isinstance(record["text"], str):
                raise ValueError(f"{self.path}: record {n + 1} has no text string")
            if isinstance(rid := record.get("id"), (bool, list, dict)):  # str() names no id
                raise ValueError(f"{self.path}: record {n + 1}'s id {rid!r} is no string or number")
            chunk_id = f"row-{n}" if rid is None or rid == "" else str(rid)  # id 0 is an id
            if chunk_id in seen:
                raise ValueError(
                    f"{self.path}: records {seen[chunk_id]} and {n + 1} have the same id "
                    f"{chunk_id!r}: chunk ids must be unique"
                )
            seen[chunk_id] = n + 1
            _check_text(record["text"], f"{self.path}: record {n + 1} (id {chunk_id!r})")
            vector = record.get("embedding")
            if (vector is None) != dims.setdefault("none", vector is None):  # mixed: one space
                has = "no embedding" if vector is None else "an embedding"
                raise ValueError(
                    f"{self.path}: record {n + 1} (id {chunk_id!r}) has {has}, unlike record 1: "
                    "give an embedding on every record (one model's) or on none"
                )
            if vector is not None and not _finite(vector):
                raise ValueError(
                    f"{self.path}: record {n + 1} (id {chunk_id!r}) has an embedding that is "
                    "not a vector of finite numbers"
                )
            if vector is not None and len(vector) != dims.setdefault("first", len(vector)):
                raise ValueError(
                    f"{self.path}: record {n + 1} (id {chunk_id!r}) has an embedding of "
                    f"{len(vector)} numbers, earlier ones {dims['first']}"
                )
            rows.append({**record, "id": chunk_id})
            if len(rows) == size:
                yield self._batch(rows)
                rows = []
        if rows:
            yield self._batch(rows)

    @staticmethod
    def _batch(rows: list[dict[str, Any]]) -> Batch:
        return Batch(
            ids=[r["id"] for r in rows],
            texts=[r["text"] for r in rows],
            titles=[str(r.get("title") or "") for r in rows],
            vectors=_vectors([r.get("embedding") for r in rows]),
            metadata=[_metadata(r) for r in rows],
        )


_OWN_FIELDS = frozenset({"id", "text", "title", "embedding", "metadata"})


def _metadata(record: dict[str, Any]) -> dict[str, Any]:
    """A record's metadata: its other fields, and those of its ``metadata`` object (which win;
    an object written as a JSON string, as Parquet exports often hold it, is read too)."""
    nested = record.get("metadata")
    if isinstance(nested, str):
        try:
            nested = json.loads(nested)
        except (ValueError, RecursionError):  # not JSON, a 4,300-digit number, too deep
            nested = None
    if nested is not None and not isinstance(nested, (str, Mapping)):  # a string: not JSON
        raise ValueError(f"chunk {record.get('id')!r}: metadata must be an object, not {nested!r}")
    extra = {k: v for k, v in record.items() if k not in _OWN_FIELDS}
    return {**extra, **nested} if isinstance(nested, Mapping) else extra


def as_corpus(knowledge_base: Any) -> Corpus:
    """Whatever an audit is given, as a :class:`Corpus`: a file path, a corpus, a list of
    texts, a LangChain vector store or a LlamaIndex index (read by the adapters, through
    :mod:`ragdefense.plugins`)."""
    if isinstance(knowledge_base, Corpus):
        return knowledge_base
    if isinstance(knowledge_base, (str, Path)):
        return FileCorpus(knowledge_base)
    if isinstance(knowledge_base, Sequence) and all(isinstance(t, str) for t in knowledge_base):
        return ListCorpus(knowledge_base)
    from ..plugins import UnknownObject, framework_of

    try:  # a framework's store, read by its adapter (registered as an entry point)
        framework = framework_of(knowledge_base)
    except UnknownObject:  # a framework's object is refused by its own message (a retriever)
        pass
    else:  # its adapter's own refusal (a store it cannot read) is the one to show
        return framework.corpus(knowledge_base)
    what = type(knowledge_base).__name__
    if isinstance(knowledge_base, Sequence):  # a list, but not of texts: say of what
        n, item = next((n, t) for n, t in enumerate(knowledge_base) if not isinstance(t, str))
        what = f"{what} holding a {type(item).__name__} (item {n}), not only texts"
    raise TypeError(
        f"cannot audit a {what}: pass a .jsonl / .parquet file of {{id, text}}, a list of texts "
        "(str), ListCorpus(texts, ids, metadata=...), a LangChain store or a LlamaIndex index"
    )


def read_queries(queries: str | Path | Iterable[str]) -> list[str]:
    """A query log: a list of strings, or a file (``.txt`` one query per line; ``.jsonl`` with a
    ``question`` or ``query`` field per line; ``.json`` a list of strings or such objects)."""
    if isinstance(queries, (str, Path)) and Path(queries).is_file():
        path = Path(queries)
        try:
            text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is not a query
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        suffix = path.suffix.lower()
        # lines end at "\n" alone (U+2028 or a form feed inside a question is part of it)
        rows = [line.removesuffix("\r") for line in text.split("\n")]
        items: list[Any]
        if suffix == ".txt":
            items = rows
        else:  # .jsonl / .ndjson a record per line, anything else JSON
            lines = suffix in (".jsonl", ".ndjson")
            try:
                items = [json.loads(r) for r in rows if r.strip()] if lines else json.loads(text)
            except ValueError as exc:  # a number past 4,300 digits is no JSONDecodeError
                kind = "JSON lines" if lines else "JSON (.txt: one query per line)"
                why = exc if hasattr(exc, "msg") else "a number past 4,300 digits"
                raise ValueError(f"{path}: not {kind} ({why})") from None
            except RecursionError:
                raise ValueError(f"{path}: JSON nested too deep") from None
            items = list(items.values()) if isinstance(items, dict) else items
            if not isinstance(items, list):
                raise ValueError(f"{path}: expected a list of queries, got {type(items).__name__}")
    elif isinstance(queries, (str, Path)):
        raise FileNotFoundError(f"no query log at {queries}")
    elif isinstance(queries, (bytes, Mapping)) or not isinstance(queries, Iterable):
        raise TypeError(f"queries must be a list of questions or a file's path, got {queries!r}")
    else:
        items = list(queries)
    out = []
    for n, item in enumerate(items, 1):
        if isinstance(item, dict):
            item = item.get("question", item.get("query"))
        if not isinstance(item, str):  # a record with neither field, a number: never dropped
            raise ValueError(f"query log item {n}: expected a question, or a record with one")
        _check_text(item, f"query log item {n}", "question")
        if item.strip():
            out.append(item.strip())
    if not out:
        raise ValueError("the query log holds no query")
    return out
