"""The plots of the benchmark pages, drawn from a results JSON's rows (``python -m benchmarks
<setting> --out``): each function takes the rows and returns a matplotlib figure, or ``None``
when the rows hold nothing to draw. :data:`PLOTS` names them per setting; :mod:`.pages` writes
them as SVG."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, StrMethodFormatter

__all__ = ["PLOTS", "Rows", "benign_percent"]

Rows = list[dict[str, Any]]
COLOURS = [f"C{i}" for i in range(10)]


def _num(row: dict[str, Any], key: str) -> float | None:
    """``row[key]`` as a float, ``None`` when absent or not a number (a cell that erred)."""
    value = row.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _mean(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.fmean(found) if found else None


def _order(rows: Rows, key: str) -> list[str]:
    """The values of ``key`` in order of first appearance."""
    return list(dict.fromkeys(str(r[key]) for r in rows if key in r))


def _figure(width: float = 7.5, height: float = 4.0) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots()


def _legend_outside(ax: Axes) -> None:
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _tradeoff(
    points: list[tuple[str, float, float | None, float | None]],
    xlabel: str,
    labels: tuple[str, str],
) -> Figure:
    """Per defense: its clean answer share (y) against two poison shares (x): a filled circle
    (``labels[0]``) and a hollow square (``labels[1]``), joined."""
    fig, ax = _figure()
    for i, (name, y, near, far) in enumerate(points):
        colour = COLOURS[i % len(COLOURS)]
        xs = [x for x in (near, far) if x is not None]
        ax.plot(xs, [y] * len(xs), color=colour, lw=1, alpha=0.5)
        if near is not None:
            ax.plot([near], [y], "o", color=colour, label=name)
        if far is not None:
            ax.plot([far], [y], "s", mfc="none", color=colour, label=name if near is None else None)
    ax.plot([], [], "ko", label=labels[0])
    ax.plot([], [], "ks", mfc="none", label=labels[1])
    ax.set_xlim(left=-0.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("clean retrieval: answer in the context")
    ax.set_title("Safety against utility (better: up and to the left)", fontsize=10)
    _legend_outside(ax)
    return fig


def threats_tradeoff(rows: Rows) -> Figure | None:
    """Each way of running the default (threats.json): clean answer share (``clean`` / ``0p``)
    against the mean poison share of the ``minority`` and of the ``majority`` scenario."""
    points = []
    for label in _order(rows, "row"):
        mine = [r for r in rows if r.get("row") == label]
        clean = [
            _num(r, "gold_in_context")
            for r in mine
            if r.get("scenario") == "clean" and r.get("setting") == "0p"
        ]
        y = _mean(clean)
        if y is None:
            continue
        near = _mean(_num(r, "poison_share") for r in mine if r.get("scenario") == "minority")
        far = _mean(_num(r, "poison_share") for r in mine if r.get("scenario") == "majority")
        points.append((label, y, near, far))
    if not points:
        return None
    labels = ("minority: RealtimeQA 1/3/5 poison", "majority: RAGDefender setting, no sources")
    return _tradeoff(points, "mean poison share of the context (all families)", labels)


def _defenses(rows: Rows) -> list[str]:
    """The defenses of default.json, without the hindsight choices (``a|b``)."""
    return [d for d in _order(rows, "defense") if "|" not in d]


def default_tradeoff(rows: Rows) -> Figure | None:
    """Per defense (default.json): RealtimeQA 0 poison answer share against the mean poison
    share of RealtimeQA 1/3/5 poison and of the RAGDefender setting, over every family."""
    points = []
    for name in _defenses(rows):
        mine = [r for r in rows if r.get("defense") == name]
        y = _mean(
            _num(r, "gold_in_context")
            for r in mine
            if r.get("dataset") == "realtimeqa" and r.get("setting") == "0p"
        )
        if y is None:
            continue
        near = _mean(
            _num(r, "poison_share")
            for r in mine
            if r.get("dataset") == "realtimeqa" and r.get("setting") != "0p"
        )
        far = _mean(_num(r, "poison_share") for r in mine if r.get("dataset") != "realtimeqa")
        points.append((name, y, near, far))
    if not points:
        return None
    labels = ("RealtimeQA 1/3/5 poison", "RAGDefender setting 1x-6x")
    return _tradeoff(points, "mean poison share of the context (every family)", labels)


def _by_count(series: dict[str, dict[int, float]], title: str) -> Figure | None:
    series = {name: found for name, found in series.items() if found}
    if not series:
        return None
    fig, ax = _figure()
    counts: set[int] = set()
    for i, (name, found) in enumerate(series.items()):
        xs = sorted(found)
        counts.update(xs)
        style = "-" if i < len(COLOURS) else "--"
        ax.plot(xs, [found[x] for x in xs], style, marker="o", color=COLOURS[i % 10], label=name)
    ax.set_xticks(sorted(counts))
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("poison passages among the 10 retrieved")
    ax.set_ylabel("poison share of the context")
    ax.set_title(title, fontsize=10)
    _legend_outside(ax)
    return fig


def default_by_count(rows: Rows) -> Figure | None:
    """RealtimeQA poison share by number of poison passages (default.json, ``poisonedrag``, the
    family with a 0-poison row), one line per defense."""
    series: dict[str, dict[int, float]] = {name: {} for name in _defenses(rows)}
    for r in rows:
        share, name = _num(r, "poison_share"), str(r.get("defense"))
        wanted = r.get("dataset") == "realtimeqa" and r.get("attack") == "poisonedrag"
        if wanted and share is not None and name in series:
            series[name][int(str(r["setting"]).rstrip("p"))] = share
    return _by_count(series, "RealtimeQA top 10, context 5 (poisonedrag)")


def grada_by_count(rows: Rows) -> Figure | None:
    """RealtimeQA poison share by number of poison passages (grada.json), one line per
    variant."""
    series: dict[str, dict[int, float]] = {}
    for r in rows:
        share = _num(r, "poison_share")
        if share is not None and "poison" in r:
            series.setdefault(str(r["defense"]), {})[int(r["poison"])] = share
    return _by_count(series, "RealtimeQA top 10, context 5: GRADA's variants")


def default_families(rows: Rows) -> Figure | None:
    """Mean poison share per attack family (rows) and defense (columns) over every poisoned
    setting of both (default.json), annotated; tuning families marked."""
    from .settings.default import TUNING

    names = _defenses(rows)
    families = _order(rows, "attack")
    grid = [
        [
            _mean(
                _num(r, "poison_share")
                for r in rows
                if r.get("attack") == family
                and r.get("defense") == name
                and r.get("setting") != "0p"
            )
            for name in names
        ]
        for family in families
    ]
    values = [v for line in grid for v in line if v is not None]
    if not values:
        return None
    top = max(max(values), 0.01)
    fig, ax = _figure(1.6 + 1.1 * len(names), 1.2 + 0.45 * len(families))
    shown = [[float("nan") if v is None else v for v in line] for line in grid]
    image = ax.imshow(shown, cmap="Reds", vmin=0.0, vmax=top, aspect="auto")
    for i, line in enumerate(grid):
        for j, v in enumerate(line):
            if v is not None:
                colour = "white" if v > 0.6 * top else "black"
                ax.text(j, i, f"{v:.3f}", ha="center", va="center", fontsize=8, color=colour)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ticks = [f + (" (tuning)" if f in TUNING else " (held out)") for f in families]
    ax.set_yticks(range(len(families)), ticks)
    ax.set_title("Poison share by attack family (mean over every poisoned setting)", fontsize=10)
    fig.colorbar(image, ax=ax, label="poison share of the context")
    return fig


def benign_percent(cell: Any) -> float | None:
    """The share in percent of an audit row's ``"benign flagged"`` cell (``"12 (0.05%)"``)."""
    if isinstance(cell, int | float):
        return float(cell)
    found = re.search(r"\(([-\d.]+)%\)", str(cell))
    return float(found.group(1)) if found else None


def audit_recall(rows: Rows) -> Figure | None:
    """Recall of planted chunks against benign chunks flagged (audit.json), one point per
    (run, scoring, planted-source layout); a marker per run, a colour per scoring and layout."""
    points: list[tuple[str, str, float, float]] = []
    for r in rows:
        x, y = benign_percent(r.get("benign flagged")), _num(r, "recall")
        if x is not None and y is not None:
            sources = r.get("sources", "none")
            scoring = str(r.get("scoring")) + ("" if sources == "none" else f", sources: {sources}")
            points.append((str(r.get("run")), scoring, x, y))
    if not points:
        return None
    runs = list(dict.fromkeys(p[0] for p in points))
    scorings = list(dict.fromkeys(p[1] for p in points))
    fig, ax = _figure()
    for run, scoring, x, y in points:
        marker = "osD^v"[runs.index(run) % 5]
        colour = COLOURS[scorings.index(scoring) % 10]
        ax.plot([x], [y], marker, color=colour, ms=8, label=f"{run}, {scoring}")
    ax.set_xlim(left=0)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("benign chunks flagged (% of the benign chunks)")
    ax.set_ylabel("recall of the planted chunks")
    ax.set_title("Audit: recall against false alarms (better: up and to the left)", fontsize=10)
    _legend_outside(ax)
    return fig


def latency(rows: Rows) -> Figure | None:
    """Median ms per defense call against pool size, log-log, one line per defense (a band up
    to p95) (latency.json)."""
    fig, ax = _figure()
    drawn = False
    for i, name in enumerate(_order(rows, "defense")):
        mine: dict[int, tuple[float, float]] = {}
        for r in rows:
            p50, p95 = _num(r, "ms_p50"), _num(r, "ms_p95")
            if r.get("defense") == name and "passages" in r and p50 is not None:
                mine[int(r["passages"])] = (p50, p50 if p95 is None else p95)
        if not mine:
            continue
        xs = sorted(mine)
        colour = COLOURS[i % 10]
        ax.plot(xs, [mine[n][0] for n in xs], "-o", color=colour, label=name, ms=4)
        ax.fill_between(
            xs, [mine[n][0] for n in xs], [mine[n][1] for n in xs], color=colour, alpha=0.15, lw=0
        )
        drawn = True
    if not drawn:
        return None
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(sorted({int(r["passages"]) for r in rows if "passages" in r}))
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    ax.set_xlabel("passages in the pool")
    ax.set_ylabel("ms per call (median; band to p95)")
    ax.set_title("Defense time against pool size (embeddings given)", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    _legend_outside(ax)
    return fig


#: per setting: (image name, alt text, drawing)
PLOTS: dict[str, list[tuple[str, str, Callable[[Rows], Figure | None]]]] = {
    "threats": [("threats-tradeoff", "clean answer against poison share", threats_tradeoff)],
    "default": [
        ("default-tradeoff", "clean answer against poison share, per defense", default_tradeoff),
        ("default-by-count", "poison share by number of poison passages", default_by_count),
        ("default-families", "poison share by attack family and defense", default_families),
    ],
    "grada": [("grada-by-count", "poison share by number of poison passages", grada_by_count)],
    "audit": [("audit-recall", "recall against benign chunks flagged", audit_recall)],
    "latency": [("latency", "defense time against pool size", latency)],
}
