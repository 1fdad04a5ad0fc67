"""``python -m benchmarks.pages``: the benchmark pages and plots rendered from results JSON (small
synthetic records in each setting's format here; no model, no data), the same bytes on every
rendering, and the committed ``docs/benchmarks/`` equal to a rendering of
``benchmarks/results/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.pages import PAGES, main, render, summary
from benchmarks.plots import PLOTS, benign_percent

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "benchmarks"
DEFENSES = ("none", "ragdefender", "grada", "auto", "consensus")
FAMILIES = ("poisonedrag", "injection", "multi-answer", "no-prefix", "synonym")


def _metrics(share: float, answer: float) -> dict[str, Any]:
    """The fields ``benchmarks.runner.summarize`` gives a cell."""
    return {
        "poison_share": share,
        "any_poison": min(1.0, 2 * share),
        "gold_in_context": answer,
        "poison_removed": 1 - share,
        "gold_kept": answer,
        "benign_removed": 0.1,
        "ms_p50": 0.5,
        "ms_p95": 0.9,
        "errors": 0,
    }


def _default_rows() -> list[dict[str, Any]]:
    rows = []
    for family in FAMILIES:
        settings = [("realtimeqa", f"{p}p") for p in (0, 1, 3, 5) if p or family == "poisonedrag"]
        settings += [(ds, f"{r}x") for ds in ("nq", "msmarco") for r in (1, 6)]
        for ds, st in settings:
            for d, name in enumerate([*DEFENSES, "ragdefender|grada"]):
                share = 0.0 if st == "0p" else round(0.9 / (1 + d) * (1 + len(family) % 3) / 3, 3)
                row = {"dataset": ds, "setting": st, "attack": family, "defense": name}
                rows.append(row | _metrics(share, 0.7 - 0.05 * d))
    rows[-1] = {k: rows[-1][k] for k in ("dataset", "setting", "attack", "defense")} | {
        "errors": 3  # a cell whose every case erred has no metric
    }
    return rows


def _threats_rows() -> list[dict[str, Any]]:
    labels = ("none", "default (text only)", "default with sources", "default, trusted sources")
    cells = [("clean", "0p", "-"), ("clean", "one document", "-")]
    cells += [("minority", f"{c}p", f) for c in (1, 3, 5) for f in ("poisonedrag", "synonym")]
    cells += [("majority", f"nq {r}x", "poisonedrag") for r in (1, 6)]
    cells += [("majority+sources", f"top 8, S={s}", "poisonedrag") for s in (1, 2)]
    cells += [("store", f"ragdefender/nq, context {k}", "-") for k in (4, 2)]
    return [
        {"row": label, "scenario": sc, "setting": st, "family": f}
        | _metrics(0.0 if sc in ("clean", "store") else 0.5 / (1 + i), 0.8 - 0.1 * i)
        for i, label in enumerate(labels)
        for sc, st, f in cells
    ]


def _audit_rows() -> list[dict[str, Any]]:
    rows = []
    for run in ("derived probes", "query log"):
        for v, scoring in enumerate(("shipped default", "isolation", "probe flags")):
            rows.append(
                {
                    "run": run,
                    "scoring": scoring,
                    "recall": 0.5 + 0.1 * v,
                    "tuning": 0.7,
                    "held out: family": "",
                    "benign flagged": f"{10 * v} ({v / 10:.2%})",
                    "precision": 0.9,
                    ("seconds" if v == 0 else "threshold"): 0.5,
                }
            )
    return rows


ROWS: dict[str, list[dict[str, Any]]] = {
    "demo": [{"defense": d} | _metrics(0.1, 0.9) for d in DEFENSES],
    "default": _default_rows(),
    "threats": _threats_rows(),
    "grada": [
        {"poison": p, "defense": d} | _metrics(p / 10, 0.6)
        for p in (0, 1, 3, 5)
        for d in ("none", "hrsim")
    ],
    "audit": _audit_rows(),
    "latency": [
        {"defense": d, "passages": n, "ms_p50": n / 10, "ms_p95": n / 8}
        for d in ("consensus", "strict")
        for n in (5, 50, 500)
    ],
}


def _write_results(folder: Path, settings: list[str] | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for setting in settings or list(ROWS):
        record = {
            "command": f"python -m benchmarks {setting} --data ../shared/data",
            "date": "2026-11-20",
            "machine": "x86_64, 2 cores, Linux",
            "setting": setting,
            "rows": ROWS[setting],
            "table": f"| {setting} | cell |\n|---|---|\n| a | 1 |",
        }
        (folder / f"{setting}.json").write_text(json.dumps(record, indent=1), encoding="utf-8")


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_pages_name_their_command_and_embed_their_plots(tmp_path: Path) -> None:
    _write_results(tmp_path / "results")
    docs = tmp_path / "docs"
    written = render(tmp_path / "results", docs)
    assert {p.name for p in written if p.suffix == ".md"} == {f"{s}.md" for s in ROWS} | {
        "index.md"
    }
    for setting in ROWS:
        page = (docs / f"{setting}.md").read_text(encoding="utf-8")
        assert page.startswith(f"# {PAGES[setting][0]}\n")
        assert summary(setting) in page
        assert (
            f"Produced by `python -m benchmarks {setting} --data ../shared/data` on 2026-11-20, "
            "x86_64, 2 cores, Linux." in page
        )
        assert f"| {setting} | cell |" in page
        for name, _, _ in PLOTS.get(setting, []):
            assert f"](img/{name}.svg)" in page
            svg = (docs / "img" / f"{name}.svg").read_text(encoding="utf-8")
            assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "Matplotlib v" not in svg
    index = (docs / "index.md").read_text(encoding="utf-8")
    assert all(f"]({s}.md)" in index for s in ROWS)
    images = sorted(p.name for p in (docs / "img").iterdir())
    assert images == sorted(f"{n}.svg" for s in ROWS for n, _, _ in PLOTS.get(s, []))


def test_rendering_twice_gives_the_same_bytes(tmp_path: Path) -> None:
    _write_results(tmp_path / "results")
    render(tmp_path / "results", tmp_path / "a")
    first = _tree(tmp_path / "a")
    render(tmp_path / "results", tmp_path / "b")
    assert _tree(tmp_path / "b") == first
    assert main(["--results", str(tmp_path / "results"), "--docs", str(tmp_path / "a")]) == 0
    assert _tree(tmp_path / "a") == first


def test_a_missing_result_has_no_page_and_a_stale_one_goes(tmp_path: Path) -> None:
    _write_results(tmp_path / "results", ["demo", "latency"])
    docs = tmp_path / "docs"
    render(tmp_path / "results", docs)
    (docs / "notes.md").write_text("kept", encoding="utf-8")  # not the renderer's
    (tmp_path / "results" / "latency.json").unlink()
    render(tmp_path / "results", docs)
    assert sorted(_tree(docs)) == ["demo.md", "index.md", "notes.md"]
    assert "latency" not in (docs / "index.md").read_text(encoding="utf-8")


def test_plots_skip_what_the_rows_lack() -> None:
    for plots in PLOTS.values():
        for _, _, draw in plots:
            assert draw([]) is None
            assert draw([{"defense": "none", "errors": 2}]) is None
    assert benign_percent("12 (0.05%)") == pytest.approx(0.05)
    assert benign_percent("") is None


def test_every_page_says_what_its_setting_measures() -> None:
    for setting in PAGES:
        about = summary(setting)
        assert about[:1].isupper() and "python -m" not in about and ":func:" not in about


@pytest.mark.skipif(
    not RESULTS.is_dir() or not any(RESULTS.glob("*.json")), reason="no benchmarks/results/"
)
def test_committed_pages_are_a_rendering_of_the_results(tmp_path: Path) -> None:
    """``docs/benchmarks/`` cannot drift from ``benchmarks/results/``: re-render with
    ``make bench-docs`` (``python -m benchmarks.pages``) after changing a result."""
    render(RESULTS, tmp_path)
    committed = _tree(DOCS) if DOCS.is_dir() else {}
    fresh = _tree(tmp_path)
    # pages byte for byte; plots by name (another matplotlib draws the same plot other bytes)
    differ = sorted(
        n
        for n in committed.keys() | fresh.keys()
        if (
            committed.get(n) != fresh.get(n)
            if n.endswith(".md")
            else (n in committed) != (n in fresh)
        )
    )
    assert differ == [], f"docs/benchmarks/ is stale ({', '.join(differ)}): run make bench-docs"


def test_a_page_says_what_was_looked_at_where_its_setting_does() -> None:
    """A page showed its docstring's first paragraph only: the paragraph saying which held-out
    numbers were seen while the rules were chosen never reached it, and its columns read
    "held out" as if blind."""
    for setting in ("audit", "quarantine"):
        about = summary(setting).split("\n\n")
        assert len(about) == 2 and about[1].startswith("What was looked at"), setting
    assert "\n\n" not in summary("grada")  # a setting without one: its first paragraph
