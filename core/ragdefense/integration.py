"""The adapter contract: what the framework adapters (LangChain, LlamaIndex) use of the core.
Building a defense by name, running it under a fail-open / fail-closed policy, the namespaced
metadata written on returned copies, and the report of what was removed. Adapters use only this
module and the public names of :mod:`ragdefense`."""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .types import (
    Defense,
    DefenseFailed,
    DefenseInputError,
    DefenseResult,
    Passage,
    Verdict,
    _jsonable,
)

if TYPE_CHECKING:
    from .defenses.registry import Parameter
    from .robustrag import RobustRAG

__all__ = [
    "FETCH_ROUNDS",
    "METADATA_KEY",
    "AdapterCore",
    "Defense",
    "adapter_params",
    "check_items",
    "defense_field",
    "defense_fields",
    "fetched_enough",
    "fetched_pool",
    "import_object",
    "plain_params",
    "pool_size",
    "positive_int",
    "removed_report",
    "robust_engine",
    "run_defense",
    "stored_vectors",
    "tagged_metadata",
    "verdict_metadata",
]

#: the metadata key under which adapters record the defense's verdict on each returned copy
METADATA_KEY = "ragdefense"

logger = logging.getLogger("ragdefense")


def positive_int(value: Any) -> int | None:
    """``value`` if it is a positive ``int`` (not a bool), else ``None``: how the adapters read
    a framework retriever's own top-k."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def pool_size(defense: Defense, k: int) -> int:
    """How many passages to retrieve so that ``defense`` can return ``k``: ``k`` times its
    ``pool_factor`` (GRADA's M = 2n), and at least its ``min_pool`` and its ``min_passages``
    (what it needs to compare anything)."""
    return max(defense.pool_factor * k, defense.min_pool, defense.min_passages, k)


def import_object(spec: str) -> Any:
    """The object named by ``"module:attribute"`` (the attribute may be dotted); ``ValueError``
    saying why when it cannot be imported."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{spec!r}: expected module:attribute")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{spec!r}: cannot import it ({exc})") from None
    return obj


class AdapterCore:
    """The core defense behind an adapter's compressor or postprocessor, built from its current
    settings and built again whenever they change (a field assigned, ``params`` edited in
    place, other embeddings): what the adapter runs always matches what it shows. Bad names
    and parameters raise in :meth:`get`, which the adapters call at construction."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._core: Defense | None = None

    def get(
        self,
        defense: Any,
        params: Mapping[str, Any],
        embeddings: Any,
        as_embedder: Callable[[Any], Any],
    ) -> Defense:
        """The core for ``defense`` (a name or an object, see :func:`ragdefense.defense`) with
        ``params`` and ``embeddings`` (a framework's model, turned into a core embedder by
        ``as_embedder``; ``None``: the packaged MiniLM)."""
        named = defense is None or isinstance(defense, str)
        key = (defense if named else id(defense), repr(sorted(params.items())), id(embeddings))
        if self._core is None or key != self._key:
            from .defenses.registry import defense as front_door

            if named:
                embedder = as_embedder(embeddings) if embeddings is not None else None
                self._core = front_door(defense, embedder=embedder, **params)
            else:  # an object comes configured: parameters are an error, as in the core
                self._core = front_door(defense, **params)
            self._key = key
        return self._core


def robust_engine(robust: Any, aggregation: Any) -> RobustRAG:
    """The RobustRAG engine behind an adapter's chain or synthesizer: ``robust`` (a configured
    :class:`~ragdefense.RobustRAG`: its aggregation and settings; the adapter rebinds its LLM),
    else one with ``aggregation`` (a name or an aggregation's settings). Both adapters take the
    two the same way; giving both is an error."""
    from .robustrag import RobustRAG as Engine

    if robust is None:  # the adapter binds its framework's LLM (RobustRAG.with_llm)
        return Engine(llm=_unbound, aggregation=aggregation)
    if not isinstance(robust, Engine):
        raise TypeError(f"robust must be a ragdefense.RobustRAG, got {type(robust).__name__}")
    if aggregation != "keyword":
        raise TypeError("give aggregation= or robust= (which holds its own aggregation), not both")
    return robust


def _unbound(prompt: str) -> str:
    raise RuntimeError("an adapter's RobustRAG answers with the LLM the adapter binds")


def plain_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """An adapter's ``params`` as it stores them: sets (e.g. ``trusted={...}``) become sorted
    lists, so that the adapter serializes to JSON; the defense reads either alike."""
    return {
        k: sorted(v, key=str) if isinstance(v, (set, frozenset)) else v for k, v in params.items()
    }


def adapter_params(model: Any, base: type) -> dict[str, Any]:
    """An adapter's parameters for its defense: the fields its class declares beyond ``base``'s
    (the per-defense classes write them out) over its ``params`` mapping."""
    own = base.model_fields  # type: ignore[attr-defined]
    fields = {k: getattr(model, k) for k in type(model).model_fields if k not in own}
    return {**dict(model.params), **fields}


def defense_fields(defense: str) -> list[Parameter]:
    """The parameters of the named defense that an adapter's per-defense class declares as
    fields (plain values: numbers, strings, literals, ``None``), with the preset's defaults and
    the core's descriptions; a test holds each class's fields to this list."""
    from .defenses.registry import parameters

    return parameters(defense)


def defense_field(defense: str, name: str) -> Parameter:
    """One of :func:`defense_fields`: what an adapter's field for it takes as default and
    description."""
    for p in defense_fields(defense):
        if p.name == name:
            return p
    raise KeyError(f"{defense} has no parameter {name!r} an adapter can declare")


#: rounds of retrieval an adapter's retriever makes, doubling the fetch, when the defense leaves
#: fewer than the ``k`` the caller asked for (one round when ``k`` is the retriever's own)
FETCH_ROUNDS = 3


def fetched_enough(k: int | None, fetch: int | None, fetched: int, kept: int) -> bool:
    """Whether an adapter's retriever stops widening: ``k`` kept, or the base retriever gave
    fewer than asked (it holds no more), or no size to widen."""
    return not k or not fetch or kept >= k or fetched < fetch


def run_defense(
    defense: Defense,
    query: str,
    passages: Sequence[Passage],
    fail_open: bool = False,
    too_few: str = "",
) -> DefenseResult | None:
    """Run ``defense``; on failure raise :class:`DefenseFailed` (fail closed, the default) or,
    with ``fail_open``, warn and return ``None`` (the caller passes the passages through).

    Handed fewer passages than a defense with a ``min_passages`` can compare (RAGDefender passes
    them through unchecked), or fewer than its ``min_pool`` where no adapter retriever fetched
    the pool (:func:`fetched_pool`), it warns once per defense object, adding ``too_few``: how to
    retrieve more in the caller's framework (a postprocessor cannot widen retrieval itself)."""
    if not passages:
        return None
    _warn_small_pool(defense, len(passages), too_few)
    try:
        return defense.defend(query, passages)
    except Exception as exc:
        message = (
            f"{defense.name} failed on {len(passages)} passage(s): {type(exc).__name__}: {exc}"
        )
        if not fail_open:
            raise DefenseFailed(message + " (fail_open=True passes documents through)") from exc
        warnings.warn(message + "; passing the documents through unchecked", stacklevel=3)
        # the warning is what a person sees; the log record is for log pipelines, at INFO so
        # that Python's last-resort handler does not print the same line twice
        logger.info("%s; passing the documents through unchecked", message)
        return None


_WARNED: weakref.WeakSet[Any] = weakref.WeakSet()
_POOLED: weakref.WeakSet[Any] = weakref.WeakSet()


def fetched_pool(defense: Any) -> None:
    """Record that an adapter's retriever fetches ``defense``'s :func:`pool_size` itself: a pool
    below its ``min_pool`` is then all the store holds, not a framework's top-k, and is not
    warned about."""
    with contextlib.suppress(TypeError):  # cannot be weakly referenced: the warning stays on
        _POOLED.add(defense)


def _warn_small_pool(defense: Defense, n: int, fix: str) -> None:
    need, floor = defense.min_passages, defense.min_pool
    if n < need:
        what = f"fewer than the {need} it needs to compare: they pass unchecked, poison included."
    elif n < floor and defense not in _POOLED:
        what = (
            f"fewer than the pool of {floor} it filters from: in so few passages a poisoned "
            "majority can be all of them and pass."
        )
    else:
        return
    if defense in _WARNED:  # False for what cannot be weakly referenced
        return
    with contextlib.suppress(TypeError):  # cannot be weakly referenced: warn each time
        _WARNED.add(defense)
    message = f"{defense.name} was given {n} passage(s), {what} {fix}".strip()
    warnings.warn(message, stacklevel=4)
    logger.info("%s", message)  # INFO: the warning above already shows it once


def tagged_metadata(metadata: Mapping[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of a document's ``metadata`` with ``record`` under :data:`METADATA_KEY`. A
    value already there (a user's own, or an earlier defense's) is kept, as
    ``record["previous"]``: nothing is overwritten, and nothing returned shares state with the
    caller's document, except a value that cannot be copied at all (a lock, a generator, an
    open file), which is carried as the very object, as the undefended retriever would."""
    out = {key: _copied(value) for key, value in dict(metadata).items()}
    mine = dict(record)
    if METADATA_KEY in out:
        mine["previous"] = out[METADATA_KEY]
    out[METADATA_KEY] = mine
    return out


def _copied(value: Any) -> Any:
    try:
        return copy.deepcopy(value)
    except Exception:  # not copyable (TypeError for locks and generators, copy.Error, ...)
        return value


def check_items(items: Any, kind: type, what: str) -> list[Any]:
    """``items`` as a list when it is a sequence of ``kind``; otherwise a clear
    :class:`~ragdefense.DefenseInputError` naming ``what`` was expected."""
    if items is None or isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise DefenseInputError(f"expected a list of {what}, got {type(items).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            raise DefenseInputError(f"item {i}: expected {what}, got {type(item).__name__}")
    return list(items)


_SAID: set[str] = set()


def stored_vectors(
    store: Any,
    ids: Sequence[str | None],
    lookup: Callable[[Any, list[str]], Mapping[str, Any] | None],
) -> list[Any | None]:
    """One stored vector per id (``None`` for a missing id or vector): ``lookup(store, ids)``
    is the adapter's reader for the stores it knows, returning ``None`` for a store it does not.
    Where no vector can be read the defense embeds the passages itself, and a warning says so
    once per store type."""
    wanted = [i for i in ids if i]
    try:
        found = lookup(store, wanted)
        why = "it is not one whose vectors ragdefense can read"
    except Exception as exc:  # a store that cannot answer: embed instead
        found, why = None, f"reading its vectors failed ({type(exc).__name__}: {exc})"
    if found is None:
        name = type(store).__name__
        if name not in _SAID:
            _SAID.add(name)
            logger.warning("%s: the defense embeds the retrieved passages itself: %s", name, why)
        return [None] * len(ids)
    return [found.get(i) if i else None for i in ids]


def verdict_metadata(result: DefenseResult, verdict: Verdict) -> dict[str, Any]:
    """The per-document record written under :data:`METADATA_KEY`."""
    return {
        "defense": result.defense,
        "kept": verdict.kept,
        "score": verdict.score,
        "score_name": result.score_name,
        "rank": verdict.rank,
        "reason": verdict.reason,
        **{k: v for k, v in verdict.details.items()},
    }


def removed_report(result: DefenseResult) -> dict[str, Any]:
    """A compact, JSON-friendly report of what was removed and why (for tracing events)."""
    return {
        "defense": result.defense,
        "query": result.query,
        "kept": len(result.kept),
        "removed": [
            {
                "index": v.index,
                "id": v.passage.id,
                "text": v.passage.text[:200],
                "score": v.score,
                "reason": v.reason,
            }
            for v in result.verdicts
            if not v.kept
        ],
        "estimates": {k: _jsonable(v) for k, v in result.estimates.items()},
    }
