"""The core defense behind an adapter's compressor or postprocessor (:class:`AdapterCore`: built
from the adapter's current fields through :func:`ragdefense.defense`, run under the fail-open /
fail-closed policy, warning once per adapter when handed too few passages), the fields the
per-defense classes declare, and the RobustRAG engine behind a chain or synthesizer."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeGuard

from ..embedders import Embedder, as_embedder
from ..types import Defense, DefenseFailed, DefenseResult, Passage, QueryInputError, defend_given

if TYPE_CHECKING:
    from ..defenses.registry import Parameter
    from ..robustrag import RobustAnswer, RobustRAG

__all__ = [
    "AdapterCore",
    "TrustedField",
    "adapter_params",
    "answered",
    "checked_set",
    "configured",
    "defense_embedder",
    "defense_field",
    "defense_fields",
    "named",
    "plain_params",
    "plain_value",
    "pooled",
    "removals",
    "report_now",
    "robust_engine",
    "same_space",
]

logger = logging.getLogger("ragdefense")

#: whether the passages being defended are the pool an adapter retriever asked for and got
#: (fewer than the defense's pool is then all the store holds); ``False``: an adapter retriever
#: could not ask for it; ``None``: a compressor or postprocessor used alone. Per call.
_POOLED: ContextVar[bool | None] = ContextVar("ragdefense_pooled", default=None)
#: how many passages the adapter retriever asked for (``None``: unknown)
_ASKED: ContextVar[int | None] = ContextVar("ragdefense_asked", default=None)
#: the results of the defenses an adapter retriever's fetch round runs (its compressor or
#: postprocessor, a pipeline of several), kept for the retriever to report the last round's
#: removals alone (``None``: outside such a round, each result is reported as it comes)
_ROUNDS: ContextVar[list[DefenseResult | None] | None] = ContextVar(
    "ragdefense_rounds", default=None
)


@contextmanager
def pooled(fetched: bool = True, asked: int | None = None) -> Iterator[list[DefenseResult | None]]:
    """Within this block, an adapter retriever's fetch round defends the pool its retriever
    fetched (``fetched``, ``asked`` passages asked for): the small-pool warning then does not
    fire on fewer than the defense's pool, which is all the store holds, and where the store
    gave all that was asked, it names the fetch as the fix. A retriever that ignores the size
    it is asked for is not pooled, and a compressor or postprocessor used on its own never is.
    The adapters' compressors and postprocessors keep each result in the list it yields
    (:func:`report_now` says so), for the retriever to report the last round's removals once
    (a narrower round's may be in the wider round's context); defenses the retriever's own
    base runs, outside the block, report as they always do."""
    results: list[DefenseResult | None] = []
    token, count, kept = _POOLED.set(fetched), _ASKED.set(asked), _ROUNDS.set(results)
    try:
        yield results
    finally:
        _POOLED.reset(token)
        _ASKED.reset(count)
        _ROUNDS.reset(kept)


def report_now(result: DefenseResult | None) -> TypeGuard[DefenseResult]:
    """Whether an adapter reports ``result``'s removals as it comes: it removed something and
    is not in a fetch round (:func:`pooled`: there it is kept for the retriever instead)."""
    rounds = _ROUNDS.get()
    if rounds is not None:
        rounds.append(result)
    return rounds is None and result is not None and bool(result.removed)


def removals(results: list[DefenseResult | None]) -> list[DefenseResult]:
    """The results of a fetch round (:func:`pooled`) that removed anything, in order."""
    return [r for r in results if r is not None and r.removed]


def named(defense: Any) -> bool:
    """Whether ``defense`` is given by name (``None``: the default defense), not an object."""
    return defense is None or isinstance(defense, str)


def configured(defense: Any, model: Any, field: str) -> None:
    """Refuse an adapter's embedding ``model`` (its ``field``) beside a defense object: the
    object embeds with its own ``embedder``, and the model would otherwise be dropped without
    a word."""
    if model is not None and not named(defense):
        raise TypeError(
            f"{field}: a defense object comes configured: give it embedder=... (e.g. "
            f"{type(defense).__name__}(embedder={field})), or give the defense by name"
        )


def defense_embedder(defense: Any) -> Any:
    """The embedding model a defense object embeds with (a wrapper's, such as a quarantine's,
    its inner defense's); ``None``: the packaged default."""
    for _ in range(8):  # wrappers nest a few deep at most
        if hasattr(defense, "embedder") or not hasattr(defense, "defense"):
            break
        defense = defense.defense
    return getattr(defense, "embedder", None)


def same_space(model: Any, own: Any) -> bool:
    """Whether the vectors a store made with ``own`` (``None``: not known) are in the space
    ``model`` embeds in: ``model`` is ``own``, a core embedder wrapping it or the one inside it
    (``ragdefense_embedder``: :func:`~ragdefense.as_embedder` unwraps it), or ``None`` (the
    packaged default) where ``own`` is the packaged model too or is not known (the core checks
    carried vectors against it). Another model's vectors would be compared with the query in
    another space, silently where the sizes agree; a known other model's are left out, and the
    default embeds the texts itself."""
    inside = getattr(own, "ragdefense_embedder", None)  # an adapter's embeddings' embedder
    if model is own or (model is not None and inside is model):
        return True
    if model is None:
        return own is None or _packaged(own)
    inner = ("embeddings", "embed_model") if isinstance(model, Embedder) else ()
    return own is not None and any(getattr(model, name, None) is own for name in inner)


def _packaged(model: Any) -> bool:
    """Whether ``model`` is the packaged all-MiniLM-L6-v2, or a framework wrapper of it (the
    adapters' ``RagdefenseEmbeddings`` / ``RagdefenseEmbedding``)."""
    wrapped = getattr(model, "embedder", None) or getattr(model, "_embedder", None)
    return any(getattr(m, "packaged", False) is True for m in (model, wrapped))


class AdapterCore:
    """The core defense behind an adapter's compressor or postprocessor, built from its current
    settings and built again whenever they change (a field assigned, ``params`` edited in
    place, other embeddings): what the adapter runs always matches what it shows. Bad names
    and parameters raise in :meth:`get`, which the adapters call at construction."""

    def __init__(self, owner: object = None) -> None:
        self._owner = id(owner) if owner is not None else None
        self._key: tuple[Any, ...] | None = None
        self._core: Defense | None = None
        self._warned = False

    @classmethod
    def claim(cls, current: AdapterCore, owner: object) -> AdapterCore:
        """``current`` if it is ``owner``'s, else a new one for it: a copy of an adapter object
        (pydantic's ``model_copy`` shares private attributes) gets its own core, caches and
        warning state instead of rebuilding the original's at every turn."""
        if current._owner is None:
            current._owner = id(owner)
        return current if current._owner == id(owner) else cls(owner)

    def get(
        self,
        defense: Any,
        params: Mapping[str, Any],
        embeddings: Any,
        wrap: Callable[[Any], Any],
    ) -> Defense:
        """The core for ``defense`` (a name or an object, see :func:`ragdefense.defense`) with
        ``params`` and ``embeddings`` (a framework's model, turned into a core embedder by
        :func:`~ragdefense.as_embedder`, the library's own by ``wrap``; ``None``: the
        packaged MiniLM)."""
        by_name = named(defense)
        key = (defense if by_name else id(defense), repr(sorted(params.items())), id(embeddings))
        if self._core is None or key != self._key:
            from ..defenses.registry import defense as front_door

            if by_name:  # one wrapper per model while in use (its cache shared by every
                # adapter on it), the library's own embeddings wrapped here (the retrievers'
                # query-once path matches on them)
                ours = getattr(embeddings, "ragdefense_embedder", None) is not None
                embed = wrap if ours else as_embedder
                embedder = embed(embeddings) if embeddings is not None else None
                self._core = front_door(defense, embedder=embedder, **params)
            else:  # an object comes configured: parameters are an error, as in the core
                self._core = front_door(defense, **params)
            self._key = key
        return self._core

    def run(
        self,
        defense: Defense,
        query: str,
        passages: Sequence[Passage],
        fail_open: bool = False,
        too_few: str = "",
        query_embedding: Any = None,
    ) -> DefenseResult | None:
        """Run ``defense``; on failure raise :class:`~ragdefense.DefenseFailed` (fail closed,
        the default) or, with ``fail_open``, warn and return ``None`` (the caller passes the
        passages through), or the defense's ``fallback(query, passages)`` where it has one (a
        :class:`~ragdefense.Quarantine` still removes what the audit flagged). A
        :class:`~ragdefense.QueryInputError` (the query, which no document causes) raises
        either way; a document's own bad data (a NaN vector) fails like any error.
        ``query_embedding``: the query's vector by the defense's own model, as the retriever
        computed it (a defense that ``uses_embeddings`` then does not embed
        the query again; any other ignores it).

        Handed fewer passages than the defense's ``min_passages`` (not compared), or
        fewer than its ``min_pool`` where no adapter retriever fetched the pool
        (:func:`pooled`), it warns once for this adapter, adding ``too_few``: how to retrieve
        more in the caller's framework (a postprocessor cannot widen retrieval itself)."""
        if not passages:
            return None
        self._warn_small_pool(defense, len(passages), too_few)
        try:
            # its defend(), with the query's vector where it embeds: the passages as before
            given = query_embedding if getattr(defense, "uses_embeddings", False) else None
            return defend_given(defense, query, passages, None, given)
        except QueryInputError:
            raise  # no document causes it (a query not a string, embedded by another model):
            # a bug to fix, never an outage to ride out by passing every document unchecked
        except Exception as exc:
            message = (
                f"{defense.name} failed on {len(passages)} passage(s): {type(exc).__name__}: {exc}"
            )
            if not fail_open:
                raise DefenseFailed(message + " (fail_open=True passes documents through)") from exc
            # a defense that can still act without its failed part (a quarantine: the audit's
            # findings) says what passes instead of everything
            fallback = getattr(defense, "fallback", None)
            passed = "but the quarantined ones" if callable(fallback) else "unchecked"
            warnings.warn(f"{message}; passing the documents through {passed}", stacklevel=4)
            # the warning is what a person sees; the log record is for log pipelines, at INFO
            # so that Python's last-resort handler does not print the same line twice
            logger.info("%s; passing the documents through %s", message, passed)
            return fallback(query, passages) if callable(fallback) else None

    def _warn_small_pool(self, defense: Defense, n: int, fix: str) -> None:
        need, floor = defense.min_passages, defense.min_pool
        if n < need:
            what = (
                f"fewer than the {need} it needs to compare: what only a comparison would "
                "catch passes."
            )
        elif n < floor and not _POOLED.get():
            what = (
                f"fewer than the pool of {floor} it filters from: in so few passages a poisoned "
                "majority can be all of them and pass."
            )
        else:
            return
        if self._warned:
            return
        self._warned = True
        asked = _ASKED.get()
        if _POOLED.get() and asked is not None and n >= asked:  # all it asked for: too few
            fix = f"defend() asked for {asked} only: raise its fetch_k to {max(need, floor)}."
        elif _POOLED.get():  # defend() asked for the pool already
            fix = "defend() asked for more: the store returned no more."
        elif _POOLED.get() is False:
            fix = (
                "defend() could not ask this retriever for that many passages: where it holds "
                "its size in a setting defend() does not know, set that to the pool yourself; "
                "where it returns fewer than it is asked (a store that filters after its "
                "search, a parent-document retriever), give defend() a larger fetch_k."
            )
        message = f"{defense.name} was given {n} passage(s), {what} {fix}".strip()
        warnings.warn(message, stacklevel=5)
        logger.info("%s", message)  # INFO: the warning above already shows it once


def robust_engine(robust: Any, aggregation: Any) -> RobustRAG:
    """The RobustRAG engine behind an adapter's chain or synthesizer: ``robust`` (a configured
    :class:`~ragdefense.RobustRAG`: its aggregation and settings; the adapter rebinds its LLM),
    else one with ``aggregation`` (a name or an aggregation's settings). Both adapters take the
    two the same way; giving both is an error."""
    from ..robustrag import RobustRAG as Engine

    named = aggregation if isinstance(aggregation, str) else getattr(aggregation, "name", None)
    if robust is None and named == "decoding":  # before the engine's own check, whose advice
        raise ValueError(_NO_DECODING)  # (a transformers model) an adapter cannot take
    if robust is None:  # the adapter binds its framework's LLM (RobustRAG.with_llm)
        engine = Engine(llm=_unbound, aggregation=aggregation)
    elif not isinstance(robust, Engine):
        raise TypeError(f"robust must be a ragdefense.RobustRAG, got {type(robust).__name__}")
    elif aggregation != "keyword":
        raise TypeError("give aggregation= or robust= (which holds its own aggregation), not both")
    else:
        engine = robust
    if engine.aggregation.name == "decoding":  # found at construction, not after retrieval
        raise ValueError(_NO_DECODING)
    return engine


def answered(report: RobustAnswer) -> RobustAnswer:
    """``report``, unless every isolated LLM call failed: then the model is down (or its key
    wrong), and "I don't know" would pass for an answer, hiding the outage from the framework's
    retries, fallbacks and error callbacks, so :class:`~ragdefense.DefenseFailed` names it. Some
    calls failing are abstentions, as in the core."""
    errors = [r.error for r in report.responses if r.error is not None]
    if errors and len(errors) == len(report.responses):
        raise DefenseFailed(
            f"every isolated LLM call failed ({len(errors)} of {len(errors)}); the first: "
            f"{errors[0]}"
        )
    return report


_NO_DECODING = (
    "secure decoding needs next-token probabilities, which a LangChain or LlamaIndex LLM does "
    "not expose: use aggregation='keyword' or 'majority' here (decoding runs with "
    "ragdefense.llm.TransformersLLM in ragdefense.RobustRAG itself)"
)


def _unbound(prompt: str) -> str:
    raise RuntimeError("an adapter's RobustRAG answers with the LLM the adapter binds")


#: ``trusted=`` as an adapter's field takes it: sources (a set or a list, held as a sorted list, so
#: that the adapter serializes to JSON), or a predicate on a passage's metadata
TrustedField = list[str] | set[str] | frozenset[str] | Callable[[Mapping[str, Any]], bool] | None


def checked_set(
    model: Any, name: str, value: Any, assign: Callable[[str, Any], None], build: Callable[[], Any]
) -> None:
    """Set a pydantic model's field through ``assign`` (its own ``__setattr__``, which checks
    the type), then ``build`` what the fields configure, as at construction: a value the build
    refuses is undone and the error raised (it would otherwise fail at the next query, and
    leave the object holding it). Other attributes are only assigned."""
    if name not in type(model).model_fields:
        assign(name, value)
        return
    before, was_set = model.__dict__.get(name), name in model.model_fields_set
    assign(name, value)
    try:
        build()
    except Exception:
        model.__dict__[name] = before
        if not was_set:
            model.model_fields_set.discard(name)
        raise


def plain_value(value: Any) -> Any:
    """A parameter's value as an adapter stores it (a ``params`` entry or the ``trusted``
    field): a set becomes a sorted list, so that the adapter serializes to JSON; anything else
    stays. The defense reads either alike."""
    return sorted(value, key=str) if isinstance(value, (set, frozenset)) else value


def plain_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """An adapter's ``params`` as it stores them (:func:`plain_value` of each)."""
    return {k: plain_value(v) for k, v in params.items()}


def adapter_params(model: Any, base: type) -> dict[str, Any]:
    """An adapter's parameters for its defense: the fields its class declares beyond ``base``'s
    (the per-defense classes write them out) over its ``params`` mapping."""
    own = base.model_fields  # type: ignore[attr-defined]
    fields = {k: getattr(model, k) for k in type(model).model_fields if k not in own}
    clash = sorted(set(model.params) & set(fields))
    if clash:
        name = type(model).__name__
        raise TypeError(
            f"{', '.join(clash)}: a field of {name}, not a params entry: {name}({clash[0]}=...)"
        )
    return {**dict(model.params), **fields}


def defense_fields(defense: str) -> list[Parameter]:
    """The parameters of the named defense that an adapter's per-defense class declares as
    fields (plain values: numbers, strings, literals, ``None``; and ``trusted``, typed
    :data:`TrustedField`), with the preset's defaults and the core's descriptions; a test holds
    each class's fields to this list."""
    from ..defenses.registry import _is_simple, parameters
    from ..provenance import Trust

    return [
        replace(p, annotation=TrustedField) if p.annotation == Trust else p
        for p in parameters(defense, simple_only=False)
        if p.annotation == Trust or _is_simple(p.annotation)
    ]


def defense_field(defense: str, name: str) -> Parameter:
    """One of :func:`defense_fields`: what an adapter's field for it takes as default and
    description."""
    for p in defense_fields(defense):
        if p.name == name:
            return p
    raise KeyError(f"{defense} has no parameter {name!r} an adapter can declare")
