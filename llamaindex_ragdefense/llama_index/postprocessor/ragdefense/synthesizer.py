"""RobustRAG as a LlamaIndex response synthesizer (one isolated LLM call per node, secure
aggregation in the core) and as a query engine."""

from __future__ import annotations

import contextvars
import copy
import string
from collections.abc import AsyncGenerator, Generator, Sequence
from dataclasses import replace
from typing import Any, cast

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.response.schema import RESPONSE_TYPE, Response
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload
from llama_index.core.llms import LLM
from llama_index.core.prompts import BasePromptTemplate, ChatPromptTemplate, PromptTemplate
from llama_index.core.prompts.mixin import PromptDictType
from llama_index.core.query_engine import CustomQueryEngine
from llama_index.core.response_synthesizers import BaseSynthesizer
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle, QueryType
from pydantic import Field

from ragdefense import Passage, RobustAnswer, RobustRAG
from ragdefense.integration.adapter import answered, robust_engine
from ragdefense.integration.records import check_items, copied
from ragdefense.llm import LlamaIndexLLM
from ragdefense.robustrag.checks import TEMPLATE_FIELDS, check_certify, check_templates
from ragdefense.robustrag.types import IDK

__all__ = ["RobustRAGQueryEngine", "RobustRAGSynthesizer"]

_report: contextvars.ContextVar[RobustAnswer | None] = contextvars.ContextVar(
    "ragdefense_report", default=None
)
#: the nodes of the synthesis in progress: their ids and metadata go with their chunks
_nodes: contextvars.ContextVar[Sequence[NodeWithScore]] = contextvars.ContextVar(
    "ragdefense_nodes", default=()
)


class RobustRAGSynthesizer(BaseSynthesizer):
    """RobustRAG response synthesizer: ``index.as_query_engine(llm=llm,
    response_synthesizer=RobustRAGSynthesizer(llm=llm))``.

    The response's ``metadata["ragdefense"]`` holds the core :class:`ragdefense.RobustAnswer`
    (isolated answers, abstentions, keyword counts, threshold, certificate).

    Each node reaches its isolated call as LlamaIndex hands nodes to any synthesizer: with the
    metadata it shows the LLM (``excluded_llm_metadata_keys`` hides a key; metadata is as
    much the attacker's as the text). LangChain's ``RobustRAGChain`` sends ``page_content``
    only, so the same passages can get other answers there.

    Args:
        llm: The LlamaIndex LLM (required: nothing falls back to ``Settings``).
        aggregation: ``"keyword"`` / ``"majority"`` (pass ``choices=`` to ``get_response``),
            or an aggregation's settings (``KeywordAggregation(alpha=0.3, beta=3)``,
            ``MajorityVote()``); secure decoding needs next-token probabilities, which a
            LlamaIndex LLM does not expose.
        robust: A configured :class:`ragdefense.RobustRAG` instead (its aggregation, timeout,
            prompts, passage budget; ``llm`` replaces its LLM): as the LangChain chain.
        max_concurrency: Isolated calls in flight at once (shared with every synthesizer over
            ``llm`` with the same limit).
        certify: k' to certify against (``None``: no certificate).
        streaming: Give a streaming response (``query_engine.query(q).response_gen``) as
            LlamaIndex's synthesizers do: the answer needs every isolated one, so it comes as
            one chunk.
        callback_manager: LlamaIndex's callback manager (default: ``Settings``'s). As with
            LlamaIndex's own synthesizers, one given is set on ``llm`` too (its calls are
            traced there); without one the LLM keeps its own.

    Its prompts are the core's templates, shown and changed as LlamaIndex's are
    (``get_prompts()``, ``update_prompts({"isolated_prompt": PromptTemplate(...)})``): a
    template given is formatted as LlamaIndex formats it (``partial_format`` values, variable
    mappings), and LlamaIndex's ``{context_str}`` / ``{query_str}`` stand for ``{context}`` /
    ``{query}``.
    """

    def __init__(
        self,
        llm: LLM,
        aggregation: Any = "keyword",
        max_concurrency: int = 8,
        certify: int | None = None,
        robust: RobustRAG | None = None,
        streaming: bool = False,
        callback_manager: CallbackManager | None = None,
    ) -> None:
        if llm is None:
            raise ValueError("RobustRAGSynthesizer needs llm= (it never falls back to Settings)")
        if not isinstance(llm, LLM):  # a LangChain model or a name failed deep in LlamaIndex
            raise TypeError(
                f"llm must be a LlamaIndex LLM, got {type(llm).__name__} (a LangChain model goes "
                "to langchain_ragdefense's RobustRAG chain, or to ragdefense.RobustRAG)"
            )
        check_certify(certify, "injection", None)  # before any query, as the chain's
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int):
            raise TypeError(f"max_concurrency must be an int, got {max_concurrency!r}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        super().__init__(
            llm=llm,
            callback_manager=callback_manager,
            streaming=bool(streaming),
            empty_response=IDK,  # RobustRAG's answer without passages, streamed or not
        )
        self._robust = robust_engine(robust, aggregation).with_llm(
            LlamaIndexLLM(llm, max_concurrency, timeout=None)  # the engine's timeout governs
        )
        self._certify = certify

    @classmethod
    def class_name(cls) -> str:
        return "RobustRAGSynthesizer"

    @property
    def robust(self) -> RobustRAG:
        """The core defense."""
        return self._robust

    def _get_prompts(self) -> PromptDictType:
        """The isolated answer's template and the aggregation's (``keyword_prompt`` or
        ``choice_prompt``); majority vote asks each passage with its ``choice_prompt``, and
        shows no isolated one (it would be accepted and never used)."""
        majority = self._robust.aggregation.name == "majority"
        found = {} if majority else {"isolated_prompt": self._robust.isolated_prompt}
        found |= {k: getattr(self._robust.aggregation, k) for k in _AGGREGATION_PROMPTS
                  if hasattr(self._robust.aggregation, k)}  # fmt: skip
        return {k: PromptTemplate(_shown(v)) for k, v in found.items()}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        """Set the core's templates (checked as the core checks them); another key is refused."""
        known = self._get_prompts()
        unknown = sorted(set(prompts) - set(known))
        if unknown:
            raise ValueError(f"unknown prompt(s) {unknown}: this synthesizer has {sorted(known)}")
        texts = {k: _core_template(k, v) for k, v in prompts.items()}
        robust = copy.copy(self._robust)
        if "isolated_prompt" in texts:
            isolated = texts.pop("isolated_prompt")
            check_templates(isolated_prompt=isolated)
            robust.isolated_prompt = isolated
        if texts:
            robust.aggregation = replace(cast(Any, robust.aggregation), **texts)  # checked anew
        self._robust = robust

    def _asked(self, response_kwargs: dict[str, Any]) -> dict[str, Any]:
        """One answer's settings: ``choices=`` is the one response keyword read (another, such
        as ``certify=``, a synthesizer setting, would be dropped unseen: refused)."""
        if unknown := sorted(set(response_kwargs) - {"choices"}):
            raise TypeError(f"unknown response keyword(s) {unknown}: give choices= alone")
        return {"choices": response_kwargs.get("choices"), "certify": self._certify}

    def get_response(
        self, query_str: str, text_chunks: Sequence[str], **response_kwargs: Any
    ) -> str:
        """Answer ``query_str`` from ``text_chunks`` (one isolated call per chunk)."""
        asked = self._asked(response_kwargs)
        report = answered(self._robust.answer(query_str, _passages(text_chunks), **asked))
        _report.set(report)
        return _one(report.answer) if self._streaming else report.answer  # type: ignore[return-value]

    async def aget_response(
        self, query_str: str, text_chunks: Sequence[str], **response_kwargs: Any
    ) -> str:
        """Async :meth:`get_response` (the isolated calls go out concurrently)."""
        asked = self._asked(response_kwargs)
        report = answered(await self._robust.aanswer(query_str, _passages(text_chunks), **asked))
        _report.set(report)
        return _aone(report.answer) if self._streaming else report.answer  # type: ignore[return-value]

    def _get_metadata_for_response(self, nodes: list[BaseNode]) -> dict[str, Any] | None:
        """LlamaIndex's response metadata with the report beside it: in the response its end
        event carries (what event handlers read), not only in the one returned."""
        found = super()._get_metadata_for_response(nodes) or {}
        report = _report.get()
        return found if report is None else {**found, "ragdefense": report}

    def synthesize(
        self,
        query: Any,
        nodes: list[NodeWithScore],
        additional_source_nodes: Sequence[NodeWithScore] | None = None,
        **response_kwargs: Any,
    ) -> RESPONSE_TYPE:
        """LlamaIndex's synthesis (events and callbacks included), with the core's report in
        the response's ``metadata["ragdefense"]``."""
        token = _report.set(None)  # this call's report only, never an earlier one's
        given = _nodes.set(nodes)
        try:
            response = super().synthesize(query, nodes, additional_source_nodes, **response_kwargs)
            if not nodes:  # LlamaIndex answers "Empty Response" without asking: our answer
                self.get_response(_query_str(query), [], **response_kwargs)
                response = _empty(response, _report.get())
            return response
        finally:
            _report.reset(token)
            _nodes.reset(given)

    async def asynthesize(
        self,
        query: Any,
        nodes: list[NodeWithScore],
        additional_source_nodes: Sequence[NodeWithScore] | None = None,
        **response_kwargs: Any,
    ) -> RESPONSE_TYPE:
        """Async :meth:`synthesize`."""
        token = _report.set(None)
        given = _nodes.set(nodes)
        try:
            response = await super().asynthesize(
                query, nodes, additional_source_nodes, **response_kwargs
            )
            if not nodes:
                await self.aget_response(_query_str(query), [], **response_kwargs)
                response = _empty(response, _report.get())
            return response
        finally:
            _report.reset(token)
            _nodes.reset(given)


def _passages(chunks: Sequence[str]) -> list[Passage]:
    """The chunks LlamaIndex hands :meth:`RobustRAGSynthesizer.get_response`, as the engine's
    passages: with their nodes' ids and metadata in its report where they come from the nodes
    of the synthesis in progress, one each (the prompts hold the chunks as LlamaIndex wrote
    them)."""
    chunks = check_items(chunks, str, "text chunks (str)")  # one str: a call per character
    nodes = _nodes.get()
    if len(nodes) != len(chunks):  # asked directly, or chunks LlamaIndex joined or split
        return [Passage(c) for c in chunks]
    return [  # the report keeps copies: a node edited later leaves it as it was
        Passage(c, id=n.node.node_id, metadata=copied(n.node.metadata))
        for c, n in zip(chunks, nodes, strict=True)
    ]


#: the aggregations' templates a synthesizer shows beside the isolated one
_AGGREGATION_PROMPTS = ("keyword_prompt", "choice_prompt")
#: LlamaIndex's own names for the passage and the question (its QA templates use them)
_ALIASES = {"context_str": "context", "query_str": "query"}


def _shown(template: str) -> str:
    """A core template (``str.format``: literal braces doubled) as LlamaIndex writes one
    (literal braces single), so that what ``get_prompts`` shows, given back, is the same."""
    parts = string.Formatter().parse(template)
    return "".join(
        text + ("" if field is None else "{" + field + "}") for text, field, _, _ in parts
    )


def _core_template(label: str, prompt: BasePromptTemplate) -> str:
    """``prompt`` as the core's template (``str.format`` style): its ``partial_format`` values,
    variable and function mappings applied; ``{context_str}`` / ``{query_str}`` read as
    ``{context}`` / ``{query}``. A variable nothing fills is refused (it would reach the LLM
    as literal text)."""
    used = getattr(prompt, "default_template", prompt)  # a selector formats its default here
    if isinstance(used, ChatPromptTemplate):  # formatted, its roles would be plain text
        raise TypeError(
            f"{label} is sent as one completion prompt: give a PromptTemplate (a chat "
            "template's roles would reach the LLM as text)"
        )
    fields = TEMPLATE_FIELDS[label]
    marks = {f: f"\x00{f}\x00" for f in fields}
    given = {**marks, **{a: marks[f] for a, f in _ALIASES.items() if f in marks}}
    mapped = prompt.template_var_mappings or {}
    filled = {mapped.get(k, k) for k in [*prompt.kwargs, *given]}
    filled |= set(prompt.function_mappings or {})
    unfilled = [v for v in prompt.template_vars if v not in filled]
    if unfilled:
        names = ", ".join("{" + f + "}" for f in fields)
        raise ValueError(
            f"{label} cannot be filled: nothing gives {', '.join('{' + v + '}' for v in unfilled)}"
            f" (RobustRAG fills {names}; give others with partial_format())"
        )
    text = prompt.format(llm=None, **given).replace("{", "{{").replace("}", "}}")
    for f, mark in marks.items():
        text = text.replace(mark, "{" + f + "}")
    return text


def _one(text: str) -> Generator[str, None, None]:
    """A streamed answer of one chunk."""
    yield text


async def _aone(text: str) -> AsyncGenerator[str, None]:
    """A streamed answer of one chunk (async)."""
    yield text


def _query_str(query: Any) -> str:
    return query if isinstance(query, str) else str(getattr(query, "query_str", query))


def _empty(response: RESPONSE_TYPE, report: RobustAnswer | None) -> RESPONSE_TYPE:
    """LlamaIndex's empty response, holding RobustRAG's answer (and certificate) instead, and
    the report in its metadata."""
    if report is not None:
        if isinstance(response, Response):
            response.response = report.answer
        response.metadata = {**(response.metadata or {}), "ragdefense": report}
    return response


class RobustRAGQueryEngine(CustomQueryEngine):
    """Retrieve, then answer with :class:`RobustRAGSynthesizer`; never touches ``Settings``."""

    retriever: BaseRetriever = Field(description="the retriever")
    synthesizer: RobustRAGSynthesizer = Field(description="the RobustRAG synthesizer")

    @classmethod
    def class_name(cls) -> str:
        return "RobustRAGQueryEngine"

    def _get_prompt_modules(self) -> dict[str, Any]:
        """The synthesizer's prompts, as a query engine exposes its synthesizer's
        (``get_prompts()``, ``update_prompts({"response_synthesizer:isolated_prompt": ...})``)."""
        return {"response_synthesizer": self.synthesizer}

    def model_post_init(self, context: Any, /) -> None:
        """This query engine passes no ``choices``: with majority vote every query would fail
        (a subclass whose ``custom_query`` or ``acustom_query`` passes them is left to do so)."""
        super().model_post_init(context)
        ours = self._own("custom_query") and self._own("acustom_query")
        if ours and self.synthesizer.robust.aggregation.name == "majority":
            raise ValueError(
                "a query engine cannot pass choices, which majority vote needs: call "
                "RobustRAGSynthesizer.get_response(query, chunks, choices=[...]) instead"
            )

    @classmethod
    def from_args(
        cls, retriever: BaseRetriever, llm: LLM, **synthesizer_kwargs: Any
    ) -> RobustRAGQueryEngine:
        """``RobustRAGQueryEngine.from_args(index.as_retriever(similarity_top_k=10), llm=llm)``;
        a ``callback_manager`` given is the engine's and the synthesizer's."""
        manager = synthesizer_kwargs.get("callback_manager")
        engine = {} if manager is None else {"callback_manager": manager}
        synthesizer = RobustRAGSynthesizer(llm, **synthesizer_kwargs)
        return cls(retriever=retriever, synthesizer=synthesizer, **engine)

    def query(self, str_or_query_bundle: QueryType) -> RESPONSE_TYPE:
        """Answer a query as LlamaIndex's query engines do: its query events and span, the
        bundle kept whole for the retriever (``custom_embedding_strs``, a given embedding);
        ``CustomQueryEngine`` passes the query's text alone and emits neither."""
        return BaseQueryEngine.query(self, str_or_query_bundle)

    async def aquery(self, str_or_query_bundle: QueryType) -> RESPONSE_TYPE:
        """Async :meth:`query`."""
        return await BaseQueryEngine.aquery(self, str_or_query_bundle)

    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        # a subclass's own custom_query gets the text, as CustomQueryEngine gives it
        query = query_bundle if self._own("custom_query") else query_bundle.query_str
        with self._query_event(query_bundle) as event:
            response = _response(self.custom_query(query))
            event.on_end(payload={EventPayload.RESPONSE: response})
        return response

    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        with self._query_event(query_bundle) as event:
            if not self._own("acustom_query"):  # a subclass's own: the text
                response = _response(await self.acustom_query(query_bundle.query_str))
            elif not self._own("custom_query"):  # its sync one only: CustomQueryEngine's way
                response = _response(self.custom_query(query_bundle.query_str))
            else:
                response = _response(await self.acustom_query(query_bundle))
            event.on_end(payload={EventPayload.RESPONSE: response})
        return response

    def _own(self, method: str) -> bool:
        """Whether ``method`` is this class's, not a subclass's (LlamaIndex wraps methods, so
        they are told apart by where they are defined)."""
        return next(c for c in type(self).__mro__ if method in vars(c)) is RobustRAGQueryEngine

    def _query_event(self, query_bundle: QueryBundle) -> Any:
        payload: dict[str, Any] = {EventPayload.QUERY_STR: query_bundle.query_str}
        return self.callback_manager.event(CBEventType.QUERY, payload=payload)

    def custom_query(self, query_str: QueryType) -> RESPONSE_TYPE:
        """Retrieve for ``query_str`` (a text, or the whole bundle :meth:`query` was given),
        then answer from the nodes in isolation."""
        nodes = self.retriever.retrieve(query_str)
        return self.synthesizer.synthesize(query_str, nodes)

    async def acustom_query(self, query_str: QueryType) -> RESPONSE_TYPE:
        """Async :meth:`custom_query`."""
        nodes = await self.retriever.aretrieve(query_str)
        return await self.synthesizer.asynthesize(query_str, nodes)


def _response(raw: Any) -> RESPONSE_TYPE:
    """A subclass's ``custom_query`` result as ``CustomQueryEngine`` returns it."""
    return Response(raw) if isinstance(raw, str) else cast(RESPONSE_TYPE, raw)
