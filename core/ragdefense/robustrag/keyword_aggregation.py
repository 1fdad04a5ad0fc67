"""Secure keyword aggregation (RobustRAG Algorithm 1) and its certificate (Appendix B and C).

Keywords of the non-abstaining isolated answers are counted once per answer; those with count
>= mu = min(alpha * n, beta) are kept, sorted, and the LLM answers from them. To certify,
every keyword set that k' injected (or rewritten) answers can cause is enumerated and answered.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from typing import ClassVar, Literal

from ..llm.base import Generation
from ..text import answer_key, gives_answer
from ..types import Passage
from .checks import check_count, check_real, check_templates
from .flow import Flow, Progress, Prompts, Runtime, failures_note
from .keywords import extract_keywords
from .types import (
    IDK,
    KEYWORD_PROMPT,
    Attack,
    Certificate,
    IsolatedResponse,
    RobustAnswer,
    is_abstention,
)

__all__ = ["CERTIFY_BATCH", "KeywordAggregation"]

logger = logging.getLogger("ragdefense")

#: certification prompts sent per batch (progress is reported after each)
CERTIFY_BATCH = 8


@dataclass
class _Plan:
    """What certification must ask the LLM (or its verdict already)."""

    keyword_sets: list[tuple[str, ...]]
    always_kept: tuple[str, ...] = ()
    undecided: tuple[str, ...] = ()
    verdict: str | None = None  # set when no LLM call can help: the reason it is not certified


@dataclass(frozen=True)
class KeywordAggregation:
    """Secure keyword aggregation for free-form answers (Algorithm 1) and its settings:
    ``RobustRAG(llm, aggregation=KeywordAggregation(alpha=0.3, beta=3))``.

    It reads English answers: the keyword tagger (spaCy's English model), the stop words and
    the abstention phrases are English; answers in another language are counted unreliably.

    Args:
        alpha: Share of the ``n`` non-abstaining answers a keyword must appear in: the
            threshold is ``mu = min(alpha * n, beta)`` (paper: 0.3 for QA).
        beta: Cap on the keyword threshold ``mu`` (paper: 3 for QA).
        max_undecided: Certification enumerates the subsets of at most this many undecided
            keywords (paper: 15); beyond it the answer is reported as not certifiable.
        max_certify_calls: Certification asks the LLM once per possible keyword set; above this
            many it stops and reports the answer as not certifiable (the number of keyword
            sets grows exponentially with the undecided keywords).
        keyword_prompt: The aggregation prompt (``{keywords}``, ``{query}``); checked here.
    """

    alpha: float = 0.3
    beta: float = 3
    max_undecided: int = 15
    max_certify_calls: int = 256
    keyword_prompt: str = KEYWORD_PROMPT

    name: ClassVar[Literal["keyword"]] = "keyword"
    local: ClassVar[bool] = False  # its work is LLM calls

    def __post_init__(self) -> None:
        check_real(alpha=self.alpha, beta=self.beta)
        check_count(max_undecided=self.max_undecided, max_certify_calls=self.max_certify_calls)
        if not 0 <= self.alpha <= 1 or self.beta <= 0:
            raise ValueError(f"need 0 <= alpha <= 1 and beta > 0, got {self.alpha}, {self.beta}")
        if self.max_certify_calls < 0 or self.max_undecided < 0:
            raise ValueError("max_certify_calls and max_undecided must be >= 0")
        check_templates(keyword_prompt=self.keyword_prompt)

    def threshold(self, n: int) -> float:
        """The keyword threshold ``mu = min(alpha * n, beta)``."""
        return min(self.alpha * n, self.beta)

    def prompt_for(self, query: str, keywords: Sequence[str]) -> str:
        """The aggregation prompt for a (sorted) keyword list."""
        return self.keyword_prompt.format(keywords=", ".join(keywords), query=query)

    def bind(self, run: Runtime) -> _Keyword:
        """The algorithm with these settings, for one call of the engine."""
        return _Keyword(self, run)


class _Keyword:
    """Keyword aggregation for one call: its settings and the engine's :class:`Runtime`."""

    def __init__(self, cfg: KeywordAggregation, run: Runtime) -> None:
        self.cfg, self.run = cfg, run

    def prompts(
        self, query: str, items: Sequence[Passage], choices: Sequence[str] | None
    ) -> list[str]:
        """The isolated prompts, one per passage."""
        return self.run.isolated_prompts(query, items)

    def answer(
        self, query: str, items: Sequence[Passage], choices: Sequence[str] | None
    ) -> Flow[RobustAnswer]:
        gens = yield Prompts(self.prompts(query, items, choices), "isolated")
        responses = self.responses(items, gens)
        result, final_prompt = self.aggregate(query, responses)
        if final_prompt is not None:
            [final] = yield Prompts([final_prompt], "aggregate")
            result = _with_final(result, final)
        return result

    def responses(
        self, items: Sequence[Passage], gens: Sequence[Generation]
    ) -> tuple[IsolatedResponse, ...]:
        out = []
        for i, (p, g) in enumerate(zip(items, gens, strict=True)):
            if not g.ok:
                out.append(IsolatedResponse(i, p, None, True, error=g.error))
            elif is_abstention(g.text):
                out.append(IsolatedResponse(i, p, g.text, True))
            else:
                kws = extract_keywords(g.text or "", self.run.nlp)
                out.append(IsolatedResponse(i, p, g.text, False, keywords=kws))
        return tuple(out)

    def aggregate(
        self, query: str, responses: tuple[IsolatedResponse, ...]
    ) -> tuple[RobustAnswer, str | None]:
        """The answer without its final LLM call, and that call's prompt (``None``: no call)."""
        note = failures_note(responses)
        n = sum(not r.abstained for r in responses)
        counts = Counter(k for r in responses if not r.abstained for k in r.keywords)
        mu = self.cfg.threshold(n)
        kept = tuple(sorted(k for k, c in counts.items() if c >= mu))
        counted = dict(sorted(counts.items(), key=lambda kc: (-kc[1], kc[0])))  # not set order
        base = RobustAnswer(query, IDK, "keyword", responses, "", counted, mu, kept)
        if n == 0:
            why = f"all {len(responses)} isolated answers abstained" + note
            return replace(base, reason=why), None
        if not kept:
            why = f"no keyword reached the threshold mu = {mu:g} over {n} answers" + note
            return replace(base, reason=why), None
        why = f"{len(kept)} keyword(s) with count >= mu = {mu:g} over {n} non-abstaining answers"
        return replace(base, reason=why + note), self.cfg.prompt_for(query, kept)

    # ------------------------------------------------------------------ certificate

    def certificate(
        self,
        result: RobustAnswer,
        k_prime: int,
        attack: Attack,
        golds: list[str],
        progress: Progress | None = None,
    ) -> Flow[Certificate]:
        plan = self.plan(result.responses, k_prime, attack)
        if plan.verdict is not None:
            return Certificate(k_prime, attack, False, plan.verdict, None, (), plan.undecided)
        prompts = [self.cfg.prompt_for(result.query, kws) for kws in plan.keyword_sets if kws]
        if prompts:
            logger.info("certifying at k'=%d: %d LLM call(s)", k_prime, len(prompts))
        gens: list[Generation] = []
        for start in range(0, len(prompts), CERTIFY_BATCH):  # in batches, to report progress
            gens += yield Prompts(prompts[start : start + CERTIFY_BATCH], "certify")
            if progress is not None:
                progress(len(gens), len(prompts))
            if any(g.timed_out for g in gens):
                why = (
                    f"certification abandoned: the deadline (timeout={self.run.timeout} s) "
                    f"passed after {sum(g.ok for g in gens)} of {len(prompts)} LLM calls"
                )
                return Certificate(
                    k_prime, attack, False, why, None, plan.always_kept, plan.undecided
                )
        failed = [g for g in gens if not g.ok and not g.timed_out]
        if failed:  # an answer the LLM could not give is not one the attacker cannot cause
            why = (
                f"certification incomplete: {len(failed)} of {len(prompts)} LLM calls failed "
                f"(e.g. {failed[0].error})"
            )
            return Certificate(k_prime, attack, False, why, None, plan.always_kept, plan.undecided)
        it = iter(gens)
        answers = []
        for kws in plan.keyword_sets:
            if not kws:
                answers.append(IDK)  # nothing kept: the inference answers "I don't know"
                continue
            g = next(it)
            answers.append(IDK if not g.ok or is_abstention(g.text) else (g.text or "").strip())
        possible = tuple(dict.fromkeys(answers))
        # the answer given is the clean keyword set's (one of these), or with a gold answer a
        # correct one however a sampling LLM words it; else its own aggregation call failed
        given = answer_key(result.answer)
        stands = given in {answer_key(a) for a in possible}
        if not (stands or (golds and gives_answer(result.answer, golds))):
            why = (
                f"the answer given ({result.answer!r}) is not what the keyword sets give "
                f"({possible[0]!r}, ...): its own aggregation call failed or answered otherwise; "
                "answer again"
            )
            return Certificate(
                k_prime, attack, False, why, possible, plan.always_kept, plan.undecided
            )
        if golds:
            wrong = [a for a in possible if not gives_answer(a, golds)]
            ok = not wrong
            why = (
                f"all {len(possible)} possible answer(s) contain the gold answer"
                if ok
                else f"{len(wrong)} of {len(possible)} possible answers miss the gold answer, "
                f"e.g. {wrong[0]!r}"
            )
        else:
            others = [a for a in possible if answer_key(a) != given]
            ok = not others
            why = (
                f"every one of the {len(plan.keyword_sets)} keyword sets the attacker can cause "
                "gives the same answer"
                if ok
                else f"the attacker can change the answer, e.g. to {others[0]!r}"
            )
        why += f" ({len(plan.always_kept)} keyword(s) always kept, {len(plan.undecided)} undecided)"
        return Certificate(k_prime, attack, ok, why, possible, plan.always_kept, plan.undecided)

    def calls_needed(self, result: RobustAnswer, k_prime: int, attack: Attack) -> int:
        """LLM calls that certifying ``result`` at ``k_prime`` would make (0 if refused)."""
        return sum(1 for kws in self.plan(result.responses, k_prime, attack).keyword_sets if kws)

    def plan(self, responses: Sequence[IsolatedResponse], k_prime: int, attack: Attack) -> _Plan:
        """Every keyword set the attacker can cause (Appendix B: injection, C: modification)."""
        rr = self.cfg
        k = len(responses)
        benign = responses[: k - k_prime] if attack == "injection" else responses
        counts = Counter(k_ for r in benign if not r.abstained for k_ in r.keywords)
        n = sum(not r.abstained for r in benign)
        if attack == "injection":  # k_eff of the injected answers do not abstain
            cases = [(n + e, e, 0) for e in range(k_prime + 1)]
        else:  # k' rewritten answers: some answered, some abstained, some answer after
            cases = _rewrites(n, k - n, min(k_prime, k))
        sets: set[tuple[str, ...]] = set()
        always: set[str] | None = None
        undecided: set[str] = set()
        for n_eff, up, down in cases:
            mu = rr.threshold(n_eff)
            if up > 0 and mu <= up:
                return _Plan(
                    [],
                    verdict=f"with {n_eff} non-abstaining answers the threshold mu = {mu:g} "
                    f"is within reach of {up} malicious answer(s): any keyword can be injected",
                )
            w_a = {w for w, c in counts.items() if c - down >= mu}
            w_c = sorted(w for w, c in counts.items() if mu - up <= c < mu + down)
            if len(w_c) > rr.max_undecided:
                return _Plan(
                    [],
                    undecided=tuple(w_c),
                    verdict=f"{len(w_c)} keywords can be switched in "
                    f"or out by the attacker (more than the enumeration cap {rr.max_undecided})",
                )
            always = w_a if always is None else always & w_a
            undecided |= set(w_c)
            for size in range(len(w_c) + 1):
                for extra in combinations(w_c, size):
                    sets.add(tuple(sorted(w_a | set(extra))))
        calls = sum(1 for kws in sets if kws)  # the empty set answers "I don't know" unasked
        if calls > rr.max_certify_calls:
            return _Plan(
                [],
                undecided=tuple(sorted(undecided)),
                verdict=f"{len(sets)} possible keyword sets would need {calls} LLM calls "
                f"(budget max_certify_calls={rr.max_certify_calls})",
            )
        return _Plan(sorted(sets), tuple(sorted(always or ())), tuple(sorted(undecided)))


def _rewrites(answering: int, abstaining: int, k_prime: int) -> list[tuple[int, int, int]]:
    """What rewriting k' of the benign passages can do (Appendix C), as cases (answers that
    do not abstain, the most a keyword's count can rise, the most it can fall): r of the
    rewritten passages answered before and k' - r abstained (r <= answering, k' - r <=
    abstaining), and s of them answer after: n - r + s answers, counts up by s, down by r.
    Rewriting fewer passages is covered: a rewritten passage may give its benign answer."""
    return [
        (answering - r + s, s, r)
        for r in range(max(0, k_prime - abstaining), min(k_prime, answering) + 1)
        for s in range(k_prime + 1)
    ]


def _with_final(result: RobustAnswer, final: Generation) -> RobustAnswer:
    if not final.ok or is_abstention(final.text):
        why = f"aggregation call {'failed: ' + str(final.error) if final.error else 'abstained'}"
        return replace(result, answer=IDK, reason=f"{result.reason}; {why}")
    return replace(result, answer=(final.text or "").strip())
