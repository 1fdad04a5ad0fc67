"""RobustRAG (Xiang et al.): isolate-then-aggregate answering with certifiable robustness.

Each retrieved passage is answered in isolation (one LLM call per passage, sent as one batch);
the isolated answers are then aggregated securely, so that k' injected passages can move the
result only by a bounded amount:

* ``aggregation="keyword"`` (Algorithm 1): keywords of the non-abstaining answers are counted
  (once per answer); those with count >= mu = min(alpha * n, beta) are kept and the LLM answers
  from them, sorted.
* ``aggregation="majority"``: for multiple-choice questions, a vote over the isolated choices.

A certificate (Appendix B and C of the paper) says, for a number k' of injected (or modified)
passages, whether the answer provably cannot change, and why. Passages must be given in
retrieval rank order: an injection attack pushes out the *bottom* k' passages.
"""

from __future__ import annotations

import asyncio
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from typing import Any, Literal

from .keywords import extract_keywords, load_spacy
from .llm import LLM, Generation, _first_line, as_llm
from .types import Passage, PassageLike, check_query, to_passages

__all__ = [
    "ISOLATED_PROMPT",
    "KEYWORD_PROMPT",
    "MULTIPLE_CHOICE_PROMPT",
    "NO_RETRIEVAL_PROMPT",
    "Certificate",
    "DecodingStep",
    "IsolatedResponse",
    "RobustAnswer",
    "RobustRAG",
    "is_abstention",
]

# Default prompts, after the paper's templates (Appendix G), zero-shot.
ISOLATED_PROMPT = (
    "Context information is below.\n---------------------\n{context}\n---------------------\n"
    "Given the context information and not prior knowledge, answer the query with no more than "
    'ten words. If the context does not contain the answer, just say "I don\'t know".\n'
    "Query: {query}\nAnswer:"
)
KEYWORD_PROMPT = (
    "Word suggestion is below.\n---------------------\n{keywords}\n---------------------\n"
    "Given the word suggestion provided by experts, concisely answer the query.\n"
    "Query: {query}\nAnswer:"
)
MULTIPLE_CHOICE_PROMPT = (
    "Context information is below.\n---------------------\n{context}\n---------------------\n"
    "Given the context information and not prior knowledge, answer the query with the best "
    "candidate.\nQuery: {query}\nCandidates:\n{choices}\nE. No information found\n"
    "Output an answer from {letters} only when there is clear evidence. Otherwise, output "
    "'E. No information found' as the answer.\nAnswer:"
)
NO_RETRIEVAL_PROMPT = (
    "Answer the query with no more than ten words. If you do not know the answer confidently, "
    'just say "I don\'t know".\nQuery: {query}\nAnswer:'
)
IDK = "I don't know"
Attack = Literal["injection", "modification"]
NO_INFO = "E"

_ABSTAIN = re.compile(
    r"\bi\s+(?:don['\u2019]?t|do\s+not)\s+know\b"
    r"|\bnot\s+sure\b"
    r"|\bno\s+(?:relevant\s+)?information\b"
    r"|\b(?:cannot|can['\u2019]?t|unable\s+to)\s+(?:answer|determine|find)\b"
    r"|\b(?:does\s+not|doesn['\u2019]?t)\s+(?:contain|mention|provide)\b",
    re.IGNORECASE,
)
_CHOICE = re.compile(r"^\W*([A-Z])(?:[\.\):\s]|$)")


def is_abstention(text: str | None) -> bool:
    """Whether an isolated answer abstains: empty, failed, saying "I don't know", or one of the
    usual paraphrases of small models ("I'm not sure", "no information", "cannot answer",
    "the context does not contain ...")."""
    return text is None or not text.strip() or bool(_ABSTAIN.search(text))


def _norm(text: str) -> str:
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(text.split())


def _contains(response: str, answers: Sequence[str]) -> bool:
    r = _norm(response)
    return any(_norm(a) and _norm(a) in r for a in answers)


@dataclass(frozen=True)
class IsolatedResponse:
    """The LLM's answer from one passage alone."""

    index: int
    passage: Passage
    text: str | None
    abstained: bool
    error: str | None = None
    keywords: frozenset[str] = frozenset()
    choice: str | None = None  # majority vote: the chosen letter ("E" = no information)
    p_idk: float | None = None  # decoding: probability that the answer is "I don't know"


@dataclass(frozen=True)
class DecodingStep:
    """One token of secure decoding: the averaged top-2, their gap, and which token was used."""

    token: str
    source: Literal["retrieval", "no-retrieval"]
    top1: str
    p1: float
    top2: str
    p2: float

    @property
    def gap(self) -> float:
        """Averaged top-1 minus top-2 probability."""
        return self.p1 - self.p2


@dataclass(frozen=True)
class Certificate:
    """Whether the answer provably survives k' injected (or modified) passages, and why."""

    k_prime: int
    attack: Attack
    certified: bool
    reason: str
    possible_answers: tuple[str, ...] | None = None  # every answer the attacker can cause
    always_kept: tuple[str, ...] = ()  # keyword aggregation: keywords the attacker cannot drop
    undecided: tuple[str, ...] = ()  # keyword aggregation: keywords the attacker controls


@dataclass(frozen=True)
class RobustAnswer:
    """RobustRAG's answer and the report behind it."""

    query: str
    answer: str
    aggregation: Literal["keyword", "majority", "decoding"]
    responses: tuple[IsolatedResponse, ...]
    reason: str
    keyword_counts: dict[str, int] = field(default_factory=dict)
    threshold: float | None = None
    kept_keywords: tuple[str, ...] = ()
    votes: dict[str, int] = field(default_factory=dict)
    choice: str | None = None  # majority vote: the winning letter
    steps: tuple[DecodingStep, ...] = ()  # decoding aggregation: one per generated token
    certificate: Certificate | None = None

    @property
    def abstentions(self) -> list[int]:
        """Indices of the passages whose isolated answer abstained (or failed)."""
        return [r.index for r in self.responses if r.abstained]

    def __str__(self) -> str:
        lines = [f"RobustRAG ({self.aggregation}): {self.answer!r}", f"  why: {self.reason}"]
        for r in self.responses:
            tag = "abstained" if r.abstained else (f"chose {r.choice}" if r.choice else "answered")
            text = r.error or r.text or ""
            if r.p_idk is not None:
                tag, text = (
                    ("dropped" if r.abstained else "kept"),
                    f"P(I don't know) = {r.p_idk:.3f}",
                )
            lines.append(f"  [{r.index}] {tag:10} {text[:70]}")
        if self.keyword_counts:
            top = sorted(self.keyword_counts.items(), key=lambda kv: (-kv[1], kv[0]))[:12]
            lines.append("  keyword counts: " + ", ".join(f"{k} ({c})" for k, c in top))
            lines.append(f"  threshold mu = {self.threshold:g}; kept: {list(self.kept_keywords)}")
        if self.votes:
            lines.append(f"  votes: {dict(self.votes)}")
        for st in self.steps:
            lines.append(
                f"  token {st.token!r:12} from {st.source:12} top-2 {st.top1!r} {st.p1:.3f} / "
                f"{st.top2!r} {st.p2:.3f} (gap {st.gap:.3f})"
            )
        if self.certificate is not None:
            c = self.certificate
            verdict = "CERTIFIED" if c.certified else "not certified"
            lines.append(f"  certificate (k'={c.k_prime}, {c.attack}): {verdict}: {c.reason}")
        return "\n".join(lines)


@dataclass
class _KeywordPlan:
    """What certification of keyword aggregation must ask the LLM (or its verdict already)."""

    keyword_sets: list[tuple[str, ...]]
    always_kept: tuple[str, ...] = ()
    undecided: tuple[str, ...] = ()
    verdict: str | None = None  # set when no LLM call can help: the reason it is not certified


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
        isolated_prompt, keyword_prompt, choice_prompt: Prompt templates (``{context}``,
            ``{query}``, ``{keywords}``, ``{choices}``, ``{letters}``).
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
        isolated_prompt: str = ISOLATED_PROMPT,
        no_retrieval_prompt: str = NO_RETRIEVAL_PROMPT,
        keyword_prompt: str = KEYWORD_PROMPT,
        choice_prompt: str = MULTIPLE_CHOICE_PROMPT,
    ) -> None:
        if aggregation not in ("keyword", "majority", "decoding"):
            raise ValueError(
                f"aggregation must be 'keyword', 'majority' or 'decoding', got {aggregation!r}"
            )
        if not 0 <= alpha <= 1 or beta <= 0:
            raise ValueError(f"need 0 <= alpha <= 1 and beta > 0, got {alpha}, {beta}")
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
        self.no_retrieval_prompt = no_retrieval_prompt
        self.isolated_prompt = isolated_prompt
        self.keyword_prompt = keyword_prompt
        self.choice_prompt = choice_prompt

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

    # ------------------------------------------------------------------ prompts

    def isolated_prompts(
        self, query: str, passages: Sequence[Passage], choices: Sequence[str] | None = None
    ) -> list[str]:
        """One prompt per passage (the passage alone as context)."""
        if self.aggregation == "majority":
            choices = self._check_choices(choices)
            letters = [chr(ord("A") + i) for i in range(len(choices))]
            listing = "\n".join(
                f"{letter}. {c}" for letter, c in zip(letters, choices, strict=True)
            )
            said = ", ".join(letters[:-1]) + f", or {letters[-1]}"
            return [
                self.choice_prompt.format(
                    context=p.text, query=query, choices=listing, letters=said
                )
                for p in passages
            ]
        return [self.isolated_prompt.format(context=p.text, query=query) for p in passages]

    def keyword_prompt_for(self, query: str, keywords: Sequence[str]) -> str:
        """The aggregation prompt for a (sorted) keyword list."""
        return self.keyword_prompt.format(keywords=", ".join(keywords), query=query)

    @staticmethod
    def _check_choices(choices: Sequence[str] | None) -> list[str]:
        if not choices or isinstance(choices, str) or not 2 <= len(choices) <= 4:
            raise ValueError("majority vote needs 2 to 4 choices (letters A-D; E = no information)")
        return [str(c) for c in choices]

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
    ) -> RobustAnswer:
        """Answer ``query`` from ``passages`` (in retrieval rank order).

        Args:
            choices: The candidate answers (majority vote only).
            certify: k', the number of injected (or modified) passages to certify against.
            attack: ``"injection"`` (k' passages pushed in, the bottom k' pushed out) or
                ``"modification"`` (any k' passages rewritten).
            gold: Correct answer string(s): certify correctness instead of stability.
        """
        query, items = check_query(query), to_passages(passages)
        if not items:
            return self._empty(query)
        if self.aggregation == "decoding":
            result = self._decode(query, items)
            if certify is not None:
                result = self.certify(result, certify, attack=attack, gold=gold)
            return result
        gens = self.llm.generate(self.isolated_prompts(query, items, choices), self.max_new_tokens)
        responses = self._responses(items, gens)
        result, final_prompt = self._aggregate(query, responses, choices)
        if final_prompt is not None:
            [final] = self.llm.generate([final_prompt], self.max_new_tokens)
            result = self._with_final(result, final)
        if certify is not None:
            result = self.certify(result, certify, attack=attack, gold=gold)
        return result

    def certify(
        self,
        result: RobustAnswer,
        k_prime: int,
        *,
        attack: Attack = "injection",
        gold: Sequence[str] | str | None = None,
    ) -> RobustAnswer:
        """Certify an answer already computed (its isolated responses are reused): a copy of
        ``result`` with its :class:`Certificate` for ``k_prime`` injected / modified passages."""
        if self.aggregation == "decoding":
            refusal = self._plan(result, k_prime, attack).verdict
            if refusal is not None:
                cert = Certificate(k_prime, attack, False, refusal)
                return _replace(result, certificate=cert)
            return _replace(
                result, certificate=self._decoding_certificate(result, k_prime, attack, gold)
            )
        plan = self._plan(result, k_prime, attack)
        prompts = self._plan_prompts(result.query, plan)
        gens = self.llm.generate(prompts, self.max_new_tokens) if prompts else []
        return self._certified(result, k_prime, attack, plan, self._plan_answers(plan, gens), gold)

    async def acertify(
        self,
        result: RobustAnswer,
        k_prime: int,
        *,
        attack: Attack = "injection",
        gold: Sequence[str] | str | None = None,
    ) -> RobustAnswer:
        """Async :meth:`certify`."""
        plan = self._plan(result, k_prime, attack)
        prompts = self._plan_prompts(result.query, plan)
        gens = await self.llm.agenerate(prompts, self.max_new_tokens) if prompts else []
        return self._certified(result, k_prime, attack, plan, self._plan_answers(plan, gens), gold)

    async def aanswer(
        self,
        query: str,
        passages: Sequence[PassageLike],
        *,
        choices: Sequence[str] | None = None,
        certify: int | None = None,
        attack: Attack = "injection",
        gold: Sequence[str] | str | None = None,
    ) -> RobustAnswer:
        """Async :meth:`answer` (the LLM calls go through the backend's async path)."""
        query, items = check_query(query), to_passages(passages)
        if not items:
            return self._empty(query)
        if self.aggregation == "decoding":  # local CPU/GPU work: run it off the event loop
            return await asyncio.to_thread(
                self.answer, query, items, certify=certify, attack=attack, gold=gold
            )
        prompts = self.isolated_prompts(query, items, choices)
        responses = self._responses(items, await self.llm.agenerate(prompts, self.max_new_tokens))
        result, final_prompt = self._aggregate(query, responses, choices)
        if final_prompt is not None:
            [final] = await self.llm.agenerate([final_prompt], self.max_new_tokens)
            result = self._with_final(result, final)
        if certify is not None:
            result = await self.acertify(result, certify, attack=attack, gold=gold)
        return result

    def _empty(self, query: str) -> RobustAnswer:
        return RobustAnswer(query, IDK, self.aggregation, (), "no passages were given")

    def _responses(
        self, items: Sequence[Passage], gens: Sequence[Generation]
    ) -> tuple[IsolatedResponse, ...]:
        out = []
        for i, (p, g) in enumerate(zip(items, gens, strict=True)):
            if not g.ok:
                out.append(IsolatedResponse(i, p, None, True, error=g.error))
            elif self.aggregation == "majority":
                m = _CHOICE.match(g.text or "")
                letter = m.group(1) if m else NO_INFO
                out.append(IsolatedResponse(i, p, g.text, letter == NO_INFO, choice=letter))
            elif is_abstention(g.text):
                out.append(IsolatedResponse(i, p, g.text, True))
            else:
                kws = extract_keywords(g.text or "", self.nlp)
                out.append(IsolatedResponse(i, p, g.text, False, keywords=kws))
        return tuple(out)

    def threshold(self, n: int) -> float:
        """The keyword threshold ``mu = min(alpha * n, beta)``."""
        return min(self.alpha * n, self.beta)

    def _aggregate(
        self,
        query: str,
        responses: tuple[IsolatedResponse, ...],
        choices: Sequence[str] | None = None,
    ) -> tuple[RobustAnswer, str | None]:
        failed = sum(r.error is not None for r in responses)
        note = f" ({failed} LLM call(s) failed, counted as abstentions)" if failed else ""
        if self.aggregation == "majority":
            votes = Counter(r.choice for r in responses if r.choice and r.choice != NO_INFO)
            if not votes:
                why = "every isolated answer abstained (no information found)" + note
                return RobustAnswer(query, IDK, "majority", responses, why), None
            ranked = sorted(votes.items(), key=lambda kv: (-kv[1], kv[0]))
            winner, count = ranked[0]
            runner = ranked[1][1] if len(ranked) > 1 else 0
            why = f"{winner} has {count} of {sum(votes.values())} votes (runner-up {runner})" + note
            idx = ord(winner) - ord("A")
            text = f"{winner}. {choices[idx]}" if choices and idx < len(choices) else winner
            answer = RobustAnswer(
                query, text, "majority", responses, why, votes=dict(votes), choice=winner
            )
            return answer, None
        n = sum(not r.abstained for r in responses)
        counts = Counter(k for r in responses if not r.abstained for k in r.keywords)
        mu = self.threshold(n)
        kept = tuple(sorted(k for k, c in counts.items() if c >= mu))
        base = RobustAnswer(query, IDK, "keyword", responses, "", dict(counts), mu, kept)
        if n == 0:
            why = f"all {len(responses)} isolated answers abstained" + note
            return _replace(base, reason=why), None
        if not kept:
            why = f"no keyword reached the threshold mu = {mu:g} over {n} answers" + note
            return _replace(base, reason=why), None
        why = f"{len(kept)} keyword(s) with count >= mu = {mu:g} over {n} non-abstaining answers"
        return _replace(base, reason=why + note), self.keyword_prompt_for(query, kept)

    @staticmethod
    def _with_final(result: RobustAnswer, final: Generation) -> RobustAnswer:
        if not final.ok or is_abstention(final.text):
            why = (
                f"aggregation call {'failed: ' + str(final.error) if final.error else 'abstained'}"
            )
            return _replace(result, answer=IDK, reason=f"{result.reason}; {why}")
        return _replace(result, answer=(final.text or "").strip())

    # ------------------------------------------------------------------ certification

    def _plan(self, result: RobustAnswer, k_prime: int, attack: Attack) -> _KeywordPlan:
        if attack not in ("injection", "modification"):
            raise ValueError(f"attack must be 'injection' or 'modification', got {attack!r}")
        k = len(result.responses)
        if k_prime < 1:
            return _KeywordPlan([], verdict="k' must be >= 1")
        if 2 * k_prime >= k:
            return _KeywordPlan(
                [],
                verdict=f"k'={k_prime} >= k/2 (k={k}): an attacker controlling half of the "
                "passages can decide the answer; no certificate is possible",
            )
        if self.aggregation != "keyword":
            return _KeywordPlan([])  # decided from the votes / by decoding, not keyword sets
        return self._keyword_plan(result.responses, k_prime, attack)

    def _keyword_plan(
        self, responses: Sequence[IsolatedResponse], k_prime: int, attack: Attack
    ) -> _KeywordPlan:
        k = len(responses)
        benign = responses[: k - k_prime] if attack == "injection" else responses
        counts = Counter(k_ for r in benign if not r.abstained for k_ in r.keywords)
        n = sum(not r.abstained for r in benign)
        if attack == "injection":  # k_eff of the injected answers do not abstain
            cases = [(n + e, e, 0) for e in range(k_prime + 1)]
        else:  # k' rewritten answers: n moves by up to k', each count by up to +-k'
            cases = [
                (m, k_prime, k_prime) for m in range(max(0, n - k_prime), min(k, n + k_prime) + 1)
            ]
        sets: set[tuple[str, ...]] = set()
        always: set[str] | None = None
        undecided: set[str] = set()
        for n_eff, up, down in cases:
            mu = self.threshold(n_eff)
            if up > 0 and mu <= up:
                return _KeywordPlan(
                    [],
                    verdict=f"with {n_eff} non-abstaining answers the threshold mu = {mu:g} "
                    f"is within reach of {up} malicious answer(s): any keyword can be injected",
                )
            w_a = {w for w, c in counts.items() if c - down >= mu}
            w_c = sorted(w for w, c in counts.items() if mu - up <= c < mu + down)
            if len(w_c) > self.max_undecided:
                return _KeywordPlan(
                    [],
                    undecided=tuple(w_c),
                    verdict=f"{len(w_c)} keywords can be switched in "
                    f"or out by the attacker (more than the enumeration cap {self.max_undecided})",
                )
            always = w_a if always is None else always & w_a
            undecided |= set(w_c)
            for size in range(len(w_c) + 1):
                for extra in combinations(w_c, size):
                    sets.add(tuple(sorted(w_a | set(extra))))
        if len(sets) > self.max_certify_calls:
            return _KeywordPlan(
                [],
                undecided=tuple(sorted(undecided)),
                verdict=f"{len(sets)} possible keyword "
                f"sets would need as many LLM calls (budget max_certify_calls="
                f"{self.max_certify_calls})",
            )
        return _KeywordPlan(sorted(sets), tuple(sorted(always or ())), tuple(sorted(undecided)))

    def _plan_prompts(self, query: str, plan: _KeywordPlan) -> list[str]:
        return [self.keyword_prompt_for(query, kws) for kws in plan.keyword_sets if kws]

    @staticmethod
    def _plan_answers(plan: _KeywordPlan, gens: Sequence[Generation]) -> list[str]:
        it = iter(gens)
        out = []
        for kws in plan.keyword_sets:
            if not kws:
                out.append(IDK)  # nothing kept: the inference answers "I don't know"
                continue
            g = next(it)
            out.append(IDK if not g.ok or is_abstention(g.text) else (g.text or "").strip())
        return out

    def _certified(
        self,
        result: RobustAnswer,
        k_prime: int,
        attack: Attack,
        plan: _KeywordPlan,
        answers: list[str],
        gold: Sequence[str] | str | None,
    ) -> RobustAnswer:
        golds = [gold] if isinstance(gold, str) else list(gold or [])
        if plan.verdict is not None:
            cert = Certificate(k_prime, attack, False, plan.verdict, None, (), plan.undecided)
            return _replace(result, certificate=cert)
        if self.aggregation == "majority":
            cert = self._vote_certificate(result, k_prime, attack, golds)
            return _replace(result, certificate=cert)
        possible = tuple(dict.fromkeys(answers))
        if golds:
            wrong = [a for a in possible if not _contains(a, golds)]
            ok = not wrong
            why = (
                f"all {len(possible)} possible answer(s) contain the gold answer"
                if ok
                else f"{len(wrong)} of {len(possible)} possible answers miss the gold answer, "
                f"e.g. {wrong[0]!r}"
            )
        else:
            others = [a for a in possible if _norm(a) != _norm(result.answer)]
            ok = not others
            why = (
                f"every one of the {len(plan.keyword_sets)} keyword sets the attacker can cause "
                "gives the same answer"
                if ok
                else f"the attacker can change the answer, e.g. to {others[0]!r}"
            )
        why += f" ({len(plan.always_kept)} keyword(s) always kept, {len(plan.undecided)} undecided)"
        cert = Certificate(k_prime, attack, ok, why, possible, plan.always_kept, plan.undecided)
        return _replace(result, certificate=cert)

    @staticmethod
    def _vote_certificate(
        result: RobustAnswer, k_prime: int, attack: Attack, golds: list[str]
    ) -> Certificate:
        k = len(result.responses)
        benign = result.responses[: k - k_prime] if attack == "injection" else result.responses
        votes = Counter(r.choice for r in benign if r.choice and r.choice != NO_INFO)
        ranked = sorted(votes.items(), key=lambda kv: (-kv[1], kv[0]))
        if not ranked:
            return Certificate(k_prime, attack, False, "no benign vote: the attacker decides")
        winner, a = ranked[0]
        b = ranked[1][1] if len(ranked) > 1 else 0
        need = k_prime if attack == "injection" else 2 * k_prime
        ok = a - b > need
        why = f"{winner} leads {a} to {b} among the benign votes; the attacker can move {need}"
        if ok and golds and winner not in golds:
            ok, why = False, why + f", but the certified winner {winner} is not the gold answer"
        elif ok and winner != result.choice:
            ok, why = False, why + f", but it differs from the answer {result.answer}"
        return Certificate(k_prime, attack, ok, why, (winner,) if a - b > need else None)

    # ------------------------------------------------------------------ secure decoding

    def _token_llm(self) -> Any:
        llm = self.llm
        if not getattr(llm, "supports_token_probs", False) or not hasattr(llm, "session"):
            raise NotImplementedError(
                f"aggregation='decoding' needs next-token probabilities, which "
                f"{type(llm).__name__} does not expose: use aggregation='keyword' (any LLM), or "
                "a transformers model (TransformersLLM, the default)"
            )
        return llm

    def _sessions(self, query: str, passages: Sequence[Passage]) -> tuple[Any, list[float]]:
        """A session over the isolated contexts plus the no-retrieval context (last row), and
        each isolated context's probability of answering "I don't know" (teacher-forced)."""
        llm = self._token_llm()
        prompts = [self.isolated_prompt.format(context=p.text, query=query) for p in passages]
        session = llm.session([*prompts, self.no_retrieval_prompt.format(query=query)])
        probe = session.clone()
        p_idk = [1.0] * len(passages)
        for token in llm.tokenizer(IDK, add_special_tokens=False)["input_ids"]:
            p_idk = [p * float(probe.probs[j, token]) for j, p in enumerate(p_idk)]
            probe.advance(token)
        return session, p_idk

    def _is_end(self, token: int) -> bool:
        llm = self._token_llm()
        return token in llm.stop_ids or "\n" in llm.tokenizer.decode([token])

    def _decode(self, query: str, items: Sequence[Passage]) -> RobustAnswer:
        """Algorithm 2: average the kept contexts' next-token distributions at every step."""
        llm = self._token_llm()
        tok = llm.tokenizer
        session, p_idk = self._sessions(query, items)
        kept = [j for j, p in enumerate(p_idk) if p < self.gamma]
        responses = tuple(
            IsolatedResponse(j, p, None, p_idk[j] >= self.gamma, p_idk=p_idk[j])
            for j, p in enumerate(items)
        )
        session.keep_rows([*kept, len(items)])
        tokens: list[int] = []
        steps: list[DecodingStep] = []
        for _ in range(self.max_new_tokens):
            probs = session.probs
            nor = int(probs[-1].argmax())
            if kept:
                avg = probs[:-1].mean(axis=0)
                a, b = (int(i) for i in avg.argsort()[-1:-3:-1])
                use_a = float(avg[a] - avg[b]) > self.eta
                token = a if use_a else nor
                step = DecodingStep(
                    tok.decode([token]),
                    "retrieval" if use_a else "no-retrieval",
                    tok.decode([a]),
                    float(avg[a]),
                    tok.decode([b]),
                    float(avg[b]),
                )
            else:
                token = nor
                step = DecodingStep(tok.decode([nor]), "no-retrieval", "", 0.0, "", 0.0)
            if token in llm.stop_ids:
                break
            tokens.append(token)
            steps.append(step)
            if "\n" in tok.decode([token]):
                break
            session.advance(token)
        text = _first_line(tok.decode(tokens, skip_special_tokens=True))
        answer = text if text and not is_abstention(text) else IDK
        n = len(kept)
        reason = (
            f"{n} of {len(items)} contexts kept (P(I don't know) < {self.gamma:g}); "
            f"{sum(st.source == 'retrieval' for st in steps)} of {len(steps)} tokens from "
            f"their averaged distribution (gap > eta = {self.eta:g}), the rest without retrieval"
        )
        return RobustAnswer(query, answer, "decoding", responses, reason, steps=tuple(steps))

    def _decoding_certificate(
        self, result: RobustAnswer, k_prime: int, attack: Attack, gold: Sequence[str] | str | None
    ) -> Certificate:
        """Algorithm 4 (and its modification variant), for the averaged inference rule.

        With benign probability sums S over the m benign contexts kept, top-1 a (sum A) and
        runner-up (sum B), an attacker shifting any token's sum by at most d = k' (injection) or
        2k' (modification) with n in [n_lo, n_hi] contexts averaged: if A - B > d + eta * n_hi
        the next token is always a; if A - B >= d - eta * n_lo it is a or the no-retrieval
        token; otherwise the attacker can choose it, and the answer is not certifiable.
        """
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
        n_hi, n_lo = m + k_prime, (m if attack == "injection" else max(1, m - k_prime))
        root, _ = self._sessions(result.query, [r.passage for r in rows])
        stack: list[tuple[Any, list[int]]] = [(root, [])]
        finished: list[list[int]] = []
        while stack:
            session, tokens = stack.pop()
            while True:
                if len(tokens) >= self.max_new_tokens:
                    finished.append(tokens)
                    break
                probs = session.probs
                total = probs[:-1].sum(axis=0)
                a, b = (int(i) for i in total.argsort()[-1:-3:-1])
                gap = float(total[a] - total[b])
                nor = int(probs[-1].argmax())
                if gap > d + self.eta * n_hi:
                    choices = [a]
                elif gap >= d - self.eta * n_lo:
                    choices = [a] if a == nor else [a, nor]
                else:
                    return Certificate(
                        k_prime,
                        attack,
                        False,
                        f"at token {len(tokens) + 1} the benign top-2 "
                        f"gap {gap:.3f} (sums over {m} contexts) is within the attacker's reach "
                        f"({d}): it can choose the next token",
                    )
                if len(finished) + len(stack) + len(choices) > self.max_certify_responses:
                    return Certificate(
                        k_prime,
                        attack,
                        False,
                        f"more than {self.max_certify_responses} possible "
                        "responses (max_certify_responses)",
                    )
                for extra in choices[1:]:  # branch: the no-retrieval token
                    if self._is_end(extra):
                        finished.append(tokens + ([] if extra in llm.stop_ids else [extra]))
                    else:
                        other = session.clone()
                        other.advance(extra)
                        stack.append((other, [*tokens, extra]))
                token = choices[0]
                if self._is_end(token):
                    finished.append(tokens + ([] if token in llm.stop_ids else [token]))
                    break
                tokens = [*tokens, token]
                session.advance(token)
        possible = tuple(
            dict.fromkeys(
                (_first_line(tok.decode(t, skip_special_tokens=True)) or IDK) for t in finished
            )
        )
        golds = [gold] if isinstance(gold, str) else list(gold or [])
        if golds:
            ok = all(_contains(a, golds) for a in possible)
            why = f"{len(possible)} possible answer(s); " + (
                "all contain the gold answer" if ok else "some miss the gold answer"
            )
        else:
            ok = all(_norm(a) == _norm(result.answer) for a in possible)
            why = f"{len(possible)} possible answer(s); " + (
                "all equal the answer" if ok else "the attacker can change the answer"
            )
        return Certificate(k_prime, attack, ok, why, possible)


def _replace(result: RobustAnswer, **changes: Any) -> RobustAnswer:
    return replace(result, **changes)
