"""Consensus's step 3: untrusted passages that contradict what the user trusts."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from ..addresses import working_folder
from ..provenance import AUTO, Trust, is_trusted_by, source_of
from ..types import DefenseInputError, Passage
from .pool import Pool

__all__ = ["contradicting", "innermost_trust", "trust_flags", "trust_of", "trust_test"]


def contradicting(pool: Pool, tightness: float, anchor: float | None) -> None:
    """Evidence 3: untrusted passages answering the query apart from every trusted one on
    the query's topic (trusted passages about something else are no reference for that),
    and near-copies of any trusted passage ranked above it (a trusted text edited toward
    the query; a faithful copy says nothing the trusted one does not). Every untrusted
    passage is judged, those below the topic bar too: a store's passages about another
    subject that resemble the query more than anything trusted go (another question's
    planted passages among them), and so does a passage a question needs beside the trusted
    ones that shares nothing with them (a multi-hop question's bridge)."""
    sim, qs, trusted, removed, estimates = pool.unpacked()
    every = [i for i, t in enumerate(trusted) if t]
    if not every:
        return
    topical = set(pool.topical) if anchor is not None else set()
    anchors = [i for i in every if i in topical]
    found = []
    for i in range(len(qs)):
        if trusted[i] or i in removed:
            continue
        copied = [j for j in every if sim[i, j] >= tightness and qs[i] > qs[j]]
        nearest = float(sim[i, anchors].max()) if anchors else 0.0
        if copied:
            j = max(copied, key=lambda t: float(sim[i, t]))
            removed[i] = (
                f"an edited copy of a trusted passage: cosine {sim[i, j]:.3f} >= "
                f"{tightness} to it, ranked above it (query similarity {qs[i]:.3f} > "
                f"{qs[j]:.3f})"
            )
        elif anchors and anchor is not None and qs[i] - nearest >= anchor:
            removed[i] = (
                f"contradicts the trusted passages: query similarity {qs[i]:.3f} exceeds "
                f"its best cosine to a trusted passage ({nearest:.3f}) by "
                f"{qs[i] - nearest:.3f} >= {anchor}"
            )
        else:
            continue
        found.append(i)
    if found:
        estimates["contradicting"] = found


def trust_flags(
    trusted: Trust, source_key: str | None, items: Sequence[Passage], sources: list[str | None]
) -> tuple[list[bool], dict[str, Any]]:
    """Whether each passage is trusted, and what the result says of it: the trusted passages
    (with trust given, none found too), and those whose trust could not be read. A ``trusted=``
    predicate failing on a passage's metadata (a key its author left out, as a planted
    document's may) leaves that passage untrusted, with a warning: raising would let one
    document fail every query that retrieves it, or, failing open, pass the pool unchecked. A
    predicate failing on every passage is a bug, and raises."""
    test = trust_test(trusted, source_key)
    flags, failed = [], {}
    for i, p in enumerate(items):
        try:
            flags.append(test(i, p, sources[i]))
        except DefenseInputError as exc:
            flags.append(False)
            failed[i] = str(exc)
    if failed and len(failed) == len(items):
        raise DefenseInputError(next(iter(failed.values())))
    found = [i for i, t in enumerate(flags) if t]
    said: dict[str, Any] = {"trusted": found} if found or trusted is not None else {}
    if failed:
        said["trust_unread"] = failed
        warnings.warn(
            "the trusted= predicate failed on some passages' metadata: they are judged as "
            "untrusted (the result's estimates['trust_unread'] names them)",
            UserWarning,
            stacklevel=4,
        )
    return flags, said


def trust_test(
    trusted: Trust, source_key: str | None
) -> Callable[[int, Passage, str | None], bool]:
    """The test ``(position, passage, its source) -> trusted?`` for ``trusted`` read with
    ``source_key``, checked (a collection of sources needs provenance); a predicate's failure
    is a :class:`~ragdefense.DefenseInputError` naming the passage. Built from a defense's
    fields as they are when it runs, so that assigning them takes effect."""
    if source_key is not None and not isinstance(source_key, str):
        raise TypeError(f"source_key must be a str or None, got {type(source_key).__name__}")
    if source_key is None and trusted is not None and not callable(trusted):
        raise ValueError(
            "trusted sources need provenance, which source_key=None turns off: name the "
            "metadata key with source_key=, or pass a predicate on the metadata"
        )
    test = trust_of(trusted, source_key)

    def judged(i: int, passage: Passage, source: str | None) -> bool:
        try:
            return bool(test(passage, source))
        except Exception as exc:  # the user's predicate
            raise DefenseInputError(f"trusted= failed on passage {i}'s metadata: {exc!r}") from exc

    return judged


def trust_of(trusted: Trust, source_key: str | None) -> Callable[[Passage, str | None], bool]:
    """:func:`~ragdefense.provenance.is_trusted_by`, kept for the last few settings: a defense
    reads its fields at every query, and parsing thousands of trusted addresses each time
    would cost more than the query."""
    try:
        listed = isinstance(trusted, (set, frozenset, list, tuple))
        key: Any = frozenset(trusted) if listed else trusted  # type: ignore[arg-type]
        return _kept(key, source_key, working_folder())
    except TypeError:  # unhashable (a predicate object), or entries refused: said as given
        return is_trusted_by(trusted, source_key)


def innermost_trust(defense: Any, wrapper: type[Any]) -> Callable[[Passage], bool]:
    """Whether the defense inside ``defense``'s ``wrapper`` layers (quarantines) trusts a
    passage, as its fields are now (a ``trusted=`` it cannot read raises here, its predicate's
    own errors when called)."""
    while isinstance(defense, wrapper):
        defense = defense.defense
    key = getattr(defense, "source_key", AUTO)
    test = trust_of(getattr(defense, "trusted", None), key)
    return lambda passage: test(passage, source_of(passage, key))


@lru_cache(maxsize=16)
def _kept(trusted: Any, source_key: str | None, here: str | None) -> Callable[..., bool]:
    return is_trusted_by(trusted, source_key, cwd=here)  # the folder the key was read in
