"""Web addresses, host names and file paths as provenance reads them: which text is an
address, its host, a scheme-less address, a path in one spelling, the pages and folders a
trusted entry names (:mod:`ragdefense.provenance` turns them into sources, documents and
trust)."""

from __future__ import annotations

import ntpath
import os
import posixpath
import re
import unicodedata
from collections.abc import Collection
from functools import lru_cache
from typing import Any
from urllib.parse import quote, unquote, urlsplit

__all__ = [
    "WEB_SCHEMES",
    "ambiguous_path",
    "bare_host",
    "clean_path",
    "decoded_document",
    "folder_forms",
    "has_scheme",
    "held_by",
    "host_name",
    "is_web",
    "page_prefix",
    "reads_as_web",
    "resolved_path",
    "schemeless",
    "web_host",
    "working_folder",
]

#: the schemes of addresses whose host is their source; any other (``s3://``, ``gs://``,
#: ``file://``) names one file, its own source
WEB_SCHEMES = frozenset({"http", "https", "ftp", "ftps"})
#: a bare host name, with a port or not (``wiki.corp:8080``, ``localhost:8000``, ``bücher.de``;
#: its last label Latin, as a top-level domain's: ``報告.文件`` is a name, not a host)
_HOST = re.compile(r"((?:[\w-]+\.)+[a-z0-9_-]+|localhost)(?::\d+)?", re.IGNORECASE)
#: an address's scheme, at the start of the text (``https://``, ``s3://``), not one further on
#: (``who.int/redirect?to=https://...`` is a scheme-less address)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
#: an IPv4 address, a host of its own (``10.0.0.5/wiki``)
_IPV4 = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
#: last labels that make a bare dotted name a file's (``Report.PDF``), never a host's
_FILE_TYPES = frozenset(
    {
        *("pdf", "txt", "md", "mdx", "rst", "html", "htm", "xml", "json", "jsonl", "csv", "tsv"),
        *("parquet", "doc", "docx", "odt", "rtf", "ppt", "pptx", "xls", "xlsx", "epub", "png"),
        *("jpg", "jpeg", "gif", "yaml", "yml", "log", "ipynb"),
    }
)
#: a percent escape of an unreserved character (RFC 3986), the only ones decoded in a path
_UNRESERVED_ESCAPE = re.compile(r"%(2[dDeE]|5[fF]|7[eE]|[46][1-9a-fA-F]|[57][0-9aA]|3[0-9])")
_UNRESERVED_NOT_DOT = re.compile(r"%(2[dD]|5[fF]|7[eE]|[46][1-9a-fA-F]|[57][0-9aA]|3[0-9])")


def web_host(text: str) -> str | None:
    """The host of a web address (:data:`WEB_SCHEMES`), lowercased, ``www.`` and a final dot
    dropped; ``None`` for another address or one whose host part is not unambiguous (a
    backslash in it, which browsers and HTTP clients read as the end of the host; an invalid
    port): never another host's source."""
    if not is_web(text):
        return None
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises on an invalid port ("who.int:443.evil.com")
        host = parts.hostname
    except ValueError:
        return None
    if not host or "\\" in parts.netloc:
        return None
    return host_name(host)


def host_name(host: str) -> str | None:
    """A host name in one spelling: Unicode's compatibility form (a full-width ``WHO.int`` is
    ``who.int``), lowercased, each internationalised label in its punycode form
    (``bücher.example`` is ``xn--bcher-kva.example``; ``boß.com`` stays another host than
    ``boss.com``), ``www.`` and a final dot dropped; ``None`` when nothing is left. Not every
    mapping a browser applies (IDNA's: an ideographic full stop read as a dot, a soft hyphen
    dropped): such a spelling is another host, never a trusted one."""
    name = unicodedata.normalize("NFKC", host).lower().rstrip(".")
    if not name.isascii() and len(name) <= 253:  # longer is no DNS name: kept as written
        name = ".".join(
            label if label.isascii() else "xn--" + label.encode("punycode").decode("ascii")
            for label in name.split(".")
        )
    return name.removeprefix("www.") or None


def has_scheme(text: str) -> bool:
    """Whether ``text`` starts with an address's scheme (``https://``, ``s3://``), spaces
    around it aside."""
    return _SCHEME.match(text.strip()) is not None


def is_web(text: str) -> bool:
    """Whether ``text`` is an address of one of :data:`WEB_SCHEMES`."""
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.strip().lower() in WEB_SCHEMES


def bare_host(text: str) -> bool:
    """Whether ``text`` reads as a host name (``who.int``, ``wiki.corp:8080``), not a file's
    name (``Report.PDF``)."""
    return bool(_HOST.fullmatch(text)) and text.rpartition(".")[2].lower() not in _FILE_TYPES


def reads_as_web(text: str, file_key: bool = False, web_key: bool = False) -> bool:
    """Whether a source's value (or a trusted entry, with neither key) names a web host or page:
    an address of :data:`WEB_SCHEMES`, a ``url`` / ``link`` value without another scheme
    (``//who.int/news`` too), and elsewhere a bare host (``who.int``); never a file key's value,
    a path (``./who.int``, ``who.int/news`` under ``source``), nor a name that reads as a
    file's (``leave.md``; only the extensions :func:`bare_host` knows)."""
    text = text.strip()
    if has_scheme(text):
        return is_web(text)
    if web_key or file_key:
        return web_key
    if text.startswith(("./", ".\\", "../", "..\\", "/", "\\")):
        return False
    return bare_host(text.rstrip("/").rstrip("."))


def schemeless(text: str) -> str | None:
    """``text`` as a web address where it is one spelled without its scheme (``who.int/news``:
    a host, then a path; the host's last label letters, as a top-level domain's are, so that a
    folder such as ``kb.v2/notes.md`` stays a path); ``None`` otherwise."""
    head, slash, _ = text.partition("/")
    if not slash or any(c in text for c in " \\") or not bare_host(head):
        return None
    host = head.partition(":")[0]
    named = "." in host and host.rpartition(".")[2].isalpha()
    return f"https://{text}" if named or _IPV4.fullmatch(host) else None


def clean_path(path: str, browser: bool = True) -> str:
    r"""A web address's path in one form whatever its spelling (``~`` or ``%7E``, ``ö`` or
    ``%C3%B6``, a space or ``%20``) with its dot segments resolved (``/a/../b`` is ``/b``),
    without a trailing ``/`` (the root is ``""``). ``browser``: as browsers read it, a ``\``
    (or ``%5C``) a ``/`` and ``%2e`` a dot; otherwise as a server may, both left as they are
    (names, not separators or dot segments)."""
    if browser:
        path = re.sub(r"%5[cC]", "/", path.replace("\\", "/"))
    unreserved = _UNRESERVED_ESCAPE if browser else _UNRESERVED_NOT_DOT
    decoded = unreserved.sub(lambda m: chr(int(m.group(1), 16)), path)
    decoded = re.sub(r"%[0-9a-f]{2}", lambda m: m.group(0).upper(), decoded)
    # a lone surrogate (a broken export) as the bytes it stood for, never an encoding error
    spelled = quote(decoded, safe="/%:@!$&'()*+,;=-._~\\", errors="surrogatepass")
    resolved = posixpath.normpath("/" + spelled.lstrip("/"))
    return "" if resolved == "/" else resolved


def page_prefix(entry: Any) -> str | None:
    """``host/path`` of a trusted web address with a path (its scheme may be left out), the
    path's dot segments resolved; ``None`` for any other entry. One with a query is refused: a
    query names a page among a site's pages, and a path prefix cannot say which."""
    text = str(entry).strip()
    if has_scheme(text) and not is_web(text):
        return None  # a storage or file address: trusted as the one file it names
    if not has_scheme(text):
        web = schemeless(text)
        if web is None:
            return None
        text = web
    host = web_host(text)
    if host is None:
        return None
    parts = urlsplit(text)
    if parts.query:
        raise ValueError(
            f"trusted {entry!r}: an address with a query is not a page prefix; trust such "
            "pages with a predicate on the metadata"
        )
    path = clean_path(parts.path)
    return f"{host}{path}" if path else None


def decoded_document(document: str) -> str:
    """``host/path`` with every escape of its path decoded (``%2F`` a ``/``), as some servers
    read it before resolving its dot segments."""
    host, _, path = document.partition("/")
    return host + clean_path("/" + unquote(path))


def held_by(prefixes: Collection[str], document: str) -> set[str]:
    """The ``prefixes`` that are ``document`` or a page or folder holding it (``document``
    starts with the prefix and a ``/``): looked up at the lengths the prefixes have, so that a
    long path's thousands of prefixes are never written out."""
    lengths = _lengths(prefixes) if isinstance(prefixes, frozenset) else {len(p) for p in prefixes}
    cuts = [i for i in lengths if i == len(document) or document[i : i + 1] == "/"]
    return {document[:i] for i in cuts if document[:i] in prefixes}


@lru_cache(maxsize=64)
def _lengths(prefixes: frozenset[str]) -> frozenset[int]:
    """The lengths of a trusted set's prefixes, read once per set (a set's hash is kept)."""
    return frozenset(map(len, prefixes))


#: a drive (``C:``) or a scheme written without its slashes (``s3:``) opening a path
_DRIVE = re.compile(r"[A-Za-z][\w+.-]*:")


def resolved_path(path: str, dots: bool = False) -> str:
    """A file path (one spelling, ``/`` separators) or a storage address without a trailing
    ``/``, a file URL's path decoded. Dot segments are resolved in a file path and a file URL,
    and in another address's key with ``dots`` only: stores differ (S3 reads
    ``uploads/../policies/x`` as a key under ``uploads/``, HDFS and SFTP resolve it), so a
    key is under a folder only when it is both ways (and see :func:`ambiguous_path`)."""
    if not has_scheme(path):
        return path.rstrip("/") or path
    scheme, _, rest = path.strip().partition("://")
    scheme = scheme.lower()
    if scheme != "file" and not dots:
        return f"{scheme}://{rest.rstrip('/')}"
    head, slash, tail = rest.partition("/")
    tail = unquote(tail) if scheme == "file" else tail
    tail = posixpath.normpath("/" + tail).lstrip("/") if slash else ""
    return f"{scheme}://{head}" + (f"/{tail}" if tail else "")


def ambiguous_path(path: str) -> bool:
    """Whether readers of ``path`` may disagree on which folder holds it, so that none can be
    said to: a ``..`` segment next to a ``\\`` (on Windows a separator, elsewhere part of a
    file's name: ``uploads/x\\..\\..\\handbook\\a.md`` is a file of ``uploads``); both
    separators where no drive or share opens the path (``/srv/kb/handbook\\x.md`` is a file of
    ``/srv/kb`` off Windows); a URL segment whose escapes hide a ``/``, ``\\``, ``.`` or ``..``
    (``%2e%2e%2fhandbook``: one file name to a reader that does not decode it; in a storage
    key, only a hidden dot segment); a file URL with a query or fragment (``#/../../x``: which
    part names the file depends on the reader)."""
    text = path.strip()
    if has_scheme(text):
        scheme, _, raw = text.partition("://")
        file = scheme.strip().lower() == "file"
        if file and ("?" in raw or "#" in raw):
            return True
        for segment in raw.split("/"):
            plain = unquote(segment)
            parts = set(re.split(r"[\\/]", plain))
            hidden = "/" in plain or "\\" in plain if file else False
            if plain != segment and (hidden or bool(parts & {".", ".."})):
                return True
        text = unquote(raw)
    if "\\" not in text:
        return False
    opened = ntpath.splitdrive(text.replace("\\", "/"))[0]  # "C:", "//server/share"
    return ".." in re.split(r"[\\/]", text) or ("/" in text and not opened)


def folder_forms(entry: Any, folder: str, here: str | None) -> list[str]:
    """A trusted folder (:func:`resolved_path`), and a relative one also from ``here`` (the
    working folder; never above its drive, share or root). A folder that names none of its
    own (``/``, ``C:/``, ``//server/share``, ``s3://``, ``file://host/``, ``.``, ``..``) is
    refused, as written or from ``here``: it would trust every file."""
    scheme, sep, rest = folder.partition("://")
    if sep and scheme != "file" and {".", ".."} & {unquote(p) for p in rest.split("/")}:
        raise ValueError(f"trusted {entry!r}: name the folder without '.' or '..' segments")
    forms = [folder]
    if here and not (folder.startswith("/") or has_scheme(folder) or _DRIVE.match(folder)):
        drive, base = ntpath.splitdrive(here.replace("\\", "/"))
        forms.append(drive + posixpath.normpath(posixpath.join(base or "/", folder)))
    for form in forms:
        scheme, sep, rest = form.partition("://")
        host, _, path = rest.partition("/") if scheme == "file" else ("", "", rest)
        if not sep:  # below its drive or share ("//server/share" is one, as "C:")
            path = ntpath.splitdrive(form)[1]
        path = path.strip("/")
        share = host not in ("", "localhost") and "/" not in path  # file://server/share/
        if not path or path in (".", "..") or _DRIVE.fullmatch(path) or share:
            raise ValueError(
                f"trusted {entry!r} names no folder of its own ({form!r}: a root, a share, "
                "'.' or '..'): it would trust every file under it; name a folder, a bucket or "
                "a file"
            )
    return forms


def working_folder() -> str | None:
    """The working folder a relative trusted folder is also read from; ``None`` where it was
    removed (relative folders then count as written only)."""
    try:
        return os.getcwd()
    except OSError:
        return None
