"""The front door, :func:`defense`: the one way every entry point (the adapters, the CLI, the
audit, the benchmarks) turns a name, or a user's object, into a :class:`~ragdefense.Defense`;
the table of named presets behind it; and the description of each defense's parameters (read
from its constructor's signature and docstring) that the adapters' fields are checked against.

Names are case-insensitive, and ``-`` / ``_`` are ignored (``"RAGDefender"``, ``"grada_peel"``).
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, UnionType
from typing import Any, Literal, Protocol, TypeVar, get_args, get_origin, overload

from ..types import Defense, DefenseResult, checked_result
from .auto import AutoDefense
from .consensus import Consensus
from .grada import GRADA
from .ragdefender import RAGDefender

__all__ = [
    "DEFAULT_DEFENSE",
    "PRESETS",
    "Parameter",
    "Preset",
    "VectorDefense",
    "defense",
    "names",
    "parameters",
    "preset",
]


@dataclass(frozen=True)
class Preset:
    """A named defense: its class and the parameters that differ from the class defaults."""

    name: str
    cls: type
    params: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""


PRESETS: Mapping[str, Preset] = MappingProxyType(
    {
        p.name: p
        for p in (
            Preset(
                "consensus",
                Consensus,
                {},
                "removes only on evidence of a coordinated attack; counts sources (the default)",
            ),
            Preset(
                "strict",
                RAGDefender,
                {},
                "a poisoned majority without provenance: RAGDefender, at a cost on clean retrieval",
            ),
            Preset("ragdefender", RAGDefender, {}, "RAGDefender (Kim et al.), task type auto"),
            Preset("grada", GRADA, {}, "GRADA with HRSIM over BM25 (the paper's best)"),
            Preset("grada-bm25", GRADA, {"similarity": "bm25"}, "GRADA, BM25 edges"),
            Preset("grada-ebd", GRADA, {"similarity": "ebd"}, "GRADA, embedding edges"),
            Preset("grada-hrsim-ebd", GRADA, {"hrsim_base": "ebd"}, "GRADA, HRSIM over cosine"),
            Preset("grada-peel", GRADA, {"peel": True}, "GRADA after peeling coordinated groups"),
            Preset("auto", AutoDefense, {}, "AutoDefense: per-query choice of the above"),
        )
    }
)


#: the defense every entry point uses when none is named (adapters, CLI, demo)
DEFAULT_DEFENSE = "consensus"


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


_BY_KEY = {_key(n): p for n, p in PRESETS.items()}


def names() -> list[str]:
    """The preset names, in table order."""
    return list(PRESETS)


def preset(name: str) -> Preset:
    """The preset called ``name`` (case, ``-`` and ``_`` ignored), else ``ValueError``."""
    found = _BY_KEY.get(_key(name)) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"unknown defense {name!r}: use one of {', '.join(PRESETS)} or an object")
    return found


class VectorDefense(Defense, Protocol):
    """A :class:`~ragdefense.Defense` that also takes the passages' vectors, as every named
    defense does: what :func:`defense` returns for a name."""

    def defend_embeddings(
        self,
        query: str,
        passages: Sequence[Any],
        embeddings: Any = None,
        query_embedding: Any = None,
    ) -> DefenseResult:
        """Decide as ``defend`` does, on the vectors given (``None``: embedded)."""
        ...


_D = TypeVar("_D", bound=Defense)


@overload
def defense(
    spec: str | None = None, /, *, embedder: Any = None, **params: Any
) -> VectorDefense: ...
@overload
def defense(spec: _D, /) -> _D: ...
@overload
def defense(spec: Any, /, *, embedder: Any = None, **params: Any) -> Defense: ...
def defense(spec: Any = None, /, *, embedder: Any = None, **params: Any) -> Defense:
    """A ready defense: ``ragdefense.defense()`` (the default), ``ragdefense.defense("grada-peel",
    n=5)``, or any object with ``defend(query, passages)``.

    Args:
        spec: A preset name (:func:`names`; case, ``-`` and ``_`` ignored; ``None``:
            :data:`DEFAULT_DEFENSE`), or an object with ``defend``: returned as it is when it
            declares every attribute of :class:`~ragdefense.Defense`, else wrapped with the
            defaults (pool factor 2, no pool floor, any number of passages).
        embedder: For a named defense: anything :func:`ragdefense.as_embedder` accepts
            (``None``: the packaged all-MiniLM-L6-v2). An object comes configured.
        params: For a named defense, its constructor's parameters over the preset's.

    Returns:
        The preset's defense, built; or the object itself (wrapped when it lacks some
        attribute of :class:`~ragdefense.Defense`).

    Raises:
        ValueError: An unknown name (here, before any query).
        TypeError: An unknown parameter, a class instead of an instance, an object without
            ``defend``, or parameters given with an object.

    Examples:
        The default defense on eight retrieved passages, three of them planted: near-copies
        of one claim that the retriever ranks above the rest. Embeddings given as vectors need
        no embedding model.

        >>> import numpy as np
        >>> import ragdefense
        >>> texts = [
        ...     "Hamlet was written by Christopher Marlowe.",
        ...     "Christopher Marlowe is the author of Hamlet.",
        ...     "Marlowe wrote the play Hamlet.",
        ...     "Hamlet is a play written by William Shakespeare.",
        ...     "William Shakespeare wrote the play Hamlet around 1600.",
        ...     "Shakespeare's Hamlet is his longest play.",
        ...     "The First Folio collects Shakespeare's plays, Hamlet among them.",
        ...     "Richard Burbage first played Shakespeare's Hamlet.",
        ... ]
        >>> e = np.eye(7)
        >>> planted = 0.9 * e[0] + 0.4 * e[1] + 0.02 * e[[0, 2, 3]]  # near-copies, close to q
        >>> benign = 0.6 * e[0] + 0.8 * e[2:]  # on topic, each from its own angle
        >>> query_vector = e[0] + 0.3 * e[1]
        >>> guard = ragdefense.defense()  # the default, Consensus
        >>> result = guard.defend_embeddings(
        ...     "Who wrote Hamlet?", texts, np.vstack([planted, benign]), query_vector
        ... )
        >>> result.removed_indices
        [0, 1, 2]
        >>> result.verdicts[3].reason
        'kept: no evidence of a coordinated attack'
        >>> ragdefense.defense("GRADA_peel", n=5).n  # names ignore case, "-" and "_"
        5
    """
    if spec is None or isinstance(spec, str):
        return _build(DEFAULT_DEFENSE if spec is None else spec, embedder, **params)
    if isinstance(spec, type):
        raise TypeError(
            f"{spec.__name__} is a class: pass an instance, {spec.__name__}(), or a name"
        )
    if not callable(getattr(spec, "defend", None)):
        raise TypeError(
            f"{type(spec).__name__} is not a defense (it has no defend(query, passages))"
        )
    if params or embedder is not None:
        given = ", ".join([*(["embedder"] if embedder is not None else []), *params])
        raise TypeError(
            f"{given}: only a defense name takes parameters; an object comes configured"
        )
    if isinstance(spec, Defense):
        _sizes(spec, str(getattr(spec, "name", None) or type(spec).__name__))  # as _Custom's
        return spec
    return _Custom(spec)


#: the sizes every entry point reads of a defense: (attribute, default, least value)
_SIZES = (("pool_factor", 2, 1), ("min_pool", 0, 0), ("min_passages", 1, 0))


def _sizes(obj: Any, name: str) -> dict[str, int]:
    """The sizes ``obj`` declares (defaults where it declares none), checked by name."""
    out = {}
    for attr, default, least in _SIZES:
        value = getattr(obj, attr, default)
        if type(value) is not int or value < least:
            raise TypeError(f"{name}.{attr} must be an int >= {least}, got {value!r}")
        out[attr] = value
    return out


class _Custom:
    """A user's object with only ``defend``, given the attributes every entry point reads
    (its own where it has them, checked)."""

    name: str
    pool_factor: int
    min_pool: int
    min_passages: int

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.name = str(getattr(obj, "name", None) or type(obj).__name__)
        for attr, value in _sizes(obj, self.name).items():
            setattr(self, attr, value)

    def defend(self, query: str, passages: Any) -> DefenseResult:
        """The object's own ``defend``."""
        passages = passages if hasattr(passages, "__len__") else list(passages)  # counted after
        return checked_result(self.obj.defend(query, passages), len(passages), self)

    def __getattr__(self, attr: str) -> Any:
        """Everything else the object has (``defend_embeddings``, ``uses_embeddings``,
        ``fallback``): read by the adapters and the audit where present."""
        if attr == "obj":  # not set yet (unpickling): never the object's own
            raise AttributeError(attr)
        return getattr(self.obj, attr)


def _build(name: str, embedder: Any = None, **params: Any) -> Defense:
    """The preset ``name`` with ``embedder`` and ``params`` (over the preset's own)."""
    p = preset(name)
    allowed = {q.name for q in parameters(p.cls, simple_only=False)}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise TypeError(
            f"{p.name} has no parameter {', '.join(map(repr, unknown))}; "
            f"its parameters: {', '.join(sorted(allowed))}"
        )
    built: Defense = p.cls(embedder=embedder, **{**p.params, **params})
    return built


@dataclass(frozen=True)
class Parameter:
    """One constructor parameter of a defense: its name, type, default and description."""

    name: str
    annotation: Any
    default: Any
    description: str


_SIMPLE = (bool, int, float, str, type(None))


def _is_simple(annotation: Any) -> bool:
    """Whether values of ``annotation`` are plain JSON values (what adapter fields carry)."""
    if annotation in _SIMPLE:
        return True
    origin = get_origin(annotation)
    if origin is Literal:
        return True
    if origin in (typing.Union, UnionType):
        return all(_is_simple(a) for a in get_args(annotation))
    return False


_ARG = re.compile(r"^ {8}([A-Za-z_][\w, ]*):\s*(.*)$")


def _described(cls: type) -> dict[str, str]:
    """``name -> description`` from the ``Args:`` section of ``cls``'s docstring."""
    out: dict[str, str] = {}
    current: list[str] = []
    in_args = False
    for line in (cls.__doc__ or "").splitlines():
        if line.strip() == "Args:":
            in_args = True
            continue
        if not in_args:
            continue
        match = _ARG.match(line)
        if match:
            current = [n.strip() for n in match.group(1).split(",")]
            for n in current:
                out[n] = match.group(2).strip()
        elif line.startswith(" " * 12) and current:
            for n in current:
                out[n] += " " + line.strip()
        elif line.strip() and not line.startswith(" " * 8):
            break  # the next section
    return out


def parameters(defense: str | type, *, simple_only: bool = True) -> list[Parameter]:
    """The constructor parameters of a defense (a preset name or a class), ``embedder``
    excluded, with the preset's values as defaults; ``simple_only`` keeps those whose values are
    plain JSON values (what the framework adapters expose as fields)."""
    if isinstance(defense, str):
        p = preset(defense)
        cls, overrides = p.cls, p.params
    else:
        cls, overrides = defense, {}
    hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]
    docs = _described(cls)
    out = []
    for name, param in inspect.signature(cls).parameters.items():
        if name == "embedder" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(name, Any)
        if simple_only and not _is_simple(annotation):
            continue
        default = overrides.get(name, param.default)
        out.append(Parameter(name, annotation, default, docs.get(name, "")))
    return out
