"""Per-call progress: whom a backend tells, as each LLM call of a batch completes, how many of
the batch's calls are done. The observer is scoped to the batch (a context variable set by the
caller around ``generate`` / ``agenerate``), so backends keep their signature and a backend that
reports nothing still works: its caller reports when the batch returns."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["Observer", "asked_for", "observer", "purpose", "quiet", "reporting"]

#: ``observer(done)``: calls of the current batch completed so far (answered, failed or late)
Observer = Callable[[int], None]

_CURRENT: ContextVar[Observer | None] = ContextVar("ragdefense_llm_observer", default=None)


def observer() -> Observer | None:
    """The observer of the batch being generated (``None``: nobody asked)."""
    return _CURRENT.get()


@contextmanager
def _within(var: ContextVar[Any], value: Any) -> Iterator[None]:
    """``var`` set to ``value`` within the block, and back after it."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def reporting(on_done: Observer | None) -> AbstractContextManager[None]:
    """Within the block, backends report completed calls to ``on_done``."""
    return _within(_CURRENT, on_done)


#: what the current batch's calls are for (RobustRAG: ``"isolated"``, ``"aggregate"``,
#: ``"certify"``), for a backend that labels its calls (LangChain's run tags)
_PURPOSE: ContextVar[str | None] = ContextVar("ragdefense_llm_purpose", default=None)


def purpose() -> str | None:
    """What the calls of the batch being generated are for (``None``: not said)."""
    return _PURPOSE.get()


def asked_for(name: str | None) -> AbstractContextManager[None]:
    """Within the block, the calls are for ``name`` (:func:`purpose`)."""
    return _within(_PURPOSE, name)


def quiet() -> None:
    """No observer from here on in the current context (a copy handed to worker threads: the
    batch's observer is told by the thread that started the batch)."""
    _CURRENT.set(None)
