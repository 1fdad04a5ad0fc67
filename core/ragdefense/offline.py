"""Offline and quiet: every model ragdefense loads ships in a pip package, so the Hugging Face
libraries are told not to reach the hub and not to draw download progress bars. Called by the
command line; in a notebook or script call it yourself, ``from ragdefense.offline import
offline`` then ``offline()`` (it changes this process's environment, which is why the library
never does it on its own). It is not a top-level name of :mod:`ragdefense`: this module has the
same name."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator

__all__ = ["offline", "quiet_loading"]

SETTINGS = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
    "ANONYMIZED_TELEMETRY": "False",  # Chroma, when a store is used
}


def offline() -> None:
    """Set :data:`SETTINGS` where the environment does not set them already, and silence the
    notebook-only "IProgress not found" warning of progress bars."""
    for key, value in SETTINGS.items():
        os.environ.setdefault(key, value)
    warnings.filterwarnings("ignore", message="IProgress not found")


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Load a packaged model without transformers' "Loading weights" bar, and put the bar
    setting back as it was afterwards (the library prints nothing and changes nothing of the
    process for good)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # no transformers: nothing draws a bar
        yield
        return
    was_on = hf_logging.is_progress_bar_enabled()
    if was_on:
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
