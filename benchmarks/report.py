"""Reporting benchmark rows: the one Markdown table writer, the cell format shared by every
table, and the suite's plots (matplotlib's object API: no pyplot, no backend switched)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["cell", "markdown_table", "plot_rows", "value"]

logger = logging.getLogger("ragdefense")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """The lines of a Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def value(row: dict[str, Any], key: str, digits: int) -> str:
    """``row[key]`` with ``digits`` decimals, ``-`` when absent."""
    v = row.get(key)
    return "-" if v is None else f"{v:.{digits}f}"


def cell(row: dict[str, Any]) -> str:
    """The retrieval-level cell of every table: ``poison share / answer in context``."""
    return value(row, "poison_share", 3) + " / " + value(row, "gold_in_context", 2)


def plot_rows(rows: Sequence[dict[str, Any]], path: Path) -> list[Path]:
    """Two PNGs beside ``path`` (``<stem>-poison.png``, ``<stem>-answer.png``): poison share and
    answer-in-context against the poison count, a panel per dataset (row) and attack (column), a
    line per defense. Nothing (and a log message) without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        logger.warning("matplotlib is not installed: no plot")
        return []
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    attacks = list(dict.fromkeys(r["attack"] for r in rows))
    names = list(dict.fromkeys(r["defense"] for r in rows))
    written = []
    for key, label, suffix in [
        ("poison_share", "poison share of the context", "poison"),
        ("gold_in_context", "answer passage in the context", "answer"),
    ]:
        fig = Figure(figsize=(3.4 * len(attacks), 2.4 * len(datasets)))
        axes = fig.subplots(len(datasets), len(attacks), squeeze=False, sharex=True, sharey=True)
        for i, ds in enumerate(datasets):
            for j, attack in enumerate(attacks):
                ax = axes[i][j]
                for name in names:
                    pts = [
                        (r["poison"], r[key])
                        for r in rows
                        if (r["dataset"], r["attack"], r["defense"]) == (ds, attack, name)
                        and key in r
                    ]
                    if pts:
                        ax.plot(*zip(*pts, strict=True), marker="o", label=name)
                ax.set_ylim(-0.03, 1.03)
                ax.set_title(f"{ds} · {attack}", fontsize=8)
                if i == len(datasets) - 1:
                    ax.set_xlabel("poison passages")
        fig.suptitle(label)
        axes[0][0].legend(fontsize=6)
        fig.tight_layout()
        out = path.with_name(f"{path.stem}-{suffix}.png")
        fig.savefig(out, dpi=100)
        written.append(out)
    return written
