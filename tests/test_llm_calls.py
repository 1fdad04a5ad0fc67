"""The LLM call layer under failure: answers without text, deadlines reached while a slot is
taken, calls that do not stop when cancelled, callers that go away. Found by an independent
review of ``ragdefense.llm``; each test failed before its fix. Fake backends only."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from ragdefense.llm import LLM, CallableLLM, Generation
from ragdefense.llm import calls as calls_module
from ragdefense.llm.base import ConcurrentLLM
from ragdefense.llm.calls import NO_TEXT, gather_within, run_threads
from ragdefense.llm.observe import cancelled
from ragdefense.robustrag import RobustRAG

from .conftest import cancel_once_started

PASSAGES = [f"passage {i}" for i in range(7)]


class _Fixed(LLM):
    """Answers prompt ``i`` with ``out(i)``."""

    def __init__(self, out: Any) -> None:
        self.out = out

    def generate(self, prompts: Any, max_new_tokens: int = 20, timeout: Any = None) -> Any:
        return [self.out(i) for i in range(len(prompts))]


def test_a_generation_without_text_is_a_failed_call_never_certified() -> None:
    """A backend's ``Generation(None)`` read as failed (``ok`` false) but carried no error, so
    RobustRAG counted it as an abstention and certified the answer of the passages left."""
    assert Generation(None).error == NO_TEXT and not Generation(None).ok
    assert Generation(None, "HTTP 500").error == "HTTP 500" and Generation("A").error is None
    rag = RobustRAG(_Fixed(lambda i: Generation("A") if i < 4 else Generation(None)), "majority")
    result = rag.answer("Which?", PASSAGES, choices=["A", "B"], certify=1)
    assert result.certificate is not None and not result.certificate.certified
    assert "3 of 7 isolated LLM call(s) failed" in result.certificate.reason


def test_a_backend_answering_too_few_prompts_is_named() -> None:
    """One generation too few failed in ``zip()``, deep in an aggregation."""
    short = _Fixed(lambda i: Generation("A"))
    short.generate = lambda prompts, *a, **k: [Generation("A")]  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="returned 1 generations for 7 prompts"):
        RobustRAG(short, "majority").answer("Which?", PASSAGES, choices=["A", "B"])


def test_no_sync_call_starts_once_the_deadline_passed_while_a_slot_was_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker that got its slot after the deadline, before the caller had said stop, still
    started a call (paid for, its answer dropped). A clock that stands still but where the
    slot is taken makes that moment certain."""
    now = [1000.0]
    monkeypatch.setattr(calls_module.time, "monotonic", lambda: now[0])

    class Late(threading.Semaphore):
        def acquire(self, blocking: bool = True, timeout: Any = None) -> bool:
            now[0] += 10.0  # the slot comes free after the batch's deadline
            return super().acquire(blocking=False)

    started: list[str] = []
    out = run_threads(started.append, ["a"], 1, 5.0, None, Late(1))
    assert started == [] and out[0].timed_out


def test_a_call_that_does_not_stop_when_cancelled_is_left_behind() -> None:
    """The async deadline waited for every cancelled call to finish: one that closes slowly
    on cancellation (an SDK's graceful close) held the batch long past its deadline."""

    async def slow_to_stop(prompt: str) -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(3)  # a slow close
            raise
        return "never"

    async def batch() -> tuple[list[Generation], float]:
        start = time.monotonic()
        out = await gather_within(slow_to_stop, ["a", "b"], 2, 0.2, None)
        return out, time.monotonic() - start

    out, took = asyncio.run(asyncio.wait_for(batch(), 10))
    assert all(g.timed_out for g in out) and took < 2.5


def test_cancelling_an_async_batch_of_sync_calls_starts_no_further_call() -> None:
    """``agenerate`` over sync calls ran the whole batch after its caller was cancelled (a
    client gone): every later prompt was still sent to the model."""
    started: list[str] = []

    def slow(prompt: str) -> str:
        started.append(prompt)
        time.sleep(0.2)
        return "ok"

    llm = CallableLLM(slow, max_concurrency=2, timeout=None)

    async def cancelled() -> None:
        task = asyncio.ensure_future(llm.agenerate([f"p{i}" for i in range(10)]))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    time.sleep(0.6)  # what would have started meanwhile
    assert len(started) <= 4, started
    assert llm.generate(["x"])[0].text == "ok"  # the slots came back


def test_a_backend_working_in_a_thread_is_told_its_async_caller_was_cancelled() -> None:
    """``agenerate`` ran a backend's own ``generate`` in a worker thread that nothing told
    when the awaiting task was cancelled: a local model decoded on for a client gone."""
    steps: list[int] = []

    class Looping(LLM):
        def generate(
            self, prompts: Any, max_new_tokens: int = 20, timeout: float | None = None
        ) -> list[Generation]:
            while not cancelled() and len(steps) < 300:
                steps.append(1)
                time.sleep(0.01)
            return [Generation("x") for _ in prompts]

    cancel_once_started(lambda: Looping().agenerate(["p"]), steps)
    assert 0 < len(steps) < 300
    assert not cancelled()  # the flag is the cancelled call's alone


def test_a_backend_that_skips_init_has_the_class_defaults() -> None:
    """The docstring said subclasses need not call ``__init__``; ``generate`` then failed on
    ``max_concurrency``."""

    class Mine(ConcurrentLLM):
        def __init__(self) -> None:  # the base's left out
            pass

        def call(self, prompt: str) -> Any:
            return prompt.upper()

    assert [g.text for g in Mine().generate(["a", "b"])] == ["A", "B"]


def test_the_backends_check_their_settings_and_prompts() -> None:
    """One string was answered character by character; a NaN deadline timed every call out at
    once; max_concurrency=0 and batch_size=0 failed later, deep inside."""

    from ragdefense.llm import TransformersLLM

    llm = CallableLLM(lambda p: "yes")
    with pytest.raises(TypeError, match="not one string"):
        llm.generate("hello")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not one string"):
        asyncio.run(llm.agenerate("hello"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NaN"):
        llm.generate(["a"], timeout=float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        CallableLLM(lambda p: "yes", timeout=float("nan")).generate(["a"])
    for bad in (0, -1, True, 2.0):
        with pytest.raises((TypeError, ValueError), match="max_concurrency must be an int >= 1"):
            CallableLLM(lambda p: "yes", max_concurrency=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        TransformersLLM(batch_size=0)
    assert [g.text for g in llm.generate(["a", "b"])] == ["yes", "yes"]
    import numpy as np

    assert CallableLLM(lambda p: "yes", max_concurrency=np.int64(2)).max_concurrency == 2
    # (review) an asyncio semaphore as the shared slots failed in the worker thread, unreported:
    # the batch waited out its deadline
    from langchain_core.runnables import RunnableLambda

    from ragdefense.llm import LangChainLLM

    with pytest.raises(TypeError, match=r"slots must be a threading\.Semaphore"):
        LangChainLLM(RunnableLambda(str), slots=asyncio.Semaphore(2))  # type: ignore[arg-type]
