"""The limits the library holds itself to, read off the code (constants and constructor
defaults), so that what ``ragdefense limits`` prints and what the documentation states cannot
drift apart."""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["limits"]


def _default(cls: Any, name: str) -> Any:
    return inspect.signature(cls.__init__).parameters[name].default


def limits() -> list[tuple[str, Any, str]]:
    """``(setting, value, what it bounds)`` for every limit a user may meet."""
    from .llm.base import CHARS_PER_TOKEN, CallableLLM, LangChainLLM, LlamaIndexLLM
    from .llm.huggingface import TransformersLLM
    from .robustrag.engine import RobustRAG
    from .robustrag.keyword_aggregation import CERTIFY_BATCH, KeywordAggregation
    from .types import MAX_PASSAGES

    return [
        ("ragdefense.types.MAX_PASSAGES", MAX_PASSAGES, "passages one defense call accepts"),
        (
            "RobustRAG(max_passage_chars=)",
            _default(RobustRAG, "max_passage_chars"),
            "characters of a passage put in a prompt (cut at a word)",
        ),
        ("RobustRAG(timeout=)", _default(RobustRAG, "timeout"), "seconds for one answer/certify"),
        (
            "KeywordAggregation(max_certify_calls=)",
            KeywordAggregation().max_certify_calls,
            "LLM calls one certification may make (refused above, before any call)",
        ),
        (
            "RobustRAG(max_new_tokens=)",
            _default(RobustRAG, "max_new_tokens"),
            "words an answer is cut to",
        ),
        ("ragdefense.llm.base.CHARS_PER_TOKEN", CHARS_PER_TOKEN, "characters per answer token"),
        ("certification batch", CERTIFY_BATCH, "certification prompts between progress reports"),
        (
            "LLM backend timeout=",
            _default(CallableLLM, "timeout"),
            "seconds for one batch of a backend (the tighter deadline wins)",
        ),
        *(
            (
                f"{cls.__name__}(max_concurrency=)",
                _default(cls, "max_concurrency"),
                "calls in flight (threads), hung calls included",
            )
            for cls in (CallableLLM, LangChainLLM, LlamaIndexLLM)
        ),
        (
            "TransformersLLM(batch_size=)",
            _default(TransformersLLM, "batch_size"),
            "prompts per forward pass of the packaged model (one at a time)",
        ),
    ]
