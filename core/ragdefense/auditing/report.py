"""The audit's result: every chunk with its evidence, ranked, and the writers (Markdown, JSON,
CSV, Parquet, a plot)."""

from __future__ import annotations

import csv
import html
import importlib.util
import json
import os
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..shown import printable

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["BLANK", "FORMATS", "FORMAT_NEEDS", "AuditReport", "Finding"]

#: the report's formats
FORMATS = ("md", "json", "csv", "parquet", "png")
#: the formats needing a library beyond the standard one: (module, what to install)
FORMAT_NEEDS = {"parquet": ("pyarrow", "'ragdefense[audit]'"), "png": ("matplotlib", "matplotlib")}


#: the reason of a blank chunk's finding (an empty page): never suspicious, whatever its score
BLANK = "blank: no text to judge (never suspicious)"


@dataclass
class Finding:
    """One chunk's evidence.

    Attributes:
        id: The chunk's id in the knowledge base.
        text: Its text.
        score: How suspicious (0 and up, suspicious from the scoring's ``threshold``; the report
            is sorted by it).
        suspicious: The verdict: ``score >= threshold``, unless it is a suspicious group's
            possible victim (``victim_of``); or, under it, a member of a group at least half
            suspects that holds every word nearly all of them share (a reason says so).
        reasons: The evidence in words.
        retrieved: Probes whose top M held the chunk.
        flagged: Per defense, the probes on which it removed the chunk.
        probes: A few probes that flagged it, with the defense's reason.
        group: The tight near-duplicate group it belongs to (id, size, similarity),
            or ``None``.
        source: Where it comes from (its metadata's source, as the defenses read it), or
            ``None``.
        victim_of: The id of the suspicious near-duplicate group whose possible victim it is
            (it shares the group's subject, not the words its members share: the honest
            passage a planted set targets), not counted as suspicious; or ``None``.
    """

    id: str
    text: str
    score: float
    suspicious: bool
    reasons: list[str]
    retrieved: int
    flagged: dict[str, int]
    probes: list[dict[str, str]] = field(default_factory=list)
    group: dict[str, Any] | None = None
    source: str | None = None
    victim_of: str | None = None

    def row(self) -> dict[str, Any]:
        """A flat record (for CSV / Parquet)."""
        group = self.group or {}
        return {
            "id": self.id,
            "score": round(self.score, 4),
            "suspicious": self.suspicious,
            "retrieved": self.retrieved,
            **{f"flagged_{k}": v for k, v in self.flagged.items()},
            "group": group.get("id", ""),
            "group_size": group.get("size", 0),
            "group_similarity": group.get("similarity", 0.0),
            "source": self.source or "",
            "victim_of": self.victim_of or "",
            "reasons": "; ".join(self.reasons),
            "probes": " | ".join(p["probe"] for p in self.probes),
            "text": self.text,
        }


@dataclass
class AuditReport:
    """The audited chunks most suspicious first (every suspicious one, and at least
    ``report_top`` of the highest scores), and how the audit ran."""

    findings: list[Finding]
    threshold: float
    stats: dict[str, Any]

    @property
    def suspicious(self) -> list[Finding]:
        """The chunks the audit flags, most suspicious first."""
        return [f for f in self.findings if f.suspicious]

    def top(self, n: int | None = 20) -> list[Finding]:
        """The ``n`` most suspicious chunks (``None``: all)."""
        return self.findings[: _count(n, "n")]

    def to_dict(self) -> dict[str, Any]:
        """Everything, JSON-friendly."""
        return {
            "threshold": self.threshold,
            "stats": self.stats,
            "findings": [asdict(f) for f in self.findings],
        }

    def to_markdown(self, top: int | None = 30, width: int = 90) -> str:
        """A summary and the ``top`` most suspicious chunks with their evidence (where more are
        suspicious, a last line says how many are left out)."""
        s, top = self.stats, _count(top, "top")
        lines = [
            "# Knowledge-base audit",
            "",
            f"{s.get('chunks', 0)} chunks, {s.get('probes', 0)} probes ({s.get('probe_source')}), "
            f"top {s.get('top_m')} per probe, defenses: {', '.join(s.get('defenses', []))}. "
            f"**{len(self.suspicious)} suspicious** (score >= {self.threshold}{_aside(s)}).",
            "",
        ]
        for said in s.get("cautions") or []:  # found on the run that read the chunks
            lines += [f"**Caution**: {_md(printable(str(said)))}.", ""]
        chunks = int(s.get("chunks") or 0)
        if chunks and 5 * len(self.suspicious) > chunks:  # a fifth: far past what it calibrates
            lines += [
                f"**Caution**: {len(self.suspicious)} of {chunks} chunks look suspicious. The "
                "scores compare each chunk with the rest of the knowledge base; in a small one "
                "(a few passages on each of a few far-apart topics) honest topics look like "
                "planted sets. Check the evidence before removing anything.",
                "",
            ]
        if s.get("victims"):
            n = int(s["victims"])
            lines += [
                f"Not counted as suspicious: {n} possible victim{'s' * (n != 1)} of suspicious "
                "groups (sharing a group's subject, not the words its members share; see the "
                "reasons).",
                "",
            ]
        suspect = s.get("suspect_sources") or []
        if suspect:
            named = ", ".join(
                f"{_md(printable(str(r['source'])))} ({r['on_own_evidence']} of {r['chunks']} "
                f"chunks on their own evidence, {r['suspicious']} in all)"
                for r in suspect[:10]
            )
            more = f" and {len(suspect) - 10} more" if len(suspect) > 10 else ""
            lines += [
                f"Sources condemned by their chunks (most look planted): {named}{more}.",
                "",
            ]
        lines += [
            "| rank | id | score | retrieved | flagged | group | reasons | text |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for rank, f in enumerate(self.findings[:top], 1):
            text = printable(f.text)
            text = text if len(text) <= width else text[: width - 1] + "…"
            flagged = ", ".join(f"{k} {v}" for k, v in f.flagged.items())
            group = f"{f.group['id']} ({f.group['size']})" if f.group else ""
            mark = "**" if f.suspicious else ""
            cells = [str(rank), f"{mark}{_md(printable(f.id))}{mark}", f"{f.score:.2f}"]
            cells += [str(f.retrieved), flagged, group, _md(printable("; ".join(f.reasons)))]
            lines.append("| " + " | ".join([*cells, _md(text)]) + " |")
        shown, listed = sum(f.suspicious for f in self.findings[:top]), len(self.suspicious)
        if shown < listed:
            lines += ["", f"{shown} of the {listed} suspicious chunks shown (the {top} highest "
                      "scores): every one in the report's JSON, CSV and Markdown."]  # fmt: skip
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.to_markdown(top=10)

    def write(
        self, folder: str | Path, formats: str | Sequence[str] = ("md", "json", "csv")
    ) -> list[Path]:
        """Write ``report.<format>`` for each of ``md``, ``json``, ``csv``, ``parquet``
        (needs pyarrow) and ``png`` (the plot; needs matplotlib) into ``folder``. Every format
        is checked before any file is written: an unknown one is a ``ValueError``, a missing
        library an ``ImportError`` naming the install."""
        if not isinstance(formats, str | Iterable):
            raise TypeError(f"formats must be a format's name or a list of them, got {formats!r}")
        formats = [formats] if isinstance(formats, str) else list(formats)  # "md": one format
        for fmt in formats:
            if fmt not in FORMATS:
                raise ValueError(f"unknown report format {fmt!r}: {', '.join(FORMATS)}")
            if fmt in FORMAT_NEEDS and importlib.util.find_spec(FORMAT_NEEDS[fmt][0]) is None:
                module, install = FORMAT_NEEDS[fmt]
                raise ImportError(f"report format {fmt} needs {module}: pip install {install}")
        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{folder} is a file: reports are written into a folder")
        folder.mkdir(parents=True, exist_ok=True)
        paths = [folder / f"report.{fmt}" for fmt in formats]
        _replace(paths, [partial(self._write, fmt=fmt) for fmt in formats])
        return paths

    def _write(self, path: Path, fmt: str) -> None:
        if fmt == "md":  # every suspicious chunk, and the 30 highest scores at least
            last = max((n + 1 for n, f in enumerate(self.findings) if f.suspicious), default=0)
            path.write_text(self.to_markdown(top=max(30, last)), encoding="utf-8")
        elif fmt == "json":
            path.write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")
        elif fmt == "csv":
            rows = [{k: _cell(v, k != "id") for k, v in f.row().items()} for f in self.findings]
            with path.open("w", newline="", encoding="utf-8") as out:
                writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["id"])
                writer.writeheader()
                writer.writerows(rows)
        elif fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist([f.row() for f in self.findings]), path)
        else:
            self.plot(path)

    def plot(self, path: str | Path) -> None:
        """Write :meth:`figure` to ``path`` (PNG, or the format its suffix names)."""
        self.figure().savefig(path, dpi=120)

    def figure(self, groups: int = 8) -> Figure:
        """Scores of the listed chunks by rank (from 1, log scale) with the threshold, the
        members of the ``groups`` first near-duplicate groups marked one colour and marker each
        (the others together), the possible victims ringed, titled with the chunks audited
        (needs matplotlib)."""
        from matplotlib.figure import Figure
        from matplotlib.ticker import StrMethodFormatter

        fig = Figure(figsize=(8, 3.8), layout="constrained")
        ax = fig.subplots()
        scores = [f.score for f in self.findings]
        ranks = range(1, len(scores) + 1)
        ax.plot(ranks, scores, lw=1.5, color="tab:blue", label="score")
        ax.axhline(self.threshold, color="tab:red", ls="--", lw=1, label="threshold")
        members: dict[str, list[int]] = {}
        sizes: dict[str, int] = {}
        for rank, f in enumerate(self.findings, 1):
            if f.group:
                members.setdefault(str(f.group["id"]), []).append(rank)
                sizes[str(f.group["id"])] = int(f.group.get("size", 0))

        def mark(ranks: list[int], **style: Any) -> None:  # points on the score line
            ax.scatter(ranks, [scores[r - 1] for r in ranks], clip_on=False, **style)

        others: list[int] = []
        for g, (gid, found) in enumerate(members.items()):  # first seen = best ranked
            if g >= groups:
                others += found
                continue
            marker, color = "os^Dv<>P"[g % 8], f"C{(g + 2) % 10}"
            label = f"group {gid} ({sizes[gid]} chunks)"
            mark(found, s=28, zorder=3, marker=marker, color=color, label=label)
        if others:
            label = f"{len(members) - groups} more groups"
            mark(others, s=14, zorder=3, marker="x", color="0.4", label=label)
        victims = [rank for rank, f in enumerate(self.findings, 1) if f.victim_of]
        if victims:
            label = f"possible victims, not suspicious ({len(victims)})"
            mark(victims, s=60, zorder=4, facecolors="none", edgecolors="k", label=label)
        ax.set_xscale("log")
        ax.set_xlim(1, max(len(scores), 2))
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        ax.set_xlabel("rank of the chunk (most suspicious first)")
        ax.set_ylabel("suspicion score")
        chunks = int(self.stats.get("chunks", len(scores)))
        suspicious = int(self.stats.get("suspicious", len(self.suspicious)))
        ax.set_title(
            f"{chunks:,} chunks audited, {suspicious:,} suspicious (score >= {self.threshold:g}"
            f"{_aside(self.stats)}); the {len(scores):,} listed are plotted",
            fontsize=10,
        )
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        return fig


def _md(text: str) -> str:
    """``text`` as a Markdown table cell shows it, as text: ``<``, ``>`` and ``&`` escaped (an
    attacker's chunk holding ``<img onerror=...>`` would run where the report is rendered with
    HTML, in MkDocs or a notebook), and the marks that make links and images
    (``[link](javascript:...)``) or end the cell (``|``) backslash-escaped."""
    return _MARKDOWN.sub(r"\\\g<0>", html.escape(text, quote=False))


#: what Markdown reads as a link or image in a table cell, or as its end (and the escape)
_MARKDOWN = re.compile(r"[\\\[\]|]")


def _cell(value: Any, shown: bool = True) -> Any:
    """A CSV cell that a spreadsheet cannot run: text starting with ``= + - @`` (or a tab or
    carriage return) gets a leading apostrophe (the usual defence against formula injection);
    nor, ``shown``, a terminal showing the file (``cat report.csv``): control and format
    characters written as escapes, as :func:`~ragdefense.shown.printable` writes them, but
    line breaks (``\\r\\n`` too) and tabs. An id is not ``shown`` (it must match the store's)."""
    if not isinstance(value, str):
        return value
    if value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        value = "'" + value
    if not shown:
        return value
    return "".join(
        ch if ch in "\n\t" or value[n : n + 2] == "\r\n" else printable(ch)
        for n, ch in enumerate(value)
    )


def _aside(stats: dict[str, Any]) -> str:
    """What the verdict adds to ``score >= threshold`` or leaves out: the members counted with
    their set, the possible victims."""
    joined = f", {stats['joined']} counted with their set" if stats.get("joined") else ""
    return joined + (", possible victims aside" if stats.get("victims") else "")


def _replace(paths: list[Path], writes: list[Callable[[Path], None]]) -> None:
    """Write ``paths`` whole or not at all: each into a temporary file beside it (same suffix,
    for the formats that read it), renamed over it once all are complete. A reader, such as a
    quarantine loading the report while it is written again, or a killed run, never sees half
    a report, nor one format of this run beside another of an earlier one (a full disk)."""
    taken = next((p for p in paths if p.is_dir()), None)  # a rename over it would fail late
    if taken is not None:
        raise IsADirectoryError(f"{taken} is a folder: the report cannot be written there")
    done: list[Path] = []
    try:
        for path, write in zip(paths, writes, strict=True):
            # created as open() creates files (the umask's mode, not mkstemp's owner-only
            # 0600): a service reading the report as another user still can
            tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex}{path.suffix}")
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            done.append(tmp)
            write(tmp)
        for tmp, path in zip(done, paths, strict=True):
            os.replace(tmp, path)
    except BaseException:
        for tmp in done:
            tmp.unlink(missing_ok=True)
        raise


def _count(n: Any, name: str) -> int | None:
    """``n`` as a count of rows to show (``None``: all; a negative one would slice from the
    end)."""
    if n is not None and (isinstance(n, bool) or not hasattr(n, "__index__")):
        raise TypeError(f"{name} must be an int >= 0 or None, got {n!r}")
    if n is not None and n < 0:
        raise ValueError(f"{name} must be an int >= 0 or None, got {n!r}")
    return None if n is None else int(n.__index__())
