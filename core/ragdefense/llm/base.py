"""The LLM interface (:class:`LLM`, :class:`Generation`) and the backends that wrap a framework's
model or a function: :class:`LangChainLLM`, :class:`LlamaIndexLLM`, :class:`CallableLLM`.

Every backend honours the same contract: one :class:`Generation` per prompt, in order; a failed,
timed-out or non-text answer is a failed generation (``error`` set), never an exception for the
batch; ``timeout`` is a deadline for the whole batch (prompts still unanswered then are reported
as timed out, and no new call is started); answers are cut to ``max_new_tokens`` words where the
backend cannot bound its own length.
"""

from __future__ import annotations

import asyncio
import inspect
import operator
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from .calls import CHARS_PER_TOKEN as CHARS_PER_TOKEN
from .calls import THREAD_NAME as THREAD_NAME
from .calls import TIMED_OUT as TIMED_OUT
from .calls import Generation, gather_within, model_slots, run_threads
from .calls import as_generation as as_generation
from .calls import timed_out as timed_out
from .observe import in_thread, purpose

__all__ = [
    "DEFAULT_TIMEOUT",
    "LLM",
    "CallableLLM",
    "ConcurrentLLM",
    "Generation",
    "LangChainLLM",
    "LlamaIndexLLM",
    "first_line_of",
]

#: seconds a batch may take when neither the call nor the backend says otherwise
DEFAULT_TIMEOUT = 120.0
#: LangGraph's tag for a model run its message stream leaves out (``TAG_NOSTREAM``)
NO_STREAM = "nostream"


class LLM(ABC):
    """A text generator for batches of prompts (user messages; chat formatting is the backend's).

    ``timeout`` on a call is the deadline of that batch in seconds; the backend's own ``timeout``
    (default :data:`DEFAULT_TIMEOUT`) applies too, the tighter one winning.
    """

    #: whether :meth:`next_token_probs` is available
    supports_token_probs = False
    timeout: float | None = DEFAULT_TIMEOUT

    @abstractmethod
    def generate(
        self, prompts: Sequence[str], max_new_tokens: int = 20, timeout: float | None = None
    ) -> list[Generation]:
        """Generate one answer per prompt; failures are reported per prompt (a model that
        cannot load at all raises: no prompt could be answered)."""

    async def agenerate(
        self, prompts: Sequence[str], max_new_tokens: int = 20, timeout: float | None = None
    ) -> list[Generation]:
        """Async :meth:`generate`; defaults to running it in a worker thread (which
        :func:`~ragdefense.llm.observe.cancelled` tells when the awaiting task is cancelled)."""
        return await in_thread(self.generate, prompts, max_new_tokens, timeout)

    def _deadline(self, timeout: float | None, prompts: Any = ()) -> float:
        """The batch's time budget in seconds: the tighter of the call's and the backend's
        (``prompts`` checked on the way: one string would be answered character by character;
        a NaN deadline would time every call out)."""
        if isinstance(prompts, (str, bytes)):
            raise TypeError("prompts: give a list of prompts, not one string")
        limits = [float(t) for t in (timeout, self.timeout) if t is not None]
        if any(t != t for t in limits):
            raise ValueError("timeout must be a number of seconds or None, not NaN")
        return max(0.0, min(limits)) if limits else float("inf")

    def next_token_probs(self, prompts: Sequence[str]) -> Any:
        """Next-token probability distributions, one row per prompt: a float array of shape
        (len(prompts), vocabulary size). Only backends with ``supports_token_probs``."""
        raise NotImplementedError(
            f"{type(self).__name__} does not expose next-token probabilities: use "
            "aggregation='keyword' (text only), or a transformers model (TransformersLLM)"
        )


def positive(name: str, value: Any) -> int:
    """``value`` checked as a count of at least 1 (a NumPy int taken; a bool or a float
    refused)."""
    try:
        count = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        count = None
    if count is None:
        raise TypeError(f"{name} must be an int >= 1, got {value!r}")
    if count < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return count


def first_line_of(text: str) -> str:
    """The first non-empty line of ``text``, stripped."""
    text = text.strip()
    return text.split("\n", 1)[0].strip() if text else text


class ConcurrentLLM(LLM):
    """A backend that answers one prompt per call, ``max_concurrency`` calls at a time, within
    the batch's deadline. Subclasses implement :meth:`call` (and :meth:`acall` when the model
    has a native async path; by default async runs the sync calls in worker threads)."""

    #: calls in flight at once (a class default, for subclasses that skip ``__init__``)
    max_concurrency: int = 1
    #: the attribute holding the model this backend calls: its limit is the model's, shared by
    #: every backend over it (``None``: this backend's own)
    _wraps: str | None = None

    def __init__(self, max_concurrency: int, timeout: float | None) -> None:
        self.max_concurrency = positive("max_concurrency", max_concurrency)
        self.timeout = timeout

    @property
    def _slots(self) -> threading.Semaphore:
        """Calls in flight across this backend's batches (``max_concurrency``), and every other
        backend's over its model with that limit (one made per request too): a
        hung call keeps its slot, so hung calls never pile up threads; once every slot is held
        by a call that never returns, later batches wait out their deadline and time out.
        Found on first use (subclasses need not call ``__init__``) and not pickled (a copy's
        is its model's)."""
        slots: threading.Semaphore | None = self.__dict__.get("_slots_made")
        if slots is None:  # setdefault: two first callers at once share one
            size, model = max(1, self.max_concurrency), getattr(self, self._wraps or "", None)
            made = threading.Semaphore(size) if model is None else model_slots(model, size)
            slots = self.__dict__.setdefault("_slots_made", made)
        return slots

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_slots_made", None)
        return state

    async def _in_threads(
        self, prompts: Sequence[str], max_new_tokens: int, timeout: float | None
    ) -> list[Generation]:
        """The sync calls of :meth:`generate` awaited from a worker thread; cancelling the
        await starts no further call (a client gone does not leave the batch running)."""
        if type(self).generate is not ConcurrentLLM.generate:  # a subclass's own batching
            return await LLM.agenerate(self, prompts, max_new_tokens, timeout)
        cancel, budget = threading.Event(), self._deadline(timeout, prompts)
        try:
            return await asyncio.to_thread(
                run_threads,
                self.call,
                prompts,
                self.max_concurrency,
                budget,
                max_new_tokens,
                self._slots,
                cancel,
            )
        except asyncio.CancelledError:
            cancel.set()
            raise

    @abstractmethod
    def call(self, prompt: str) -> Any:
        """The model's raw answer to one prompt (text, or anything else: a failed call)."""

    async def acall(self, prompt: str) -> Any:
        """Async :meth:`call`."""
        raise NotImplementedError

    def generate(
        self, prompts: Sequence[str], max_new_tokens: int = 20, timeout: float | None = None
    ) -> list[Generation]:
        budget = self._deadline(timeout, prompts)
        return run_threads(
            self.call, prompts, self.max_concurrency, budget, max_new_tokens, self._slots
        )

    async def agenerate(
        self, prompts: Sequence[str], max_new_tokens: int = 20, timeout: float | None = None
    ) -> list[Generation]:
        if type(self).acall is ConcurrentLLM.acall:  # no native async path
            return await self._in_threads(prompts, max_new_tokens, timeout)
        budget = self._deadline(timeout, prompts)
        return await gather_within(
            self.acall, prompts, self.max_concurrency, budget, max_new_tokens, self._slots
        )


class CallableLLM(ConcurrentLLM):
    """A plain function ``prompt -> answer``, called from ``max_concurrency`` threads, or an
    ``async def`` function, awaited (in its own event loop from the sync API).

    From the sync API each call of an ``async def`` function runs in an event loop of its own,
    so that calls run in parallel and nothing outlives them: a client bound to the loop it first
    ran in (an HTTP connection pool) must be made inside the function, or use the async API
    (``RobustRAG.aanswer``), where every call is awaited in the caller's loop.

    Args:
        fn: The function; an answer that is not a ``str`` is a failed call.
        max_concurrency: Calls in flight at once (with every other backend calling the same
            model with the same limit: made per request, they share it).
        timeout: Default deadline of a batch in seconds (``None``: none).
    """

    _wraps = "fn"

    def __init__(
        self,
        fn: Callable[[str], str],
        max_concurrency: int = 4,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(max_concurrency, timeout)
        self.fn = fn
        # an async def function, or an object whose __call__ is one
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            type(fn).__call__ if not inspect.isfunction(fn) else None
        )

    def call(self, prompt: str) -> Any:
        value = self.fn(prompt)
        return asyncio.run(value) if inspect.iscoroutine(value) else value

    async def agenerate(
        self, prompts: Sequence[str], max_new_tokens: int = 20, timeout: float | None = None
    ) -> list[Generation]:
        if not self.is_async:
            return await self._in_threads(prompts, max_new_tokens, timeout)
        budget = self._deadline(timeout, prompts)
        return await gather_within(
            self._awaited, prompts, self.max_concurrency, budget, max_new_tokens, self._slots
        )

    async def _awaited(self, prompt: str) -> Any:
        return await self.fn(prompt)  # type: ignore[misc]


def _message_text(result: Any) -> Any:
    """The text of a LangChain result: a message's content (blocks joined), or the value."""
    content = getattr(result, "content", result)
    if isinstance(content, list):  # content blocks
        content = "".join(b if isinstance(b, str) else str(b.get("text", "")) for b in content)
    return content


class LangChainLLM(ConcurrentLLM):
    """A LangChain chat model or LLM (any ``Runnable`` taking a string), called concurrently.

    Args:
        model: The runnable.
        max_concurrency: Calls in flight at once (with every other backend calling the same
            model with the same limit: made per request, they share it).
        timeout: Default deadline of a batch in seconds (``None``: none).
        config: A ``RunnableConfig`` passed on each call (e.g. the calling chain's callbacks).
        slots: The calls-in-flight limit to share (``threading.Semaphore``), where backends
            made per run (each with its run's ``config``) must hold ``max_concurrency`` together.
    """

    _wraps = "model"

    def __init__(
        self,
        model: Any,
        max_concurrency: int = 8,
        timeout: float | None = DEFAULT_TIMEOUT,
        config: dict[str, Any] | None = None,
        slots: threading.Semaphore | None = None,
    ) -> None:
        super().__init__(max_concurrency, timeout)
        self.model = model
        self.config = dict(config or {})
        if slots is not None:  # an asyncio one would fail in the worker thread, unreported
            if not isinstance(slots, threading.Semaphore):
                raise TypeError(f"slots must be a threading.Semaphore, got {slots!r}")
            self.__dict__["_slots_made"] = slots

    def call(self, prompt: str) -> Any:
        return _message_text(self.model.invoke(prompt, config=self._labelled()))

    async def acall(self, prompt: str) -> Any:
        return _message_text(await self.model.ainvoke(prompt, config=self._labelled()))

    def _labelled(self) -> dict[str, Any]:
        """The config, its run tagged ``ragdefense:<purpose>`` where the batch says what its
        calls are for (RobustRAG's ``isolated`` answers, one passage each, stream like any
        model run: a streaming UI filters them out by tag). Every run but the final answer's
        is also tagged ``nostream``, which LangGraph's ``stream_mode="messages"`` (what chat
        UIs show) leaves out: a planted passage's isolated answer never reaches the user."""
        what = purpose()
        if what is None:
            return self.config
        hidden = [] if what == "aggregate" else [NO_STREAM, "langsmith:nostream"]  # older
        tags = [*(self.config.get("tags") or []), f"ragdefense:{what}", *hidden]
        return {**self.config, "tags": tags}

    async def agenerate(
        self, prompts: Sequence[str], max_new_tokens: int = 20, timeout: float | None = None
    ) -> list[Generation]:
        # a model without an async path of its own answers ``ainvoke`` in the event loop's
        # shared thread pool, where a hung call outlives its cancelled task and holds a thread
        # other requests need: its sync calls run in this backend's own threads instead
        if not _native_async(self.model):
            return await self._in_threads(prompts, max_new_tokens, timeout)
        return await super().agenerate(prompts, max_new_tokens, timeout)


def _native_async(model: Any) -> bool:
    """Whether a LangChain runnable awaits its own async code (a chat model's ``_agenerate``,
    an ``async def`` lambda), not its sync code in a thread pool; a wrapper (``bind``,
    ``with_retry``, ``with_fallbacks``, a configurable model, ``prompt | model``) only where
    every runnable it may call does."""
    try:
        from langchain_core.language_models import LLM, BaseChatModel, BaseLLM, SimpleChatModel
        from langchain_core.runnables import (
            Runnable,
            RunnableLambda,
            RunnableSequence,
            RunnableWithFallbacks,
        )
        from langchain_core.runnables.base import RunnableBindingBase
        from langchain_core.runnables.configurable import DynamicRunnable
    except ImportError:  # pragma: no cover - a LangChain model implies langchain-core
        return True
    if isinstance(model, RunnableBindingBase):  # bind, with_config, with_retry
        return _native_async(model.bound)
    if isinstance(model, RunnableWithFallbacks):
        return all(_native_async(r) for r in (model.runnable, *model.fallbacks))
    if isinstance(model, RunnableSequence):
        return all(_native_async(step) for step in model.steps)
    if isinstance(model, DynamicRunnable):  # its alternatives are chosen per call: the default
        return _native_async(model.default)
    if isinstance(model, RunnableLambda):
        return hasattr(model, "afunc")
    if isinstance(model, (BaseChatModel, BaseLLM)):  # these bases run the sync code in a pool
        kind: Any = type(model)
        if isinstance(model, LLM) and kind._acall is not LLM._acall:
            return True  # a custom LLM's own async call
        return kind._agenerate not in (
            BaseChatModel._agenerate,
            SimpleChatModel._agenerate,
            BaseLLM._agenerate,
            LLM._agenerate,
        )
    return type(model).ainvoke is not Runnable.ainvoke


class LlamaIndexLLM(ConcurrentLLM):
    """A LlamaIndex LLM, called concurrently as LlamaIndex's synthesizers call it
    (``predict`` / ``apredict``: its ``system_prompt``, ``query_wrapper_prompt`` and chat
    messages applied; ``complete`` / ``acomplete`` for an LLM without them).

    Args:
        llm: The LlamaIndex LLM.
        max_concurrency: Calls in flight at once (with every other backend calling the same
            model with the same limit: made per request, they share it).
        timeout: Default deadline of a batch in seconds (``None``: none).
    """

    _wraps = "llm"

    def __init__(
        self, llm: Any, max_concurrency: int = 8, timeout: float | None = DEFAULT_TIMEOUT
    ) -> None:
        super().__init__(max_concurrency, timeout)
        self.llm = llm

    def call(self, prompt: str) -> Any:
        if hasattr(self.llm, "predict"):
            return self.llm.predict(_whole_prompt(), text=prompt)
        return self.llm.complete(prompt).text

    async def acall(self, prompt: str) -> Any:
        if hasattr(self.llm, "apredict"):
            return await self.llm.apredict(_whole_prompt(), text=prompt)
        return (await self.llm.acomplete(prompt)).text

    async def agenerate(
        self, prompts: Sequence[str], max_new_tokens: int = 20, timeout: float | None = None
    ) -> list[Generation]:
        # LlamaIndex's CustomLLM (the base of most local models) answers ``acomplete`` by
        # calling ``complete`` on the event loop, one call at a time: worker threads instead
        if getattr(type(self.llm).acomplete, "__qualname__", "") == "CustomLLM.acomplete":
            return await self._in_threads(prompts, max_new_tokens, timeout)
        return await super().agenerate(prompts, max_new_tokens, timeout)


def _whole_prompt() -> Any:
    """A LlamaIndex template that is the whole prompt (RobustRAG writes its own)."""
    from llama_index.core.prompts import PromptTemplate

    return PromptTemplate("{text}")
