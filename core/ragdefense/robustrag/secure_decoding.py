"""Secure decoding (RobustRAG Algorithm 2) and its certificate (Algorithm 4).

At every step the next-token distributions of the isolated contexts that do not answer
"I don't know" (probability < gamma) are averaged; the averaged top-1 is used when it leads the
top-2 by more than eta, else the no-retrieval token. Needs next-token probabilities
(:class:`ragdefense.llm.TransformersLLM`); runs locally, so the flows yield no prompt batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from ..llm import first_line_of
from ..llm.observe import stop_if_cancelled
from ..text import answer_key, gives_answer
from ..types import Passage
from .checks import check_count, check_real, check_templates
from .flow import Flow, Progress, Runtime
from .types import (
    IDK,
    NO_RETRIEVAL_PROMPT,
    Attack,
    Certificate,
    DecodingStep,
    IsolatedResponse,
    RobustAnswer,
    is_abstention,
)

__all__ = ["SecureDecoding"]

#: a top-2 gap must exceed eta by more than this to count as a lead: averaging rounds, and at
#: a tie (two tokens equally likely) leaves a gap of the order of the float epsilon that would
#: beat eta = 0 and pick whichever token the sort ranks first (an order of the passages); a
#: tie falls back to the no-retrieval token. The certificate compares with the same margin.
TIE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class SecureDecoding:
    """Secure decoding (Algorithm 2) and its settings:
    ``RobustRAG(TransformersLLM(...), aggregation=SecureDecoding(gamma=0.99, eta=0.0))``; needs
    an LLM exposing next-token probabilities.

    Args:
        gamma: Contexts whose probability of answering "I don't know" is >= gamma are dropped
            (paper: 0.99).
        eta: The averaged top-1 is used when it leads the top-2 by more than eta, else the
            no-retrieval token (paper: 0 for short QA).
        max_certify_responses: Certification explores at most this many responses.
        no_retrieval_prompt: The no-retrieval context's template (``{query}``); checked here.
    """

    gamma: float = 0.99
    eta: float = 0.0
    max_certify_responses: int = 64
    no_retrieval_prompt: str = NO_RETRIEVAL_PROMPT

    name: ClassVar[Literal["decoding"]] = "decoding"
    local: ClassVar[bool] = True  # CPU/GPU work in this process: async callers use a thread

    def __post_init__(self) -> None:
        check_real(gamma=self.gamma, eta=self.eta)
        check_count(max_certify_responses=self.max_certify_responses)
        if not 0 <= self.gamma <= 1 or self.eta < 0 or self.max_certify_responses < 1:
            raise ValueError(
                "need 0 <= gamma <= 1, eta >= 0 and max_certify_responses >= 1, got "
                f"{self.gamma}, {self.eta}, {self.max_certify_responses}"
            )
        check_templates(no_retrieval_prompt=self.no_retrieval_prompt)

    def bind(self, run: Runtime) -> _Decoding:
        """The algorithm with these settings, for one call of the engine."""
        return _Decoding(self, run)


class _Decoding:
    """Secure decoding for one call: its settings and the engine's :class:`Runtime`."""

    def __init__(self, cfg: SecureDecoding, run: Runtime) -> None:
        self.cfg, self.run = cfg, run

    def prompts(
        self, query: str, items: Sequence[Passage], choices: Sequence[str] | None
    ) -> list[str]:
        """The isolated prompts, one per passage."""
        return self.run.isolated_prompts(query, items)

    def calls_needed(self, result: RobustAnswer, k_prime: int, attack: Attack) -> int:
        """Certification runs the model locally; no generation call is made."""
        return 0

    def _token_llm(self) -> Any:
        llm = self.run.llm
        if not getattr(llm, "supports_token_probs", False) or not hasattr(llm, "session"):
            raise NotImplementedError(
                f"aggregation='decoding' needs next-token probabilities, which "
                f"{type(llm).__name__} does not expose: use aggregation='keyword' (any LLM), or "
                "a transformers model (TransformersLLM, the default)"
            )
        return llm

    def _sessions(
        self, query: str, passages: Sequence[Passage], numbers: Sequence[int] | None = None
    ) -> tuple[Any, list[float]]:
        """A session over the isolated contexts plus the no-retrieval context (last row), and
        each isolated context's probability of answering "I don't know" (teacher-forced).
        ``numbers``: each passage's index among the answer's passages (default: its place)."""
        numbers = range(len(passages)) if numbers is None else numbers
        llm = self._token_llm()
        prompts = self.run.isolated_prompts(query, passages)
        prompts.append(self.cfg.no_retrieval_prompt.format(query=query))
        session = llm.session(prompts)
        probe = session.clone()
        p_idk = [1.0] * len(passages)
        for token in _idk_tokens(llm, prompts[0]):  # every prompt ends alike
            probs = _finite(probe.probs, numbers)
            p_idk = [p * float(probs[j, token]) for j, p in enumerate(p_idk)]
            probe.advance(token)
        return session, p_idk

    def _is_end(self, token: int, tokens: Sequence[int]) -> bool:
        """Whether ``token``, after ``tokens``, ends the output: an end-of-text token, or a
        newline once the output holds text (a leading newline is skipped, as generation does)."""
        llm = self._token_llm()
        if token in llm.stop_ids:
            return True
        tok = llm.tokenizer
        return "\n" in tok.decode([token]) and bool(
            tok.decode([*tokens, token], skip_special_tokens=True).strip()
        )

    def answer(
        self, query: str, items: Sequence[Passage], choices: Sequence[str] | None
    ) -> Flow[RobustAnswer]:
        """Algorithm 2: average the kept contexts' next-token distributions at every step."""
        yield from ()  # local work: no prompt batch for the caller's LLM
        llm = self._token_llm()
        tok = llm.tokenizer
        session, p_idk = self._sessions(query, items)
        kept = [j for j, p in enumerate(p_idk) if p < self.cfg.gamma]
        responses = tuple(
            IsolatedResponse(j, p, None, p_idk[j] >= self.cfg.gamma, p_idk=p_idk[j])
            for j, p in enumerate(items)
        )
        if not kept:  # no passage supports an answer: the model's own memory is none (the
            # authors' code answers "I don't know" too; the average over no context is undefined)
            why = (
                f"all {len(items)} contexts abstain (P(I don't know) >= {self.cfg.gamma:g}): "
                "no passage supports an answer"
            )
            return RobustAnswer(query, IDK, "decoding", responses, why, steps=())
        session.keep_rows([*kept, len(items)])
        tokens: list[int] = []
        steps: list[DecodingStep] = []
        for _ in range(self.run.max_new_tokens):
            stop_if_cancelled()
            probs = _finite(session.probs, kept)
            nor = int(probs[-1].argmax())
            avg = probs[:-1].mean(axis=0)
            a, b = (int(i) for i in avg.argsort()[-1:-3:-1])
            use_a = float(avg[a] - avg[b]) > self.cfg.eta + TIE_TOLERANCE
            token = a if use_a else nor
            step = DecodingStep(
                tok.decode([token]),
                "retrieval" if use_a else "no-retrieval",
                tok.decode([a]),
                float(avg[a]),
                tok.decode([b]),
                float(avg[b]),
            )
            if token in llm.stop_ids:
                break
            ends = self._is_end(token, tokens)
            tokens.append(token)
            steps.append(step)
            if ends:
                break
            session.advance(token)
        answer = _answer_of(tok.decode(tokens, skip_special_tokens=True))
        n = len(kept)
        reason = (
            f"{n} of {len(items)} contexts kept (P(I don't know) < {self.cfg.gamma:g}); "
            f"{sum(st.source == 'retrieval' for st in steps)} of {len(steps)} tokens from "
            f"their averaged distribution (gap > eta = {self.cfg.eta:g}), "
            "the rest without retrieval"
        )
        return RobustAnswer(query, answer, "decoding", responses, reason, steps=tuple(steps))

    def certificate(
        self,
        result: RobustAnswer,
        k_prime: int,
        attack: Attack,
        golds: list[str],
        progress: Progress | None = None,
    ) -> Flow[Certificate]:
        """Algorithm 4 (and its modification variant), for the averaged inference rule: the
        published depth-first search, kept in one piece so that it reads as the paper does.

        With benign probability sums over the m benign contexts kept, top-1 a (sum A),
        runner-up (sum B) and best token other than a and the no-retrieval one (sum C), each
        way k' passages can act (:func:`_reach`: a shift s of any token's sum against
        another's, n contexts then averaged) and e = eta + :data:`TIE_TOLERANCE` (the lead the
        inference requires): if A - B > s + e * n in every way, the next token is always a;
        if some way gives A - C < s - e * n, the attacker can choose a token of its own, and
        the answer is not certifiable; otherwise the next token is a or the no-retrieval one,
        and only the latter where A + s > B + e * n in no way (the paper's third case).
        """
        yield from ()  # local work
        llm = self._token_llm()
        tok = llm.tokenizer
        k = len(result.responses)
        benign = [r for r in result.responses[: k - k_prime if attack == "injection" else k]]
        rows = [r for r in benign if not r.abstained]
        m = len(rows)
        if m == 0:
            return Certificate(
                k_prime,
                attack,
                False,
                "no benign context passes the abstention filter: the "
                "attacker's passages decide every token",
            )
        d = k_prime if attack == "injection" else 2 * k_prime
        reach = _reach(m, k_prime, attack, len(benign) - m)
        numbers = [r.index for r in rows]
        root, _ = self._sessions(result.query, [r.passage for r in rows], numbers)
        lead = self.cfg.eta + TIE_TOLERANCE  # as the inference compares
        stack: list[tuple[Any, list[int]]] = [(root, [])]
        finished: list[list[int]] = []
        while stack:
            session, tokens = stack.pop()
            while True:
                stop_if_cancelled()
                if len(tokens) >= self.run.max_new_tokens:
                    finished.append(tokens)
                    break
                probs = _finite(session.probs, numbers, after=tok.decode(tokens))
                total = probs[:-1].sum(axis=0)
                nor = int(probs[-1].argmax())
                a, b = (int(i) for i in total.argsort()[-1:-3:-1])
                gap = float(total[a] - total[b])
                rivals = np.delete(total, [a, nor])  # tokens the inference never falls back to
                rival_gap = float(total[a] - rivals.max()) if rivals.size else np.inf
                if any(s - rival_gap > lead * n for s, n in reach if n):
                    return Certificate(
                        k_prime,
                        attack,
                        False,
                        f"at token {len(tokens) + 1} the benign top token's lead "
                        f"{rival_gap:.3f} over the next but the no-retrieval one (sums over {m} "
                        f"contexts) is within the attacker's reach ({d}): it can choose the "
                        "next token",
                    )
                if all(n and gap - s > lead * n for s, n in reach):
                    choices = [a]  # a leads by more than eta however the attacker acts
                elif a != nor and any(n and gap + s > lead * n for s, n in reach):
                    choices = [a, nor]
                else:
                    choices = [nor]  # a never leads by more than eta: always the fallback
                if len(finished) + len(stack) + len(choices) > self.cfg.max_certify_responses:
                    return Certificate(
                        k_prime,
                        attack,
                        False,
                        f"more than {self.cfg.max_certify_responses} possible "
                        "responses (max_certify_responses)",
                    )
                for extra in choices[1:]:  # branch: the no-retrieval token
                    if self._is_end(extra, tokens):
                        finished.append(tokens + ([] if extra in llm.stop_ids else [extra]))
                    else:
                        other = session.clone()
                        other.advance(extra)
                        stack.append((other, [*tokens, extra]))
                token = choices[0]
                if self._is_end(token, tokens):
                    finished.append(tokens + ([] if token in llm.stop_ids else [token]))
                    break
                tokens = [*tokens, token]
                session.advance(token)
        # each possible output read as the inference reads it: its first line, "I don't know"
        # where that is empty or abstains (says "I don't know"); a hedge such as "Paris or
        # London" is kept as written
        possible = tuple(
            dict.fromkeys(_answer_of(tok.decode(t, skip_special_tokens=True)) for t in finished)
        )
        if any(n == 0 for _, n in reach) and IDK not in possible:  # every context silenced:
            possible += (IDK,)  # the inference abstains ("I don't know"), never decodes
        if golds:
            ok = all(gives_answer(a, golds) for a in possible)
            why = f"{len(possible)} possible answer(s); " + (
                "all contain the gold answer" if ok else "some miss the gold answer"
            )
        else:
            given = answer_key(result.answer)
            ok = all(answer_key(a) == given for a in possible)
            why = f"{len(possible)} possible answer(s); " + (
                "all equal the answer" if ok else "the attacker can change the answer"
            )
        return Certificate(k_prime, attack, ok, why, possible)


def _reach(m: int, k_prime: int, attack: Attack, silent: int) -> list[tuple[int, int]]:
    """Each way ``k_prime`` attacker passages can act on one decoding step of ``m`` benign
    contexts (``silent`` more benign contexts abstain), as (s, n): s, the most it moves one
    token's probability sum against another's, and n, the contexts then averaged (0: none, the
    no-retrieval token). Injection adds up to k' contexts (each moves a sum by 1 at most);
    modification silences a context (1: it abstains), rewrites one (2) or makes a silent one
    answer (1)."""
    if attack == "injection":
        return [(j, m + j) for j in range(k_prime + 1)]
    ways = set()
    for quiet in range(min(k_prime, m) + 1):
        for rewritten in range(min(k_prime - quiet, m - quiet) + 1):
            for woken in range(min(k_prime - quiet - rewritten, silent) + 1):
                ways.add((quiet + 2 * rewritten + woken, m - quiet + woken))
    return sorted(ways)


def _answer_of(decoded: str) -> str:
    """The answer a decoded output gives: its first line, or "I don't know" where that is empty
    or abstains. The inference and the certificate read outputs alike."""
    text = first_line_of(decoded)
    return text if text and not is_abstention(text) else IDK


def _idk_tokens(llm: Any, prompt: str) -> list[int]:
    """The tokens of "I don't know" as the model writes them after ``prompt``: after a raw
    prompt's "Answer:" with the space a tokenizer folds into the first word (" I" is another
    token than "I"), after a chat template's turn without it."""
    tok = llm.tokenizer
    head = llm.format(prompt) if hasattr(llm, "format") else prompt
    said = head + ("" if head[-1:].isspace() else " ") + IDK
    start = tok(head, add_special_tokens=False)["input_ids"]
    full = tok(said, add_special_tokens=False)["input_ids"]
    if list(full[: len(start)]) == list(start) and len(full) > len(start):
        return list(full[len(start) :])
    alone = tok(said[len(head) :], add_special_tokens=False)["input_ids"]
    return list(alone or tok(IDK, add_special_tokens=False)["input_ids"])


def _finite(probs: Any, numbers: Sequence[int] | None = None, after: str | None = None) -> Any:
    """``probs`` where every row is a distribution of finite numbers, else ``ValueError``: one
    NaN row would make every average NaN and every token silently the no-retrieval one (and a
    certificate's verdict meaningless); a row of log-probabilities or scores, negative or summing
    past 1 (a truncated row may sum to less), would break the bound each context's row is
    certified on (it moves a sum by at most 1). ``numbers``: the passage number of each row but the
    last, the no-retrieval context's, which the error names so; ``after``: the output decoded
    so far on the certificate's branch. Returned in float64: a model's float32 rows, averaged
    in float32, leave a tie a gap past :data:`TIE_TOLERANCE`."""
    probs = np.asarray(probs, dtype=np.float64)
    finite = np.isfinite(probs).all(axis=1)
    ok = finite & (probs >= -1e-6).all(axis=1) & (probs.sum(axis=1) <= 1 + 1e-3)
    bad = np.flatnonzero(~ok).tolist()
    if not bad:
        return probs
    where = f"context(s) {bad}"
    if numbers is not None:
        named = [numbers[i] for i in bad if i < len(numbers)]
        parts = [f"the passage(s) at index {named}"] if named else []
        parts += ["the no-retrieval context"] if any(i >= len(numbers) for i in bad) else []
        where = " and ".join(parts)
    on = "" if after is None else f" while certifying, after the output {after!r}"
    kinds = ["not finite"] * (not finite[bad].all())
    kinds += ["no distribution (< 0 or summing past 1)"] * bool(finite[bad].any())
    what = ", or ".join(kinds)  # rows of both kinds: both said
    raise ValueError(f"the model's next-token probabilities of {where} are {what}{on}")
