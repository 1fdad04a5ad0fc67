"""``python -m benchmarks.pages``: the benchmark pages of the docs, rendered from the results
JSON that ``python -m benchmarks <setting> --out benchmarks/results`` writes (never pasted).

Each ``<setting>.json`` present becomes ``<docs>/<setting>.md``: a title, what the setting
measures (the setting module's docstring), the command, date and machine that produced it, its
plots (SVG under ``<docs>/img/``, drawn by :mod:`.plots`) and its table; ``index.md`` lists the
pages. The output depends on the JSON only (no timestamp, fixed SVG ids), so rendering twice
gives the same bytes, and the committed pages can be checked against the results."""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .plots import PLOTS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PAGES", "README_BLOCK", "main", "readme_block", "render", "render_page", "summary"]

HERE = Path(__file__).resolve().parent
#: per setting, in the index's order: (title, module of benchmarks.settings whose docstring
#: says what it measures)
PAGES: dict[str, tuple[str, str]] = {
    "demo": ("The built-in poisoned knowledge base", "demo"),
    "default": ("The default defense's targets", "default"),
    "threats": ("Choose your threat model", "threats"),
    "e2e": ("The default end to end with an LLM", "e2e"),
    "grada": ("The GRADA setting (RealtimeQA)", "grada"),
    "ragdefender": ("The RAGDefender setting", "ragdefender"),
    "auto": ("AutoDefense in both settings", "auto"),
    "robustrag": ("RobustRAG with an LLM", "robustrag"),
    "latency": ("Defense time against pool size", "latency"),
    "stores": ("Latency added per vector store", "stores"),
    "import": ("Import time", "imports"),
    "audit": ("Knowledge-base audit: quality", "audit"),
    "audit-scale": ("Knowledge-base audit: speed", "audit_scale"),
    "quarantine": ("A poisoned majority, audited and quarantined", "quarantine"),
}
#: no date, no version: the SVG's bytes depend on the figure only
SVG_METADATA = {"Date": None, "Creator": None}


def _rst_to_markdown(text: str) -> str:
    """Sphinx roles (``:func:`~a.b.c```) as code spans (``c``); double backquotes as single."""
    text = re.sub(r":[a-z]+:`~([^`]+)`", lambda m: f"``{m.group(1).split('.')[-1]}``", text)
    text = re.sub(r":[a-z]+:`([^`]+)`", r"``\1``", text)
    return text.replace("``", "`")


def summary(setting: str) -> str:
    """What ``setting`` measures: the first paragraph of its module's docstring, on one line,
    without the ``python -m benchmarks ...:`` lead; and its paragraph saying what was looked at
    while its rules were chosen, where it has one (what its held-out columns are worth)."""
    module = PAGES.get(setting, (setting, setting))[1]
    path = HERE / "settings" / f"{module}.py"
    if not path.exists():
        return ""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    paragraphs = [" ".join(p.split()) for p in (ast.get_docstring(tree) or "").split("\n\n")]
    first = re.sub(r"^``python -m benchmarks [\w-]+``: ", "", paragraphs[0])
    first = re.sub(r" \(``python -m benchmarks [\w-]+``\)", "", first)
    looked = [p for p in paragraphs[1:] if p.startswith("What was looked at")]
    return "\n\n".join(_rst_to_markdown(p) for p in [first[:1].upper() + first[1:], *looked])


def _svg(fig: Figure) -> bytes:
    import matplotlib

    # a fixed salt for the SVG's ids; text kept as text (not glyph paths)
    with matplotlib.rc_context({"svg.hashsalt": "ragdefense-benchmarks", "svg.fonttype": "none"}):
        out = io.BytesIO()
        fig.savefig(out, format="svg", metadata=SVG_METADATA)
    return out.getvalue()


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` unless the file already holds it (the file's time is kept)."""
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)


def render_page(record: dict[str, Any], docs: Path) -> tuple[str, list[str]]:
    """The Markdown page of one results record, writing its plots under ``docs/img``; the
    page's text and the images written (``img/<name>.svg``)."""
    setting = str(record["setting"])
    title = PAGES.get(setting, (f"Benchmark: {setting}", setting))[0]
    lines = [f"# {title}", ""]
    about = summary(setting)
    if about:
        lines += [about, ""]
    lines += [
        f"Produced by `{record['command']}` on {record['date']}, {record['machine']}.",
        "",
    ]
    images = []
    for name, alt, draw in PLOTS.get(setting, []):
        fig = draw(list(record.get("rows", [])))
        if fig is None:
            continue
        (docs / "img").mkdir(parents=True, exist_ok=True)
        _write(docs / "img" / f"{name}.svg", _svg(fig))
        images.append(f"img/{name}.svg")
        lines += [f"![{alt}](img/{name}.svg)", ""]
    lines += [str(record.get("table", "")).rstrip(), ""]
    return "\n".join(lines), images


def _index(entries: list[tuple[str, str, dict[str, Any]]]) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Every page here is rendered by `python -m benchmarks.pages` from the JSON that its "
        "command wrote to `benchmarks/results/` (`python -m benchmarks <setting> --out "
        "benchmarks/results`, all of them: `make bench-results`); nothing is pasted.",
        "",
    ]
    for setting, title, record in entries:
        lines.append(f"- [{title}]({setting}.md): `{record['command']}`, {record['date']}")
    return "\n".join(lines) + "\n"


def _owned(docs: Path) -> set[Path]:
    """The files the renderer may write under ``docs`` (any other file there is left alone)."""
    pages = {docs / f"{s}.md" for s in PAGES} | {docs / "index.md"}
    return pages | {docs / "img" / f"{name}.svg" for plots in PLOTS.values() for name, *_ in plots}


def render(results: str | Path, docs: str | Path) -> list[Path]:
    """Render every ``<setting>.json`` of ``results`` into ``docs``: the pages, their plots and
    the index; pages and plots of the renderer whose JSON is gone are removed. The files
    written (or found up to date), sorted."""
    results, docs = Path(results), Path(docs)
    records = []
    for path in sorted(results.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(record, dict) and {"setting", "command", "date", "machine"} <= set(record):
            records.append(record)
    order = list(PAGES)
    records.sort(
        key=lambda r: (order.index(r["setting"]) if r["setting"] in order else 99, r["setting"])
    )
    docs.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    entries = []
    for record in records:
        text, images = render_page(record, docs)
        page = docs / f"{record['setting']}.md"
        _write(page, text.encode("utf-8"))
        written += [page, *(docs / image for image in images)]
        entries.append((str(record["setting"]), text.splitlines()[0][2:], record))
    index = docs / "index.md"
    _write(index, _index(entries).encode("utf-8"))
    written.append(index)
    for stale in _owned(docs) - set(written):
        stale.unlink(missing_ok=True)
    return sorted(written)


#: the README's threat-model table sits between these two lines, rendered from threats.json
README_BLOCK = (
    "<!-- threats: rendered by `make bench-docs` from benchmarks/results/threats.json -->",
    "<!-- /threats -->",
)


def readme_block(record: dict[str, Any]) -> str:
    """The README's threat-model table: the first table of the threats result and the note
    under it (a paragraph that introduces no further table), with the command, date and machine
    that produced it."""
    text = _rst_to_markdown(str(record["table"]))
    lead, _, rest = text.partition("\n\n")
    table, *after = rest.split("\n\n")
    if after and not after[0].startswith("|") and not after[0].rstrip().endswith(":"):
        table = f"{table}\n\n{after[0]}"
    return (
        f"{lead}\n\n{table}\n\nProduced by `{record['command']}` on {record['date']}, "
        f"{record['machine']}; the S curve and every other setting: "
        "[benchmarks](docs/benchmarks/index.md)."
    )


def update_readme(readme: Path, results: Path) -> bool:
    """Replace the README's block between :data:`README_BLOCK` with :func:`readme_block` of
    ``results/threats.json``; ``False`` (nothing written) when either is missing."""
    source = results / "threats.json"
    if not (readme.exists() and source.exists()):
        return False
    text = readme.read_text(encoding="utf-8")
    start, end = README_BLOCK
    head, found, tail = text.partition(start)
    if not found or end not in tail:  # the end marker must follow the start marker
        return False
    _, _, tail = tail.partition(end)
    block = readme_block(json.loads(source.read_text(encoding="utf-8")))
    new = f"{head}{start}\n{block}\n{end}{tail}"
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Render the pages; print what was written."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pages", description=__doc__)
    parser.add_argument("--results", default="benchmarks/results", help="the results JSON")
    parser.add_argument("--docs", default="docs/benchmarks", help="folder of the pages")
    parser.add_argument("--readme", default=None, help="a README with the threats block to fill")
    args = parser.parse_args(argv)
    if not Path(args.results).is_dir():
        parser.error(f"no results folder {args.results!r}: run `make bench-results` first")
    written = render(args.results, args.docs)
    if args.readme and update_readme(Path(args.readme), Path(args.results)):
        written.append(Path(args.readme))
    print("written: " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
