"""RobustRAG's certificates at their edges: ties in secure decoding, the cases a passage
modification can cause in keyword aggregation (checked against every rewrite of small cases),
settings that are not finite numbers, and hedges between two letters."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from ragdefense.llm.base import Generation
from ragdefense.robustrag import KeywordAggregation, RobustRAG, SecureDecoding
from ragdefense.robustrag.flow import drive
from ragdefense.robustrag.types import IDK, IsolatedResponse

from .test_decoding import NOR, PER, FakeSession, FakeTokenLLM, Q, dist, rr

#: the no-retrieval prompt's key in the probability tables
NOR_KEY = next(iter(NOR))

# ------------------------------------------------------------------ secure decoding: ties


def test_a_tie_between_the_top_two_falls_back_to_the_no_retrieval_token() -> None:
    """Three contexts for Canberra, three for Sydney: their averages are equal, and the mean
    rounds to a gap of about 1e-16 that beats eta = 0 alone, electing whichever token the sort
    ranks first (an order of the passages). A tie is no lead: Algorithm 2 falls back, in
    every order."""
    names = [f"c{i}" for i in range(3)] + [f"s{i}" for i in range(3)]
    for dtype in (np.float64, np.float32):  # a model's probabilities come in float32
        tables = {
            **{f"c{i}": [dist(can=0.9, syd=0.1).astype(dtype)] for i in range(3)},
            **{f"s{i}": [dist(syd=0.9, can=0.1).astype(dtype)] for i in range(3)},
            **{key: [row.astype(dtype) for row in rows] for key, rows in NOR.items()},
        }
        for order in (names, names[::-1], ["c0", "s0", "c1", "s1", "c2", "s2"]):
            r = rr(tables).answer(Q, order)
            assert r.answer == "Perth" and r.steps[0].source == "no-retrieval", (dtype, order)


def _attacked_answers(tables: dict[str, Any], benign: list[str], **kw: Any) -> set[str]:
    """Every answer one injected context (each token for sure, or a tie) can cause, at each
    place among the benign ones."""
    attacks = {
        "atk_can": [dist(can=1.0)],
        "atk_syd": [dist(syd=1.0)],
        "atk_per": [dist(per=1.0)],
        "atk_eos": [dist(eos=1.0)],
        "atk_half": [dist(can=0.5, syd=0.5)],
    }
    out = set()
    for name in attacks:
        for at in range(len(benign) + 1):
            passages = [*benign[:at], name, *benign[at:]]
            out.add(rr({**tables, **attacks}, **kw).answer(Q, passages).answer)
    return out


def test_the_certificate_covers_every_answer_an_injection_causes_at_a_tie() -> None:
    """Benign sums Canberra 2.5, Sydney 1.5: one injected Sydney context ties them, and the
    inference falls back to the no-retrieval token (Perth). The sums round the gap to just
    above k' = 1, and the rounded average with the injected context in front elects Sydney:
    compared without the inference's margin, the certificate would hold Canberra alone. It
    holds every answer an injection causes."""
    rows = [(0.65, 0.35), (0.2, 0.8), (0.85, 0.15), (0.8, 0.2)]
    tables = {f"c{i}": [dist(can=c, syd=s)] for i, (c, s) in enumerate(rows)} | NOR
    benign = list(tables)[:4]
    cert = rr(tables).answer(Q, [*benign, "c0"], certify=1, gold="Canberra").certificate
    assert cert is not None and cert.possible_answers is not None
    attacked = _attacked_answers(tables, benign)
    assert attacked <= set(cert.possible_answers), (attacked, cert)
    assert not cert.certified  # Perth is possible, and misses the gold


def test_a_tie_in_the_sums_certifies_when_the_no_retrieval_token_agrees() -> None:
    """Ten contexts at Canberra 0.55, Sydney 0.45: the benign gap is exactly k' = 1, and the
    sums round it to just below, within the attacker's reach without the margin. At a tie the
    inference takes the no-retrieval token, here Canberra too: certified."""
    tables = {f"c{i}": [dist(can=0.55, syd=0.45)] for i in range(10)}
    tables["If you do not know the answer confidently"] = [dist(can=1.0)]
    passages = [*list(tables)[:10], "c0"]
    r = rr(tables).answer(Q, passages, certify=1, gold="Canberra")
    assert r.certificate is not None and r.certificate.certified, r.certificate
    assert r.certificate.possible_answers == ("Canberra",)
    assert _attacked_answers(tables, passages[:10]) == {"Canberra"}


# ------------------------------------------------------------------ secure decoding: NaN


class _BranchSession(FakeSession):
    """A :class:`FakeSession` whose rows ``bad`` turn NaN once Perth (the no-retrieval token)
    is decoded: a branch only the certificate follows."""

    bad: frozenset[str] = frozenset()

    def _update(self) -> None:
        super()._update()
        if PER in getattr(self, "seen", ()):
            self.probs = self.probs.copy()
            for row, key in enumerate(self.keys):
                if key in self.bad:
                    self.probs[row] = np.nan

    def advance(self, token: int) -> np.ndarray:
        self.seen = [*getattr(self, "seen", []), token]
        return super().advance(token)

    def clone(self) -> _BranchSession:
        other = object.__new__(type(self))
        other.tables, other.keys, other.t = self.tables, list(self.keys), self.t
        other.seen, other.bad = list(getattr(self, "seen", [])), self.bad
        other._update()
        return other


class _BranchLLM(FakeTokenLLM):
    def __init__(self, tables: dict[str, list[np.ndarray]], bad: set[str]) -> None:
        super().__init__(tables)
        self.bad = frozenset(bad)

    def session(self, prompts: list[str]) -> FakeSession:
        session = _BranchSession(self.tables, prompts)
        session.bad = self.bad
        return session


@pytest.mark.parametrize(
    ("bad", "named"),
    [({"c1"}, r"the passage\(s\) at index \[1\] "), ({NOR_KEY}, "the no-retrieval context")],
)
def test_probabilities_not_finite_on_a_certificate_branch_are_an_error(
    bad: set[str], named: str
) -> None:
    """With eta = 0.9 the certificate follows the no-retrieval token (Perth) beside Canberra;
    on that branch a context's probabilities are NaN: an error naming the passage (or the
    no-retrieval context), not a verdict computed from NaN."""
    tables = {f"c{i}": [dist(can=1.0), dist(eos=1.0)] for i in range(4)} | NOR
    engine = RobustRAG(llm=_BranchLLM(tables, bad), aggregation=SecureDecoding(eta=0.9))
    assert engine.answer(Q, list(tables)[:4]).answer == "Canberra"
    with pytest.raises(ValueError, match=rf"{named}.*not finite while certifying"):
        engine.answer(Q, list(tables)[:4], certify=1)


def test_secure_decodings_answer_has_its_docstring() -> None:
    from ragdefense.robustrag.secure_decoding import _Decoding

    assert _Decoding.answer.__doc__ and "Algorithm 2" in _Decoding.answer.__doc__


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize(
    ("make", "kwargs", "error", "named"),
    [
        (SecureDecoding, {"eta": math.nan}, ValueError, "eta"),
        (SecureDecoding, {"eta": math.inf}, ValueError, "eta"),
        (SecureDecoding, {"gamma": math.nan}, ValueError, "gamma"),
        (SecureDecoding, {"eta": True}, TypeError, "eta"),
        (SecureDecoding, {"eta": "0"}, TypeError, "eta"),
        (SecureDecoding, {"max_certify_responses": math.nan}, TypeError, "max_certify_responses"),
        (SecureDecoding, {"max_certify_responses": 8.0}, TypeError, "max_certify_responses"),
        (SecureDecoding, {"max_certify_responses": True}, TypeError, "max_certify_responses"),
        (KeywordAggregation, {"alpha": math.nan}, ValueError, "alpha"),
        (KeywordAggregation, {"beta": math.nan}, ValueError, "beta"),
        (KeywordAggregation, {"beta": math.inf}, ValueError, "beta"),
        (KeywordAggregation, {"beta": False}, TypeError, "beta"),
        (KeywordAggregation, {"max_undecided": math.nan}, TypeError, "max_undecided"),
        (KeywordAggregation, {"max_certify_calls": math.inf}, TypeError, "max_certify_calls"),
        (KeywordAggregation, {"max_certify_calls": True}, TypeError, "max_certify_calls"),
    ],
)
def test_settings_must_be_finite_numbers(
    make: Any, kwargs: dict[str, Any], error: type[Exception], named: str
) -> None:
    """A NaN passes every range check (nan < 0 is False) and makes every comparison false."""
    with pytest.raises(error, match=named):
        make(**kwargs)


def test_numpy_numbers_are_settings_too() -> None:
    agg = KeywordAggregation(alpha=np.float64(0.5), beta=np.int64(2), max_undecided=np.int64(3))
    assert agg.threshold(10) == 2
    assert SecureDecoding(eta=np.float32(0.25), max_certify_responses=np.int32(4)).eta == 0.25


# ------------------------------------------------------------------ keyword modification

#: benign isolated answers: None abstains, else its keywords
_BENIGN: tuple[frozenset[str] | None, ...] = (None, frozenset("a"), frozenset("ab"), frozenset("b"))
#: what a rewritten passage's answer can be: an abstention, or any keywords of a small
#: vocabulary (the benign ones and an attacker's), none included (an answer without keywords)
_REWRITES: tuple[frozenset[str] | None, ...] = (
    None,
    *(frozenset(c) for size in range(4) for c in itertools.combinations("abx", size)),
)


def _responses(said: Sequence[frozenset[str] | None]) -> tuple[IsolatedResponse, ...]:
    return tuple(
        IsolatedResponse(i, f"p{i}", IDK, True)
        if s is None
        else IsolatedResponse(i, f"p{i}", " ".join(sorted(s)) or "-", False, keywords=s)
        for i, s in enumerate(said)
    )


def _final(keywords: Sequence[str]) -> str:
    """The fake aggregation LLM: the first keyword it is given, or "I don't know"."""
    return sorted(keywords)[0] if keywords else IDK


def _inference(agg: Any, said: Sequence[frozenset[str] | None]) -> tuple[tuple[str, ...], Any]:
    """The keywords the inference keeps, and its answer."""
    result, prompt = agg.aggregate("q?", _responses(said))
    kept = result.kept_keywords if prompt is not None else ()
    return kept, dataclasses.replace(result, answer=_final(kept))


def _certify(agg: Any, result: Any, k_prime: int, attack: str) -> Any:
    table = {
        agg.cfg.prompt_for("q?", kws): _final(kws)
        for size in range(4)
        for kws in itertools.combinations("abx", size)
    }

    def generate(prompts: list[str]) -> list[Generation]:
        return [Generation(text=table[p]) for p in prompts]

    return drive(agg.certificate(result, k_prime, attack, []), generate)


def _attacks(
    benign: tuple[frozenset[str] | None, ...], k_prime: int, attack: str
) -> set[tuple[frozenset[str] | None, ...]]:
    """Every retrieval the attacker can make (order aside: the counts ignore it): injection
    replaces the bottom k' answers, modification any k'; each by any answer of _REWRITES."""
    out = set()
    dropped = (
        [tuple(range(len(benign) - k_prime, len(benign)))]
        if attack == "injection"
        else list(itertools.combinations(range(len(benign)), k_prime))
    )
    for gone in dropped:
        kept = [s for i, s in enumerate(benign) if i not in gone]
        for new in itertools.combinations_with_replacement(_REWRITES, k_prime):
            out.add(tuple(sorted([*kept, *new], key=_order)))
    return out


def _order(s: frozenset[str] | None) -> tuple[int, str]:
    return (0, "") if s is None else (1, "".join(sorted(s)))


def test_no_certified_keyword_answer_can_be_flipped_by_any_small_attack() -> None:
    """Every benign retrieval of 4 or 5 answers over a small vocabulary, k' = 1 and 2, both
    attacks: each keyword set the attacker can cause is among those the certificate
    enumerates, and a certified answer is what every attacked retrieval answers."""
    certified = 0
    settings = [(0.3, 3), (0.5, 2), (0.25, 1.5), (0.0, 3)]
    for (alpha, beta), k in itertools.product(settings, (4, 5)):
        agg = KeywordAggregation(alpha=alpha, beta=beta).bind(None)  # type: ignore[arg-type]
        seen: dict[tuple[frozenset[str] | None, ...], tuple[tuple[str, ...], Any]] = {}
        for benign in itertools.combinations_with_replacement(_BENIGN, k):
            _, result = _inference(agg, benign)
            for k_prime, attack in itertools.product((1, 2), ("injection", "modification")):
                plan = agg.plan(result.responses, k_prime, attack)
                cert = _certify(agg, result, k_prime, attack)
                certified += cert.certified
                for attacked in _attacks(benign, k_prime, attack):
                    if attacked not in seen:
                        seen[attacked] = _inference(agg, attacked)
                    kept, flipped = seen[attacked]
                    case = (alpha, beta, benign, k_prime, attack, attacked)
                    if plan.verdict is None:
                        assert kept in plan.keyword_sets, case
                    if cert.certified:
                        assert flipped.answer == result.answer, case
    assert certified > 100  # the check is not vacuous


def test_a_modification_certificate_counts_what_rewriting_can_do(nlp: Any) -> None:
    """Four answers "Paris", six "I don't know", one passage rewritten, alpha 0.3, beta 3: an
    injected keyword needs 2 answers unless the count of answers falls to 3, and it falls
    only where the rewritten passage, one of the Paris answers, abstains: no keyword is then
    added. Certified: the count of answers and the injected keywords move together."""

    def llm(prompt: str) -> str:
        said = prompt.split("---------------------\n")[1].split("\n")[0]
        return "Answer from " + said if prompt.startswith("Word suggestion") else said

    passages = ["Paris"] * 4 + ["I don't know"] * 6
    r = RobustRAG(llm=llm, nlp=nlp).answer(
        "capital of France?", passages, certify=1, attack="modification"
    )
    assert r.certificate is not None and r.certificate.certified, r.certificate
    agg = KeywordAggregation().bind(None)  # type: ignore[arg-type]
    plan = agg.plan(_responses([frozenset({"paris"})] * 4 + [None] * 6), 1, "modification")
    assert plan.verdict is None and plan.keyword_sets == [("paris",)]
    three = agg.plan(_responses([frozenset({"paris"})] * 3 + [None] * 7), 1, "modification")
    assert three.verdict is not None and "within reach" in three.verdict  # a real attack


# ------------------------------------------------------------------ majority vote


@pytest.mark.parametrize(
    ("said", "vote"),
    [
        ("B, a city in France", "B"),
        ("B, e.g. Paris", "B"),
        ("B, A city in France", "B"),
        ("B, Canberra", "B"),
        ("A, B", None),
        ("A, B, C", None),
        ("B, C.", None),
        ("B or C?", None),
        ("C & D", None),
        ("B, E. No information found", None),
    ],
)
def test_a_second_letter_is_a_hedge_only_standing_alone(said: str, vote: str | None) -> None:
    from ragdefense.robustrag.majority_vote import _choice

    assert _choice(said) == vote


# --------------------------------------------- answers that differ by a value's punctuation


class _NumberTokenizer:
    """The fake tokenizer of ``test_decoding`` with two numbers for Canberra and Sydney."""

    WORDS = ("<eos>", "I don't know", "1.5", "15", "million")

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [1] if text == "I don't know" else []}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(self.WORDS[i] for i in ids if not (skip_special_tokens and i == 0))


def _numbers_rag(tables: dict[str, Any]) -> RobustRAG:
    llm = FakeTokenLLM(tables)
    llm.tokenizer = _NumberTokenizer()
    return RobustRAG(llm=llm, aggregation=SecureDecoding())


def test_decoding_certificate_tells_1_5_million_from_15_million() -> None:
    """ "1.5 million" and "15 million" were one answer once punctuation was dropped: a
    certificate listed both as possible and certified, and one injected passage turned the
    answer into the other."""
    tables = {f"c{i}": [dist(can=0.6, syd=0.4), dist(per=1.0)] for i in range(4)}
    tables[NOR_KEY] = [dist(syd=1.0), dist(per=1.0)]
    passages = ["c0", "c1", "c2", "c3"]
    r = _numbers_rag(tables).answer(Q, passages, certify=1)
    assert r.answer == "1.5 million"
    assert r.certificate is not None and not r.certificate.certified
    assert "15 million" in (r.certificate.possible_answers or ())
    gold = _numbers_rag(tables).answer(Q, passages, certify=1, gold="1.5 million").certificate
    assert gold is not None and not gold.certified
    attacked = _numbers_rag({**tables, "atk": [dist(syd=1.0), dist(per=1.0)]})
    assert attacked.answer(Q, ["c0", "c1", "c2", "atk"]).answer == "15 million"  # it can


def test_keyword_certificate_tells_1_5_million_from_15_million(nlp: Any) -> None:
    isolated = {f"p{i}": "1.5 million" for i in range(6)}
    isolated |= {"q0": "15 million", "q1": "15 million", "r0": "I don't know", "r1": "I don't know"}

    def llm(prompt: str) -> str:
        if prompt.startswith("Word suggestion"):  # the kept keywords decide the answer
            kept = prompt.split("---------------------\n")[1].strip().split(", ")
            return "15 million" if "15" in kept else "1.5 million"
        return next((a for key, a in isolated.items() if key in prompt), "I don't know")

    from ragdefense.llm import CallableLLM

    r = RobustRAG(llm=CallableLLM(llm), nlp=nlp).answer(Q, list(isolated), certify=1)
    assert r.answer == "1.5 million"
    cert = r.certificate
    assert cert is not None and "15 million" in (cert.possible_answers or ())
    assert not cert.certified, cert.reason
    gold = RobustRAG(llm=CallableLLM(llm), nlp=nlp).answer(
        Q, list(isolated), certify=1, gold="1.5 million"
    )
    assert gold.certificate is not None and not gold.certificate.certified
