"""The LLM interface (:class:`LLM`, :class:`Generation`) and the backends that wrap a framework's
model or a function: :class:`LangChainLLM`, :class:`LlamaIndexLLM`, :class:`CallableLLM`."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

__all__ = ["LLM", "CallableLLM", "Generation", "LangChainLLM", "LlamaIndexLLM", "first_line_of"]


@dataclass(frozen=True)
class Generation:
    """The model's answer to one prompt: ``text``, or ``error`` when the call failed."""

    text: str | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the call succeeded."""
        return self.error is None and self.text is not None


class LLM(ABC):
    """A text generator for batches of prompts (user messages; chat formatting is the backend's)."""

    #: whether :meth:`next_token_probs` is available
    supports_token_probs = False

    @abstractmethod
    def generate(self, prompts: Sequence[str], max_new_tokens: int = 20) -> list[Generation]:
        """Generate one answer per prompt; failures are reported per prompt."""

    async def agenerate(self, prompts: Sequence[str], max_new_tokens: int = 20) -> list[Generation]:
        """Async :meth:`generate`; defaults to running it in a worker thread."""
        return await asyncio.to_thread(self.generate, prompts, max_new_tokens)

    def next_token_probs(self, prompts: Sequence[str]) -> Any:
        """Next-token probability distributions, one row per prompt: a float array of shape
        (len(prompts), vocabulary size). Only backends with ``supports_token_probs``."""
        raise NotImplementedError(
            f"{type(self).__name__} does not expose next-token probabilities: use "
            "aggregation='keyword' (text only), or a transformers model (TransformersLLM)"
        )


def first_line_of(text: str) -> str:
    text = text.strip()
    return text.split("\n", 1)[0].strip() if text else text


class CallableLLM(LLM):
    """A plain function ``prompt -> answer``; ``timeout`` (s) turns slow calls into failures."""

    def __init__(
        self, fn: Callable[[str], str], max_concurrency: int = 4, timeout: float | None = None
    ) -> None:
        self.fn = fn
        self.max_concurrency = max_concurrency
        self.timeout = timeout

    def generate(self, prompts: Sequence[str], max_new_tokens: int = 20) -> list[Generation]:
        return _threaded(self.fn, prompts, self.max_concurrency, self.timeout)


def _threaded(
    fn: Callable[[str], Any], prompts: Sequence[str], workers: int, timeout: float | None
) -> list[Generation]:
    out: list[Generation] = []
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        futures = [pool.submit(fn, p) for p in prompts]
        for f in futures:
            try:
                out.append(Generation(str(f.result(timeout=timeout))))
            except FutureTimeout:
                out.append(Generation(None, f"timed out after {timeout} s"))
            except Exception as exc:
                out.append(Generation(None, f"{type(exc).__name__}: {exc}"))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return out


class LangChainLLM(LLM):
    """A LangChain chat model or LLM (any ``Runnable`` taking a string)."""

    def __init__(
        self,
        model: Any,
        max_concurrency: int = 8,
        timeout: float | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.config = dict(config or {})  # e.g. callbacks of the calling chain

    def _config(self) -> dict[str, Any]:
        return {**self.config, "max_concurrency": self.max_concurrency}

    @staticmethod
    def _text(result: Any) -> Generation:
        if isinstance(result, Exception):
            return Generation(None, f"{type(result).__name__}: {result}")
        content = getattr(result, "content", result)
        if isinstance(content, list):  # content blocks
            content = "".join(b if isinstance(b, str) else str(b.get("text", "")) for b in content)
        return Generation(str(content))

    def generate(self, prompts: Sequence[str], max_new_tokens: int = 20) -> list[Generation]:
        results = self.model.batch(list(prompts), config=self._config(), return_exceptions=True)
        return [self._text(r) for r in results]

    async def agenerate(self, prompts: Sequence[str], max_new_tokens: int = 20) -> list[Generation]:
        results = await self.model.abatch(
            list(prompts), config=self._config(), return_exceptions=True
        )
        return [self._text(r) for r in results]


class LlamaIndexLLM(LLM):
    """A LlamaIndex LLM (``complete`` / ``acomplete``), called concurrently."""

    def __init__(self, llm: Any, max_concurrency: int = 8, timeout: float | None = None) -> None:
        self.llm = llm
        self.max_concurrency = max_concurrency
        self.timeout = timeout

    def generate(self, prompts: Sequence[str], max_new_tokens: int = 20) -> list[Generation]:
        return _threaded(
            lambda p: self.llm.complete(p).text, prompts, self.max_concurrency, self.timeout
        )

    async def agenerate(self, prompts: Sequence[str], max_new_tokens: int = 20) -> list[Generation]:
        sem = asyncio.Semaphore(self.max_concurrency)

        async def one(p: str) -> Generation:
            async with sem:
                try:
                    r = await asyncio.wait_for(self.llm.acomplete(p), self.timeout)
                    return Generation(str(r.text))
                except asyncio.TimeoutError:
                    return Generation(None, f"timed out after {self.timeout} s")
                except Exception as exc:
                    return Generation(None, f"{type(exc).__name__}: {exc}")

        return list(await asyncio.gather(*(one(p) for p in prompts)))
