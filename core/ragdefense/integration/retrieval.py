"""How much an adapter's retriever fetches for a defense: the pool for the caller's ``k``, the
rounds that widen it, and a framework retriever's own top-k."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from numbers import Integral
from typing import Any, cast

import numpy as np

from .. import types
from ..types import Defense

__all__ = [
    "FETCH_ROUNDS",
    "asked_ahead",
    "check_request",
    "checked_size",
    "fetch_rounds",
    "fetched_enough",
    "first_fetch",
    "judged_positions",
    "pool_size",
    "positive_int",
    "query_ahead",
    "wider",
]


async def asked_ahead(
    defense: Any,
    embedder: Any,
    passages: Sequence[Any],
    carried: Sequence[bool],
    aembed: Callable[[list[str]], Awaitable[Any]],
    query: str,
    aembed_query: Callable[[str], Awaitable[Any]] | None,
) -> tuple[list[Any] | None, Any]:
    """For an async adapter: the vectors ``defense`` would ask its ``embedder``'s hosted model
    for, asked through the model's async API (:meth:`~ragdefense.Embedder.embed_ahead`): one
    per passage it judges whose vector is not ``carried`` (``None`` for the others), and the
    query's (by ``aembed_query``, unless the defense embeds it only where it needs it).
    ``(None, None)`` where nothing is asked (fewer such texts than it judges at least, or its
    trust unread) or the model failed: the defense's own calls ask again."""
    judged = judged_positions(defense, passages)
    if judged is None:
        return None, None
    wanted = [i in judged and not c for i, c in enumerate(carried)]
    texts = [p.text for p, w in zip(passages, wanted, strict=True) if w]
    if len(set(texts)) < max(1, getattr(defense, "min_passages", 1)):
        return None, None
    ask = aembed_query if query_ahead(defense) else None
    rows, vector = await embedder.embed_ahead(texts, aembed, query, ask)
    if rows is None or (vector is not None and len(rows) and np.size(vector) != np.size(rows[0])):
        return None, None  # failed, or sized the query otherwise: the defense's calls say so
    found = iter(rows)
    return [next(found) if w else None for w in wanted], vector


def judged_positions(defense: Any, passages: Sequence[Any]) -> set[int] | None:
    """The positions of ``passages`` that ``defense`` judges, the ones worth embedding ahead (a
    quarantine holds some back unjudged; any other judges all); ``None`` where that cannot be
    read (a ``trusted=`` the defense cannot read: the defense says so itself when run)."""
    judged = getattr(defense, "judged", None)
    try:
        return set(judged(passages) if callable(judged) else range(len(passages)))
    except Exception:
        return None


def query_ahead(defense: Any) -> bool:
    """Whether an async adapter asks a hosted model for the query's vector ahead: unless the
    defense, inside any wrapper, embeds the query only where it needs it (``lazy_query``)."""
    for _ in range(8):  # wrappers nest a few deep at most
        if getattr(defense, "lazy_query", False):
            return False
        defense = getattr(defense, "defense", None)
    return True


def positive_int(value: Any) -> int | None:
    """``value`` if it is a positive ``int`` (not a bool), else ``None``: how the adapters read
    a framework retriever's own top-k."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def checked_size(label: str, value: Any, none: str = "or None") -> int | None:
    """A size an adapter is given (``k``, ``fetch_k``, ``max_rounds``): a positive integer (a
    NumPy one too) as a plain ``int``, or ``None``; anything else a ``ValueError`` naming
    ``label`` (``none`` says what ``None`` means there); a ``fetch_k`` past
    :data:`~ragdefense.types.MAX_PASSAGES` too (every query would fail)."""
    whole = isinstance(value, Integral) and not isinstance(value, bool) and int(value) > 0
    if value is not None and not whole:
        raise ValueError(f"{label} must be a positive int {none}, got {value!r}")
    if label == "fetch_k" and value is not None and int(value) > types.MAX_PASSAGES:
        raise ValueError(  # refused when set, not on every query
            f"fetch_k={int(value)} is more than a defense compares at once "
            f"(ragdefense.types.MAX_PASSAGES = {types.MAX_PASSAGES})"
        )
    return None if value is None else int(value)


def check_request(defense: Any, params: Mapping[str, Any], **sizes: Any) -> dict[str, int | None]:
    """What an adapter's ``defend()`` checks before it builds anything, so that a mistake is
    the core's own plain error, not a framework's validation error wrapping it: each of
    ``sizes`` (``k``, ``fetch_k``) a positive integer (a NumPy one too) or ``None``, and a
    defense given by name built once with ``params`` (a misspelled name, parameter or value).
    Returns the sizes as plain ints; a fetch past :data:`~ragdefense.types.MAX_PASSAGES` (what
    a defense compares at once) is refused here, not on every query."""
    out = {label: checked_size(label, value) for label, value in sizes.items()}
    if defense is None or isinstance(defense, str):
        from ..defenses.registry import defense as front_door

        front_door(defense, **params)
    return out


def pool_size(defense: Defense, k: int) -> int:
    """How many passages to retrieve so that ``defense`` can return ``k``: ``k`` times its
    ``pool_factor`` (GRADA's M = 2n), and at least its ``min_pool`` and its ``min_passages``
    (what it needs to compare anything)."""
    return max(defense.pool_factor * k, defense.min_pool, defense.min_passages, k)


def first_fetch(pool: int, own: int | None) -> int:
    """The first round's fetch: the defense's ``pool``, at least what the base retriever
    returns by default (a retriever set to fetch more is not narrowed), at most
    :data:`~ragdefense.types.MAX_PASSAGES` (what a defense compares at once)."""
    return min(max(pool, own or 0), types.MAX_PASSAGES)


#: rounds of retrieval an adapter's retriever makes, doubling the fetch, when the defense leaves
#: fewer than the ``k`` the caller asked for (see :func:`fetch_rounds`)
FETCH_ROUNDS = 3


def fetch_rounds(defense: Any, k_given: bool) -> int:
    """The rounds ``defend()`` lets its retriever fetch: :data:`FETCH_ROUNDS` where the caller
    chose ``k``, else one (the retriever's own ``k``, fetched once); where the defense (or the
    adapter's compressor or postprocessor holding it) is a :class:`~ragdefense.Quarantine`
    holding anything, whose audited chunks can fill a pool, enough for the doubling fetch to
    pass its first pool by every chunk it holds (a planted set larger than the pool would
    empty the context otherwise), and never fewer than :data:`FETCH_ROUNDS`."""
    from ..defenses.quarantine import Quarantine

    inner = getattr(defense, "defense", None)  # a compressor's or postprocessor's
    held, first = 0, 0
    for guard in (defense, inner):
        while isinstance(guard, Quarantine):  # a quarantine inside another holds its own too
            first = first or pool_size(cast(Defense, guard), 1)
            held, guard = held + guard.size, guard.defense
    if held:
        return max(FETCH_ROUNDS, 1 + math.ceil(math.log2(1 + held / first)))
    return FETCH_ROUNDS if k_given else 1


def fetched_enough(
    k: int | None,
    fetch: int | None,
    fetched: int,
    kept: int,
    honoured: bool = True,
    before: int | None = None,
) -> bool:
    """Whether an adapter's retriever stops widening: ``k`` kept, or the base retriever gave
    fewer than asked where it returns what it is asked for when it holds that many
    (``honoured``: then it holds no more; FAISS with a filter filters its candidates after the
    search and gives fewer while it holds more), or no more than the round ``before`` (a
    retriever that ignores the size it is asked for: asking again gives the same), or no size
    to widen, or the next round could return more than one defense call accepts
    (:data:`~ragdefense.types.MAX_PASSAGES`)."""
    if before is not None and fetched <= before:
        return True
    most = types.MAX_PASSAGES  # read now: a user may raise it
    if (fetch and fetch >= most) or 2 * fetched > most:  # the next round could pass it (an
        return True  # ensemble returns more than each retriever is asked): one call takes no more
    return not k or not fetch or kept >= k or (honoured and fetched < fetch)


def wider(fetch: int | None) -> int | None:
    """The next round's fetch: twice this one, at most :data:`~ragdefense.types.MAX_PASSAGES`
    (what one defense call accepts); ``None`` where there is no size to widen."""
    return min(2 * fetch, types.MAX_PASSAGES) if fetch else None
