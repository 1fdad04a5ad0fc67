"""Griffe extension for the API reference: the docstrings' Sphinx roles (``:class:`~a.B```,
``:func:`f```, ``:py:data:`X```, ``:class:`a title <a.B>```, ...), which the Google style
leaves as raw text, become code spans: the title where one is given, else the last name where
the role shortens it (``~``), else the whole name. Code (fenced blocks, doctest lines) is left
as written."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|data|attr|mod|obj|exc):`(~?)([^`<]+?)\s*(?:<([^`>]+)>)?`"
)


def _span(match: re.Match[str]) -> str:
    short, name, target = match[1], match[2], match[3]
    if target is not None:  # a title: its words as written, on one line
        return f"`{' '.join(name.split())}`"
    name = "".join(name.split())  # a name wrapped over two lines is one name
    return f"`{name.rsplit('.', 1)[-1] if short else name}`"


def plain(text: str) -> str:
    """``text`` with each Sphinx role outside code a code span."""
    out: list[str] = []
    prose: list[str] = []
    fenced = False
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip()
        fence = stripped.startswith("```")
        fenced ^= fence
        if fence or fenced or stripped.startswith((">>>", "...")):
            out += [_ROLE.sub(_span, "".join(prose)), line]
            prose = []
        else:
            prose.append(line)
    return "".join([*out, _ROLE.sub(_span, "".join(prose))])


class SphinxRoles(griffe.Extension):
    """Rewrites each object's docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
