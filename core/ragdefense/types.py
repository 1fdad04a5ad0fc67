"""The two types every defense shares: :class:`Passage` in, :class:`DefenseResult` out."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .shown import Described as Described
from .shown import jsonable, number_text, plain_id, printable
from .vector_rows import numeric

__all__ = [
    "MAX_PASSAGES",
    "Defense",
    "DefenseFailed",
    "DefenseInputError",
    "DefenseResult",
    "Described",
    "Passage",
    "PassageLike",
    "Verdict",
    "check_embeddings",
    "check_query",
    "check_query_embedding",
    "checked_result",
    "defend_given",
    "to_passages",
]


class DefenseInputError(ValueError):
    """Raised when a defense is given input it cannot work on (the message says which item)."""


class QueryInputError(DefenseInputError):
    """A query (or its embedding) a defense cannot use: no retrieved document causes it, so the
    adapters raise it even with ``fail_open`` (a bug to fix, such as a query that is not a
    string, or a query embedded by another model than the documents)."""


class DefenseFailed(RuntimeError):
    """Raised by the framework adapters when a defense fails and they are set to fail closed,
    and by their RobustRAG chain and synthesizer when every isolated LLM call failed."""


@dataclass(frozen=True)
class Passage:
    """A retrieved passage.

    Args:
        text: The passage text.
        id: Optional identifier (a document id, a node id).
        score: Optional retrieval score given by the retriever.
        metadata: Free-form metadata, carried through untouched.
        embedding: Optional precomputed embedding (e.g. the vector store's); used as is. It
            must be the defense's model's: checked against the packaged default where that
            embeds beside it, not against a model given as ``embedder=``.
        shown: What the generator is shown of the passage where that is more than ``text``
            (a LlamaIndex node's metadata, an image's path): passages of one text shown
            differently are not copies of each other. Not judged otherwise.

    Examples:
        >>> p = Passage(
        ...     "Hamlet is a tragedy by William Shakespeare.",
        ...     id="doc-7",
        ...     metadata={"source": "https://www.britannica.com/topic/Hamlet"},
        ...     embedding=[0.1, 0.7, 0.2],
        ... )
        >>> p.id, p.metadata["source"]
        ('doc-7', 'https://www.britannica.com/topic/Hamlet')
        >>> p == Passage("Hamlet is a tragedy by William Shakespeare.", id="doc-7")
        True
    """

    text: str
    id: str | None = None
    score: float | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False)
    embedding: Sequence[float] | np.ndarray | None = field(default=None, compare=False, repr=False)
    shown: str | None = field(default=None, compare=False, repr=False)


PassageLike = Passage | str

#: the most passages one call of a defense takes: every defense compares all pairs, so time and
#: memory grow with the square of the count (a retrieval pool is tens; a whole corpus is for
#: :func:`ragdefense.audit`). Raise it knowingly.
MAX_PASSAGES = 2000


def to_passages(passages: Sequence[PassageLike] | None) -> list[Passage]:
    """Coerce a sequence of passages or plain strings into :class:`Passage` objects.

    Raises:
        DefenseInputError: if the container or an item has the wrong type, or it holds more
            than :data:`MAX_PASSAGES` passages.

    Examples:
        >>> passages = to_passages(["plain text", Passage("a document", id="d1")])
        >>> [(p.text, p.id) for p in passages]
        [('plain text', None), ('a document', 'd1')]
        >>> to_passages("one string")
        Traceback (most recent call last):
        ...
        ragdefense.types.DefenseInputError: passages must be a sequence of Passage or str, got str
    """
    if passages is None:
        raise DefenseInputError("passages must be a sequence of Passage or str, got None")
    if isinstance(passages, (str, bytes)) or not isinstance(passages, Sequence):
        raise DefenseInputError(
            f"passages must be a sequence of Passage or str, got {type(passages).__name__}"
        )
    if len(passages) > MAX_PASSAGES:
        raise DefenseInputError(
            f"{len(passages)} passages: more than a defense compares at once (MAX_PASSAGES = "
            f"{MAX_PASSAGES}; every pair is compared, so time and memory grow with the square): "
            "retrieve fewer, audit a whole corpus with ragdefense.audit, or raise "
            "ragdefense.types.MAX_PASSAGES knowingly"
        )
    out: list[Passage] = []
    for i, p in enumerate(passages):
        if isinstance(p, Passage):
            if not isinstance(p.text, str):
                raise DefenseInputError(
                    f"passage {i}: text must be str, got {type(p.text).__name__}"
                )
            if p.shown is not None and not isinstance(p.shown, str):
                raise DefenseInputError(
                    f"passage {i}: shown must be str or None, got {type(p.shown).__name__}"
                )
            out.append(p)
        elif isinstance(p, str):
            out.append(Passage(text=p))
        else:
            raise DefenseInputError(f"passage {i}: expected Passage or str, got {type(p).__name__}")
    return out


def check_embeddings(embeddings: Any, n: int) -> np.ndarray:
    """``embeddings`` as a finite float64 (n, d) matrix, else :class:`DefenseInputError`
    (complex numbers too: their imaginary part would be dropped silently)."""
    try:
        raw = np.asarray(numeric(embeddings))
        if raw.dtype.kind == "c" or (
            raw.dtype.kind == "O" and any(isinstance(x, complex) for x in raw.ravel())
        ):
            raise DefenseInputError("embeddings are complex numbers: give real vectors")
        if n == 0 and raw.size == 0:  # an empty pool's embeddings: [] as well as (0, d)
            return np.zeros((0, raw.shape[-1] if raw.ndim == 2 else 0))
        if raw.dtype.kind not in "iufO":  # strings of digits or booleans are no vectors
            raise DefenseInputError(
                f"embeddings must be real numbers, got an array of dtype {raw.dtype}"
            )
        arr = raw.astype(np.float64)
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
        if isinstance(exc, DefenseInputError):
            raise
        raise DefenseInputError(f"embeddings are not a numeric matrix ({exc})") from exc
    if arr.ndim != 2 or arr.shape[0] != n or (n and arr.shape[1] == 0):
        raise DefenseInputError(f"embeddings have shape {arr.shape}, expected ({n}, d)")
    if not np.isfinite(arr).all():
        bad = sorted({int(i) for i in np.argwhere(~np.isfinite(arr))[:, 0]})
        raise DefenseInputError(f"embeddings of passage(s) {bad} contain NaN or infinite values")
    return arr


def check_query_embedding(
    query_embedding: Any, dim: int | None = None, fix: str = ""
) -> np.ndarray:
    """A given query embedding as a finite float64 vector (of ``dim`` numbers when given),
    else :class:`QueryInputError` saying what is wrong with it (and ``fix``, how to mend a
    size that is not ``dim``)."""
    try:
        raw = np.asarray(numeric(query_embedding))
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
        raise QueryInputError(f"query_embedding is not a vector of numbers ({exc})") from exc
    if raw.ndim != 1 or raw.dtype.kind not in "iufO" or raw.size == 0:
        kind = type(query_embedding).__name__
        raise QueryInputError(
            f"query_embedding must be a 1-D vector of real numbers, got {kind} of shape "
            f"{raw.shape} and dtype {raw.dtype}"
        )
    try:
        q: np.ndarray = raw.astype(np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise QueryInputError(f"query_embedding is not a vector of real numbers ({exc})") from exc
    if not np.isfinite(q).all():
        raise QueryInputError("query_embedding contains NaN or infinite values")
    if dim is not None and q.shape[0] != dim:
        raise QueryInputError(f"query embedding size {q.shape[0]}, passages {dim}{fix}")
    return q


def check_query(query: object) -> str:
    """Return ``query`` if it is a string, else raise :class:`QueryInputError`."""
    if not isinstance(query, str):
        raise QueryInputError(f"query must be str, got {type(query).__name__}")
    return query


@dataclass(frozen=True)
class Verdict:
    """What a defense decided about one passage.

    Attributes:
        index: Position of the passage in the input.
        passage: The passage itself (the caller's object, never modified).
        kept: Whether the passage is passed on to the generator.
        score: The defense's per-passage score (its meaning is ``DefenseResult.score_name``;
            NaN where the passage was not scored, as a quarantined one; ``None`` in
            :meth:`DefenseResult.to_dict`).
        reason: Why, in words.
        rank: Position among the kept passages (0 = first), ``None`` if removed.
        details: Further per-passage numbers (e.g. query similarity, graph degree).
    """

    index: int
    passage: Passage
    kept: bool
    score: float
    reason: str
    rank: int | None = None
    details: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, repr=False)
class DefenseResult:
    """The uniform result of every defense.

    Attributes:
        defense: Name of the defense that produced it.
        query: The query.
        verdicts: One :class:`Verdict` per input passage, in input order.
        score_name: What ``Verdict.score`` means for this defense (a label for people).
        reranked: Whether the kept passages are ordered by ``Verdict.score``, best first (a
            reranker such as GRADA): a framework adapter then gives each returned document
            that score, so that anything sorting by score keeps the defense's order. ``False``
            for a filter, whose kept passages keep the retriever's order and scores.
        estimates: The defense's internal estimates (e.g. estimated number of adversarial
            passages, which estimator was used, thresholds), for people and logs.
    """

    defense: str
    query: str
    verdicts: tuple[Verdict, ...]
    score_name: str
    estimates: Mapping[str, Any] = field(default_factory=dict)
    reranked: bool = False

    @property
    def kept(self) -> list[Passage]:
        """The passages passed on, in the defense's output order."""
        return [self.verdicts[i].passage for i in self.kept_indices]

    @property
    def removed(self) -> list[Passage]:
        """The passages filtered out, in input order."""
        return [v.passage for v in self.verdicts if not v.kept]

    @property
    def kept_indices(self) -> list[int]:
        """Input positions of the kept passages, in output order."""
        kept = [v for v in self.verdicts if v.kept]
        kept.sort(key=lambda v: v.index if v.rank is None else v.rank)
        return [v.index for v in kept]

    @property
    def removed_indices(self) -> list[int]:
        """Input positions of the removed passages."""
        return [v.index for v in self.verdicts if not v.kept]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view of the result."""
        return {
            "defense": self.defense,
            "query": self.query,
            "score_name": self.score_name,
            "reranked": self.reranked,
            "estimates": {k: jsonable(v) for k, v in self.estimates.items()},
            "verdicts": [
                {
                    "index": int(v.index),
                    "id": plain_id(v.passage.id),
                    "text": v.passage.text,
                    "kept": v.kept,
                    "score": jsonable(v.score),
                    "rank": jsonable(v.rank),
                    "reason": v.reason,
                    "details": jsonable(dict(v.details)),
                }
                for v in self.verdicts
            ],
        }

    def to_table(self, width: int = 48) -> str:
        """A small plain-text table: one row per passage (its text cut to ``width`` characters,
        at least 1), then the estimates."""
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise ValueError(f"width must be a positive int, got {width!r}")
        head = f"{self.defense}: kept {len(self.kept)} of {len(self.verdicts)}"
        rows = [head, f"{'#':>3}  {'decision':8}  {self.score_name:>12}  text / reason"]
        for v in self.verdicts:
            text = printable(" ".join(v.passage.text.split()))  # a planted ESC drives a terminal
            if len(text) > width:
                text = text[: width - 1] + "…"
            decision = "kept" if v.kept else "REMOVED"
            rows.append(f"{v.index:>3}  {decision:8}  {number_text(v.score):>12}  {text}")
            rows.append(f"{'':>3}  {'':8}  {'':>12}  ↳ {printable(v.reason)}")
        if self.estimates:
            est = ", ".join(f"{k}={printable(number_text(v))}" for k, v in self.estimates.items())
            rows.append(f"estimates: {est}")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.to_table()

    def __repr__(self) -> str:
        """One line (the dataclass's held every passage's text and metadata): the defense,
        what it kept and removed, the query cut short; ``print`` shows the table."""
        query = self.query if len(self.query) <= 60 else self.query[:59] + "…"
        return (
            f"<DefenseResult {self.defense}: kept {self.kept_indices} of {len(self.verdicts)}, "
            f"removed {self.removed_indices}, query {query!r}>"
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython and Jupyter show the table."""
        printer.text(self.to_table())


@runtime_checkable
class Defense(Protocol):
    """What every entry point (the adapters, the CLI, the audit, the benchmarks) uses of a
    defense. :func:`ragdefense.defense` returns one for a name, and turns any object with a
    ``defend(query, passages)`` method into one.

    Attributes:
        name: Shown in verdicts, warnings and reports.
        pool_factor: Passages to retrieve per passage returned (GRADA's M = 2n: 2; a filter
            such as RAGDefender: 1).
        min_pool: The pool the defense is designed to filter from: adapters fetch at least this
            many, and warn when handed fewer (0: no floor).
        min_passages: Below this many passages the defense removes nothing (Consensus counts
            copies once, and still compares the others with a passage the user trusts).
    """

    @property
    def name(self) -> str: ...
    @property
    def pool_factor(self) -> int: ...
    @property
    def min_pool(self) -> int: ...
    @property
    def min_passages(self) -> int: ...

    def defend(self, query: str, passages: Sequence[Any]) -> DefenseResult:
        """Decide, per passage, what reaches the generator."""
        ...


def defend_given(
    defense: Defense, query: str, passages: Sequence[Any], embeddings: Any, query_embedding: Any
) -> DefenseResult:
    """``defense`` run with the vectors given where it takes them (``defend_embeddings``), else
    (or where none is given) its ``defend()`` alone (all :class:`Defense` asks for), which
    embeds what it needs; the result checked (:func:`checked_result`)."""
    run = getattr(defense, "defend_embeddings", None)
    if callable(run) and (embeddings is not None or query_embedding is not None):
        result = run(query, passages, embeddings, query_embedding)
    else:
        result = defense.defend(query, passages)
    return checked_result(result, len(passages), defense)


def checked_result(result: Any, n: int, defense: Any) -> DefenseResult:
    """``result`` of ``defense`` handed ``n`` passages, checked to be a :class:`DefenseResult`
    with one verdict per passage (put in input order): a user's defense returning its kept
    passages, or verdicts for some, failed far from its cause or lost passages silently."""
    name = getattr(defense, "name", None) or type(defense).__name__
    if not isinstance(result, DefenseResult):
        raise TypeError(f"{name}.defend returned {type(result).__name__}, not a DefenseResult")
    indices = [getattr(v, "index", None) for v in result.verdicts]
    if all(type(i) is int for i in indices) and indices == list(range(n)):
        return result
    try:  # another order, or numbers of another type (NumPy's): plain ints, in input order
        order = sorted(operator.index(i) for i in indices if not isinstance(i, bool))  # type: ignore[arg-type]
    except TypeError:
        order = None
    if order != list(range(n)):
        what = "" if len(indices) != n else f", not indexed 0 to {n - 1} once each"
        raise ValueError(
            f"{name}.defend returned {len(indices)} verdict(s) for {n} passage(s){what}: a "
            "DefenseResult holds one Verdict per passage"
        )
    plain = (replace(v, index=operator.index(v.index)) for v in result.verdicts)
    return replace(result, verdicts=tuple(sorted(plain, key=lambda v: v.index)))
