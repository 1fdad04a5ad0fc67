"""The names an audit keeps each defense's flags under."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["defense_names"]


def defense_names(defenses: Sequence[Any]) -> list[str]:
    """The name each defense's flags are kept under: its registry name, or its class's; a name
    given twice is numbered (``Consensus``, ``Consensus#2``), so that two defenses of one class
    with other settings each keep their own flags.

    Examples:
        >>> defense_names(["consensus", "consensus", "grada"])
        ['consensus', 'consensus#2', 'grada']
    """
    out: list[str] = []
    for d in defenses:
        name = d if isinstance(d, str) else type(d).__name__
        n = sum(o == name or o.startswith(f"{name}#") for o in out)
        out.append(f"{name}#{n + 1}" if n else name)
    return out
