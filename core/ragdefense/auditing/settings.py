"""What an audit computes (:class:`AuditSettings`), apart from where and how it runs.

```python
from ragdefense.auditing import AuditSettings, audit

settings = AuditSettings(top_m=20, index="hnsw")
report = audit("chunks.jsonl", settings, workdir="audit/")
report = audit("chunks.jsonl", settings, workdir="other/", part_size=256)  # one changed
```
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from .. import embedders
from ..defenses.registry import DEFAULT_DEFENSE, preset
from ..embedders import as_embedder
from .evidence import Scoring

__all__ = [
    "AuditSettings",
    "defense_mark",
    "embedder_mark",
    "queries_mark",
    "with_overrides",
]


@dataclass(frozen=True)
class AuditSettings:
    """What :func:`~ragdefense.auditing.audit` computes; checked when made (``ValueError``, or
    ``TypeError`` for a value of the wrong type), before any chunk is read.

    Attributes:
        defenses: Registry names or defense objects run on each probe's top ``top_m``
            (default: the per-query default, ``DEFAULT_DEFENSE``); with a query log, the first
            one's flags are evidence (``Scoring.flag_threshold``).
        top_m: Chunks retrieved per probe.
        max_probes: At most this many derived probes (a seeded sample); a query log is asked
            whole (a warning says so).
        neighbours: Nearest neighbours per chunk for the near-duplicate groups and the
            isolation of small planted sets.
        scoring: Weights and thresholds (:class:`~ragdefense.auditing.evidence.Scoring`;
            default: ``Scoring()``).
        part_size: Chunks / probes per part (the unit of work, of resuming and of memory).
        index: ``"flat"`` (exact), ``"hnsw"`` (approximate, for millions of chunks) or
            ``"auto"`` (flat up to 200,000 chunks per shard).
        report_top: The report lists every suspicious chunk and at least this many of the
            highest scores.
        wide_neighbours: Nearest neighbours per chunk for the isolation of large planted sets
            (a set larger than ``neighbours`` fills a chunk's whole neighbour list, so only a
            longer list shows it apart from the rest; a set as large as this list fills it too,
            and shows no gap); 0 turns it off.
        source_key: The metadata key naming a chunk's source (``"auto"``: the first of
            :data:`ragdefense.provenance.SOURCE_KEYS` it has, as the per-query defenses read
            it; ``None``: provenance off). Chunks without one have no source evidence.
        shards: Shards of the index (default: one per worker); each is one task, its index
            built once. Without ``route`` they are contiguous ranges of parts (at most one
            per part); with it, the cells of a k-means of the vectors (an IVF index's lists).
        route: Search each chunk and probe in the ``route`` shards nearest it only (an IVF
            index's ``nprobe``; :mod:`ragdefense.auditing.routing`): ``route`` searches per
            vector instead of one per shard, for knowledge bases too large to search every
            shard. Approximate where a neighbour lies in a farther cell; the chunks
            suspicious on that evidence are searched again in every shard before the
            report. ``None``: every shard searched. Needs ``shards`` above ``route``
            (ignored, with a warning, otherwise).
    """

    defenses: Sequence[Any] = (DEFAULT_DEFENSE,)
    top_m: int = 10
    max_probes: int | None = None
    neighbours: int = 10
    scoring: Scoring | None = None
    part_size: int = 512
    index: str = "auto"
    report_top: int = 1000
    wide_neighbours: int = 40
    source_key: str | None = "auto"
    shards: int | None = None
    route: int | None = None

    @property
    def searched(self) -> int:
        """Hits of each chunk's own search: itself, a copy of it (a knowledge base ingested
        twice) and the wider of ``neighbours`` and ``wide_neighbours``."""
        return max(self.neighbours, self.wide_neighbours) + 2

    def __post_init__(self) -> None:
        for name in ("top_m", "neighbours", "part_size", "report_top", "wide_neighbours"):
            _whole(name, getattr(self, name))
            object.__setattr__(self, name, int(getattr(self, name)))  # a numpy int: JSON's
        for name in ("max_probes", "shards", "route"):
            if getattr(self, name) is not None:
                _whole(name, getattr(self, name))
                object.__setattr__(self, name, int(getattr(self, name)))
        if self.max_probes is not None and self.max_probes < 1:
            raise ValueError(
                f"max_probes must be None (every probe) or >= 1, got {self.max_probes}"
            )
        if self.report_top < 0:
            raise ValueError(f"report_top must be >= 0, got {self.report_top}")
        if self.index not in INDEXES:
            raise ValueError(f"index must be one of {', '.join(INDEXES)}, got {self.index!r}")
        if isinstance(self.defenses, str) or not isinstance(self.defenses, Sequence):
            raise TypeError(
                f"defenses must be a list of names or defense objects, got {self.defenses!r}"
                " (one name: defenses=[name])"
            )
        for spec in self.defenses:
            if isinstance(spec, str):
                preset(spec)  # an unknown name fails here, before any chunk is read
        if (self.shards is not None and self.shards < 1) or (
            self.route is not None and self.route < 1
        ):
            raise ValueError("shards and route must be None or >= 1")
        for name, least in (("top_m", 2), ("neighbours", 1), ("part_size", 1)):
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)!r}")
        if self.wide_neighbours < 0 or 0 < self.wide_neighbours <= self.neighbours:
            raise ValueError("wide_neighbours must be 0 (off) or more than neighbours")
        if self.source_key is not None and not (
            isinstance(self.source_key, str) and self.source_key.strip()
        ):
            raise ValueError("source_key must be a metadata key, 'auto' or None")
        if not self.defenses:
            raise ValueError("give at least one defense")
        for spec in self.defenses:  # an object must defend, before hours of embedding
            if not isinstance(spec, str) and not callable(getattr(spec, "defend", None)):
                raise TypeError(f"defenses: {spec!r} is neither a name nor a defense")
            if any(getattr(d, "trusted", None) is not None for d in (spec, *_inner(spec))):
                raise ValueError(
                    "defenses: the audit's defenses read each chunk's text and vector only "
                    "(provenance is the audit's own evidence, source_key=), so trusted= "
                    f"would match nothing: give {type(spec).__name__} without it"
                )
        if self.scoring is not None:
            object.__setattr__(self, "scoring", _checked(self.scoring))
        least = (self.scoring or Scoring()).min_group + 1  # a list this long holds a group
        if self.neighbours < least:
            raise ValueError(
                f"neighbours must be >= scoring.min_group + 1 ({least}), got "
                f"{self.neighbours}: a shorter list holds no group"
            )


def _inner(spec: Any) -> tuple[Any, ...]:
    """The defense a wrapper (a :class:`~ragdefense.Quarantine`) runs, if any."""
    inner = getattr(spec, "defense", None)
    return () if inner is None or isinstance(inner, str) else (inner,)


def _checked(scoring: Any) -> Scoring:
    """``scoring`` with each value a plain number (JSON writes the report's ``stats``), each
    checked: a whole number >= 2 for the group sizes, a finite one >= 0 for the rest."""
    if not isinstance(scoring, Scoring):
        raise TypeError(f"scoring must be a Scoring, got {scoring!r}")
    values: dict[str, Any] = {}
    for f in fields(scoring):
        value = getattr(scoring, f.name)
        if f.name in ("min_group", "max_group"):
            _whole(f"scoring.{f.name}", value)
            if value < 2:
                raise ValueError(f"scoring.{f.name} must be >= 2, got {value}")
            values[f.name] = int(value)
            continue
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            raise TypeError(f"scoring.{f.name} must be a number, got {value!r}")
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"scoring.{f.name} must be finite and >= 0, got {value}")
        if f.name in _SHARES and value > 1:  # a weight, a cosine, a share of words
            raise ValueError(f"scoring.{f.name} must be at most 1, got {value}")
        values[f.name] = float(value)
    if not values["threshold"] > 0:
        raise ValueError("scoring.threshold must be > 0: at 0 every chunk is suspicious")
    return replace(scoring, **values)


#: the scoring settings that are shares: above 1, the setting means nothing or everything
_SHARES = ("probe_weight", "group_similarity", "victim_share")


#: the search indexes an audit builds
INDEXES = ("auto", "flat", "hnsw")


def _whole(name: str, value: Any) -> None:
    """A setting that counts something is a whole number (not a bool, float or string)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be a whole number, got {value!r}")


def queries_mark(texts: list[str]) -> str:
    """How many texts, and a hash of them: what a resumed audit compares a query log by."""
    joined = json.dumps(texts).encode()  # unambiguous: texts may hold any character
    return f"{len(texts)} {hashlib.sha256(joined).hexdigest()[:16]}"


#: the text whose vector tells one embedding model from another
_PROBE = "ragdefense audit: which model embeds this text?"


def embedder_mark(embedder: Any, recorded: Any = None) -> str | None:
    """The embedder as a resumed audit compares it: its type and projections of its vectors
    for a fixed text, as a passage and as a query (another model of the same type gives
    others; so does one embedding queries otherwise, an instruction prefix changed), ``None``
    for the packaged default (given as ``None`` or as :func:`~ragdefense.default_embedder`'s
    own). ``recorded`` (an earlier run's mark) is returned when it is the same model's, up to
    rounding (another machine computes the last digits otherwise)."""
    if embedder is None or as_embedder(embedder) is embedders._DEFAULT:  # never builds it
        return None
    model = as_embedder(embedder)
    rows = [model.embed([_PROBE]), model.embed_query(_PROBE)]  # the chunks' and the probes' (kept)
    vectors = np.concatenate([np.asarray(r, dtype=np.float64).reshape(1, -1) for r in rows])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True).clip(min=1e-12)
    # eight fixed projections of each: a few coordinates may be zero in any model
    signature = (vectors @ np.random.default_rng(0).standard_normal((vectors.shape[1], 8))).ravel()
    mark = f"{type(embedder).__name__} " + " ".join(f"{v:.3f}" for v in signature)
    if isinstance(recorded, str) and recorded.split(" ")[0] == mark.split(" ")[0]:
        try:
            before = np.array([float(v) for v in recorded.split(" ")[1:]])
        except ValueError:
            return mark
        # another model's projections differ by about one each; the same model's on another
        # machine or precision by hundredths
        if before.shape == signature.shape and np.allclose(before, signature, atol=0.1):
            return recorded
    return mark


def defense_mark(defense: Any) -> str:
    """A defense as a resumed audit compares it: its name, or its type with its settings (its
    public attributes: plain values, collections of them, dataclasses by their fields,
    functions by name and code, nested defenses by their own mark)."""
    return _marked(defense, ())


def _marked(defense: Any, seen: tuple[int, ...]) -> str:
    """:func:`defense_mark`, ``seen`` the objects being written (one met again is a cycle: a
    function of a defense that refers to the defense)."""
    if isinstance(defense, str):
        return defense
    if id(defense) in seen:
        return f"<cycle {type(defense).__name__}>"
    seen = (*seen, id(defense))
    attrs = getattr(defense, "__dict__", None)
    if attrs is None:  # __slots__
        slots = getattr(type(defense), "__slots__", ())
        attrs = {k: getattr(defense, k) for k in slots if hasattr(defense, k)}
    settings = sorted((k, _setting(v, seen)) for k, v in attrs.items() if not k.startswith("_"))
    return f"{type(defense).__name__}({', '.join(f'{k}={v}' for k, v in settings)})"


def _setting(value: Any, seen: tuple[int, ...] = ()) -> str:
    """One attribute as :func:`defense_mark` writes it."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return repr(value)
    if id(value) in seen:
        return f"<cycle {type(value).__name__}>"
    inner = (*seen, id(value))
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_setting(v, inner) for v in value]
        return (
            "[" + ", ".join(sorted(items) if isinstance(value, (set, frozenset)) else items) + "]"
        )
    if isinstance(value, Mapping):
        return (
            "{" + ", ".join(sorted(f"{k!r}: {_setting(v, inner)}" for k, v in value.items())) + "}"
        )
    if is_dataclass(value) and not isinstance(value, type):  # settings (BM25's k1 and b)
        shown = ", ".join(
            f"{f.name}={_setting(getattr(value, f.name), inner)}" for f in fields(value)
        )
        return f"{type(value).__name__}({shown})"
    if isinstance(value, partial):
        return f"partial({_setting((value.func, value.args, value.keywords), inner)})"
    function = getattr(value, "__func__", value)  # a bound method: its function, and its object
    if callable(value) and hasattr(function, "__code__"):  # two lambdas differ by their code
        closure = [_cell(c, inner) for c in function.__closure__ or ()]
        bound = _setting(getattr(value, "__self__", None), inner)
        body = _code(function.__code__) + repr(closure) + bound
        body += _setting((function.__defaults__, function.__kwdefaults__), inner)
        return f"<{value.__qualname__} {hashlib.sha256(body.encode()).hexdigest()[:12]}>"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"<{value.__qualname__}>"
    if hasattr(value, "defend"):  # a nested defense (a quarantine's)
        return _marked(value, seen)
    return f"<{type(value).__name__}>"  # a model or another object: its type


def _cell(cell: Any, seen: tuple[int, ...]) -> str:
    try:
        return _setting(cell.cell_contents, seen)
    except ValueError:  # a cell not yet filled
        return "<empty>"


def _code(code: Any) -> str:
    """A function's code as a mark reads it: its bytecode and constants, a nested function's
    (a comprehension's) by its own code (their text names a memory address)."""
    consts = [
        _code(c) if hasattr(c, "co_code") else _setting(c) if isinstance(c, frozenset) else repr(c)
        for c in code.co_consts  # a frozenset's order changes with the process's hash seed
    ]
    return str(code.co_code.hex()) + repr(consts) + repr(code.co_names)


def with_overrides(settings: AuditSettings | None, overrides: dict[str, Any]) -> AuditSettings:
    """``settings`` (default ``AuditSettings()``) with ``overrides`` replacing its fields."""
    if settings is not None and not isinstance(settings, AuditSettings):
        raise TypeError(f"settings must be an AuditSettings, not a {type(settings).__name__}")
    valid = [f.name for f in fields(AuditSettings)]
    if unknown := sorted(set(overrides) - set(valid)):
        raise TypeError(
            f"audit() got unexpected keyword argument(s) {', '.join(unknown)}; the settings "
            f"are {', '.join(valid)}"
        )
    return replace(AuditSettings() if settings is None else settings, **overrides)
