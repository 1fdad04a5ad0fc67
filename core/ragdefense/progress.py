"""A progress bar on stderr where one is asked for and tqdm is installed; nothing otherwise."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["progress_bar"]


def progress_bar(items: Sequence[Any], desc: str | None, total: int | None = None) -> Any:
    """``items`` wrapped in a tqdm progress bar on stderr (``desc=None`` or no tqdm: no bar)."""
    if desc is None:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm comes with the embeddings extra; the core runs without it
        return items

    return tqdm(items, desc=desc, total=total, leave=False, file=sys.stderr, mininterval=0.5)
