"""Per-call progress: whom a backend tells, as each LLM call of a batch completes, how many of
the batch's calls are done. The observer is scoped to the batch (a context variable set by the
caller around ``generate`` / ``agenerate``), so backends keep their signature and a backend that
reports nothing still works: its caller reports when the batch returns. Cancellation is scoped
the same way: local work an async caller runs in a worker thread (:func:`in_thread`) reads
:func:`cancelled` between steps."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

__all__ = [
    "Observer",
    "asked_for",
    "cancelled",
    "in_thread",
    "observer",
    "purpose",
    "quiet",
    "reporting",
    "stop_if_cancelled",
]

#: ``observer(done)``: calls of the current batch completed so far (answered, failed or late)
Observer = Callable[[int], None]

T = TypeVar("T")

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


#: set once the async caller of the batch being generated is cancelled (a client gone)
_CANCEL: ContextVar[threading.Event | None] = ContextVar("ragdefense_llm_cancel", default=None)


def cancelled() -> bool:
    """Whether the async caller of the work running in this worker thread has been cancelled
    (a client gone): local decoding stops at its next step; a thread cannot be stopped from
    outside."""
    event = _CANCEL.get()
    return event is not None and event.is_set()


def stop_if_cancelled() -> None:
    """Raise :class:`asyncio.CancelledError` where :func:`cancelled` (between two steps of
    local work whose result nobody awaits any more)."""
    if cancelled():
        raise asyncio.CancelledError("the caller was cancelled")


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` awaited from a worker thread whose :func:`cancelled` turns true once the
    awaiting task is cancelled."""
    event = threading.Event()
    token = _CANCEL.set(event)  # the worker runs in a copy of this context
    try:
        return await asyncio.to_thread(fn, *args)
    except asyncio.CancelledError:
        event.set()
        raise
    finally:
        _CANCEL.reset(token)
