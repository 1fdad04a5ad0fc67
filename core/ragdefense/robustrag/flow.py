"""One flow for the sync and the async API: an answer (or a certificate) is a generator that
yields batches of prompts and receives their generations; :func:`drive` runs it with a sync LLM
call, :func:`adrive` with an async one. Each algorithm is written once. :class:`Runtime` is what
an aggregation uses of the engine that runs it, handed to it per call."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from ..llm.base import TIMED_OUT, Generation
from ..llm.observe import asked_for, in_thread, reporting
from ..types import Passage

__all__ = [
    "Flow",
    "Progress",
    "Prompts",
    "Runtime",
    "adrive",
    "drive",
    "failures_note",
    "local",
    "reported",
]

T = TypeVar("T")

#: yields prompt batches, is sent their generations (same order), returns its result
Flow = Generator[list[str], list[Generation], T]
#: ``progress(done, total)``: LLM calls answered so far out of those planned
Progress = Callable[[int, int], None]


def local(value: T) -> Flow[T]:
    """A flow that asks the LLM nothing."""
    yield from ()
    return value


class Prompts(list[str]):
    """A prompt batch saying what its calls are for (``purpose``: ``"isolated"`` answers from
    one passage each, the ``"aggregate"`` answer, ``"certify"`` calls), which a backend may
    label its calls with (:func:`ragdefense.llm.observe.purpose`)."""

    def __init__(self, prompts: Sequence[str], purpose: str | None = None) -> None:
        super().__init__(prompts)
        self.purpose = purpose


class _Batch(Prompts):
    """A prompt batch whose calls are reported one by one to ``on_done(done)`` as the backend
    completes them (:mod:`ragdefense.llm.observe`)."""

    def __init__(self, prompts: Sequence[str], on_done: Callable[[int], None]) -> None:
        super().__init__(prompts, getattr(prompts, "purpose", None))
        self.on_done = on_done


def reported(flow: Flow[T], progress: Progress, total: int) -> Flow[T]:
    """``flow`` with each LLM call reported as ``progress(done, total)`` when it completes,
    counted across its batches; ``progress(total, total)`` at its end if the backend did not
    report every call."""
    done = last = 0

    def teller(size: int) -> Callable[[int], None]:
        def tell(n: int) -> None:  # n of this batch's ``size`` calls are done
            nonlocal last
            if done + min(n, size) > last:
                last = done + min(n, size)
                progress(last, total)

        return tell

    try:
        prompts = next(flow)
        while True:
            generations = yield _Batch(prompts, teller(len(prompts)))
            done += len(prompts)
            prompts = flow.send(generations)
    except StopIteration as stop:
        if last != total:
            progress(total, total)
        result: T = stop.value
        return result


def drive(flow: Flow[T], generate: Callable[[list[str]], Sequence[Generation]]) -> T:
    """Run ``flow`` to its end, answering each prompt batch with ``generate``."""
    try:
        prompts = next(flow)
        while True:
            with reporting(getattr(prompts, "on_done", None)), _for(prompts):
                generations = _one_each(prompts, generate(list(prompts)))  # a plain list
            prompts = flow.send(generations)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def adrive(
    flow: Flow[T], agenerate: Callable[[list[str]], Awaitable[Sequence[Generation]]]
) -> T:
    """:func:`drive` with an async ``agenerate``. The flow's own work between two batches
    (keyword extraction and loading spaCy, certification) runs in a worker thread: on the
    event loop it would stall every other request meanwhile."""
    done, got = await in_thread(_step, flow, None)
    while not done:
        prompts = got
        with reporting(getattr(prompts, "on_done", None)), _for(prompts):
            generations = _one_each(prompts, await agenerate(list(prompts)))
        done, got = await in_thread(_step, flow, generations)
    result: T = got
    return result


def _one_each(prompts: Sequence[str], generations: Sequence[Generation]) -> list[Generation]:
    """The backend's answers, one per prompt, or an error naming the count (a custom backend
    returning fewer failed in ``zip``, deep in an aggregation)."""
    out = list(generations)
    if len(out) != len(prompts):
        raise ValueError(
            f"the LLM backend returned {len(out)} generations for {len(prompts)} prompts: its "
            "generate() must return one Generation per prompt, in order"
        )
    return out


def _step(flow: Flow[Any], sent: list[Generation] | None) -> tuple[bool, Any]:
    """The flow's next batch (``sent`` None: its first), or ``(True, result)`` at its end: a
    ``StopIteration`` cannot cross a thread's future."""
    try:
        return False, (next(flow) if sent is None else flow.send(sent))
    except StopIteration as stop:
        return True, stop.value


def _for(prompts: Sequence[str]) -> AbstractContextManager[None]:
    return asked_for(getattr(prompts, "purpose", None))


def failures_note(responses: Sequence[object]) -> str:
    """`` (n LLM call(s) failed, m of them timed out, ...)`` when some isolated calls failed,
    else ``""``."""
    errors = [e for r in responses if (e := getattr(r, "error", None)) is not None]
    if not errors:
        return ""
    late = sum(e.startswith(TIMED_OUT) for e in errors)
    timed = f", {late} of them timed out" if late else ""
    return f" ({len(errors)} LLM call(s) failed{timed}, counted as abstentions)"


@dataclass(frozen=True)
class Runtime:
    """What an aggregation uses of the :class:`~ragdefense.robustrag.RobustRAG` running it:
    made by the engine for each call and handed to the aggregation, which keeps no engine.

    Attributes:
        load_llm, load_nlp: The LLM backend and the spaCy pipeline (each loaded on first use).
        isolated_prompt: The template of an isolated answer (``{context}``, ``{query}``).
        context: A passage's text as a prompt holds it (cut to the engine's budget).
        max_new_tokens: Answer length cap.
        timeout: The deadline of one call, in seconds (``None``: none).
    """

    load_llm: Callable[[], Any]
    load_nlp: Callable[[], Any]
    isolated_prompt: str
    context: Callable[[Passage], str]
    max_new_tokens: int
    timeout: float | None

    @property
    def llm(self) -> Any:
        """The LLM backend."""
        return self.load_llm()

    @property
    def nlp(self) -> Any:
        """The spaCy pipeline."""
        return self.load_nlp()

    def isolated_prompts(self, query: str, passages: Sequence[Passage]) -> list[str]:
        """One prompt per passage, the passage alone as its context."""
        return [self.isolated_prompt.format(context=self.context(p), query=query) for p in passages]
