"""RobustRAG as a LangChain Runnable: retrieve, one isolated LLM call per document (the model's
``invoke``, or ``ainvoke`` on the async path, ``max_concurrency`` calls at a time), secure
aggregation in the core."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForChainRun,
    CallbackManagerForChainRun,
)
from langchain_core.documents import Document
from langchain_core.language_models import BaseLanguageModel
from langchain_core.prompt_values import StringPromptValue
from langchain_core.retrievers import RetrieverLike
from langchain_core.runnables import Runnable, RunnableConfig, RunnableSerializable
from langchain_core.runnables.config import patch_config
from pydantic import ConfigDict, Field, PrivateAttr, field_validator
from typing_extensions import TypedDict

from ragdefense import Passage, RobustAnswer, RobustRAG
from ragdefense.integration.adapter import answered, checked_set, robust_engine
from ragdefense.integration.records import check_items, copied
from ragdefense.llm import LangChainLLM
from ragdefense.llm.calls import model_slots
from ragdefense.robustrag.checks import check_certify

__all__ = ["RobustRAGChain", "RobustRAGOutput", "RobustRAGQuestion"]


class RobustRAGQuestion(TypedDict, total=False):
    """A question as a dict: ``question`` (or ``query`` / ``input``), and for multiple choice
    the ``choices``."""

    question: str
    query: str
    input: str
    choices: list[str] | None


class RobustRAGOutput(TypedDict):
    """What the chain returns: the query, the aggregated answer, the retrieved documents and
    the core :class:`ragdefense.RobustAnswer` behind the answer."""

    query: str
    answer: str
    context: list[Document]
    report: RobustAnswer


class RobustRAGChain(RunnableSerializable[Any, RobustRAGOutput]):
    """Isolate-then-aggregate question answering (RobustRAG) over a retriever.

    Input: a question string, or a dict with ``"question"`` (or ``"query"`` / ``"input"``) and,
    for multiple choice, ``"choices"``. Output: ``{"query", "answer", "context", "report"}`` where
    ``report`` is the core :class:`ragdefense.RobustAnswer` (isolated answers, keyword counts,
    threshold, certificate). ``.stream()`` gives that output as one chunk (the answer needs every
    isolated one); each model run is tagged ``ragdefense:isolated``, ``ragdefense:certify`` or
    ``ragdefense:aggregate``, so that a UI streaming model tokens shows the aggregate's only.

    Build it with :meth:`from_llm`.

    Attributes:
        llm: The chat model (or any Runnable) answering each passage in isolation.
        retriever: Where the passages come from (in rank order): a retriever or any Runnable
            from a query string to Documents (``defend(r).with_config(...)``,
            ``.configurable_fields(...)``, ``.with_retry()``).
        aggregation: ``"keyword"`` / ``"majority"``, or an aggregation's settings
            (``KeywordAggregation(alpha=0.3, beta=3)``, ``MajorityVote()``); secure decoding
            needs next-token probabilities, which a LangChain model does not expose.
        robust: A configured :class:`ragdefense.RobustRAG` instead (its aggregation, timeout,
            prompts, passage budget; ``llm`` replaces its LLM): as the LlamaIndex synthesizer.
        max_concurrency: Isolated calls in flight at once, across every run of this chain
            (and of any chain or backend calling the same model with the same limit: a chain
            built per request shares it); a run's ``config["max_concurrency"]`` lowers it for
            that run's own calls.
        certify: k' to certify against (``None``: no certificate).
    """

    # a field set after construction is checked as at construction (max_concurrency=0 would
    # wait forever for a free slot)
    model_config = ConfigDict(
        arbitrary_types_allowed=True, extra="forbid", validate_assignment=True
    )

    llm: Runnable[Any, Any]
    retriever: RetrieverLike
    aggregation: Any = "keyword"
    robust: RobustRAG | None = None
    max_concurrency: int = Field(default=8, ge=1, strict=True)
    certify: int | None = Field(default=None, strict=True)
    _robust: RobustRAG | None = PrivateAttr(default=None)
    _built_for: tuple[Any, Any] | None = PrivateAttr(default=None)

    @field_validator("retriever", mode="before")
    @classmethod
    def _retriever(cls, value: Any) -> Any:
        """Any Runnable from a query to Documents but a language model: ``from_llm``'s two
        arguments swapped would otherwise build, and fail only at the first question."""
        if isinstance(value, Runnable) and not isinstance(value, BaseLanguageModel):
            return value
        hint = "store.as_retriever(...)" if hasattr(value, "as_retriever") else "a retriever"
        raise ValueError(f"retriever: expected {hint}, got {type(value).__name__}")

    @field_validator("certify")
    @classmethod
    def _certify(cls, value: int | None) -> int | None:
        check_certify(value, "injection", None)  # before any question, as the synthesizer's
        return value

    def model_post_init(self, context: Any, /) -> None:
        """Build the engine now, so that a bad aggregation fails at construction."""
        super().model_post_init(context)
        self._engine()

    def __setattr__(self, name: str, value: Any) -> None:
        """A field set later is checked as at construction (the engine built again); a value
        it refuses is undone."""
        checked_set(self, name, value, super().__setattr__, self._engine)

    def _engine(self) -> RobustRAG:
        """The core engine for the current ``robust`` and ``aggregation`` (built again when
        either changes, as the compressors' defenses are)."""
        fields = (self.robust, self.aggregation)
        built = self._built_for
        if (
            self._robust is None
            or built is None
            or built[0] is not fields[0]
            or built[1] != fields[1]
        ):
            self._robust, self._built_for = robust_engine(*fields), fields
        return self._robust

    @property
    def InputType(self) -> Any:
        """A question string, or a ``RobustRAGQuestion`` dict (what the input schema
        shows)."""
        return str | RobustRAGQuestion

    @property
    def OutputType(self) -> Any:
        """A ``RobustRAGOutput`` dict (what the output schema shows)."""
        return RobustRAGOutput

    @classmethod
    def from_llm(
        cls, llm: Runnable[Any, Any], retriever: RetrieverLike, **kwargs: Any
    ) -> RobustRAGChain:
        """``RobustRAGChain.from_llm(chat_model, retriever, max_concurrency=8, certify=1)``."""
        return cls(llm=llm, retriever=retriever, **kwargs)

    def _core(self, config: RunnableConfig) -> RobustRAG:
        # shares the spaCy pipeline and the model's calls-in-flight limit (every run's, a
        # chain rebuilt by configurable_fields or per request too: hung calls keep their
        # slots); the LLM is bound to this run's config
        slots = model_slots(self.llm, self.max_concurrency)
        cap = config.get("max_concurrency")  # LangChain's own limit, given for this run
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            cap = self.max_concurrency
        workers = min(cap, self.max_concurrency)
        backend = LangChainLLM(self.llm, workers, timeout=None, config=dict(config), slots=slots)
        return self._engine().with_llm(backend)

    @staticmethod
    def _parse(value: Any) -> tuple[str, list[str] | None]:
        if isinstance(value, StringPromptValue):  # ``prompt | chain``
            value = value.to_string()
        if isinstance(value, str):
            return value, None
        if isinstance(value, dict):
            for key in ("question", "query", "input"):
                if isinstance(value.get(key), str):
                    return value[key], value.get("choices")
        raise TypeError(
            "input must be a question string, a string prompt value, or a dict with a "
            "'question' (or 'query', 'input') key and, for majority vote, 'choices'"
        )

    @staticmethod
    def _output(query: str, docs: list[Document], report: RobustAnswer) -> RobustRAGOutput:
        return {"query": query, "answer": report.answer, "context": docs, "report": report}

    def _invoke(
        self,
        value: Any,
        run_manager: CallbackManagerForChainRun,
        config: RunnableConfig,
        **kwargs: Any,
    ) -> RobustRAGOutput:
        query, choices = self._parse(value)
        child = patch_config(config, callbacks=run_manager.get_child())
        found = self.retriever.invoke(query, child, **kwargs)
        docs = check_items(found, Document, "LangChain Document")
        report = self._core(child).answer(
            query, _passages(docs), choices=choices, certify=self.certify
        )
        answered(report)  # every call failed: the model is down, not undecided
        return self._output(query, docs, report)

    async def _ainvoke(
        self,
        value: Any,
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        **kwargs: Any,
    ) -> RobustRAGOutput:
        query, choices = self._parse(value)
        child = patch_config(config, callbacks=run_manager.get_child())
        found = await self.retriever.ainvoke(query, child, **kwargs)
        docs = check_items(found, Document, "LangChain Document")
        report = await self._core(child).aanswer(
            query, _passages(docs), choices=choices, certify=self.certify
        )
        answered(report)
        return self._output(query, docs, report)

    def invoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> RobustRAGOutput:
        """Answer a question; keyword arguments go to the retriever (``k=`` for a
        :func:`~langchain_ragdefense.defend` retriever or a vector store's)."""
        return self._call_with_config(self._invoke, input, config, run_type="chain", **kwargs)

    async def ainvoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> RobustRAGOutput:
        """Answer a question (async; the isolated calls go out concurrently through the model's
        ``ainvoke``)."""
        return await self._acall_with_config(
            self._ainvoke, input, config, run_type="chain", **kwargs
        )


def _passages(docs: list[Document]) -> list[Passage]:
    """The documents as the engine's passages: their ids and metadata in its report (the
    prompts hold their text alone)."""
    return [Passage(d.page_content, id=d.id, metadata=copied(d.metadata)) for d in docs]
