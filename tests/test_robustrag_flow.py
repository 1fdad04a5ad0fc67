"""RobustRAG's sync and async APIs drive one flow: every aggregation x certify x attack gives the
same result both ways; the certification cost is known before it is paid; with_llm is the public
way to swap the model."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ragdefense.llm import CallableLLM
from ragdefense.robustrag import RobustAnswer, RobustRAG

from .test_decoding import NOR, FakeTokenLLM, dist
from .test_robustrag import CHOICES, Q, mc_llm, scripted

PASSAGES = [f"p{i}" for i in range(5)]


def _view(r: RobustAnswer) -> tuple[Any, ...]:
    c = r.certificate
    cert = None if c is None else (c.certified, c.reason, c.possible_answers, c.undecided)
    return (r.answer, r.reason, tuple(x.abstained for x in r.responses), cert)


def _keyword(nlp: Any) -> RobustRAG:
    answers = {"p0": "Canberra", "p1": "Canberra", "p2": "Canberra", "p3": "Sydney"}
    return RobustRAG(llm=scripted(answers), nlp=nlp)


def _majority(nlp: Any) -> RobustRAG:
    letters = ["B. Canberra", "B", "B", "A. Sydney", "E. No info"]
    return RobustRAG(llm=mc_llm(letters), aggregation="majority")


def _decoding(nlp: Any) -> RobustRAG:
    tables = {f"p{i}": [dist(can=0.7, syd=0.3)] for i in range(4)} | {"p4": [dist(syd=1.0)]}
    return RobustRAG(llm=FakeTokenLLM(tables | NOR), aggregation="decoding")


@pytest.mark.parametrize("make", [_keyword, _majority, _decoding])
@pytest.mark.parametrize("certify", [None, 1, 2])
@pytest.mark.parametrize("attack", ["injection", "modification"])
def test_sync_and_async_give_the_same_answer_and_certificate(
    nlp: Any, make: Any, certify: int | None, attack: Any
) -> None:
    rr = make(nlp)
    passages = [f"passage {i}" for i in range(5)] if rr.aggregation.name == "majority" else PASSAGES
    choices = CHOICES if rr.aggregation.name == "majority" else None
    kw = {"choices": choices, "certify": certify, "attack": attack, "gold": None}
    sync = rr.answer(Q, passages, **kw)
    asyn = asyncio.run(rr.aanswer(Q, passages, **kw))
    assert _view(sync) == _view(asyn)
    assert (sync.certificate is None) is (certify is None)
    if certify is not None:  # certify / acertify on the computed answer agree too
        plain = rr.answer(Q, passages, choices=choices)
        again = rr.certify(plain, certify, attack=attack)
        aagain = asyncio.run(rr.acertify(plain, certify, attack=attack))
        assert _view(again) == _view(aagain) == _view(sync)


def test_async_decoding_certificate_checks_the_gaps() -> None:
    # the gap 0.6 is within the attacker's reach: not certified, sync and async alike
    tables = {
        "c0": [dist(can=0.9, syd=0.1)],
        "c1": [dist(can=0.8, syd=0.2)],
        "c2": [dist(syd=0.9, can=0.1)],
        "c3": [dist(can=1.0)],
        **NOR,
    }
    rr = RobustRAG(llm=FakeTokenLLM(tables), aggregation="decoding")
    plain = rr.answer(Q, ["c0", "c1", "c2", "c3"])
    cert = asyncio.run(rr.acertify(plain, 1)).certificate
    assert cert is not None and not cert.certified and "within the attacker's reach" in cert.reason


def test_certify_calls_is_what_certify_spends(nlp: Any) -> None:
    calls: list[str] = []
    answers = ["Canberra"] * 7 + ["Sydney"] * 2 + ["Perth"]
    iso = {f"p{i}!": a for i, a in enumerate(answers)}
    base = scripted(iso, lambda kws: "Sydney" if "Sydney" in kws else "Canberra")

    def counting(prompt: str) -> str:
        calls.append(prompt)
        return base.fn(prompt)

    rr = RobustRAG(llm=CallableLLM(counting), nlp=nlp)
    result = rr.answer(Q, list(iso))
    expected = rr.certify_calls(result, 1)
    calls.clear()
    rr.certify(result, 1)
    assert expected == len(calls) > 0
    assert rr.certify_calls(result, 5) == 0  # refused without asking: k' >= k / 2


def test_with_llm_returns_a_copy_on_another_model(nlp: Any) -> None:
    rr = RobustRAG(llm=scripted({"p": "Canberra"}), nlp=nlp)
    other = rr.with_llm(scripted({"p": "Sydney"}))
    assert other is not rr and other.nlp is rr.nlp
    assert rr.answer(Q, ["p"]).answer == "Canberra"
    assert other.answer(Q, ["p"]).answer == "Sydney"


def test_async_batches_hold_the_backends_limit_together() -> None:
    """Each async batch had a limit of its own: six concurrent requests of a backend (or of a
    chain's per-run backends sharing its slots) at max_concurrency=2 had twelve calls in
    flight; the sync path held the limit already."""
    flight = [0, 0]  # now, peak

    async def slow(prompt: str) -> str:
        flight[0] += 1
        flight[1] = max(flight)
        await asyncio.sleep(0.02)
        flight[0] -= 1
        return "Paris"

    llm = CallableLLM(slow, max_concurrency=2)

    async def requests() -> list[Any]:
        return await asyncio.gather(*(llm.agenerate(["a", "b", "c"]) for _ in range(6)))

    outs = asyncio.run(requests())
    assert flight[1] == 2 and all(g.text == "Paris" for batch in outs for g in batch)


def test_a_langchain_config_without_tags_still_labels_its_calls() -> None:
    """``config={"tags": None}`` made every labelled call fail (every answer "I don't know")."""
    from langchain_core.language_models import FakeListChatModel

    from ragdefense.llm import LangChainLLM
    from ragdefense.llm.observe import asked_for

    llm = LangChainLLM(FakeListChatModel(responses=["Paris"]), config={"tags": None})
    with asked_for("isolated"):
        assert [g.text for g in llm.generate(["q"])] == ["Paris"]


def test_calls_waiting_for_the_shared_limit_are_served_in_arrival_order() -> None:
    """Waiters polled with a growing pause, so newcomers polling sooner took the freed slots:
    an early request could wait out its deadline while later ones were served."""
    started: list[int] = []

    async def call(prompt: str) -> str:
        started.append(int(prompt))
        await asyncio.sleep(0.01)
        return "ok"

    llm = CallableLLM(call, max_concurrency=2)

    async def requests() -> None:
        async def one(i: int) -> None:
            await asyncio.sleep(0.002 * i)  # arrivals in order, faster than they are served
            await llm.agenerate([str(i)])

        await asyncio.gather(*(one(i) for i in range(40)))

    asyncio.run(requests())
    overtaken = [sum(j > i for j in started[: started.index(i)]) for i in range(40)]
    assert max(overtaken) <= 2, overtaken  # at most the limit's width ahead of a waiter


def _slow_polls(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], Awaitable[None]]:
    """Waiters' pauses stretched fiftyfold (the test's own sleeps use the returned one):
    a waiter in line is surely asleep when another polls."""
    real = asyncio.sleep
    monkeypatch.setattr(asyncio, "sleep", lambda delay: real(delay * 50))
    return real


def test_a_freed_slot_goes_to_the_head_of_the_line_whoever_polls_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A newcomer polling at once took a slot freed while the head of the line was pausing
    between its polls: the head could be overtaken again and again under load. A waiter now
    takes a slot only while fewer waiters still polling are ahead of it than slots are free."""
    import threading

    from ragdefense.llm.calls import _held

    sleep = _slow_polls(monkeypatch)
    slots = threading.Semaphore(1)
    slots.acquire()
    served: list[str] = []

    async def wait(name: str) -> None:
        async with _held(slots, window=2):
            served.append(name)

    async def run() -> None:
        head = asyncio.ensure_future(wait("head"))
        await sleep(0.07)  # the head polled, and sleeps until 0.15 s
        slots.release()
        newcomer = asyncio.ensure_future(wait("newcomer"))  # polls before the head wakes
        await asyncio.gather(head, newcomer)

    asyncio.run(run())
    assert served == ["head", "newcomer"]
    assert slots.acquire(blocking=False)  # the slot given back


def test_a_waiter_that_stopped_polling_never_holds_the_line() -> None:
    """A waiter whose event loop was abandoned (or is busy) never polls again: the waiters
    behind it are served as the slots free, and no slot is set aside for it."""
    import threading

    from ragdefense.llm import calls

    slots = threading.Semaphore(1)
    slots.acquire()
    abandoned = calls._Waiter()
    abandoned.seen -= 10 * calls._STALE  # it polled long ago
    with calls._LINES_LOCK:
        calls._LINES.setdefault(slots, collections.deque()).append(abandoned)
    served: list[str] = []

    async def wait() -> None:
        async with calls._held(slots, window=1):
            served.append("behind")

    async def run() -> None:
        behind = asyncio.ensure_future(wait())
        await asyncio.sleep(0.05)
        slots.release()
        await asyncio.wait_for(behind, 1.0)

    asyncio.run(run())
    assert served == ["behind"] and slots.acquire(blocking=False)  # its slot given back
    assert list(calls._LINES[slots]) == [abandoned]  # keeping its place, should it poll again


def test_a_cancelled_async_batch_cancels_its_calls() -> None:
    """The caller giving up (a timeout, a client gone) cancels the isolated calls still
    running: they held the backend's shared slots and kept a hosted model busy."""
    finished: list[str] = []

    async def slow(prompt: str) -> str:
        await asyncio.sleep(0.6)
        finished.append(prompt)
        return "Paris"

    llm = CallableLLM(slow, max_concurrency=2)

    async def give_up() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(llm.agenerate(["a", "b", "c"]), 0.1)
        await asyncio.sleep(1.0)  # what was left running would finish by now

    asyncio.run(give_up())
    assert finished == []
    assert [g.text for g in asyncio.run(llm.agenerate(["d"]))] == ["Paris"]  # slots freed


class _Stop(BaseException):
    """An error outside ``Exception`` raised by a model call (a framework's control flow)."""


def test_a_call_raising_outside_exception_fails_its_prompt_alone() -> None:
    """A call raising a ``BaseException`` (a ``CancelledError`` of its own, a framework's
    exit) fails its own prompt at once, sync and async: the sync batch waited out its whole
    deadline (forever without one) and called it a timeout; the async one raised it."""
    import time

    def sync_call(prompt: str) -> str:
        if prompt == "bad":
            raise _Stop("its own")
        return "Paris"

    async def async_call(prompt: str) -> str:
        if prompt == "bad":
            raise asyncio.CancelledError("its own")
        return "Paris"

    start = time.monotonic()
    plain = CallableLLM(sync_call, timeout=5).generate(["ok", "bad", "ok"])
    assert time.monotonic() - start < 2
    assert [g.text for g in plain] == ["Paris", None, "Paris"]
    assert plain[1].error is not None and plain[1].error.startswith("_Stop")
    awaited = asyncio.run(CallableLLM(async_call).agenerate(["ok", "bad", "ok"]))
    assert [g.text for g in awaited] == ["Paris", None, "Paris"]
    assert awaited[1].error is not None and awaited[1].error.startswith("CancelledError")
