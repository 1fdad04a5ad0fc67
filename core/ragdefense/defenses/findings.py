"""Reading an audit report for :class:`~ragdefense.defenses.quarantine.Quarantine`: its
findings and stats, each field checked where it decides something, and the text digest passages
are matched by."""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .params import finite, said
from .pool import marked_scripts, plain_text

__all__ = [
    "BLANK",
    "STANDS_APART",
    "check_held",
    "copy_groups",
    "digest",
    "finding_source",
    "number",
    "read_report",
]

#: how a report's reason opens where it names the member standing apart in its group (the
#: audit writes it; the quarantine reads it)
STANDS_APART = "stands apart in group"


#: characters no reader sees beyond the format (Cf) and control (Cc) ones: Unicode's other
#: default-ignorable code points (fillers, variation selectors) and the blank braille pattern
_UNSEEN = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2065\u2800\u3164\ufe00-\ufe0f\uffa0\ufff0-\ufff8"
    "\U000e0000-\U000e0fff]"
)


def digest(text: str) -> str:
    """SHA-256 of ``text`` with its spacing, Unicode form, case, accents and invisible
    characters (zero-width spaces, joiners, variation selectors, fillers, controls) normalised:
    a store may strip, rewrap or re-encode it, and an attacker's copy must not escape by a
    character no reader sees, nor by a change of case or accents (which the per-query defense
    reads as a copy of one text, :func:`~.pool.plain_text`)."""
    said = _UNSEEN.sub("", unicodedata.normalize("NFKC", marked_scripts(text)))  # 10⁵: not 105
    said = "".join(c for c in said if c.isspace() or unicodedata.category(c) not in ("Cf", "Cc"))
    said = plain_text(said)  # decomposed again (NFKD) where not ASCII, accents left out
    return hashlib.sha256(said.encode("utf-8", errors="surrogatepass")).hexdigest()


#: the digest of a text no reader sees (an image's node, a blank chunk): never quarantined, it
#: would hold every passage without text
BLANK = digest("")


def read_report(report: Any) -> tuple[list[Mapping[str, Any]], Mapping[str, Any]]:
    """The findings (as mappings) of an AuditReport, its ``to_dict()``, a ``report.json`` or the
    audit's folder holding one; and its stats."""
    if isinstance(report, (str, os.PathLike)):
        path = Path(report)
        path = path / "report.json" if path.is_dir() else path
        if path.suffix.lower() in (".csv", ".parquet", ".md", ".png"):
            raise ValueError(
                f"{str(path)!r} is a view of an audit report: give its report.json (or the "
                "audit's folder), which holds every finding with its group and the stats"
            )
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read the audit report {str(path)!r}: {exc}") from exc
    if hasattr(report, "to_dict"):
        report = report.to_dict()
    if not isinstance(report, Mapping) or not isinstance(report.get("findings"), list):
        raise ValueError("not an audit report: expected its 'findings' (ragdefense.audit)")
    stats = report.get("stats")
    findings = report["findings"]
    odd = next((n for n, f in enumerate(findings) if not isinstance(f, Mapping)), None)
    if odd is not None:  # dropped, it would let a flagged chunk through unsaid
        raise ValueError(
            f"finding {odd} is {type(findings[odd]).__name__}, not a mapping (an audit "
            "report's findings come from ragdefense.audit)"
        )
    for n, f in enumerate(findings):  # the fields read as keys and lists, checked here
        group, reasons = f.get("group"), f.get("reasons")
        if isinstance(group, Mapping) and not isinstance(group.get("id"), str | int | None):
            raise ValueError(f"finding {n} (id {f.get('id')!r}): its group's id is not a string")
        if reasons is not None and not (
            isinstance(reasons, list) and all(isinstance(r, str) for r in reasons)
        ):
            raise ValueError(
                f"finding {n} (id {f.get('id')!r}): its reasons are {reasons!r}, not a list of"
                " strings (an audit report's findings come from ragdefense.audit)"
            )
    return findings, stats if isinstance(stats, Mapping) else {}


def finding_source(finding: Mapping[str, Any]) -> str | None:
    """A finding's source (``None``: none, or an empty one, as the audit writes none)."""
    source = finding.get("source")
    return source if isinstance(source, str) and source else None


def copy_groups(findings: list[Mapping[str, Any]]) -> set[Any]:
    """The ids of the groups whose members the report lists, all, with one text: copies of one
    text, of which the quarantine lets one through to the per-query defense. Quarantining them
    all by text would let an attacker who stores copies of an honest passage have that passage
    quarantined."""
    texts: dict[Any, set[str]] = {}
    listed: dict[Any, int] = {}
    for f in findings:
        group, text = f.get("group"), f.get("text")
        if isinstance(group, Mapping) and isinstance(text, str):
            texts.setdefault(group.get("id"), set()).add(digest(text))
            listed[group.get("id")] = listed.get(group.get("id"), 0) + 1
    groups = [f["group"] for f in findings if isinstance(f.get("group"), Mapping)]
    sizes = {group.get("id"): group.get("size") for group in groups}
    return {g for g, t in texts.items() if len(t) == 1 and listed[g] == sizes.get(g)}


def number(n: int, finding: Mapping[str, Any], what: str, value: Any, whole: bool) -> float:
    """A finding's ``what`` as a number, else ``ValueError`` naming the finding: a report from
    another version, or edited by hand, must not quarantine the wrong passages."""
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    huge = numeric and not isinstance(value, float) and not finite(value)
    if not numeric or huge or (whole and not float(value).is_integer()):
        kind = "a whole number" if whole else "a number"
        raise ValueError(
            f"finding {n} (id {finding.get('id')!r}): its {what} is {said(value)}, not {kind}"
            f"{' a float holds' if huge else ''}"
            " (an audit report's findings come from ragdefense.audit)"
        )
    return float(value)


def check_held(defense: Any, chunks: Any, reasons: Mapping[str, Any], held: Iterable[str]) -> None:
    """A quarantine built by hand checked as one read from a report is: a defense to wrap, a
    count of chunks, and for every text it holds a reason a person reads (a missing one failed
    on the first query, a blank one removed a passage saying nothing, ``None`` let it through)."""
    if not isinstance(reasons, Mapping):
        raise TypeError(f"reasons must map each text's digest to a reason, got {reasons!r}")
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 0:
        raise ValueError(f"chunks must be an int >= 0, got {chunks!r}")
    if not callable(getattr(defense, "defend", None)):
        raise TypeError(f"defense must be a defense (ragdefense.defense(name)), got {defense!r}")
    unsaid = [d for d in held if not isinstance(reasons.get(d), str) or not reasons[d].strip()]
    if unsaid:
        raise ValueError(f"reasons must give each text held a reason; none for {unsaid[:3]}")
