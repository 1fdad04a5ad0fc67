"""RobustRAG (Xiang et al.): isolate-then-aggregate answering with certifiable robustness.

Each retrieved passage is answered in isolation (one LLM call per passage, sent as one batch);
the isolated answers are then aggregated securely, so that k' injected passages can move the
result only by a bounded amount. One module per aggregation, each with its certificate:
:mod:`.keyword_aggregation`, :mod:`.majority_vote`, :mod:`.secure_decoding`. This module holds the
class users call; the sync and async methods drive the same flow (:mod:`.flow`).

Passages must be given in retrieval rank order: an injection attack pushes out the *bottom* k'
passages.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal, Protocol

from ..llm import LLM, as_llm
from ..types import Passage, PassageLike, check_query, to_passages
from .checks import check_attack, check_certify, check_installed, check_templates
from .flow import Flow, Progress, adrive, drive, local
from .keyword_aggregation import KeywordAggregation
from .keywords import load_spacy
from .majority_vote import MajorityVote
from .secure_decoding import SecureDecoding
from .types import (
    IDK,
    ISOLATED_PROMPT,
    KEYWORD_PROMPT,
    MULTIPLE_CHOICE_PROMPT,
    NO_RETRIEVAL_PROMPT,
    Attack,
    Certificate,
    RobustAnswer,
)

__all__ = ["RobustRAG"]


class Aggregation(Protocol):
    """What an aggregation module provides: the answer and certificate flows, and the cost."""

    local: bool  # its work runs in this process (async callers run it in a thread)

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


_AGGREGATIONS: dict[str, Callable[[RobustRAG], Aggregation]] = {
    "keyword": KeywordAggregation,
    "majority": MajorityVote,
    "decoding": SecureDecoding,
}


class RobustRAG:
    """RobustRAG: isolate-then-aggregate answering with certification.

    Args:
        llm: Any LLM :func:`ragdefense.llm.as_llm` accepts (``None``: the packaged SmolLM2).
        aggregation: ``"keyword"`` (free-form answers) or ``"majority"`` (multiple choice).
        alpha, beta: Keyword threshold ``mu = min(alpha * n, beta)`` (paper: 0.3 and 3 for QA).
        nlp: A spaCy pipeline (default: ``en_core_web_sm`` if installed, else the packaged one).
        max_new_tokens: Answer length cap.
        max_undecided: Certification enumerates the subsets of at most this many undecided
            keywords (paper: 15); beyond it the answer is reported as not certifiable.
        max_certify_calls: Certification asks the LLM once per possible keyword set; above this
            many it stops and reports the answer as not certifiable (2^15 calls is hours on a
            CPU).
        gamma: Decoding: contexts whose probability of answering "I don't know" is >= gamma
            are dropped (paper: 0.99).
        eta: Decoding: the averaged top-1 is used when it leads the top-2 by more than eta,
            else the no-retrieval token (paper: 0 for short QA).
        max_certify_responses: Decoding certification explores at most this many responses.
        timeout: Seconds one call of :meth:`answer` / :meth:`certify` may spend waiting for the
            LLM, all its batches together (``None``: no limit). Isolated calls still unanswered
            then are abstentions (reported as timed out); a certification cut short is reported
            as not certified, with the answer. Secure decoding runs locally and is bounded by
            ``max_new_tokens`` and ``max_certify_responses`` instead.
        isolated_prompt, keyword_prompt, choice_prompt: Prompt templates (``{context}``,
            ``{query}``, ``{keywords}``, ``{choices}``, ``{letters}``); checked at construction.
        max_passage_chars: Each passage is cut to this many characters (at a word) before it
            is put in a prompt: a model's deadline is checked between tokens, not while it
            reads its prompt, so one huge passage would otherwise hold every answer past it
            (``None``: no cut).
    """

    name = "RobustRAG"

    def __init__(
        self,
        llm: Any = None,
        aggregation: Literal["keyword", "majority", "decoding"] = "keyword",
        alpha: float = 0.3,
        beta: float = 3,
        nlp: Any = None,
        max_new_tokens: int = 20,
        max_undecided: int = 15,
        max_certify_calls: int = 256,
        gamma: float = 0.99,
        eta: float = 0.0,
        max_certify_responses: int = 64,
        timeout: float | None = 300.0,
        isolated_prompt: str = ISOLATED_PROMPT,
        no_retrieval_prompt: str = NO_RETRIEVAL_PROMPT,
        keyword_prompt: str = KEYWORD_PROMPT,
        choice_prompt: str = MULTIPLE_CHOICE_PROMPT,
        max_passage_chars: int | None = 1500,
    ) -> None:
        if aggregation not in ("keyword", "majority", "decoding"):
            raise ValueError(
                f"aggregation must be 'keyword', 'majority' or 'decoding', got {aggregation!r}"
            )
        if not 0 <= alpha <= 1 or beta <= 0:
            raise ValueError(f"need 0 <= alpha <= 1 and beta > 0, got {alpha}, {beta}")
        if max_new_tokens < 1 or max_certify_calls < 0 or max_undecided < 0:
            raise ValueError(
                "max_new_tokens must be >= 1, max_certify_calls and max_undecided >= 0"
            )
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds (or None), got {timeout!r}")
        if max_passage_chars is not None and max_passage_chars < 1:
            raise ValueError(f"max_passage_chars must be >= 1 (or None), got {max_passage_chars}")
        check_templates(
            isolated_prompt=(isolated_prompt, ("context", "query")),
            no_retrieval_prompt=(no_retrieval_prompt, ("query",)),
            keyword_prompt=(keyword_prompt, ("keywords", "query")),
            choice_prompt=(choice_prompt, ("context", "query", "choices", "letters")),
        )
        self.max_passage_chars = max_passage_chars
        self._llm = llm
        self.aggregation: Literal["keyword", "majority", "decoding"] = aggregation
        self.alpha = alpha
        self.beta = beta
        self._nlp = nlp
        self.max_new_tokens = max_new_tokens
        self.max_undecided = max_undecided
        self.max_certify_calls = max_certify_calls
        self.gamma = gamma
        self.eta = eta
        self.max_certify_responses = max_certify_responses
        self.timeout = timeout
        self.no_retrieval_prompt = no_retrieval_prompt
        self.isolated_prompt = isolated_prompt
        self.keyword_prompt = keyword_prompt
        self.choice_prompt = choice_prompt
        self._strategy: Aggregation = _AGGREGATIONS[aggregation](self)
        check_installed(llm, aggregation, nlp)

    @property
    def llm(self) -> LLM:
        """The LLM backend (resolved on first use)."""
        if not isinstance(self._llm, LLM):
            self._llm = as_llm(self._llm)
        return self._llm

    @property
    def nlp(self) -> Any:
        """The spaCy pipeline for keyword extraction (loaded on first use)."""
        if self._nlp is None:
            self._nlp = load_spacy()
        return self._nlp

    def with_llm(self, llm: Any) -> RobustRAG:
        """A copy of this RobustRAG answering with ``llm`` (anything :func:`ragdefense.llm.as_llm`
        accepts); settings and the loaded spaCy pipeline are shared, ``self`` is unchanged."""
        other = copy.copy(self)
        other._llm = llm
        other._strategy = _AGGREGATIONS[self.aggregation](other)
        return other

    # ------------------------------------------------------------------ prompts

    def isolated_prompts(
        self, query: str, passages: Sequence[Passage], choices: Sequence[str] | None = None
    ) -> list[str]:
        """One prompt per passage (the passage alone as context)."""
        if self.aggregation == "majority":
            return MajorityVote(self).prompts(query, passages, choices)
        return [self.isolated_prompt.format(context=self.context(p), query=query) for p in passages]

    def context(self, passage: Passage) -> str:
        """The passage's text as a prompt holds it: cut to ``max_passage_chars`` at a word."""
        text, cap = passage.text, self.max_passage_chars
        if cap is None or len(text) <= cap:
            return text
        cut = text[:cap]
        return (cut.rsplit(" ", 1)[0] if " " in cut[cap // 2 :] else cut) + " …"

    def keyword_prompt_for(self, query: str, keywords: Sequence[str]) -> str:
        """The aggregation prompt for a (sorted) keyword list."""
        return self.keyword_prompt.format(keywords=", ".join(keywords), query=query)

    def threshold(self, n: int) -> float:
        """The keyword threshold ``mu = min(alpha * n, beta)``."""
        return min(self.alpha * n, self.beta)

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
            gold: Correct answer string(s): certify correctness instead of stability.
            progress: Called as ``progress(done, total)``: for the answer's own calls (``total``
                is :meth:`answer_calls`: before they start and when they are done), then while
                certification asks the LLM (``total`` is :meth:`certify_calls`).
        """
        flow = self._answer_flow(query, passages, choices, certify, attack, gold, progress)
        return self._run(flow)

    def answer_calls(self, passages: Sequence[PassageLike]) -> int:
        """LLM calls :meth:`answer` makes before any certification, known before the work:
        one per passage, and the keyword aggregation's one (decoding: the passages' and the
        no-retrieval prompt's, run locally). Certification adds :meth:`certify_calls`, at
        most ``max_certify_calls``."""
        k = len(to_passages(passages))
        return k + (1 if k and self.aggregation in ("keyword", "decoding") else 0)

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
        check_attack(attack)
        if _refusal(len(result.responses), k_prime) is not None:
            return 0
        return int(self._strategy.calls_needed(result, k_prime, attack))

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
        if self._strategy.local:  # local CPU/GPU work: run it off the event loop
            return await asyncio.to_thread(self._run, flow)
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
        if certify is not None or gold is not None:  # before any LLM call is made
            check_certify(certify, attack, gold)
        if not items:
            empty = RobustAnswer(query, IDK, self.aggregation, (), "no passages were given")
            return (yield from local(empty))
        calls = self.answer_calls(items)
        if progress is not None:
            progress(0, calls)
        result: RobustAnswer = yield from self._strategy.answer(query, items, choices)
        if progress is not None:
            progress(calls, calls)
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
        check_certify(k_prime, attack, gold)
        golds = [gold] if isinstance(gold, str) else list(gold or [])
        refusal = _refusal(len(result.responses), k_prime)
        if refusal is not None:
            cert = yield from local(Certificate(k_prime, attack, False, refusal))
        else:
            cert = yield from self._strategy.certificate(result, k_prime, attack, golds, progress)
        return replace(result, certificate=cert)


def _left(end: float) -> float:
    return max(0.0, end - time.monotonic())


def _refusal(k: int, k_prime: int) -> str | None:
    """Why no aggregation can be certified at ``k_prime`` over ``k`` passages (``None``: go on)."""
    if k_prime < 1:
        return "k' must be >= 1"
    if 2 * k_prime >= k:
        return (
            f"k'={k_prime} >= k/2 (k={k}): an attacker controlling half of the "
            "passages can decide the answer; no certificate is possible"
        )
    return None
