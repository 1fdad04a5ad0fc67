"""Secure decoding aggregation and its certification, on hand-made probability tables."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from ragdefense.llm import CallableLLM
from ragdefense.robustrag import RobustRAG, SecureDecoding

from .conftest import cancel_once_started

VOCAB = ["<eos>", "I don't know", "Canberra", "Sydney", "Perth"]
EOS, IDK, CAN, SYD, PER = range(5)


def dist(**p: float) -> np.ndarray:
    v = np.zeros(len(VOCAB))
    for name, value in p.items():
        v[{"eos": EOS, "idk": IDK, "can": CAN, "syd": SYD, "per": PER}[name]] = value
    return v


class FakeTokenizer:
    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [IDK] if text == "I don't know" else []}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(VOCAB[i] for i in ids if not (skip_special_tokens and i == EOS))


class FakeSession:
    """Rows are prompts; each prompt's distribution at step t is ``tables[key][t]`` (then EOS)."""

    def __init__(self, tables: dict[str, list[np.ndarray]], prompts: list[str]) -> None:
        self.tables = tables
        self.keys = [next(k for k in tables if k in p) for p in prompts]
        self.t = 0
        self._update()

    def _update(self) -> None:
        rows = [
            self.tables[k][self.t] if self.t < len(self.tables[k]) else dist(eos=1.0)
            for k in self.keys
        ]
        self.probs = np.stack(rows)

    def advance(self, token: int) -> np.ndarray:
        self.t += 1
        self._update()
        return self.probs

    def keep_rows(self, rows: list[int]) -> None:
        self.keys = [self.keys[r] for r in rows]
        self._update()

    def clone(self) -> FakeSession:
        other = object.__new__(FakeSession)
        other.tables, other.keys, other.t = self.tables, list(self.keys), self.t
        other._update()
        return other


class FakeTokenLLM(CallableLLM):
    supports_token_probs = True

    def __init__(self, tables: dict[str, list[np.ndarray]]) -> None:
        super().__init__(lambda p: "")
        self.tables = tables
        self.tokenizer = FakeTokenizer()
        self.stop_ids = {EOS}

    def session(self, prompts: list[str]) -> FakeSession:
        # the first isolated step is the "I don't know" probe: tables give P(IDK) at step 0
        return FakeSession(self.tables, prompts)


def rr(tables: dict[str, list[np.ndarray]], **kw: Any) -> RobustRAG:
    return RobustRAG(llm=FakeTokenLLM(tables), aggregation=SecureDecoding(**kw))


Q = "capital?"
# the no-retrieval prompt (the only one with this phrase) answers "Perth"
NOR = {"If you do not know the answer confidently": [dist(per=1.0)]}


def test_averaged_top1_wins_and_idk_contexts_are_dropped() -> None:
    tables = {
        "c0": [dist(can=0.9, syd=0.1)],
        "c1": [dist(can=0.8, syd=0.2)],
        "c2": [dist(syd=0.9, can=0.1)],  # poison
        "c3": [dist(idk=0.995, can=0.005)],  # abstains: P(I don't know) >= 0.99
        **NOR,
    }
    r = rr(tables).answer(Q, ["c0", "c1", "c2", "c3"])
    assert [x.abstained for x in r.responses] == [False, False, False, True]
    # average over c0..c2: Canberra (0.9 + 0.8 + 0.1) / 3 = 0.6, Sydney 0.4: gap 0.2 > eta = 0
    step = r.steps[0]
    assert step.token == "Canberra" and step.source == "retrieval"
    assert step.p1 == pytest.approx(0.6) and step.p2 == pytest.approx(0.4)
    assert r.answer == "Canberra"


def test_no_gap_falls_back_to_the_no_retrieval_token() -> None:
    tables = {"c0": [dist(can=0.5, syd=0.5)], "c1": [dist(can=0.5, syd=0.5)], **NOR}
    r = rr(tables).answer(Q, ["c0", "c1"])
    assert r.steps[0].source == "no-retrieval" and r.answer == "Perth"


def test_certificate_gap_within_reach() -> None:
    # injection k'=1, k=4: benign top 3. Sums: Canberra 0.9+0.8+0.1 = 1.8, Sydney 1.2.
    # gap 0.6 <= d = 1: the attacker can choose the token.
    tables = {
        "c0": [dist(can=0.9, syd=0.1)],
        "c1": [dist(can=0.8, syd=0.2)],
        "c2": [dist(syd=0.9, can=0.1)],
        "c3": [dist(can=1.0)],
        **NOR,
    }
    r = rr(tables).answer(Q, ["c0", "c1", "c2", "c3"], certify=1, gold="Canberra")
    assert r.certificate is not None and not r.certificate.certified
    assert "within the attacker's reach (1)" in r.certificate.reason


def test_certified_injection_not_modification() -> None:
    # each context: Canberra 0.7, Sydney 0.3; then EOS.
    # injection k'=1, benign top 3: 2.1 vs 0.9, gap 1.2 > 1; EOS step: 3.0 vs 0 > 1 -> certified
    # modification k'=1, all 4: 2.8 vs 1.2, gap 1.6 <= 2 -> not certifiable
    tables = {f"c{i}": [dist(can=0.7, syd=0.3)] for i in range(4)} | NOR
    passages = ["c0", "c1", "c2", "c3"]
    inj = rr(tables).answer(Q, passages, certify=1, gold="Canberra").certificate
    assert inj is not None and inj.certified and inj.possible_answers == ("Canberra",)
    mod = rr(tables).answer(Q, passages, certify=1, attack="modification").certificate
    assert mod is not None and not mod.certified and "(2)" in mod.reason


def test_a_hedge_holding_the_gold_is_no_certified_answer() -> None:
    """Every context decodes "I don't know Canberra": the inference answers "I don't know"
    (a hedge abstains), and the certificate must read its possible outputs alike. It kept
    them as decoded, found the gold in each, and certified an answer that was not given."""
    hedge = [dist(idk=0.98, can=0.02), dist(can=1.0)]  # P(IDK) < 0.99: none is dropped
    tables = {f"c{i}": hedge for i in range(4)} | NOR
    r = rr(tables).answer(Q, ["c0", "c1", "c2", "c3"], certify=1, gold="Canberra")
    assert r.answer == "I don't know"
    assert r.certificate is not None and not r.certificate.certified
    assert r.certificate.possible_answers == ("I don't know",)


def test_an_answer_is_certified_by_an_engine_decoding_it_alike() -> None:
    """The certificate decodes again with the certifying engine's length cap: one of
    ``max_new_tokens=1`` certified "Canberra" for an answer decoded to 20 tokens, whose second
    token the attacker can choose (an injected "I don't know" there changes the answer)."""
    tables = {f"c{i}": [dist(can=1.0), dist(eos=0.6, idk=0.4)] for i in range(4)} | NOR
    passages = ["c0", "c1", "c2", "c3"]
    answer = rr(tables).answer(Q, passages)
    assert answer.engine is not None and answer.engine["max_new_tokens"] == 20
    own = rr(tables).certify(answer, 1, gold="Canberra").certificate
    assert own is not None and not own.certified and "token 2" in own.reason
    short = RobustRAG(llm=FakeTokenLLM(tables), aggregation=SecureDecoding(), max_new_tokens=1)
    with pytest.raises(ValueError, match=r"max_new_tokens=20 \(this one's 1\)"):
        short.certify(answer, 1, gold="Canberra")
    evil = {"evil": [dist(can=1.0), dist(idk=1.0)]}  # the attack the certificate must cover
    attacked = rr(tables | evil).answer(Q, ["c0", "c1", "c2", "evil"])
    assert attacked.answer != answer.answer


def test_branch_to_the_no_retrieval_token() -> None:
    # eta = 0.2, injection k'=1, m = 3 benign contexts: "always a" needs gap > 1 + 0.2*4 = 1.8;
    # "a or no-retrieval" needs gap >= 1 - 0.2*3 = 0.4. Sums 2.1 vs 0.9: gap 1.2 -> both.
    tables = {f"c{i}": [dist(can=0.7, syd=0.3)] for i in range(4)} | NOR
    r = rr(tables, eta=0.2).answer(Q, ["c0", "c1", "c2", "c3"], certify=1, gold="Canberra")
    c = r.certificate
    assert c is not None and not c.certified
    assert set(c.possible_answers or ()) == {"Canberra", "Perth"}
    capped = rr(tables, eta=0.2, max_certify_responses=1).answer(
        Q, ["c0", "c1", "c2", "c3"], certify=1
    )
    assert capped.certificate is not None and "max_certify_responses" in capped.certificate.reason


def test_decoding_needs_token_probabilities() -> None:
    with pytest.raises(ValueError, match="aggregation='keyword'"):  # when made, not answering
        RobustRAG(llm=CallableLLM(lambda p: "x"), aggregation="decoding")


@pytest.mark.slow
def test_real_smollm2_decoding() -> None:
    from ragdefense.data import load_demo_kb

    q = load_demo_kb()[1]
    r = RobustRAG(aggregation="decoding").answer(
        q.question, q.benign + q.poison[:1], certify=1, gold=[q.correct_answer]
    )
    assert "Canberra" in r.answer and r.steps
    assert all(st.p1 >= st.p2 for st in r.steps)
    assert r.certificate is not None and r.certificate.certified


def test_every_context_abstaining_answers_i_dont_know() -> None:
    """With no context kept the average is over nothing: the answer came from the
    no-retrieval prompt alone (the model's memory, presented as a RAG answer)."""
    tables = {f"c{i}": [dist(idk=1.0)] for i in range(3)} | NOR
    r = rr(tables).answer(Q, ["c0", "c1", "c2"])
    assert r.answer == "I don't know" and r.steps == ()
    assert "all 3 contexts abstain" in r.reason


class _NewlineTokenizer(FakeTokenizer):
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        words = ["\n" if i == SYD else VOCAB[i] for i in ids]  # Sydney's token: a newline
        return "".join(
            w for i, w in zip(ids, words, strict=True) if not (skip_special_tokens and i == EOS)
        )


def test_a_leading_newline_does_not_end_the_answer() -> None:
    """A model that writes a newline before its answer (after "Answer:") was read as
    answering nothing, "I don't know"; generation skips a leading newline, and so do the
    inference and its certificate. A newline after text still ends the answer."""
    tables = {
        f"c{i}": [dist(syd=1.0), dist(can=1.0), dist(syd=1.0), dist(per=1.0)] for i in range(4)
    }
    llm = FakeTokenLLM(tables | NOR)
    llm.tokenizer = _NewlineTokenizer()
    r = RobustRAG(llm=llm, aggregation=SecureDecoding()).answer(
        Q, ["c0", "c1", "c2", "c3"], certify=1, gold="Canberra"
    )
    assert r.answer == "Canberra" and [s.token for s in r.steps] == ["\n", "Canberra", "\n"]
    assert r.certificate is not None and r.certificate.certified
    assert r.certificate.possible_answers == ("Canberra",)


def test_a_certificate_counts_every_answering_context_silenced_as_i_dont_know() -> None:
    """With eta >= 1 and as few answering contexts as k', a modification silencing them all
    makes the inference abstain, an outcome the certificate never listed: it certified an
    answer one rewritten passage turns into "I don't know"."""
    idk = [dist(idk=0.995, can=0.005)]
    tables = {"c0": [dist(can=1.0)], "c1": idk, "c2": idk, "evil": idk}
    tables["If you do not know the answer confidently"] = [dist(can=1.0)]
    engine = rr(tables, eta=1.0)
    attacked = engine.answer("capital?", ["evil", "c1", "c2"])
    assert attacked.answer == "I don't know"  # the premise: one rewrite silences c0
    clean = engine.answer(
        "capital?", ["c0", "c1", "c2"], certify=1, attack="modification", gold="Canberra"
    )
    assert clean.certificate is not None and not clean.certificate.certified
    assert "I don't know" in clean.certificate.possible_answers


def test_cancelling_an_async_answer_stops_the_local_decoding() -> None:
    """Secure decoding runs in a worker thread for an async caller: cancelling the caller
    left it decoding to ``max_new_tokens`` (a client gone held the CPU meanwhile)."""
    steps: list[int] = []

    class Slow(FakeSession):
        def advance(self, token: int) -> np.ndarray:
            steps.append(token)
            time.sleep(0.01)
            return super().advance(token)

    endless = [dist(can=1.0)] * 600
    tables = {"c0": endless, "c1": endless, "If you do not know": endless}
    llm = FakeTokenLLM(tables)
    llm.session = lambda prompts: Slow(tables, prompts)  # type: ignore[method-assign]
    engine = RobustRAG(llm=llm, aggregation=SecureDecoding(), max_new_tokens=600)

    cancel_once_started(lambda: engine.aanswer(Q, ["c0", "c1"]), steps)
    assert 0 < len(steps) < 599
    llm.session = lambda prompts: FakeSession(tables, prompts)  # type: ignore[method-assign]
    assert engine.answer(Q, ["c0", "c1"]).answer.startswith("Canberra")  # sync: unaffected
