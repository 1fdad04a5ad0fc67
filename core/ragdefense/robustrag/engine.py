"""RobustRAG (Xiang et al.): isolate-then-aggregate answering with certifiable robustness.

Each retrieved passage is answered in isolation (one LLM call per passage, sent as one batch);
the isolated answers are then aggregated securely, so that k' injected passages can move the
result only by a bounded amount. One module per aggregation, each with its certificate:
:mod:`.keyword_aggregation`, :mod:`.majority_vote`, :mod:`.secure_decoding`. This module holds the
class users call; the sync and async methods drive the same flow (:mod:`.flow`).

Passages must be given in retrieval rank order, and be the retriever's full top k: an injection
attack pushes out the *bottom* k' passages. Where retrieval may return fewer (a score threshold,
a small store, a filter before it), injected passages are added, not swapped in: the
certificate does not cover that.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal, Protocol

from ..llm import LLM, as_llm
from ..llm.observe import in_thread
from ..text import well_formed
from ..types import Described, Passage, PassageLike, check_query, to_passages
from .checks import check_alike, check_certify, check_engine, check_installed, deciding
from .flow import Flow, Progress, Runtime, adrive, drive, local, reported
from .keyword_aggregation import KeywordAggregation
from .keywords import SPACY_LOCK, load_spacy
from .majority_vote import MajorityVote, check_choices
from .secure_decoding import SecureDecoding
from .types import IDK, ISOLATED_PROMPT, Attack, Certificate, RobustAnswer

__all__ = ["Aggregation", "RobustRAG"]

#: held while an engine resolves its LLM on first use (the packaged one loads once)
_LLM_LOCK = threading.Lock()


class Aggregation(Protocol):
    """An aggregation's settings (:class:`KeywordAggregation`, :class:`MajorityVote`,
    :class:`SecureDecoding`): its name, whether its work runs in this process, and the algorithm
    bound to one call's :class:`~ragdefense.robustrag.flow.Runtime`."""

    @property
    def name(self) -> Literal["keyword", "majority", "decoding"]:
        """``"keyword"``, ``"majority"`` or ``"decoding"``."""
        ...

    @property
    def local(self) -> bool:
        """Its work runs in this process (async callers run it in a thread)."""
        ...

    def bind(self, run: Runtime) -> Strategy:
        """The algorithm for one call."""
        ...


class Strategy(Protocol):
    """An aggregation bound to one call: prompts, the answer and certificate flows, the cost."""

    def prompts(
        self, query: str, items: Sequence[Passage], choices: Sequence[str] | None
    ) -> list[str]: ...

    def answer(
        self, query: str, items: Sequence[Passage], choices: Sequence[str] | None
    ) -> Flow[RobustAnswer]: ...

    def certificate(
        self,
        result: RobustAnswer,
        k_prime: int,
        attack: Attack,
        golds: list[str],
        progress: Progress | None,
    ) -> Flow[Certificate]: ...

    def calls_needed(self, result: RobustAnswer, k_prime: int, attack: Attack) -> int: ...


#: the aggregations by name, with their default settings
AGGREGATIONS: dict[str, Callable[[], Aggregation]] = {
    "keyword": KeywordAggregation,
    "majority": MajorityVote,
    "decoding": SecureDecoding,
}


class RobustRAG(Described):
    """RobustRAG: isolate-then-aggregate answering with certification.

    Args:
        llm: Any LLM :func:`ragdefense.llm.as_llm` accepts (``None``: the packaged SmolLM2).
        aggregation: The aggregation and its own settings: :class:`KeywordAggregation`
            (free-form answers; ``alpha``, ``beta``, certification caps, its prompt),
            :class:`MajorityVote` (multiple choice) or :class:`SecureDecoding` (next-token
            probabilities); or the name of one with its defaults (``"keyword"``,
            ``"majority"``, ``"decoding"``).
        nlp: A spaCy pipeline (default: ``en_core_web_sm`` if installed, else the packaged one).
        max_new_tokens: Answer length cap.
        timeout: Seconds one call of :meth:`answer` / :meth:`certify` may spend waiting for the
            LLM, all its batches together (``None``: no limit). Isolated calls still unanswered
            then are abstentions (reported as timed out); a certification cut short is reported
            as not certified, with the answer. Secure decoding runs locally and is bounded by
            ``max_new_tokens`` and ``max_certify_responses`` instead.
        isolated_prompt: The isolated answer's template (``{context}``, ``{query}``); checked
            at construction (each aggregation checks its own).
        max_passage_chars: Each passage is cut to this many characters (at a word) before it
            is put in a prompt: a model's deadline is checked between tokens, not while it
            reads its prompt, so one huge passage would otherwise hold every answer past it
            (``None``: no cut).
    """

    name = "RobustRAG"

    def __init__(
        self,
        llm: Any = None,
        aggregation: Aggregation | Literal["keyword", "majority", "decoding"] = "keyword",
        *,
        nlp: Any = None,
        max_new_tokens: int = 20,
        timeout: float | None = 300.0,
        isolated_prompt: str = ISOLATED_PROMPT,
        max_passage_chars: int | None = 1500,
    ) -> None:
        if isinstance(aggregation, str):
            if aggregation not in AGGREGATIONS:
                raise ValueError(
                    "aggregation must be KeywordAggregation(...), MajorityVote(...), "
                    f"SecureDecoding(...) or one's name ({', '.join(AGGREGATIONS)}), "
                    f"got {aggregation!r}"
                )
            aggregation = AGGREGATIONS[aggregation]()
        elif not isinstance(aggregation, (KeywordAggregation, MajorityVote, SecureDecoding)):
            what = f"an aggregation's settings or name, got {aggregation!r}"
            raise TypeError(f"aggregation must be {what}")
        check_engine(max_new_tokens, timeout, max_passage_chars, isolated_prompt)
        self.aggregation: Aggregation = aggregation
        self.max_passage_chars = None if max_passage_chars is None else int(max_passage_chars)
        self._llm = llm
        self._nlp = nlp
        self.max_new_tokens = int(max_new_tokens)
        self.timeout = timeout
        self.isolated_prompt = isolated_prompt
        check_installed(llm, aggregation.name, nlp)

    @property
    def llm(self) -> LLM:
        """The LLM backend (resolved on first use). A model wrapped here answers within this
        engine's ``timeout`` alone; an :class:`~ragdefense.llm.LLM` given as it is keeps its
        own ``timeout`` too (the tighter wins)."""
        if not isinstance(self._llm, LLM):
            with _LLM_LOCK:  # threads sharing this engine resolve it once: one model, one limit
                if not isinstance(self._llm, LLM):
                    wrapped = copy.copy(as_llm(self._llm))  # a copy: never change one given
                    wrapped.timeout = None
                    self._llm = wrapped
        return self._llm

    @property
    def nlp(self) -> Any:
        """The spaCy pipeline for keywords: one given, else the process's (never pickled)."""
        if self._nlp is not None:
            return self._nlp
        with SPACY_LOCK:  # concurrent async answers extract keywords in threads: load once
            return load_spacy()

    def with_llm(self, llm: Any) -> RobustRAG:
        """A copy of this RobustRAG answering with ``llm`` (anything :func:`ragdefense.llm.as_llm`
        accepts); settings and the loaded spaCy pipeline are shared, ``self`` is unchanged."""
        other = copy.copy(self)
        other._llm = llm
        return other

    # ------------------------------------------------------------------ prompts

    def isolated_prompts(
        self, query: str, passages: Sequence[Passage], choices: Sequence[str] | None = None
    ) -> list[str]:
        """One prompt per passage (the passage alone as context)."""
        return self._bound().prompts(query, passages, choices)

    def _bound(self) -> Strategy:
        """The aggregation for one call, handed what it uses of this engine (no back-pointer)."""
        run = Runtime(
            load_llm=lambda: self.llm,
            load_nlp=lambda: self.nlp,
            isolated_prompt=self.isolated_prompt,
            context=self.context,
            max_new_tokens=self.max_new_tokens,
            timeout=self.timeout,
        )
        return self.aggregation.bind(run)

    def context(self, passage: Passage) -> str:
        """The passage's text as a prompt holds it: well formed, cut to ``max_passage_chars``."""
        text, cap = well_formed(passage.text), self.max_passage_chars
        if cap is None or len(text) <= cap:
            return text
        cut = text[:cap]
        return (cut.rsplit(" ", 1)[0] if " " in cut[cap // 2 :] else cut) + " …"

    # ------------------------------------------------------------------ answering

    def answer(
        self,
        query: str,
        passages: Sequence[PassageLike],
        *,
        choices: Sequence[str] | None = None,
        certify: int | None = None,
        attack: Attack = "injection",
        gold: Sequence[str] | str | None = None,
        progress: Progress | None = None,
    ) -> RobustAnswer:
        """Answer ``query`` from ``passages`` (in retrieval rank order).

        Args:
            choices: The candidate answers (majority vote only).
            certify: k', the number of injected (or modified) passages to certify against.
            attack: ``"injection"`` (k' passages pushed in, the bottom k' pushed out) or
                ``"modification"`` (any k' passages rewritten).
            gold: With ``certify``: correct answer(s), to certify correctness, not stability
                (majority vote: a candidate's letter, its text or both; an offered letter is one).
            progress: Called as ``progress(done, total)``: for the answer's own calls (``total``
                is :meth:`answer_calls`) before the first and as each completes, then while
                certification asks the LLM (``total`` is :meth:`certify_calls`). From the
                calling thread; with :meth:`aanswer`, also from a worker thread.
        """
        flow = self._answer_flow(query, passages, choices, certify, attack, gold, progress)
        return self._run(flow)

    def answer_calls(self, passages: Sequence[PassageLike]) -> int:
        """LLM calls :meth:`answer` makes before certification, known before the work: one
        per passage, and the keyword aggregation's one (decoding: the passages' and the
        no-retrieval prompt's, run locally); :meth:`certify_calls` adds at most its cap."""
        k = len(to_passages(passages))
        return k + (1 if k and self.aggregation.name in ("keyword", "decoding") else 0)

    async def aanswer(
        self,
        query: str,
        passages: Sequence[PassageLike],
        *,
        choices: Sequence[str] | None = None,
        certify: int | None = None,
        attack: Attack = "injection",
        gold: Sequence[str] | str | None = None,
        progress: Progress | None = None,
    ) -> RobustAnswer:
        """Async :meth:`answer` (the LLM calls go through the backend's async path)."""
        flow = self._answer_flow(query, passages, choices, certify, attack, gold, progress)
        return await self._arun(flow)

    def certify(
        self,
        result: RobustAnswer,
        k_prime: int,
        *,
        attack: Attack = "injection",
        gold: Sequence[str] | str | None = None,
        progress: Progress | None = None,
    ) -> RobustAnswer:
        """Certify an answer already computed (its isolated responses are reused): a copy of
        ``result`` with its :class:`Certificate` for ``k_prime`` injected / modified passages.
        :meth:`certify_calls` says beforehand how many LLM calls it takes; ``progress(done,
        total)`` is called as they complete."""
        return self._run(self._certify_flow(result, k_prime, attack, gold, progress))

    async def acertify(
        self,
        result: RobustAnswer,
        k_prime: int,
        *,
        attack: Attack = "injection",
        gold: Sequence[str] | str | None = None,
        progress: Progress | None = None,
    ) -> RobustAnswer:
        """Async :meth:`certify`."""
        return await self._arun(self._certify_flow(result, k_prime, attack, gold, progress))

    def certify_calls(
        self, result: RobustAnswer, k_prime: int, *, attack: Attack = "injection"
    ) -> int:
        """How many LLM calls :meth:`certify` would make for ``result`` (0 when it is refused
        without asking, or decided without generation)."""
        k_prime = check_certify(k_prime, attack, None, optional=False)
        if _refusal(len(result.responses), k_prime) is not None or _failed(result) is not None:
            return 0
        return int(self._bound().calls_needed(result, k_prime, attack))

    # ------------------------------------------------------------------ the shared flow

    def _end(self) -> float:
        """This call's deadline (monotonic time)."""
        return time.monotonic() + (float("inf") if self.timeout is None else self.timeout)

    def _run(self, flow: Flow[RobustAnswer]) -> RobustAnswer:
        end = self._end()

        def gen(prompts: list[str]) -> Any:
            return self.llm.generate(prompts, self.max_new_tokens, _left(end))

        return drive(flow, gen)

    async def _arun(self, flow: Flow[RobustAnswer]) -> RobustAnswer:
        if self.aggregation.local:  # local CPU/GPU work: run it off the event loop
            return await in_thread(self._run, flow)
        end = self._end()

        async def agen(prompts: list[str]) -> Any:
            return await self.llm.agenerate(prompts, self.max_new_tokens, _left(end))

        return await adrive(flow, agen)

    def _answer_flow(
        self,
        query: str,
        passages: Sequence[PassageLike],
        choices: Sequence[str] | None,
        certify: int | None,
        attack: Attack,
        gold: Sequence[str] | str | None,
        progress: Progress | None,
    ) -> Flow[RobustAnswer]:
        query, items = check_query(query), to_passages(passages)
        if certify is not None or gold is not None or attack != "injection":  # before any call
            certify = check_certify(certify, attack, gold)
            if certify is None and gold is not None:  # it shapes a certificate only
                raise ValueError("gold= takes effect with certify=k' only (the certificate's)")
        if choices is not None or self.aggregation.name == "majority":  # passages or none
            check_choices(choices, self.aggregation.name)
        if not items:
            empty = RobustAnswer(query, IDK, self.aggregation.name, (), "no passages were given")
            if certify is not None:  # a certificate asked for is always given, here a refusal
                why = "no passages were given: nothing to certify"
                empty = replace(empty, certificate=Certificate(certify, attack, False, why))
            return (yield from local(empty))
        answer = self._bound().answer(query, items, choices)
        if progress is not None:  # before the first call, then as each call completes
            calls = self.answer_calls(items)
            progress(0, calls)
            answer = reported(answer, progress, calls)
        done = yield from answer
        result: RobustAnswer = replace(done, settings=self.aggregation, engine=deciding(self))
        if certify is not None:
            result = yield from self._certify_flow(result, certify, attack, gold, progress)
        return result

    def _certify_flow(
        self,
        result: RobustAnswer,
        k_prime: int,
        attack: Attack,
        gold: Sequence[str] | str | None,
        progress: Progress | None,
    ) -> Flow[RobustAnswer]:
        k_prime = check_certify(k_prime, attack, gold, optional=False)
        check_alike(result, self.aggregation, deciding(self))
        golds = [gold] if isinstance(gold, str) else list(gold or [])
        refusal = _refusal(len(result.responses), k_prime) or _failed(result)
        if refusal is not None:
            cert = yield from local(Certificate(k_prime, attack, False, refusal))
        else:
            strategy = self._bound()
            cert = yield from strategy.certificate(result, k_prime, attack, golds, progress)
        return replace(result, certificate=cert)


def _left(end: float) -> float:
    return max(0.0, end - time.monotonic())


def _failed(result: RobustAnswer) -> str | None:
    """Why an answer with failed isolated calls is not certified: what those passages say is
    unknown (a slow injected passage can make benign calls time out on the shared deadline)."""
    failed = sum(r.error is not None for r in result.responses)
    if not failed:
        return None
    return (
        f"{failed} of {len(result.responses)} isolated LLM call(s) failed: what those passages "
        "say is unknown, so no certificate is possible"
    )


def _refusal(k: int, k_prime: int) -> str | None:
    """Why no aggregation can be certified at ``k_prime`` over ``k`` passages (``None``: go on)."""
    if k_prime < 1:
        return "k' must be >= 1"
    if 2 * k_prime >= k:
        return (
            f"k'={k_prime} >= k/2 (k={k}): not certified here (an attacker with half of the "
            "passages can decide a vote or a keyword count; retrieve more passages)"
        )
    return None
