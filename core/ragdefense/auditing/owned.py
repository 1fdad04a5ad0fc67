"""What an audit writes in its working folder, by name: all that a fresh start may remove. A
file of the user's saved inside one of the audit's folders (a knowledge base in ``chunks/``, a
query log in ``probes/``) is no file of the audit's: a fresh start refuses to clear it."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["AUDIT_ENTRIES", "PART_FOLDERS", "STRAY", "foreign"]

#: the folders an audit keeps its parts in (:data:`_OWN` names what each holds)
PART_FOLDERS = ("chunks", "probes", "route", "search", "probed")
#: everything an audit writes in its folder: all that ``fresh`` may ever remove
AUDIT_ENTRIES = (
    "manifest.json",
    *PART_FOLDERS,
    *(f"report.{fmt}" for fmt in ("md", "json", "csv", "parquet", "png")),
)
#: the temporary files of a manifest or report a killed run left in the folder
STRAY = re.compile(r"\.(manifest\.json\.[0-9a-f]{32}\.tmp|report\.[0-9a-f]{32}\.[a-z]+)")
#: every path the audit writes under its part folders (workdir.py names them)
_OWN = re.compile(
    r"(chunks|probes|probed)/\d{5,}\.(json|npy|sources\.json)"
    r"|route/((chunks|probes)-\d{5,}|centroids|suspects)\.npy"
    r"|search/\d+-of-\d+(/(index\.faiss|(chunks|probes)-\d{5,}\.npz|rechecked-\d+\.json|done\.json))?"
    r"|(.+/)?\.[^/]+\.[0-9a-f]{32}\.tmp"  # a part written when the run was killed
    r"|(.+/)?(\.DS_Store|\._.+|Thumbs\.db|desktop\.ini)"  # a file browser's: no user's file
)


def foreign(root: Path) -> list[str]:
    """The paths under ``root``'s part folders the audit never writes, relative and sorted
    (a folder that is a link is removed as a link: what it names is not looked into)."""
    found = []
    for folder in PART_FOLDERS:
        top = root / folder
        if top.is_dir() and not top.is_symlink():
            for path in top.rglob("*"):
                name = path.relative_to(root).as_posix()
                if not _OWN.fullmatch(name) and not (path.is_dir() and name.startswith("search/")):
                    found.append(name)
    return sorted(found)
