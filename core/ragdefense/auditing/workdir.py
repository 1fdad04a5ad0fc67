"""The audit's working folder: every intermediate result is a file written once, atomically, so a
killed audit restarts where it stopped and recomputes nothing it had written.

```
manifest.json                  the parameters the files were made with (a restart must match)
chunks/00000.json              ids, texts, titles of one part of the knowledge base
chunks/00000.npy               their vectors (unit length, float32)
probes/00000.json, .npy        a part of the probe questions and their vectors
route/                         routed search only: shard centres, routes, suspects
search/<s>-of-<n>/<kind>-00000.npz  the top hits of a part's vectors in index shard s of n
probed/00000.json              what each defense decided on each probe's retrieved chunks
```
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
import warnings
import zipfile
from bisect import bisect_right
from collections.abc import Iterator
from functools import lru_cache
from itertools import accumulate, pairwise
from pathlib import Path
from typing import Any

import numpy as np

from ..similarity import unit_rows
from .owned import AUDIT_ENTRIES, foreign
from .owned import STRAY as _STRAY

__all__ = [
    "AUDIT_ENTRIES",
    "MARKER",
    "Workdir",
    "index_file",
    "locate",
    "part_digest",
    "part_name",
    "part_starts",
    "part_texts",
    "route_file",
    "rows_at",
    "search_file",
]

#: the key of the manifest that says "this folder holds a ragdefense audit"
MARKER = "ragdefense_audit"


def part_name(kind: str, part: int) -> str:
    """Where a part of ``kind`` lives, without suffix: ``chunks/00003``, ``probed/00003``."""
    return f"{kind}/{part:05d}"


def route_file(kind: str, part: int) -> str:
    """Where the routes of a part of ``kind`` (``chunks`` or ``probes``) are kept (routed
    search: :mod:`ragdefense.auditing.routing`)."""
    return f"route/{kind}-{part:05d}.npy"


def index_file(shard: int, n_shards: int) -> str:
    """Where a routed shard's FAISS index is saved (read back by the recheck)."""
    return f"search/{shard}-of-{n_shards}/index.faiss"


def search_file(shard: int, n_shards: int, kind: str, part: int) -> str:
    """Where a shard's hits for a part are kept (another number of shards: other files)."""
    return f"search/{shard}-of-{n_shards}/{kind}-{part:05d}.npz"


def part_starts(sizes: list[int]) -> list[int]:
    """The position of each part's first chunk, and the total last."""
    return [0, *accumulate(sizes)]


def locate(starts: list[int], position: int) -> tuple[int, int]:
    """``(part, offset in the part)`` of a chunk position (``starts`` from :func:`part_starts`)."""
    part = bisect_right(starts, position) - 1
    return part, position - starts[part]


class Workdir:
    """One audit's folder (created when missing)."""

    def __init__(self, path: str | Path) -> None:
        # absolute: steps run elsewhere (a Ray worker's own folder) must find it
        self.path = Path(path).absolute()
        self._run: str | None = None  # read once: new only with a start this object makes
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"cannot make the working folder {path}: {exc.strerror}") from None
        if not os.access(self.path, os.W_OK | os.X_OK):  # found at once, not at a first write
            raise ValueError(f"cannot write in the working folder {path}: permission denied")

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The folder locked for one audit while it runs: a second audit given the same folder
        (another process, or the CLI's default folder shared by two runs started in one
        place) is refused at once, instead of one clearing or overwriting the other's parts and
        reporting its chunks. The lock is the system's (``flock`` on the folder), released when
        the audit ends or its process dies; where the system or the filesystem has none
        (Windows; NFS and some FUSE mounts refuse a folder's lock, with a warning), keeping
        one audit per folder is the user's to do."""
        try:
            import fcntl
        except ImportError:
            yield
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ValueError(
                    f"{self.path}: another audit is running in this working folder: wait for "
                    "it to end, or give another folder (workdir=, --workdir)"
                ) from None
            except OSError as exc:  # a filesystem without such locks (NFS, some FUSE mounts)
                logging.getLogger("ragdefense").warning(
                    "%s: the working folder cannot be locked (%s): run one audit at a time in it",
                    self.path,
                    exc.strerror or exc,
                )
            yield
        finally:
            os.close(fd)  # releases the lock

    # ---- writing, atomically ---------------------------------------------------------------

    def _atomic(self, path: Path, write: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)  # the umask's mode, not mkstemp's 0600:
        tmp = str(path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp")  # read by other users
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def write_json(self, name: str, value: Any) -> None:
        """Write ``value`` as JSON to ``name`` (relative to the folder)."""
        data = json.dumps(value, ensure_ascii=False).encode("utf-8")
        self._atomic(self.path / name, lambda f: f.write(data))

    def write_array(self, name: str, array: np.ndarray) -> None:
        """Write one array (``.npy``)."""
        self._atomic(self.path / name, lambda f: np.save(f, array, allow_pickle=False))

    def write_stream(self, name: str, write: Any) -> None:
        """Write ``name`` by calling ``write`` on its open binary file (a temporary file,
        renamed once complete)."""
        self._atomic(self.path / name, write)

    def write_arrays(self, name: str, **arrays: np.ndarray) -> None:
        """Write named arrays (``.npz``)."""
        self._atomic(self.path / name, lambda f: np.savez(f, allow_pickle=False, **arrays))

    # ---- reading -------------------------------------------------------------------------

    def has(self, name: str) -> bool:
        """Whether ``name`` was written."""
        return (self.path / name).is_file()

    def read_json(self, name: str) -> Any:
        """The JSON value stored under ``name``."""
        with self._damaged(name):
            return json.loads((self.path / name).read_text(encoding="utf-8"))

    def read_array(self, name: str) -> np.ndarray:
        """An array, memory-mapped (read only)."""
        with self._damaged(name):
            array: np.ndarray = np.load(self.path / name, mmap_mode="r", allow_pickle=False)
        return array

    def read_arrays(self, name: str) -> dict[str, np.ndarray]:
        """Named arrays (``.npz``)."""
        with self._damaged(name), np.load(self.path / name, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}

    @contextlib.contextmanager
    def _damaged(self, name: str) -> Iterator[None]:
        """A file of the folder that cannot be read (truncated, overwritten) is named, with the
        way out, instead of surfacing as a raw zip / JSON / numpy error."""
        try:
            yield
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
            what = (
                "missing (removed after the audit wrote it)"
                if isinstance(exc, FileNotFoundError)
                else f"damaged or truncated ({type(exc).__name__}: {exc})"
            )
            raise ValueError(
                f"{self.path / name}: {what}; run the audit again with fresh=True (--fresh) "
                "to redo it"
            ) from exc

    # ---- the manifest ----------------------------------------------------------------------

    def recorded(self, param: str) -> Any:
        """A parameter as an earlier run recorded it (``None``: none recorded, or unreadable;
        :meth:`start` then says what is wrong)."""
        try:
            params = self.read_json("manifest.json")["params"] if self.has("manifest.json") else {}
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return params.get(param) if isinstance(params, dict) else None

    def _damaged_audit(self, entries: list[Path]) -> bool:
        """Whether the folder (its ``entries``, temporary manifests aside) is an audit's whose
        manifest cannot be read: a ``manifest.json`` that does not parse, beside nothing but
        the audit's own entries, its chunk parts among them."""
        if not self.has("manifest.json") or not {p.name for p in entries} <= set(AUDIT_ENTRIES):
            return False
        chunks = self.path / "chunks"
        if not chunks.is_dir() or not all(
            re.fullmatch(r"\d{5,}\.(json|npy|sources\.json)", p.name) for p in chunks.iterdir()
        ):
            return False
        try:
            json.loads((self.path / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return True
        return False

    def _is_audit(self) -> bool:
        """Whether the folder's ``manifest.json`` is an audit's: it bears :data:`MARKER`, or
        records an audit's own stage (``part_sizes``)."""
        try:
            manifest = self.read_json("manifest.json")
        except (OSError, ValueError):
            return False
        if not isinstance(manifest, dict) or "params" not in manifest:
            return False
        # a manifest without the marker is still an audit's when it records an audit stage
        return manifest.get(MARKER) == 1 or "part_sizes" in manifest

    def start(self, params: dict[str, Any], fresh: bool = False) -> None:
        """Record ``params``; on a restart they must equal the recorded ones (a changed
        parameter would mix results of two audits), unless ``fresh`` clears the audit's own
        files (:data:`AUDIT_ENTRIES`, its part folders with whatever they hold; anything
        else in the folder stays). An audit that stopped before it had read its whole
        knowledge base (an empty or invalid input, or killed while reading) is started over,
        with a warning, where the parameters changed: it holds nothing but that reading.
        A folder that holds other files but no audit (no manifest bearing :data:`MARKER`)
        is refused, never cleared nor written to."""
        self._run = None  # whatever was read before, this start decides
        stray = [p for p in self.path.iterdir() if _STRAY.fullmatch(p.name)]  # killed mid-write
        others = [p for p in self.path.iterdir() if p not in stray]
        if others and not self._is_audit():
            if not self._damaged_audit(others):
                raise ValueError(
                    f"{self.path} is not empty and holds no audit: give a new or empty folder as "
                    "the working folder (nothing in it was touched)"
                )
            if not fresh:
                raise ValueError(
                    f"{self.path / 'manifest.json'}: damaged, beside an audit's parts: run "
                    "the audit again with fresh=True (--fresh) to redo it"
                )
        if fresh:
            self._clear(stray)
        if self.has("manifest.json") and self.read_json("manifest.json").get("clearing"):
            self._clear(stray)  # a start stopped while clearing the folder: clear it again
        if self.has("manifest.json"):
            manifest = self.read_json("manifest.json")
            known = manifest.get("params")
            if not isinstance(known, dict):
                raise ValueError(
                    f"{self.path / 'manifest.json'}: damaged (no parameters recorded): run the "
                    "audit again with fresh=True (--fresh) to redo it"
                )
            changed = sorted(k for k in {*known, *params} if known.get(k) != params.get(k))
            if not changed:
                return
            if manifest.get("part_digests") is not None:
                raise ValueError(
                    f"{self.path} holds an audit made with other parameters "
                    f"({', '.join(changed)}): use another folder, or fresh=True (--fresh) to "
                    "start over"
                )
            # that audit stopped before it had read its whole knowledge base (an empty or
            # invalid input, or killed while reading): nothing but the reading is lost
            parts = len(list((self.path / "chunks").glob("[0-9]*[0-9].json")))
            warnings.warn(
                f"{self.path}: the audit there stopped while reading its knowledge base ({parts} "
                "chunk part(s) written) and was made with other parameters "
                f"({', '.join(changed)}): starting over with these",
                UserWarning,
                stacklevel=4,
            )
            self._clear(stray)
        self._run = uuid.uuid4().hex
        self.write_json("manifest.json", {MARKER: 1, "run": self._run, "params": params})

    def _clear(self, stray: list[Path]) -> None:
        """Remove the audit's own files (:data:`AUDIT_ENTRIES`) and a manifest's temporary
        ones (``stray``); nothing else in the folder. The manifest, first marked "clearing",
        goes last: a run stopped on the way leaves a folder the next start clears again. A
        file of the user's in one of the audit's folders stops it, before anything is removed."""
        if found := foreign(self.path):
            raise ValueError(
                f"{self.path} holds files the audit never writes in its own folders "
                f"({', '.join(found[:3])}{', ...' if len(found) > 3 else ''}): move them out of "
                "the working folder and run again (nothing was removed)"
            )
        self.write_json("manifest.json", {MARKER: 1, "params": {}, "clearing": 1})
        for tmp in stray:
            tmp.unlink(missing_ok=True)
        for entry in (*AUDIT_ENTRIES[1:], AUDIT_ENTRIES[0]):
            target = self.path / entry
            if target.is_dir() and not target.is_symlink():  # a link goes, not what it names
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)

    @property
    def run(self) -> str:
        """This audit's identity, new with every fresh start: what per-process caches of its
        files (indexes, parts) are keyed by, so that a fresh audit in the same folder never
        reads the last one's."""
        if self._run is None:
            self._run = str(self.read_json("manifest.json").get("run", ""))
        return self._run

    def note(self, key: str, value: Any) -> None:
        """Add a result of a finished stage to the manifest (e.g. the part sizes)."""
        manifest = self.read_json("manifest.json")
        manifest[key] = value
        self.write_json("manifest.json", manifest)

    def noted(self, key: str) -> Any:
        """A value added by :meth:`note` (``None`` when that stage has not finished)."""
        return self.read_json("manifest.json").get(key)


def part_digest(ids: list[str], texts: list[str], titles: list[str], vectors: Any) -> str:
    """A chunk part's identity: a hash of its ids, texts and titles (they choose the derived
    probes) and of its stored vectors (``None``: the audit embeds it), at unit length and 5
    decimals (a store read again gives them as it stored them, whatever their float type)."""
    digest = hashlib.sha256(json.dumps([ids, texts, titles]).encode())  # unambiguous
    if vectors is not None:
        digest.update(np.round(unit_rows(np.asarray(vectors, dtype=np.float64)), 5).tobytes())
    return digest.hexdigest()[:32]


@lru_cache(maxsize=8)
def _part_texts(path: str, version: tuple[str, int, int, int]) -> dict[str, Any]:
    """A part's ids / texts / titles (a few parts cached per process, keyed by the audit's
    :attr:`Workdir.run` and the file's identity: a part written again, by a fresh audit in the
    same folder, is read again, even where the system reuses its inode within a clock tick)."""
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    return data


def part_texts(workdir: Workdir, part: int) -> dict[str, Any]:
    """The ids, texts and titles of chunk part ``part`` (and its ``digest``)."""
    name = f"{part_name('chunks', part)}.json"
    with workdir._damaged(name):
        stat = (workdir.path / name).stat()
        version = (workdir.run, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        return _part_texts(str(workdir.path / name), version)


def rows_at(wd: Workdir, kind: str, sizes: list[int], positions: np.ndarray) -> np.ndarray:
    """The stored vectors of ``kind`` (``chunks``, ``probes``) at sorted ``positions``, read part
    by part (memory: those rows only; at least one position)."""
    starts = part_starts(sizes)
    bounds = np.searchsorted(positions, starts)
    return np.concatenate([
        np.asarray(wd.read_array(f"{part_name(kind, part)}.npy"))[positions[a:b] - starts[part]]
        for part, (a, b) in enumerate(pairwise(bounds)) if b > a
    ])  # fmt: skip


def same_texts(workdir: Workdir, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Per pair of chunk positions, whether the two chunks hold one text and title (spacing,
    case, accents and Unicode form aside, as the defenses' copies): vectors alone cannot say,
    an embedder reads a window of each text and what follows it may differ."""
    from ..defenses.pool import plain_text

    starts = part_starts(workdir.noted("part_sizes"))

    def said(position: int) -> str:
        part, offset = locate(starts, position)
        data = part_texts(workdir, part)
        return plain_text(data["titles"][offset]) + "\0" + plain_text(data["texts"][offset])

    return np.array([said(int(a)) == said(int(b)) for a, b in zip(first, second, strict=True)])
