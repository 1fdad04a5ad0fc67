"""One flow for the sync and the async API: an answer (or a certificate) is a generator that
yields batches of prompts and receives their generations; :func:`drive` runs it with a sync LLM
call, :func:`adrive` with an async one. Each algorithm is written once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import TypeVar

from ..llm.base import TIMED_OUT, Generation

__all__ = ["Flow", "Progress", "adrive", "drive", "failures_note", "local"]

T = TypeVar("T")

#: yields prompt batches, is sent their generations (same order), returns its result
Flow = Generator[list[str], list[Generation], T]
#: ``progress(done, total)``: LLM calls answered so far out of those planned
Progress = Callable[[int, int], None]


def local(value: T) -> Flow[T]:
    """A flow that asks the LLM nothing."""
    yield from ()
    return value


def drive(flow: Flow[T], generate: Callable[[list[str]], Sequence[Generation]]) -> T:
    """Run ``flow`` to its end, answering each prompt batch with ``generate``."""
    try:
        prompts = next(flow)
        while True:
            prompts = flow.send(list(generate(prompts)))
    except StopIteration as stop:
        result: T = stop.value
        return result


async def adrive(
    flow: Flow[T], agenerate: Callable[[list[str]], Awaitable[Sequence[Generation]]]
) -> T:
    """:func:`drive` with an async ``agenerate``."""
    try:
        prompts = next(flow)
        while True:
            prompts = flow.send(list(await agenerate(prompts)))
    except StopIteration as stop:
        result: T = stop.value
        return result


def failures_note(responses: Sequence[object]) -> str:
    """`` (n LLM call(s) failed, m of them timed out, ...)`` when some isolated calls failed,
    else ``""``."""
    errors = [e for r in responses if (e := getattr(r, "error", None)) is not None]
    if not errors:
        return ""
    late = sum(e.startswith(TIMED_OUT) for e in errors)
    timed = f", {late} of them timed out" if late else ""
    return f" ({len(errors)} LLM call(s) failed{timed}, counted as abstentions)"
