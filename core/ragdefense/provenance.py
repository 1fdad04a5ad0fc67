"""Provenance: where a passage comes from, and whether the user trusts it.

Real documents say where they come from: LangChain loaders set ``metadata["source"]``,
LlamaIndex readers ``file_path`` / ``file_name`` / ``url``, nodes a ``ref_doc_id``. A defense
that counts support per *source* rather than per passage is not outvoted by twenty chunks of one
upload, or by one web host repeating itself (search engines' host crowding). Web addresses
(``http``, ``https``, ``ftp``; under ``url`` / ``link`` also without the scheme) and host names
count per host (``www.`` and a port dropped, an internationalised name in its ASCII form;
subdomains are hosts of their own); any other value (``s3://bucket/key``) is taken as it is.
"""

from __future__ import annotations

import numbers
import os
import posixpath
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from .addresses import (
    WEB_SCHEMES,
    ambiguous_path,
    bare_host,
    clean_path,
    decoded_document,
    folder_forms,
    has_scheme,
    held_by,
    host_name,
    is_web,
    page_prefix,
    reads_as_web,
    resolved_path,
    schemeless,
    web_host,
    working_folder,
)
from .integration.records import CopiedOnRead
from .text import printed
from .types import Passage

__all__ = [
    "AUTO",
    "SOURCE_KEYS",
    "WEB_SCHEMES",
    "Trust",
    "document_of",
    "is_trusted_by",
    "metadata_source",
    "no_source_read",
    "source_of",
    "sources_of",
]

#: the metadata keys read, in this order, when no ``source_key`` is named
SOURCE_KEYS = (
    "source",
    "url",
    "link",  # LangChain's news and feed loaders
    "file_path",
    "file_name",
    "filename",
    "doc_id",
    "document_id",
    "ref_doc_id",
)

#: the keys naming a file or page, which a number under ``source`` (a page's) gives way to; not
#: an id (a chunk's ``doc_id``, or the ``ref_doc_id`` of a reader's document per page)
_FILES = ("url", "link", "file_path", "file_name", "filename")

#: the keys whose values are web addresses, with their scheme or without
_WEB_KEYS = frozenset({"url", "link"})
#: the keys whose values are files, never hosts (``Main.py`` and ``main.py`` are two files)
_FILE_KEYS = frozenset({"file_path", "file_name", "filename"})

#: ``source_key`` value meaning "the first of :data:`SOURCE_KEYS` a passage has"
AUTO = "auto"

#: what ``trusted=`` accepts: sources (as :func:`source_of` gives them), or a predicate on a
#: passage's metadata
Trust = Collection[str] | Callable[[Mapping[str, Any]], bool] | None


#: values that say "no source" (a missing value as pandas, JSON or str(None) writes it)
_MISSING = frozenset({"nan", "none", "null", "n/a", "<na>", "nat"})


def _normal(value: Any, web: bool = False, file: bool = False) -> str | None:
    """``value`` as a source; ``web``: a ``url`` / ``link`` value (a page, even scheme-less or
    scheme-relative, ``//who.int/news``); ``file``: a file key's, never a host."""
    if (text := printed(value)) is None:  # no value, or one without a text
        return None
    return (_normal_text if len(text) <= _CACHED else _normal_text.__wrapped__)(text, web, file)


#: the longest value whose reading is kept (a source is a name or an address, not a document)
_CACHED = 2048


@lru_cache(maxsize=8192)  # a store's documents come back query after query
def _normal_text(value: str, web: bool, file: bool) -> str | None:
    text = value.strip()
    if not text.isascii():  # a lone surrogate (a broken export) escaped: stored and shown alike
        text = text.encode("utf-8", "xmlcharrefreplace").decode("utf-8")  # no path separator
    if not text or text.casefold() in _MISSING:
        return None
    if web and text.startswith("//") and not text.startswith("///"):  # scheme-relative
        text = text[2:]
    if has_scheme(text):  # a web address is its host; any other (a malformed one, a storage or
        scheme, sep, rest = text.partition("://")  # file address) is one file, its scheme's
        return web_host(text) or scheme.lower() + sep + rest  # case aside (RFC 3986)
    bare = text.rstrip("/").rstrip(".")  # "who.int/" and "who.int." name the host "who.int"
    if not file and bare_host(bare):
        return host_name(bare.partition(":")[0]) or text
    page = schemeless(text) if web else None  # "who.int/news/1": as with its scheme
    if page is not None:
        return web_host(page) or text
    if ("/" in text or "\\" in text) and not ambiguous_path(text):  # one spelling of a path:
        return posixpath.normpath(text.replace("\\", "/"))  # "./kb/a.pdf", "kb\\a.pdf"
    return text  # "uploads/..\\who.int" as written: a file of uploads off Windows, not who.int


def source_of(passage: Passage, source_key: str | None = AUTO) -> str | None:
    """The source of ``passage``: the value of its metadata ``source_key`` (``"auto"``: the
    first of :data:`SOURCE_KEYS` it has; ``None``: provenance off), a web address reduced to its
    host; ``None`` when it has none.

    Examples:
        >>> web = Passage("Measles: key facts.", metadata={"url": "https://www.who.int/news/1"})
        >>> source_of(web)
        'who.int'
        >>> source_of(Passage("Q3 revenue grew.", metadata={"file_path": "reports/q3.pdf"}))
        'reports/q3.pdf'
        >>> source_of(web, source_key=None) is None  # provenance off
        True
    """
    return metadata_source(passage.metadata, source_key)


def no_source_read(
    metadatas: Sequence[Any], sources: Sequence[str | None], source_key: str | None, trusted: Trust
) -> str | None:
    """Why provenance asked for reads nothing in these passages (``None`` where it reads
    something, or was not asked for): a ``source_key`` named that none of ``metadatas`` holds
    (a misspelled key turns provenance, and trust by source, off silently), or ``trusted``
    sources where none has a source (``sources``, as read). Said of one pool: a store whose
    chunks carry the key only in part may retrieve none that do."""
    if not metadatas or source_key is None or any(s is not None for s in sources):
        return None
    n = len(metadatas)
    if source_key != AUTO and not any(
        isinstance(m, Mapping) and source_key in m for m in metadatas
    ):
        return (
            f"none of these {n} passages holds source_key={source_key!r} in its metadata: no "
            "source was read (provenance and trust by source are off); is the key misspelled?"
        )
    if trusted is None or callable(trusted) or len(trusted) == 0:  # an array has no truth
        return None
    keys = ", ".join(SOURCE_KEYS) if source_key == AUTO else repr(source_key)
    return (
        f"trusted= names sources, but none of these {n} passages carries one (metadata keys "
        f"read: {keys}): nothing was trusted; name the key with source_key=, or pass a "
        "predicate on the metadata"
    )


def document_of(passage: Passage, source_key: str | None = AUTO) -> str | None:
    """The document ``passage`` belongs to, within its :func:`source_of`: for a web address
    (under ``url`` / ``link`` its scheme may be left out) its host and path in one spelling
    (scheme, ``www.``, query, fragment and a trailing ``/`` dropped: two pages of one site
    are two documents of one source, one page under two spellings is one); any other value
    is its source (the chunks of one file share their document). ``None`` when it has no
    source.

    Examples:
        >>> document_of(Passage("...", metadata={"url": "https://www.who.int/news/1/?s=2#top"}))
        'who.int/news/1'
        >>> document_of(Passage("...", metadata={"file_path": "reports/q3.pdf"}))
        'reports/q3.pdf'
    """
    host, value, _ = _source_value(passage.metadata, source_key)
    return None if host is None else _read_document(host, value)


def _read_document(host: str, value: Any) -> str:
    """:func:`_document`, kept for values short enough to be names (:data:`_CACHED`)."""
    text = str(value)
    return (_document if len(text) <= _CACHED else _document.__wrapped__)(host, text)


@lru_cache(maxsize=8192)
def _document(host: str, value: str) -> str:
    """:func:`document_of` of a passage whose source ``host`` is read from ``value``."""
    text = value.strip()
    page = None if has_scheme(text) else schemeless(text[2:] if text[:2] == "//" else text)
    text = page if page is not None and web_host(page) == host else text  # read as a page
    if web_host(text) is None:
        return host
    try:
        path = urlsplit(text).path
    except ValueError:
        return host
    return f"{host}{clean_path(path, browser=False)}"


def metadata_source(metadata: Any, source_key: str | None = AUTO) -> str | None:
    """:func:`source_of` for a bare metadata mapping (a stored chunk's, before it is a
    passage); ``None`` when ``metadata`` is not a mapping."""
    return _source_value(metadata, source_key)[0]


def _source_value(metadata: Any, source_key: str | None) -> tuple[str | None, Any, str | None]:
    """The source, the metadata value it is read from and the key of that value (its kind,
    web or file, read in any case: ``URL`` is a ``url``): ``source_key``'s, or the first of
    :data:`SOURCE_KEYS` that names one, a key as listed before one in another case
    (``(None, None, None)``: none, or provenance off)."""
    if source_key is None or not isinstance(metadata, Mapping) or not metadata:
        return None, None, None  # checked first: no metadata is the common case
    meta = metadata
    keys = SOURCE_KEYS if source_key == AUTO else (source_key,)
    if source_key == AUTO:  # a key written in another case: "URL", "Source"
        other = {k.lower(): v for k, v in meta.items() if isinstance(k, str) and not k.islower()}
        meta = {**other, **meta} if other else meta
    for key in keys:
        kind = key.lower() if isinstance(key, str) else key
        found = _normal(meta.get(key), kind in _WEB_KEYS, kind in _FILE_KEYS)
        if found is None:
            continue
        if source_key == AUTO and key == "source" and _page_number(meta[key]):
            for beside in _FILES:  # a page number (PyMuPDFReader's): the file it is a page of
                file = _normal(meta.get(beside), beside in _WEB_KEYS, beside in _FILE_KEYS)
                if file is not None:
                    return file, meta[beside], beside
        return found, meta[key], kind
    return None, None, None


def _page_number(value: Any) -> bool:
    """Whether a ``source`` value is a page number (``4``, ``"4"``, ``4.0``)."""
    if isinstance(value, float):
        return value.is_integer()
    return not isinstance(value, bool) and str(value).strip().isdigit()


def sources_of(passages: Sequence[Passage], source_key: str | None = AUTO) -> list[str | None]:
    """:func:`source_of` for each passage."""
    return [source_of(p, source_key) for p in passages]


def is_trusted_by(
    trusted: Trust, source_key: str | None = AUTO, *, cwd: str | None = None
) -> Callable[[Passage, str | None], bool]:
    """A test ``(passage, its source) -> trusted?`` for ``trusted``: a collection of sources,
    or a predicate on the passage's metadata, its answer read as Python's truth but for a
    string or NaN (``"false"`` or a missing flag in pandas, true to Python), which is an error.
    ``None``: nothing is.

    A source is compared after the same reduction as :func:`source_of`: ``"who.int"`` and
    ``"https://www.who.int/"`` trust that host exactly (not ``apps.who.int``: a predicate can
    match more). An address with a path, with or without its scheme, trusts that page and the
    pages under it (:func:`document_of` read with ``source_key``, dot segments resolved), not
    its whole host: a shared host (a code forge, a blog platform) serves anyone's pages. One
    with a query (``?t=1``) is refused: a path prefix cannot tell one thread from another. A
    file path or storage address written as a path trusts that file and, as a folder, the
    files under it (``"kb/handbook"`` trusts ``kb/handbook/leave.md``; a file path's dot
    segments resolved, a storage key under it both ways, nothing under it through ``..`` and
    a backslash), a relative one also from ``cwd`` (``None``: the working folder now), as
    readers write absolute paths; an entry naming no folder of its own is refused.

    Examples:
        >>> passage = Passage("...", metadata={"source": "https://who.int/x", "reviewed": True})
        >>> is_trusted_by({"https://www.who.int/"})(passage, source_of(passage))
        True
        >>> is_trusted_by({"https://who.int/news"})(passage, source_of(passage))
        False
        >>> is_trusted_by(lambda metadata: metadata.get("reviewed", False))(passage, None)
        True
        >>> is_trusted_by(None)(passage, "who.int")
        False
    """
    if trusted is None:
        return _Sources(frozenset())
    if callable(trusted):
        return _Predicate(trusted)
    if isinstance(trusted, (str, bytes, Mapping)) or not isinstance(trusted, Collection):
        raise TypeError(
            "trusted must be a collection of sources (a set of strings) or a predicate on "
            f"metadata, got {type(trusted).__name__}"
        )
    if odd := [t for t in trusted if not isinstance(t, (str, os.PathLike))]:
        raise TypeError(f"trusted: each source is a string, got {odd[0]!r}")
    pattern = next((t for t in trusted if "*" in str(t).split("://")[-1].split("/")[0]), None)
    if pattern is not None:  # an allow-list's "*.who.int" would trust nothing, silently
        raise ValueError(
            f'trusted: {pattern!r} is a pattern, not a source: name each host ("who.int" '
            "trusts who.int and www.who.int, not apps.who.int), or pass a predicate"
        )
    pages = {t: page_prefix(t) for t in trusted}
    # also the exact source an entry names ("www.who.int/index.html": a path under "source"),
    # read as a host where it may be one, and as a file key's value, its case kept ("Main.py"
    # trusts the file Main.py, not main.py)
    named = [t for t, p in pages.items() if not p or not has_scheme(str(t))]
    sites = [t for t in named if type(t) is str and reads_as_web(t)]  # a Path is a file
    hosts = frozenset(n for n in map(_normal, sites) if n is not None)
    named = [t for t in named if not is_web(str(t).strip())]  # an address names a site only
    names = frozenset(n for n in map(_normal, named) if n is not None)
    files = frozenset(n for t in named if (n := _normal(t, file=True)) is not None)
    cwd = working_folder() if cwd is None else cwd
    # a page's entry trusts what is under it by the page rule (escapes read as servers do)
    found = [(t, f) for t in named if not pages[t] and (f := _folder(t)) is not None]
    folders = frozenset(form for t, f in found for form in folder_forms(t, f, cwd))
    written = frozenset(str(t).strip() for t, _ in found)
    pages_ = frozenset(p for p in pages.values() if p)
    return _Sources(names, pages_, source_key, files, folders, written, hosts)


def _folder(entry: Any) -> str | None:
    """A trusted file path or storage address written as a path (``kb/handbook``, ``docs/``,
    ``s3://acme/policies/``) as the folder or key prefix holding the files under it
    (:func:`~ragdefense.addresses.resolved_path`); ``None`` for another entry (a host,
    ``who.int/`` too, a bare file name, a web address)."""
    raw, text = str(entry).strip(), _normal(entry, file=True)
    if text is None or "/" not in raw.replace("\\", "/") or bare_host(raw.rstrip("/").rstrip(".")):
        return None
    if is_web(raw):  # "https://who.int": a host, never a local folder "who.int"
        return None
    return resolved_path(text)


@dataclass(frozen=True)
class _Sources:
    """Trusted: a passage from one of ``names`` (``files`` for a file key's, ``hosts`` for a web
    address's), from or under one of ``pages``, or under one of ``folders`` (it pickles)."""

    names: frozenset[str]
    pages: frozenset[str] = frozenset()
    source_key: str | None = AUTO
    files: frozenset[str] = frozenset()
    folders: frozenset[str] = frozenset()
    written: frozenset[str] = frozenset()  # the entries that are paths, as written
    hosts: frozenset[str] = frozenset()  # names reading as hosts, for a web address's host

    def __call__(self, passage: Passage, source: str | None) -> bool:
        named = source in self.names or source in self.files or source in self.hosts
        if source is None or not (self.written or self.folders or self.pages or named):
            return False  # no rule could trust it: its metadata is not read again
        host, value, key = _source_value(passage.metadata, self.source_key)
        if str(value).strip() in self.written:  # the very string trusted: one file anywhere
            return True
        if ("/" in source or "\\" in source) and ambiguous_path(str(value)):
            return False  # "uploads/x\\..\\handbook\\a.md": a file of uploads off Windows
        # a file or storage key under a trusted folder ("kb/handbook" holds "kb/handbook/a.md"),
        # read with and without its dot segments resolved (stores differ)
        readings = {resolved_path(source, dots) for dots in (False, True)} if self.folders else ()
        if "/" in source and readings and all(held_by(self.folders, r) for r in readings):
            return True
        web = reads_as_web(str(value), key in _FILE_KEYS, key in _WEB_KEYS)  # a host, a page
        as_file = key in _FILE_KEYS and not has_scheme(str(value))  # an address: its host
        sure = web and (has_scheme(str(value)) or key in _WEB_KEYS)  # a bare "who.int": either
        either = web and not sure and source in self.hosts  # or a name, as below
        if either or source in (self.files if as_file else self.hosts if sure else self.names):
            return True  # each form by the entries that read as it
        if not self.pages or not web or host is None or "/" in host:  # a file, a path: no
            return False  # web page, whatever its folders are named ("who.int/news/x.md")
        doc = _read_document(host, value)
        host, _, path = doc.partition("/")
        # under a trusted page as a browser and as servers may read it: "../" (or "..\\") cannot
        # climb out of one, nor "%2e%2e" or "..;x" (Tomcat drops ";params") lead into one
        paths = (path, re.sub(r";[^/]*", "", path))
        seen = [host + clean_path("/" + p, b) for p in paths for b in (True, False)]
        # a page p holds d where d is p or starts with p + "/"
        held = set.intersection(*(held_by(self.pages, s) for s in seen))
        # and as servers decoding every escape read page and document ("..%2f" is "../")
        return bool(held_by({decoded_document(p) for p in held}, decoded_document(doc)))


@dataclass(frozen=True)
class _Predicate:
    """Trusted: a passage whose metadata ``predicate`` accepts (pickles when it does)."""

    predicate: Callable[[Mapping[str, Any]], Any]

    def __call__(self, passage: Passage, source: str | None) -> bool:
        meta = passage.metadata if isinstance(passage.metadata, Mapping) else {}
        verdict = self.predicate(CopiedOnRead(meta))  # the caller's stays as it is
        # "false" (a flag read from CSV or JSON) and NaN (a missing flag in pandas) are true
        # to bool(): a passage would be trusted by a value that means the opposite
        nan = isinstance(verdict, (numbers.Complex, Decimal)) and (
            verdict.is_nan() if isinstance(verdict, Decimal) else verdict != verdict
        )
        if isinstance(verdict, (str, bytes)) or nan:
            raise TypeError(f"the trusted= predicate answered {verdict!r}: return True or False")
        return bool(verdict)
