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
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from .types import DefenseFailed, DefenseInputError, DefenseResult, Passage, Verdict, _jsonable

if TYPE_CHECKING:
    from .defenses.registry import Parameter

__all__ = [
    "METADATA_KEY",
    "Defense",
    "adapter_defense",
    "check_items",
    "defense_fields",
    "fetched_pool",
    "import_object",
    "make_defense",
    "pool_size",
    "positive_int",
    "removed_report",
    "run_defense",
    "stored_vectors",
    "tagged_metadata",
    "verdict_metadata",
    "with_defense_fields",
]

#: the metadata key under which adapters record the defense's verdict on each returned copy
METADATA_KEY = "ragdefense"

logger = logging.getLogger("ragdefense")


@runtime_checkable
class Defense(Protocol):
    """Anything with the defenses' verb."""

    def defend(self, query: str, passages: Sequence[Any]) -> DefenseResult: ...


def positive_int(value: Any) -> int | None:
    """``value`` if it is a positive ``int`` (not a bool), else ``None``: how the adapters read
    a framework retriever's own top-k."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def pool_size(defense: Any, k: int) -> int:
    """How many passages to retrieve so that ``defense`` can return ``k``: ``k`` times its
    ``pool_factor`` (default 2, GRADA's M = 2n), and at least its ``min_pool`` and its
    ``min_passages`` (what it needs to compare anything)."""
    factor = getattr(defense, "pool_factor", 2)
    need = max(getattr(defense, "min_pool", 0), getattr(defense, "min_passages", 1))
    return max(int(factor) * k, int(need), k)


def make_defense(defense: Any = None, embedder: Any = None, **params: Any) -> Defense:
    """A core defense from a name of :mod:`ragdefense.defenses.registry` (``"ragdefender"``,
    ``"grada"``, ``"grada-peel"``, ``"auto"``, ...; ``None``: its ``DEFAULT_DEFENSE``) or an
    object with ``defend``.

    ``embedder`` and ``params`` go to the defense's constructor when it is built by name; bad
    names, parameters and values raise here, before any query.
    """
    if defense is None or isinstance(defense, str):
        from .defenses.registry import DEFAULT_DEFENSE, build

        built: Defense = build(DEFAULT_DEFENSE if defense is None else defense, embedder, **params)
        return built
    if isinstance(defense, Defense):  # an object comes configured: embedder is not applied
        if params:
            raise TypeError("parameters can only be given with a defense name")
        return defense
    raise TypeError(
        f"{type(defense).__name__} is not a defense (it has no defend(query, passages))"
    )


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


def adapter_defense(model: Any, base: type, embedder: Any) -> Defense:
    """The core defense of an adapter's pydantic ``model``: its ``defense`` built with
    ``embedder`` and the parameters its class declares beyond ``base``'s fields (the ones
    :func:`with_defense_fields` added). Bad parameters raise here, at construction."""
    own = base.model_fields  # type: ignore[attr-defined]
    params = {k: getattr(model, k) for k in type(model).model_fields if k not in own}
    return make_defense(model.defense, embedder, **params)


def defense_fields(defense: str) -> list[Parameter]:
    """The parameters of the named defense that an adapter exposes as fields (plain values:
    numbers, strings, literals, ``None``), with the preset's defaults and the core's
    descriptions. Adapters derive their fields from this, never from a hand copy."""
    from .defenses.registry import parameters

    return parameters(defense)


B = TypeVar("B")


def with_defense_fields(base: type[B], defense: str) -> type[B]:
    """A subclass of the pydantic model ``base`` (an adapter's compressor or postprocessor) with
    one field per parameter of ``defense`` (:func:`defense_fields`: type, default, description)
    and ``defense`` fixed to that name. Both adapters build their per-defense classes on it."""
    from pydantic import Field, create_model

    fields: dict[str, Any] = {
        p.name: (p.annotation, Field(default=p.default, description=p.description))
        for p in defense_fields(defense)
    }
    fixed = Field(default=defense, frozen=True, description="the core defense")
    model: type[B] = create_model(  # type: ignore[type-var]
        f"_{defense}_fields", __base__=base, defense=(Any, fixed), **fields
    )
    return model


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
        name = getattr(defense, "name", type(defense).__name__)
        message = f"{name} failed on {len(passages)} passage(s): {type(exc).__name__}: {exc}"
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
    need = getattr(defense, "min_passages", None)
    floor = getattr(defense, "min_pool", None)
    if need is not None and n < need:
        what = f"fewer than the {need} it needs to compare: they pass unchecked, poison included."
    elif floor is not None and n < floor and defense not in _POOLED:
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
    name = getattr(defense, "name", type(defense).__name__)
    message = f"{name} was given {n} passage(s), {what} {fix}".strip()
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
