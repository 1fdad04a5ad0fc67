"""Griffe extension for the API reference: the docstrings' Sphinx roles (``:class:`~a.B```,
``:func:`f```, ``:data:`X```, ...), which the Google style leaves as raw text, become code spans:
the last name where the role shortens it (``~``), the whole name otherwise."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|data|attr|mod|obj|exc):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """``text`` with each Sphinx role a code span."""
    return _ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", text)


class SphinxRoles(griffe.Extension):
    """Rewrites each object's docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
