from __future__ import annotations

import re
import time
import warnings
from typing import Any

import pytest

from ragdefense.llm import CallableLLM, Generation, LangChainLLM, as_llm
from ragdefense.robustrag import KeywordAggregation, RobustRAG, is_abstention
from ragdefense.robustrag.keywords import extract_keywords

Q = "What is the capital of Australia?"


def scripted(isolated: dict[str, str], keyword_rule=None):  # type: ignore[no-untyped-def]
    """An LLM that answers an isolated prompt by the passage it contains, and a keyword prompt
    by ``keyword_rule(keywords)`` (default: the first keyword)."""

    def fn(prompt: str) -> str:
        if prompt.startswith("Word suggestion"):
            kws = re.search(r"-+\n(.*)\n-+", prompt).group(1)  # type: ignore[union-attr]
            return keyword_rule(kws) if keyword_rule else kws.split(", ")[0]
        for key, answer in isolated.items():
            if key in prompt:
                return answer
        return "I don't know"

    return CallableLLM(fn)


# ---------------------------------------------------------------- keywords


def test_keywords_reproduce_the_papers_figure_8(nlp) -> None:  # type: ignore[no-untyped-def]
    responses = [
        "NATO",
        "Several hundred US companies and organizations",
        "U.S. government",
        "SolarWinds",
    ]
    sets = [extract_keywords(r, nlp) for r in responses]
    assert sets[0] == {"NATO"}
    assert sets[1] == {
        "Several hundred US companies and organizations",
        "several hundred US company",
        "several",
        "hundred",
        "US",
        "company",
        "organization",
    }
    assert sets[2] == {"U.S. government", "U.S.", "government"}
    assert sets[3] == {"SolarWinds", "solarwind"}
    assert len(set().union(*sets)) == 13  # the figure's 13 keywords


def test_keywords_keep_numbers_and_drop_function_words(nlp) -> None:  # type: ignore[no-untyped-def]
    kws = extract_keywords("There are three of them.", nlp)
    assert "three" in kws and "them" not in kws and "of" not in kws


def test_a_month_named_as_a_modal_verb_is_a_keyword(nlp) -> None:  # type: ignore[no-untyped-def]
    # "may" was a stop word (NLTK's list, which the paper's code uses, has no modal verb but
    # "can", "will" and "should"): the month was dropped, a modal verb is no keyword by its POS
    assert "May" in extract_keywords("The treaty was signed in May.", nlp)
    assert extract_keywords("You may go.", nlp) == {"You may go."}


@pytest.mark.parametrize(
    ("text", "abstains"),
    [
        ("I don't know.", True),
        ("i do not KNOW", True),
        ("I don\u2019t know", True),
        ("I'm not sure.", True),
        ("The context does not contain the answer.", True),
        ("No information found", True),
        ("", True),
        (None, True),
        ("Canberra", False),
        ("I know: Canberra", False),
        ("Not mentioned in the context.", True),  # a context without the answer, said so
        ("It is not stated in the passage.", True),
        ("The context doesn't say.", True),
        ("It cannot be determined from the context.", True),
        ("Unknown", True),
        ("N/A", True),
        ("The Tomb of the Unknown Soldier", False),  # answers holding such words
        ("It was not mentioned until 1990, in Paris.", False),
        ("NA", False),  # sodium, say: only "N/A" written so is an abstention
    ],
)
def test_abstention(text: str | None, abstains: bool) -> None:
    assert is_abstention(text) is abstains


# ---------------------------------------------------------------- keyword aggregation


def test_keyword_aggregation_with_a_scripted_llm(nlp) -> None:  # type: ignore[no-untyped-def]
    passages = ["p1 canberra", "p2 canberra", "p3 canberra", "p4 poison", "p5 nothing"]
    llm = scripted({"p1": "Canberra", "p2": "Canberra", "p3": "Canberra", "p4": "Sydney"})
    r = RobustRAG(llm=llm, nlp=nlp).answer(Q, passages)
    assert r.abstentions == [4]
    # a one-word answer gives the word and its lemma (spaCy lower-cases it), as "SolarWinds" /
    # "solarwind" in the paper's figure 8
    assert r.keyword_counts == {"Canberra": 3, "canberra": 3, "Sydney": 1, "sydney": 1}
    assert r.threshold == pytest.approx(1.2)  # min(0.3 * 4, 3)
    assert r.kept_keywords == ("Canberra", "canberra")
    assert r.answer == "Canberra"
    assert "Canberra (3)" in str(r)


def test_keyword_counts_are_listed_in_one_order_in_every_process(nlp) -> None:  # type: ignore[no-untyped-def]
    """The counts came in the order of the answers' keyword sets, which Python's per-process
    string hashing sets: one answer's JSON differed from run to run. Most counted first, then
    by keyword."""
    ocean = ["p1 ocean", "p2 ocean", "p3 ocean", "p4 poison"]
    llm = scripted(
        {
            "p1": "The Pacific Ocean is the largest deepest ocean basin on Earth.",
            "p2": "The Pacific Ocean is the largest deepest ocean basin on Earth.",
            "p3": "The Pacific Ocean, the largest basin on Earth.",
            "p4": "The Atlantic Ocean, the largest basin on Earth.",
        }
    )
    counts = list(RobustRAG(llm=llm, nlp=nlp).answer(Q, ocean).keyword_counts.items())
    assert len(counts) >= 8
    assert counts == sorted(counts, key=lambda kc: (-kc[1], kc[0]))


def test_keyword_prompt_is_sorted(nlp) -> None:  # type: ignore[no-untyped-def]
    seen: list[str] = []
    llm = scripted({f"p{i}": "Zeta Alpha" for i in range(3)}, lambda kws: seen.append(kws) or "x")
    RobustRAG(llm=llm, nlp=nlp).answer(Q, ["p0", "p1", "p2"])
    assert seen == ["Alpha, Zeta, Zeta Alpha"]


def test_all_abstain_and_no_passages(nlp) -> None:  # type: ignore[no-untyped-def]
    rr = RobustRAG(llm=scripted({}), nlp=nlp)
    r = rr.answer(Q, ["a", "b"])
    assert r.answer == "I don't know" and "all 2 isolated answers abstained" in r.reason
    empty = rr.answer(Q, [])
    assert empty.answer == "I don't know" and "no passages" in empty.reason


def test_failing_and_slow_llm_calls_count_as_abstentions(nlp) -> None:  # type: ignore[no-untyped-def]
    def fn(prompt: str) -> str:
        if "boom" in prompt:
            raise RuntimeError("server error")
        if "slow" in prompt:
            time.sleep(2)
        if prompt.startswith("Word suggestion"):
            return "Canberra"
        return "Canberra"

    r = RobustRAG(llm=CallableLLM(fn, timeout=0.5), nlp=nlp).answer(
        Q, ["ok 1", "boom", "slow", "ok 2"]
    )
    errors = {x.index: x.error for x in r.responses if x.error}
    assert set(errors) == {1, 2}
    assert "server error" in errors[1] and "timed out" in errors[2]
    assert r.answer == "Canberra" and "2 LLM call(s) failed" in r.reason


# ---------------------------------------------------------------- certification (keyword)


def test_certified_by_hand(nlp) -> None:  # type: ignore[no-untyped-def]
    # k=5, k'=1 injection: benign = top 4, all "Canberra": n = 4, count(Canberra) = 4.
    # k_eff=0: mu = min(1.2, 3) = 1.2 -> kept {Canberra}
    # k_eff=1: mu = min(1.5, 3) = 1.5 > 1 ; always kept: count >= 1.5 ; undecided: [0.5, 1.5) = {}
    passages = [f"p{i}" for i in range(5)]
    llm = scripted({p: "Canberra" for p in passages[:4]} | {"p4": "Sydney"})
    r = RobustRAG(llm=llm, nlp=nlp).answer(Q, passages, certify=1, gold="Canberra")
    c = r.certificate
    assert c is not None and c.certified
    assert c.always_kept == ("Canberra", "canberra") and c.undecided == ()
    assert c.possible_answers == ("Canberra",)


def test_an_answer_its_own_aggregation_call_failed_is_never_certified(nlp) -> None:  # type: ignore[no-untyped-def]
    """The final call failed once (a 503): the answer was "I don't know", and the certificate
    read the keyword sets alone, answered by the certification's own calls, and said
    certified as correct (found by an independent review)."""
    calls = {"final": 0}

    def fn(prompt: str) -> str:
        if prompt.startswith("Word suggestion"):
            calls["final"] += 1
            if calls["final"] == 1:
                raise RuntimeError("HTTP 503 from provider (transient)")
        return "Paris"

    passages = [f"Passage {i}: Paris is the capital of France." for i in range(6)]
    for gold in ("Paris", None):
        calls["final"] = 0
        r = RobustRAG(fn, nlp=nlp, timeout=None).answer(Q, passages, certify=1, gold=gold)
        assert r.answer == "I don't know" and r.certificate is not None
        assert not r.certificate.certified and "answer again" in r.certificate.reason
    answered = RobustRAG(fn, nlp=nlp, timeout=None).answer(Q, passages, certify=1, gold="Paris")
    assert answered.answer == "Paris" and answered.certificate.certified  # type: ignore[union-attr]
    worded = {"final": 0}  # a sampling LLM wording the same answer otherwise: still certified

    def sampled(prompt: str) -> str:
        if prompt.startswith("Word suggestion"):
            worded["final"] += 1
            return "The capital is Paris." if worded["final"] == 1 else "Paris"
        return "Paris"

    wrong = RobustRAG(fn, nlp=nlp, timeout=None).answer(Q, passages, certify=1, gold="Lyon")
    assert wrong.certificate is not None and not wrong.certificate.certified  # the sets' answer,
    assert "miss the gold answer" in wrong.certificate.reason  # wrong: not "answer again"
    again = RobustRAG(sampled, nlp=nlp, timeout=None).answer(Q, passages, certify=1, gold="Paris")
    assert again.answer == "The capital is Paris." and again.certificate.certified  # type: ignore[union-attr]


def test_a_report_is_plain_json(nlp) -> None:  # type: ignore[no-untyped-def]
    """``json.dumps`` failed on a report (keyword sets, passages, the settings dataclass)."""
    import json

    passages = [f"p{i}" for i in range(5)]
    llm = scripted({p: "Canberra" for p in passages[:4]} | {"p4": "Sydney"})
    r = RobustRAG(llm=llm, nlp=nlp).answer(Q, passages, certify=1)
    back = json.loads(json.dumps(r.to_dict()))
    assert back["answer"] == r.answer and back["certificate"]["certified"] is True
    assert back["responses"][4] | {"keywords": None} == back["responses"][4] | {
        "passage": "p4", "text": "Sydney", "keywords": None, "abstained": False
    }  # fmt: skip
    assert back["settings"]["alpha"] == r.settings.alpha
    vote = RobustRAG(llm=mc_llm(["B", "B", "A", "B", "E"]), aggregation="majority")
    voted = vote.answer(Q, [f"passage {i}" for i in range(5)], choices=CHOICES)
    assert json.loads(json.dumps(voted.to_dict()))["votes"] == {"B": 3, "A": 1}


def test_not_certified_when_an_undecided_keyword_flips_the_answer(nlp) -> None:  # type: ignore[no-untyped-def]
    # k=10, k'=1: benign = top 9, all answering; 7 say "Canberra", 2 say "Sydney".
    # k_eff=1: mu = min(3.0, 3) = 3: "Sydney" (count 2) is in [mu - 1, mu) -> undecided.
    answers = ["Canberra"] * 7 + ["Sydney"] * 2 + ["Perth"]
    iso = {f"p{i}!": a for i, a in enumerate(answers)}
    llm = scripted(iso, lambda kws: "Sydney" if "Sydney" in kws else "Canberra")
    r = RobustRAG(llm=llm, nlp=nlp).answer(Q, list(iso), certify=1, gold=["Canberra"])
    assert r.answer == "Canberra"
    c = r.certificate
    assert c is not None and not c.certified
    assert c.undecided == ("Sydney", "sydney")
    assert set(c.possible_answers or ()) == {"Canberra", "Sydney"}
    assert "miss the gold answer" in c.reason
    # without a gold answer, the certificate is about stability of the answer
    r2 = RobustRAG(llm=llm, nlp=nlp).answer(Q, list(iso), certify=1)
    assert r2.certificate is not None and "change the answer" in r2.certificate.reason


def test_an_abstention_is_no_certified_answer_whatever_letters_it_holds(nlp) -> None:  # type: ignore[no-untyped-def]
    """Gold "no": "I don't know" holds it as letters ("know"), and a certificate listing the
    abstention an attacker can cause among the possible answers called them all correct."""
    answers = ["No"] * 7 + ["Yes"] * 2 + ["No"]  # "Yes" is undecided at k'=1 (as above)
    iso = {f"p{i}!": a for i, a in enumerate(answers)}
    llm = scripted(iso, lambda kws: "I don't know" if "Yes" in kws else kws.split(", ")[0])
    r = RobustRAG(llm=llm, nlp=nlp).answer(
        "Is Canberra the largest city?", list(iso), certify=1, gold="no"
    )
    c = r.certificate
    assert r.answer == "No" and c is not None
    assert set(c.possible_answers or ()) == {"No", "I don't know"}
    assert not c.certified and "miss the gold answer" in c.reason


def test_threshold_within_reach_is_not_certifiable(nlp) -> None:  # type: ignore[no-untyped-def]
    # k=3, k'=1: benign top 2, n=2; k_eff=1: mu = min(0.9, 3) = 0.9 <= 1: any keyword enters
    llm = scripted({"p0": "Canberra", "p1": "Canberra", "p2": "Canberra"})
    r = RobustRAG(llm=llm, nlp=nlp).answer(Q, ["p0", "p1", "p2"], certify=1)
    assert r.certificate is not None and not r.certificate.certified
    assert "any keyword can be injected" in r.certificate.reason


def test_power_set_cap_is_reported(nlp) -> None:  # type: ignore[no-untyped-def]
    answers = ["Canberra"] * 7 + ["Sydney"] * 2 + ["Perth"]
    iso = {f"p{i}!": a for i, a in enumerate(answers)}
    rr = RobustRAG(llm=scripted(iso), aggregation=KeywordAggregation(max_undecided=0), nlp=nlp)
    c = rr.answer(Q, list(iso), certify=1).certificate
    assert c is not None and not c.certified and "enumeration cap 0" in c.reason


def test_llm_call_budget_is_reported(nlp) -> None:  # type: ignore[no-untyped-def]
    answers = ["Canberra"] * 7 + ["Sydney"] * 2 + ["Perth"]
    iso = {f"p{i}!": a for i, a in enumerate(answers)}
    rr = RobustRAG(llm=scripted(iso), aggregation=KeywordAggregation(max_certify_calls=1), nlp=nlp)
    c = rr.answer(Q, list(iso), certify=1).certificate
    # undecided {Sydney, sydney}: 4 keyword sets > budget 1
    assert c is not None and not c.certified and "max_certify_calls=1" in c.reason


def test_refuses_k_prime_of_half(nlp) -> None:  # type: ignore[no-untyped-def]
    llm = scripted({"p0": "Canberra", "p1": "Canberra"})
    c = RobustRAG(llm=llm, nlp=nlp).answer(Q, ["p0", "p1"], certify=1).certificate
    assert c is not None and not c.certified and "k/2" in c.reason


def test_modification_certificate(nlp) -> None:  # type: ignore[no-untyped-def]
    # k=5 all "Canberra", k'=1 modification: n_eff in {4, 5}; mu(4)=1.2, mu(5)=1.5 > 1;
    # always kept: count - 1 >= mu -> Canberra (5 - 1 = 4); undecided: [mu-1, mu+1) -> none.
    passages = [f"p{i}" for i in range(5)]
    llm = scripted({p: "Canberra" for p in passages})
    c = (
        RobustRAG(llm=llm, nlp=nlp)
        .answer(Q, passages, certify=1, attack="modification")
        .certificate
    )
    assert c is not None and c.certified and c.attack == "modification"


# ---------------------------------------------------------------- majority vote

CHOICES = ["Sydney", "Canberra", "Perth", "Melbourne"]


def mc_llm(letters: list[str]) -> CallableLLM:
    def fn(prompt: str) -> str:
        i = int(re.search(r"passage (\d)", prompt).group(1))  # type: ignore[union-attr]
        return letters[i]

    return CallableLLM(fn)


def test_majority_vote_and_its_certificates() -> None:
    passages = [f"passage {i}" for i in range(5)]
    rr = RobustRAG(
        llm=mc_llm(["B. Canberra", "B", "(B) Canberra", "A. Sydney", "E. No info"]),
        aggregation="majority",
    )
    r = rr.answer(Q, passages, choices=CHOICES, certify=1, gold="B")
    assert r.answer == "B. Canberra" and r.votes == {"B": 3, "A": 1} and r.abstentions == [4]
    # injection: top 4 votes B3 A1 -> 3 - 1 = 2 > 1
    assert r.certificate is not None and r.certificate.certified
    # modification: all 5 votes B3 A1 -> 2 > 2 fails
    m = rr.answer(Q, passages, choices=CHOICES, certify=1, attack="modification")
    assert m.certificate is not None and not m.certificate.certified
    # a certified winner that is not the gold answer is not certified correct
    wrong = rr.answer(Q, passages, choices=CHOICES, certify=1, gold="A")
    assert wrong.certificate is not None and not wrong.certificate.certified
    for gold in ("B.", "(B)", " b) "):  # the letter as a key writes it: read as the letter
        given = rr.answer(Q, passages, choices=CHOICES, certify=1, gold=gold)
        assert given.certificate is not None and given.certificate.certified, gold


def test_majority_vote_needs_choices() -> None:
    with pytest.raises(ValueError, match="2 to 4 choices"):
        RobustRAG(llm=mc_llm(["A"]), aggregation="majority").answer(Q, ["passage 0"])


def test_no_votes() -> None:
    r = RobustRAG(llm=mc_llm(["E. No information found"] * 2), aggregation="majority").answer(
        Q, ["passage 0", "passage 1"], choices=CHOICES
    )
    assert r.answer == "I don't know" and r.votes == {}


# ---------------------------------------------------------------- backends, async


def test_langchain_runnable_backend_sync_and_async(nlp) -> None:  # type: ignore[no-untyped-def]
    from langchain_core.runnables import RunnableLambda

    def answer(prompt: str) -> str:
        if "fail" in prompt:
            raise ValueError("bad request")
        return "Canberra"

    llm = as_llm(RunnableLambda(answer))
    assert isinstance(llm, LangChainLLM)
    assert llm.generate(["x", "fail"]) == [
        Generation("Canberra"),
        Generation(None, "ValueError: bad request"),
    ]
    rr = RobustRAG(llm=llm, nlp=nlp)
    import asyncio

    r = asyncio.run(rr.aanswer(Q, ["a", "b", "fail"], certify=1))
    assert r.answer == "Canberra" and r.abstentions == [2]
    assert r.certificate is not None


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="aggregation"):
        RobustRAG(aggregation="vote")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot use int as an LLM"):
        as_llm(3)


def test_token_probabilities_need_a_capable_backend() -> None:
    with pytest.raises(NotImplementedError, match="aggregation='keyword'"):
        CallableLLM(lambda p: p).next_token_probs(["x"])


def test_copies_of_a_transformers_llm_load_its_model_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A RobustRAG engine answers with a copy of its LLM (its own timeout): the copy, made
    before the model was loaded, loaded a second SmolLM2, and every RobustRAG() one more."""
    import copy

    import transformers

    from ragdefense.llm import TransformersLLM

    loads: list[str] = []

    class Loaded:
        padding_side, pad_token = "left", "<pad>"

        def to(self, device: Any) -> Loaded:
            return self

        def eval(self) -> Loaded:
            return self

    def load(path: str, *args: Any, **kwargs: Any) -> Loaded:
        loads.append(path)
        return Loaded()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", load)
    llm = TransformersLLM(str(tmp_path), device="cpu")
    twin, engine = copy.copy(llm), RobustRAG(llm=llm)
    assert twin.model is llm.model is engine.llm.model and twin.tokenizer is llm.tokenizer
    assert loads == [str(tmp_path)] * 2  # the model and its tokenizer, once each


@pytest.mark.slow
def test_real_next_token_probabilities_match_greedy_decoding() -> None:
    import numpy as np

    from ragdefense.llm import default_llm

    llm = default_llm()
    prompts = ["What is the capital of France? Answer in one word.", "Say hello."]
    probs = llm.next_token_probs(prompts)
    assert probs.shape[0] == 2 and np.allclose(probs.sum(axis=1), 1, atol=1e-4)
    # left padding must not change the distribution: the short prompt alone gives the same row
    alone = llm.next_token_probs(prompts[1:])
    np.testing.assert_allclose(probs[1], alone[0], atol=1e-4)
    # and the argmax is the first token greedy decoding produces
    first = llm.tokenizer.decode([int(probs[0].argmax())])
    with warnings.catch_warnings():
        # the KV cache is passed by the name this transformers takes (a renamed keyword warned
        # on every decoding step, into the user's output, and will be removed)
        warnings.simplefilter("error", FutureWarning)
        session = llm.session(
            ["Long shared prefix for two prompts: one", "Long shared prefix for two prompts: two"]
        )
        session.advance(int(session.probs[0].argmax()))
        answer = llm.generate(prompts[:1], max_new_tokens=3)[0]
    assert (answer.text or "").startswith(first.strip()), answer


@pytest.mark.slow
def test_real_smollm2_and_spacy() -> None:
    from ragdefense.data import load_demo_kb

    q = load_demo_kb()[1]  # capital of Australia
    r = RobustRAG().answer(q.question, q.benign + q.poison[:1], certify=1, gold=[q.correct_answer])
    assert len(r.responses) == 4
    assert "Canberra" in r.answer
    assert "Canberra" in r.kept_keywords
    assert r.certificate is not None and r.certificate.k_prime == 1


@pytest.mark.slow
def test_a_huge_passage_does_not_silence_the_packaged_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the packaged SmolLM2, a 20 KB passage among three short ones made every isolated
    answer time out (the model reads the whole padded batch first); cut to
    ``max_passage_chars``, no prompt the model reads holds it whole, and the short passages
    are answered. What is checked is the prompts' size, not a time: the deadline is generous
    so that a loaded machine decides nothing."""
    from ragdefense.llm import default_llm

    llm = default_llm()
    read: list[int] = []
    generate = llm.generate

    def spy(prompts: Any, *args: Any, **kwargs: Any) -> Any:
        read.extend(len(p) for p in prompts)
        return generate(prompts, *args, **kwargs)

    monkeypatch.setattr(llm, "generate", spy)
    huge = "Canberra is the capital of Australia. " + "The city hosts many parks. " * 800
    small = [
        "Canberra is the capital city of Australia.",
        "Australia's capital is Canberra, not Sydney.",
        "The Australian Parliament sits in Canberra.",
    ]
    engine = RobustRAG(timeout=300)
    r = engine.answer("What is the capital of Australia?", [huge, *small])
    assert sum(not x.abstained for x in r.responses) >= 2, [x.error for x in r.responses]
    assert "Canberra" in r.answer
    assert read and max(read) < len(huge) // 4  # the passage was cut before the model read it


def test_each_aggregation_is_its_own_settings_reached_alike_by_both_adapters(nlp: Any) -> None:
    """(#28) ``RobustRAG(llm, aggregation=KeywordAggregation(alpha=..., beta=...))``: settings
    objects checked when made, holding no engine; the LangChain chain and the LlamaIndex
    synthesizer take ``aggregation=`` or ``robust=`` the same way."""
    import dataclasses

    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables import RunnableLambda
    from llama_index.core.llms import MockLLM

    from langchain_ragdefense import RobustRAGChain
    from llama_index.postprocessor.ragdefense import RobustRAGSynthesizer
    from ragdefense import MajorityVote

    agg = KeywordAggregation(alpha=0.5, beta=2)
    rr = RobustRAG(llm=str, aggregation=agg, nlp=nlp)
    assert rr.aggregation is agg and rr.aggregation.threshold(10) == 2
    assert not any(isinstance(v, RobustRAG) for v in vars(agg).values())  # no back-pointer
    with pytest.raises(dataclasses.FrozenInstanceError):
        agg.alpha = 0.1  # type: ignore[misc]
    with pytest.raises(ValueError, match="alpha"):
        KeywordAggregation(alpha=2.0)
    with pytest.raises(TypeError, match=r"keyword-only|positional"):
        RobustRAG(str, "keyword", nlp)  # type: ignore[misc]

    class Nothing(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Any]:
            return []

    configured = RobustRAG(llm=str, aggregation=MajorityVote(), nlp=nlp, timeout=7)
    lc = RobustRAGChain.from_llm(RunnableLambda(str), Nothing(), aggregation=agg)
    li = RobustRAGSynthesizer(llm=MockLLM(), aggregation=agg)
    assert lc._robust is not None and lc._robust.aggregation is li.robust.aggregation is agg
    lc = RobustRAGChain.from_llm(RunnableLambda(str), Nothing(), robust=configured)
    li = RobustRAGSynthesizer(llm=MockLLM(), robust=configured)
    assert lc._robust is not None
    assert (lc._robust.timeout, li.robust.timeout, li.robust.aggregation.name) == (7, 7, "majority")
    with pytest.raises(TypeError, match="not both"):
        RobustRAGSynthesizer(llm=MockLLM(), aggregation="majority", robust=configured)
    with pytest.raises(TypeError, match="not both"):
        RobustRAGChain.from_llm(RunnableLambda(str), Nothing(), aggregation=agg, robust=configured)


def test_choices_without_majority_vote_are_refused(nlp) -> None:  # type: ignore[no-untyped-def]
    """Keyword aggregation ignored ``choices=`` without a word: a free-form answer came back
    to a multiple-choice question."""
    rr = RobustRAG(llm=scripted({}), nlp=nlp)
    with pytest.raises(ValueError, match="choices are for aggregation='majority', not keyword"):
        rr.answer(Q, ["p0", "p1"], choices=CHOICES)
