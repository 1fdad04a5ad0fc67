"""The one table from names to defenses, with presets, used by the adapters, the CLI, the
benchmarks and the suite; and the description of each defense's parameters (read from its
constructor's signature and docstring) from which the adapters derive their fields.

Names are case-insensitive, and ``-`` / ``_`` are ignored (``"RAGDefender"``, ``"grada_peel"``).
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, UnionType
from typing import Any, Literal, get_args, get_origin

from .auto import AutoDefense
from .consensus import Consensus
from .grada import GRADA
from .ragdefender import RAGDefender

__all__ = [
    "DEFAULT_DEFENSE",
    "PRESETS",
    "Parameter",
    "Preset",
    "build",
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


def build(name: str, embedder: Any = None, **params: Any) -> Any:
    """The defense ``name`` with ``embedder`` and ``params`` (over the preset's own). Unknown
    parameters and bad values raise ``TypeError`` / ``ValueError`` here, at construction."""
    p = preset(name)
    allowed = {q.name for q in parameters(p.cls, simple_only=False)}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise TypeError(
            f"{p.name} has no parameter {', '.join(map(repr, unknown))}; "
            f"its parameters: {', '.join(sorted(allowed))}"
        )
    return p.cls(embedder=embedder, **{**p.params, **params})


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
