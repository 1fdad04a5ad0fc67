"""What broke when the library was tried as a new user would (issue #18), each pinned by a test
that failed before its fix."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

from ragdefense.llm import CallableLLM, LangChainLLM
from ragdefense.robustrag import RobustRAG

from .test_robustrag import Q, scripted

# ---------------------------------------------------------------- 1. one deadline per query


def test_the_deadline_covers_the_whole_batch_and_starts_nothing_after_it(nlp: Any) -> None:
    started: list[str] = []

    def slow(prompt: str) -> str:
        started.append(prompt)
        time.sleep(3)
        return "Canberra"

    rr = RobustRAG(llm=CallableLLM(slow, max_concurrency=2), nlp=nlp, timeout=0.5)
    t0 = time.monotonic()
    r = rr.answer(Q, [f"p{i}" for i in range(6)])
    assert time.monotonic() - t0 < 1.5  # not 6 x 0.5 s in sequence, not 3 x 3 s
    assert len(started) == 2  # the two calls in flight; none started after the deadline
    assert r.abstentions == list(range(6)) and r.answer == "I don't know"
    assert all("timed out" in (x.error or "") for x in r.responses)
    assert "6 of them timed out" in r.reason


def test_async_deadline_cancels_the_calls(nlp: Any) -> None:
    from langchain_core.runnables import RunnableLambda

    cancelled = []

    async def slow(prompt: str) -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(prompt)
            raise
        return "Canberra"

    rr = RobustRAG(llm=LangChainLLM(RunnableLambda(slow)), nlp=nlp, timeout=0.3)
    r = asyncio.run(rr.aanswer(Q, ["p0", "p1", "p2"]))
    assert r.abstentions == [0, 1, 2] and len(cancelled) == 3


def test_langchain_backend_reads_its_timeout() -> None:
    from langchain_core.runnables import RunnableLambda

    def slow(prompt: str) -> str:
        time.sleep(2)
        return "x"

    t0 = time.monotonic()
    [g] = LangChainLLM(RunnableLambda(slow), timeout=0.2).generate(["q"])
    assert g.timed_out and time.monotonic() - t0 < 1.0


def test_a_hanging_call_does_not_keep_the_process_alive() -> None:
    script = textwrap.dedent(
        """
        import time
        from ragdefense.llm import CallableLLM
        [g] = CallableLLM(lambda p: time.sleep(60) or "x", timeout=0.2).generate(["q"])
        print(g.error)
        """
    )
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert "timed out" in out.stdout and time.monotonic() - t0 < 20


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout"):
        RobustRAG(llm=CallableLLM(str), timeout=0)


# ---------------------------------------------------------------- 2. non-text answers fail


@pytest.mark.parametrize("value", [None, 3, {"text": "Canberra"}, b"Canberra", ["Canberra"]])
def test_non_string_answers_are_failed_calls_never_answers(nlp: Any, value: Any) -> None:
    rr = RobustRAG(llm=CallableLLM(lambda p: value), nlp=nlp)
    r = rr.answer(Q, [f"p{i}" for i in range(5)], certify=1)
    assert r.answer == "I don't know" and r.abstentions == [0, 1, 2, 3, 4]
    assert all("expected str" in (x.error or "") for x in r.responses)
    assert r.certificate is not None and not r.certificate.certified


def test_a_timeout_error_raised_by_the_function_is_named_as_such() -> None:
    def fn(prompt: str) -> str:
        raise TimeoutError("upstream gateway")

    [g] = CallableLLM(fn).generate(["q"])
    assert g.error == "raised TimeoutError: upstream gateway" and not g.timed_out


# ---------------------------------------------------------------- 4. certification cost


def _undecided(nlp: Any, fn: Any = None) -> tuple[RobustRAG, Any]:
    answers = ["Canberra"] * 7 + ["Sydney"] * 2 + ["Perth"]
    iso = {f"p{i}!": a for i, a in enumerate(answers)}
    base = scripted(iso, lambda kws: "Sydney" if "Sydney" in kws else "Canberra")
    rr = RobustRAG(llm=CallableLLM(fn or base.fn), nlp=nlp)
    return rr, rr.answer(Q, list(iso))


def test_certification_reports_progress_against_its_estimate(nlp: Any) -> None:
    rr, result = _undecided(nlp)
    seen: list[tuple[int, int]] = []
    total = rr.certify_calls(result, 1)
    rr.certify(result, 1, progress=lambda done, of: seen.append((done, of)))
    assert total > 0 and seen and seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_abandoned_certification_still_returns_the_answer(nlp: Any) -> None:
    _, result = _undecided(nlp)

    def slow_keywords(prompt: str) -> str:
        time.sleep(2)
        return "Canberra"

    rr = RobustRAG(llm=CallableLLM(slow_keywords), nlp=nlp, timeout=0.3)
    certified = rr.certify(result, 1)
    assert certified.answer == result.answer == "Canberra"
    c = certified.certificate
    assert c is not None and not c.certified and "abandoned" in c.reason


def test_the_call_budget_is_respected_and_said(nlp: Any) -> None:
    rr, result = _undecided(nlp)
    calls = rr.certify_calls(result, 1)
    tight = RobustRAG(llm=rr.llm, nlp=nlp, max_certify_calls=calls - 1)
    assert tight.certify_calls(result, 1) == 0  # refused before any call
    c = tight.certify(result, 1).certificate
    assert c is not None and f"max_certify_calls={calls - 1}" in c.reason


# ---------------------------------------------------------------- 5. max_new_tokens


def test_max_new_tokens_bounds_what_a_function_backend_returns(nlp: Any) -> None:
    huge = "Canberra " + "word " * 20_000
    rr = RobustRAG(llm=CallableLLM(lambda p: huge), nlp=nlp, max_new_tokens=5)
    r = rr.answer(Q, ["p0", "p1", "p2"])
    assert all(len((x.text or "").split()) <= 5 for x in r.responses)


def test_threads_left_behind_are_daemons() -> None:
    before = set(threading.enumerate())
    CallableLLM(lambda p: time.sleep(1) or "x", timeout=0.05).generate(["a", "b"])
    assert all(t.daemon for t in set(threading.enumerate()) - before)
