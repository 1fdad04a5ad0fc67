"""One answer per prompt, within a deadline: :class:`Generation` (text, or why there is none)
and the two ways a backend runs one call per prompt: sync calls in daemon threads
(:func:`run_threads`), async calls as tasks (:func:`gather_within`). Both report each completed
call to the batch's observer (:mod:`.observe`)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import inspect
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .observe import observer, quiet

__all__ = [
    "CHARS_PER_TOKEN",
    "THREAD_NAME",
    "TIMED_OUT",
    "Generation",
    "as_generation",
    "gather_within",
    "model_slots",
    "run_threads",
    "timed_out",
]


@dataclass(frozen=True)
class Generation:
    """The model's answer to one prompt: ``text``, or ``error`` when the call failed."""

    text: str | None
    error: str | None = None

    def __post_init__(self) -> None:
        if self.text is None and self.error is None:  # no answer is a failed call, said so
            object.__setattr__(self, "error", NO_TEXT)

    @property
    def ok(self) -> bool:
        """Whether the call succeeded."""
        return self.error is None and self.text is not None

    @property
    def timed_out(self) -> bool:
        """Whether the call failed by running past the deadline."""
        return self.error is not None and self.error.startswith(TIMED_OUT)


TIMED_OUT = "timed out"
#: the error of a generation made without text or error (a backend's ``Generation(None)``)
NO_TEXT = "no text: the backend gave no answer"
#: the name of the worker threads that call sync backends (to tell them apart)
THREAD_NAME = "ragdefense-llm-call"


def timed_out(timeout: float) -> Generation:
    return Generation(None, f"{TIMED_OUT}: no answer within the batch's {timeout:g} s deadline")


def as_generation(value: Any, max_new_tokens: int | None = None) -> Generation:
    """A backend's raw answer as a :class:`Generation`: text (cut to ``max_new_tokens`` words,
    and to :data:`CHARS_PER_TOKEN` characters per token: an answer without spaces is cut too),
    or a failure for anything that is not text (``None``, numbers, dicts, bytes, exceptions)."""
    if isinstance(value, BaseException):
        kind = "raised TimeoutError" if isinstance(value, TimeoutError) else type(value).__name__
        return Generation(None, f"{kind}: {value}")
    if not isinstance(value, str):
        return Generation(None, f"the model returned {type(value).__name__}, expected str")
    if max_new_tokens is not None:
        words = value.split(" ")
        if len(words) > max_new_tokens:
            value = " ".join(words[:max_new_tokens])
        value = value[: max_new_tokens * CHARS_PER_TOKEN]
    return Generation(value)


#: the most characters one generated token stands for when answers are cut
CHARS_PER_TOKEN = 32


def run_threads(
    call: Callable[[str], Any],
    prompts: Sequence[str],
    workers: int,
    budget: float,
    max_new_tokens: int | None,
    slots: threading.Semaphore | None = None,
    cancel: threading.Event | None = None,
) -> list[Generation]:
    """``call`` on every prompt from ``workers`` daemon threads, all within ``budget`` seconds.

    Prompts not answered by then are timed out and no further call starts; a call already
    running cannot be interrupted, but it runs in a daemon thread and its answer is dropped, so
    neither the caller nor the interpreter's exit waits for it. ``slots`` bounds the calls in
    flight across batches: a call that hangs keeps its slot, so hung calls never pile up beyond
    it (later batches wait for a free slot within their own deadline, then time out). Once
    ``cancel`` is set (an async caller gone), no call starts and the batch returns at once.
    """
    stopped = cancel.is_set if cancel is not None else lambda: False
    if budget <= 0:  # nothing left of the deadline: start nothing
        return [timed_out(budget) for _ in prompts]
    slots = slots or threading.Semaphore(max(1, workers))
    end = time.monotonic() + budget
    caller = contextvars.copy_context()  # each call sees the caller's context (tracing, spans)
    caller.run(quiet)  # but not this batch's observer: it is told here, in the caller's thread
    results: list[Generation | None] = [None] * len(prompts)
    pending = list(range(len(prompts)))[::-1]
    lock = threading.Lock()
    finished = threading.Condition(lock)
    stop = False
    left = len(prompts)

    def work() -> None:
        nonlocal left
        while True:
            with lock:
                if stop or not pending or stopped():
                    return
            wait = None if end == float("inf") else max(0.0, end - time.monotonic())
            if not slots.acquire(timeout=wait):
                return  # every slot is held by a call still running: nothing more starts
            with lock:  # the deadline may have passed while the slot was taken
                if stop or not pending or time.monotonic() >= end or stopped():
                    slots.release()
                    return
                i = pending.pop()
            try:
                value: Any = caller.copy().run(call, prompts[i])
            except BaseException as exc:  # reported on this prompt (a CancelledError or an
                value = exc  # exit raised by the call too: the thread goes on counting)
            finally:
                slots.release()
            with lock:
                if not stop:
                    results[i] = as_generation(value, max_new_tokens)
                left -= 1
                finished.notify_all()

    observe, told = observer(), 0
    for _ in range(max(1, min(workers, len(prompts)))):
        threading.Thread(target=work, daemon=True, name=THREAD_NAME).start()
    try:
        while True:
            with lock:
                if left and time.monotonic() < end:  # a cancel is looked at 20 times a second
                    finished.wait(min(end - time.monotonic(), 3600.0 if cancel is None else 0.05))
                done = len(prompts) - left
                more = bool(left) and time.monotonic() < end and not stopped()
            if observe is not None and done > told:  # in the caller's thread, lock released
                told = done
                observe(told)
            if not more:
                break
    finally:
        with lock:
            stop = True
    with lock:
        return [r if r is not None else timed_out(budget) for r in results]


async def gather_within(
    call: Callable[[str], Awaitable[Any]],
    prompts: Sequence[str],
    workers: int,
    budget: float,
    max_new_tokens: int | None,
    slots: threading.Semaphore | None = None,
) -> list[Generation]:
    """``call`` on every prompt, ``workers`` at a time, within ``budget`` seconds; calls still
    running then are cancelled and reported as timed out. ``slots``: a calls-in-flight limit
    shared with other batches (other runs, other event loops, threads), held too."""
    if budget <= 0:  # nothing left of the deadline: start nothing
        return [timed_out(budget) for _ in prompts]
    sem = asyncio.Semaphore(max(1, workers))
    end = time.monotonic() + budget
    observe, told = observer(), 0
    failed: list[Exception] = []
    stopping = False  # the calls are being cancelled here (the deadline, or the caller's)

    async def one(p: str) -> Generation:
        nonlocal told
        generation = await answer(p)
        told += 1
        if observe is not None and not failed and not stopping and time.monotonic() <= end:
            try:
                observe(told)
            except Exception as exc:  # the caller's own error: raised once the batch is over
                failed.append(exc)
        return generation

    async def answer(p: str) -> Generation:
        async with sem, _held(slots, max(1, workers)):
            try:
                value = await call(p)
            except asyncio.CancelledError as exc:  # a cancellation of the call's own making is
                if stopping:  # its failure; one of ours stops it
                    raise
                return as_generation(exc)
            except Exception as exc:  # reported on this prompt
                return as_generation(exc)
            # a model that blocks the event loop cannot be cancelled in time: what it returns
            # after the deadline is late, and counted so
            return (
                timed_out(budget)
                if time.monotonic() > end
                else as_generation(value, max_new_tokens)
            )

    tasks = [asyncio.ensure_future(one(p)) for p in prompts]
    if not tasks:
        return []
    try:
        done, pending = await asyncio.wait(
            tasks, timeout=None if budget == float("inf") else budget
        )
    except BaseException:  # the caller gave up (a timeout, a client gone): no call runs on
        stopping = True
        await _cancelled(tasks)
        raise
    stopping = True
    await _cancelled(pending)
    if failed:
        raise failed[0]
    return [t.result() if t in done else timed_out(budget) for t in tasks]


async def _cancelled(tasks: Any) -> None:
    """``tasks`` cancelled, waited for :data:`_GRACE` seconds at most: a call that delays its
    cancellation (an SDK closing its connection) or ignores it is left behind, as a hung sync
    call is, never waited out past the deadline."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=_GRACE)


#: seconds a cancelled call may take to stop before its batch returns without it
_GRACE = 0.1


@contextlib.asynccontextmanager
async def _held(slots: threading.Semaphore | None, window: int = 1) -> AsyncIterator[None]:
    """One of ``slots`` held, waited for without blocking the event loop, in arrival order
    among the async calls waiting for it. Waiters poll (a thread blocked on it could not be
    cancelled with its task, and would keep the slot it took); a waiter takes a free slot only
    while fewer waiters ahead of it still poll than slots are free, so a newcomer polling sooner
    never overtakes a long wait. A waiter that stopped polling for :data:`_STALE` seconds (its
    event loop busy, or abandoned without cancelling it) is passed over, keeping its place:
    no slot is ever set aside for it. The first ``window`` in line poll often, the rest less."""
    if slots is None:
        yield
        return
    me = _Waiter()
    with _LINES_LOCK:
        line = _LINES.setdefault(slots, collections.deque())
        line.append(me)
    pause = 0.001
    try:
        while True:
            with _LINES_LOCK:
                now = me.seen = time.monotonic()
                if me not in line:  # left out after a long stall: in line again, at its end
                    line.append(me)
                waiting = [w for w in line if w is me or now - w.seen <= _STALE]
                ahead = waiting.index(me)
                free = getattr(slots, "_value", window)  # CPython's count of free slots
                if ahead < free and slots.acquire(blocking=False):
                    line.remove(me)
                    break
                for gone in [w for w in line if now - w.seen > _GONE]:
                    line.remove(gone)  # abandoned: never polls again
                soon = ahead < window
            await asyncio.sleep(pause if soon else 0.02)
            pause = min(2 * pause, 0.005) if soon else 0.001
    except BaseException:  # cancelled (its deadline): out of the line
        with _LINES_LOCK:
            if me in line:
                line.remove(me)
        raise
    try:
        yield
    finally:
        slots.release()


class _Waiter:
    """An async call in line for a slot (compared by identity), and when it last polled."""

    def __init__(self) -> None:
        self.seen = time.monotonic()


#: seconds without a poll after which a waiter is passed over (it polls every 0.02 s at most)
_STALE = 0.25
#: seconds without a poll after which a waiter is taken out of the line
_GONE = 60.0

#: per calls-in-flight limit, the async calls waiting for it, in arrival order
_LINES: weakref.WeakKeyDictionary[threading.Semaphore, collections.deque[_Waiter]] = (
    weakref.WeakKeyDictionary()
)
_LINES_LOCK = threading.Lock()


#: the calls-in-flight limits of the models backends call, by the model's id and the limit's
#: size: backends made anew over one model (an engine, a chain's run, a synthesizer per
#: request) share its limit, so calls hung past their deadline never pile up past it; an entry
#: goes with its model
_MODEL_SLOTS: dict[tuple[int, ...], threading.Semaphore] = {}
_MODEL_SLOTS_LOCK = threading.Lock()


def model_slots(model: Any, size: int) -> threading.Semaphore:
    """The limit of ``size`` calls in flight that every backend calling ``model`` shares (a
    bound method: its object's, per method, though each access makes a new one; a model that
    cannot be weakly referenced: a limit of its own for each caller)."""
    owner = getattr(model, "__self__", None) if inspect.ismethod(model) else None
    key = (id(model), size) if owner is None else (id(owner), id(model.__func__), size)
    with _MODEL_SLOTS_LOCK:
        slots = _MODEL_SLOTS.get(key)
        if slots is None:
            slots = threading.Semaphore(size)
            try:
                weakref.finalize(model if owner is None else owner, _MODEL_SLOTS.pop, key, None)
            except TypeError:
                return slots
            _MODEL_SLOTS[key] = slots
    return slots
