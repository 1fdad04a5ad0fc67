"""From the steps' files to per-chunk evidence: how often each chunk was retrieved and flagged by
each defense (and on which probes), the tight near-duplicate groups of the corpus, and the score
that ranks them. Streams over the part files; memory grows with the number of chunks only
(a few numbers each)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .copies import copies_allowed, one_chunk
from .records import closest_queries, counts
from .sources import SourceTally, read_sources, source_reason, source_tally
from .steps import merged_hits
from .workdir import Workdir

__all__ = [
    "Evidence",
    "Scoring",
    "assess",
    "find_groups",
    "isolation",
    "own_score",
    "reasons",
    "score",
    "scored",
]


@dataclass(frozen=True)
class Scoring:
    """How evidence becomes a score (how its values were chosen: the tuning notes in the docs;
    what they reach: the audit benchmark's page).

    The score is the *isolation* of the tightest small group around a chunk, read off its
    nearest-neighbour similarities ``s_1 >= ... >= s_K``: the largest
    ``mean(s_1..s_j) - mean(s_j+1..s_K)`` for ``min_group - 1 <= j <= K - 2``. Planted passages
    come in small sets written for one question: very close to each other, far from the rest;
    benign near-duplicates sit in graded topical neighbourhoods. ``probe_weight`` mixes in the
    share of probes on which the first defense removed the chunk; it is off by default, as it
    did not improve the ranking at a low false-positive budget (the report still shows it).

    A planted set larger than the neighbour list fills it whole, and shows no gap there: the
    *wide isolation*, the same measure over ``AuditSettings(wide_neighbours=)`` neighbours,
    finds it; it has a threshold of its own (``wide_threshold``), and a chunk's score is the
    larger of the two, each relative to its threshold.

    With a query log, *targeting*: a chunk a logged question retrieves that is closer to that
    question than to any other chunk of the knowledge base (its cosine to the question minus its
    cosine to its nearest chunk). A passage written for a question sits next to it, apart from
    the documents around it; isolation cannot see a lone one, targeting can. It counts, relative
    to ``target_threshold``, like the wide isolation; derived probes (each a chunk's own title or
    first sentence) give no such evidence, and it is not computed from them. The one passage that
    truly answers a logged question can be targeted too: the report says so. The margin was set
    with a model that embeds questions and passages alike (MiniLM); with one that embeds
    questions apart (``embed_query``), set it for that model, or 0 to turn targeting off.

    With sources in the chunks' metadata, *provenance*: planted passages arrive together, from
    the few sources an attacker controls (an upload, a site), so a chunk whose source's *other*
    chunks are mostly suspicious on their own evidence (targeting aside: a FAQ site's pages each
    answer a logged question) is suspicious too, whatever its wording.
    The support (:func:`support_of`) is the share ``suspicious others / (others + 2)`` (the 2:
    at the shipped threshold one suspicious chunk never condemns another of its source; two of
    three can) above the suspicious share of the rest of the knowledge base (where most chunks
    look suspicious, a source that does proves nothing), relative to ``source_threshold``. A
    source whose other chunks are mostly missed gives no such evidence, nor does a source
    shared with many honest documents.

    With a query log, *the defense's flags*: the share of the logged questions retrieving a
    chunk on which the first defense (the per-query default unless told otherwise) removed it
    with a set (any reason but the lone-passage veto, :data:`~.records.LONE_REMOVAL`, which in
    a poisoned pool removes the honest minority), relative to ``flag_threshold``, for chunks
    whose own score is at least ``flag_gate`` (some isolation or targeting). Count it only for
    a defense that removes on evidence: RAGDefender's flags remove many honest chunks too (with
    it first, set ``flag_threshold=0``). Derived probes give no such evidence.

    Attributes:
        min_group: Smallest group (the chunk and ``min_group - 1`` neighbours) that counts.
        probe_weight: Weight of the probe evidence (0-1).
        threshold: Score from which a chunk is reported suspicious.
        wide_threshold: The wide isolation that counts as ``threshold``.
        target_threshold: The targeting that counts as ``threshold`` (0 turns it off).
        source_threshold: The source support that counts as ``threshold`` (0 turns it off).
        flag_threshold: With a query log, the first defense's rate of removals with a set
            that counts as ``threshold`` (0 turns it off).
        flag_gate: The own score a chunk needs for its flags to count.
        group_similarity: Near-duplicates shown together in the report (cosine similarity).
        max_group: Larger near-duplicate components are topics: within them only near-copies
            (cosine :data:`NEAR_COPIES` or more) form groups, of any size (group similarities
            there are the mean of those edges only).
        apart: Least excess of a suspicious group's agreement among its other members over
            their agreement with one member for the report to name that member as the honest
            passage the group may target (:func:`~.victims.apart_in_groups`; 0 turns it off).
        victim_share: A suspect in or next to a group (more than half of it suspects sharing
            its words) that holds less than this share of the words most of the group's other
            members share is reported as the group's possible victim, not as suspicious
            (:func:`~.victims.unlike_their_group`; 0 turns it off).
    """

    min_group: int = 3
    probe_weight: float = 0.0
    threshold: float = 0.32
    wide_threshold: float = 0.48
    target_threshold: float = 0.1
    source_threshold: float = 0.5
    flag_threshold: float = 0.5
    flag_gate: float = 0.1
    group_similarity: float = 0.8
    max_group: int = 30
    apart: float = 0.05
    victim_share: float = 0.5


@dataclass
class Evidence:
    """Per chunk position: retrieved count and flags per defense (from the probes), isolation
    and near-duplicate group (from the neighbours)."""

    retrieved: np.ndarray
    flagged: dict[str, np.ndarray]
    isolated: np.ndarray
    group_of: np.ndarray
    groups: list[dict[str, Any]]
    wide: np.ndarray | None = None  # the wide isolation (None: not computed)
    near: np.ndarray | None = None  # positions of each chunk's nearest neighbours (-1: none)
    nearest: np.ndarray | None = None  # cosine to the nearest other chunk (NaN: none)
    closest_query: np.ndarray | None = None  # best cosine to a logged question (-inf: none)
    closest_probe: np.ndarray | None = None  # that question's probe number (-1: none)
    source: np.ndarray | None = None  # each chunk's source, a number (-1: none; None: no sources)
    source_names: list[str] = field(default_factory=list)  # the sources, by number
    with_set: dict[str, np.ndarray] | None = None  # removals with a set (None: as flagged)
    #: cosine to the closest logged question that retrieved it minus cosine to its nearest
    #: chunk (``None`` without a query log; -1 where no question retrieved it, or it has no
    #: other chunk to be nearer to)
    targeting: np.ndarray | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.closest_query is not None and self.nearest is not None:
            known = np.isfinite(self.closest_query) & np.isfinite(self.nearest)
            self.targeting = np.where(known, self.closest_query - self.nearest, -1.0)

    def removed_with_set(self, primary: str) -> np.ndarray:
        """Per position: ``primary``'s removals with a set (all of them when not counted apart)."""
        return (self.with_set or self.flagged)[primary]

    def group(self, i: int) -> dict[str, Any] | None:
        """The near-duplicate group of position ``i`` (``None`` when it has none)."""
        return self.groups[self.group_of[i]] if self.group_of[i] >= 0 else None


def assess(wd: Workdir, defenses: list[str], scoring: Scoring) -> Evidence:
    """All the evidence in a finished audit's folder (its sizes, shards and neighbours as the
    manifest records them)."""
    sizes = wd.noted("part_sizes")
    retrieved, flagged, with_set = counts(wd, sum(sizes), wd.noted("probe_parts"), defenses)
    params = wd.read_json("manifest.json")["params"]
    group_of, groups, isolated, wide, near, nearest = find_groups(
        wd, len(sizes), wd.noted("shards"), params["neighbours"], scoring,
        params.get("wide_neighbours", 0),
    )  # fmt: skip
    closest = probe = None
    if params.get("queries") is not None:  # a query log: its questions are the users'
        closest, probe = closest_queries(wd, sum(sizes), wd.noted("shards"), params["top_m"])
    source, names = read_sources(wd, len(sizes))
    return Evidence(
        retrieved, flagged, isolated, group_of, groups, wide, near, nearest, closest, probe,
        source, names, with_set,
    )  # fmt: skip


def isolation(sims: np.ndarray, min_group: int, found: np.ndarray | None = None) -> np.ndarray:
    """Per row of neighbour similarities (best first, self excluded; ``found``: how many of a
    row's count, the rest no neighbour): the largest ``mean(s_1..s_j) - mean(s_j+1..s_K)``
    for ``min_group - 1 <= j <= K - 2``, K the row's count (0 when K is too small)."""
    n, k = sims.shape
    found = np.full(n, k) if found is None else np.minimum(found, k)
    total, best = np.cumsum(sims, axis=1), np.zeros(n)
    last = total[np.arange(n), np.maximum(found, 1) - 1] if k else best
    for j in range(max(1, min_group - 1), k - 1):
        head = total[:, j - 1] / j
        tail = (last - total[:, j - 1]) / np.maximum(found - j, 1)
        best = np.where(j <= found - 2, np.maximum(best, head - tail), best)
    return best


#: the least cosine between near-copies: within a near-duplicate component larger than
#: ``Scoring.max_group`` (a topic), only chunks this close to each other form groups
NEAR_COPIES = 0.95


def find_groups(
    wd: Workdir, chunk_parts: int, n_shards: int, k: int, scoring: Scoring, wide: int = 0
) -> tuple[np.ndarray, list[dict[str, Any]], np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """Connected components of the near-duplicate graph (each chunk's ``k`` nearest neighbours
    with similarity >= ``scoring.group_similarity``) of 2 or more; within a component larger
    than ``scoring.max_group`` (a topic), only the edges of :data:`NEAR_COPIES` or more (a
    set of near-copies is a group however large), and each chunk's :func:`isolation`
    over ``k`` and (when ``wide``) over ``wide`` neighbours: ``(group index per position or -1,
    [{id, size, similarity}] per group, isolation per position, wide isolation per position or
    None, each position's k nearest neighbours, its cosine to the nearest or NaN when it has
    none)``."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    rows, cols, sims, isolated, wides, nears, firsts = [], [], [], [], [], [], []
    start, reach = 0, max(k, wide)
    allowed = copies_allowed(wd, chunk_parts, n_shards, reach + 2)
    # a hit missing where the knowledge base holds enough chunks: a routed search's small cell,
    # the rest of its neighbours in other cells, far (counted as cosine 0; suspects are rechecked)
    full = sum(int(n) for n in wd.noted("part_sizes")[:chunk_parts]) >= reach + 2
    for part in range(chunk_parts):
        s, p = merged_hits(wd, "chunks", part, n_shards, reach + 2)
        me = np.arange(start, start + len(p))[:, None]
        others = (p >= 0) & (p != me) & (s != 0)  # at 0: a blank chunk's zero row, no direction
        others &= ~one_chunk(wd, start, s, p, others, allowed)  # a knowledge base ingested again
        order = np.argsort(~others, axis=1, kind="stable")[:, :reach]  # self dropped, in order
        neighbour_sims = np.take_along_axis(np.where(others, s, 0.0), order, axis=1)
        found = others.sum(axis=1) + ((p < 0).sum(axis=1) if full else 0)  # copies: no padding
        isolated.append(isolation(neighbour_sims[:, :k], scoring.min_group, found))
        firsts.append(np.where(others.any(axis=1), neighbour_sims[:, 0], np.nan))
        if wide:
            wides.append(isolation(neighbour_sims[:, :wide], scoring.min_group, found))
        # the group graph and the neighbours kept for the report: the k nearest
        valid = np.take_along_axis(others, order, axis=1)[:, :k]
        near = np.where(valid, np.take_along_axis(p, order, axis=1)[:, :k], -1).astype(np.int64)
        nears.append(near)
        keep = valid & (neighbour_sims[:, :k] >= scoring.group_similarity)
        rows.append(np.broadcast_to(me, near.shape)[keep])
        cols.append(near[keep])
        sims.append(neighbour_sims[:, :k][keep])
        start += len(me)
    n = start
    r, c, w = (np.concatenate(x) if x else np.zeros(0) for x in (rows, cols, sims))
    r, c = r.astype(np.int64), c.astype(np.int64)

    def components(r: np.ndarray, c: np.ndarray) -> np.ndarray:
        graph = coo_matrix((np.ones(len(r)), (r, c)), shape=(n, n))
        labels: np.ndarray = connected_components(graph, directed=False)[1]
        return labels

    labels = components(r, c)
    # a component larger than max_group is a topic: within it only near-copies form groups (a
    # planted set joined to the topic, or to the honest passage it copies, by looser edges comes
    # out whole, of any size); a looser cut would make groups of a topic's honest articles
    oversized = np.bincount(labels)[labels] > scoring.max_group
    if oversized.any():
        keep = ~oversized[r] | (w >= NEAR_COPIES)
        r, c, w = r[keep], c[keep], w[keep]
        labels = components(r, c)
    sizes = np.bincount(labels, minlength=labels.max() + 1 if n else 0)
    kept = sizes >= 2
    number = np.cumsum(kept) - 1  # component label -> group number (where kept)
    group_of = np.where(kept[labels], number[labels], -1).astype(np.int64)
    edge_group = group_of[r] if len(r) else np.zeros(0, dtype=np.int64)
    on_edge = edge_group >= 0
    n_groups = int(kept.sum())
    edge_sum = np.bincount(edge_group[on_edge], weights=w[on_edge], minlength=n_groups)
    edge_count = np.bincount(edge_group[on_edge], minlength=n_groups)
    mean = np.divide(edge_sum, edge_count, out=np.zeros(n_groups), where=edge_count > 0)
    info = [
        {"id": f"g{g}", "size": int(size), "similarity": min(1.0, float(mean[g]))}
        for g, size in enumerate(sizes[kept])
    ]
    wide_isolation = (np.concatenate(wides) if wides else np.zeros(0)) if wide else None
    near_all = np.concatenate(nears) if nears else np.zeros((0, k), dtype=np.int64)
    isolation_all = np.concatenate(isolated) if isolated else np.zeros(0)
    nearest = np.concatenate(firsts) if firsts else np.zeros(0)
    return group_of, info, isolation_all, wide_isolation, near_all, nearest


def score(evidence: Evidence, primary: str, scoring: Scoring) -> np.ndarray:
    """Per position: ``(1 - w) x isolation + w x flag rate`` (the share of the probes that
    retrieved the chunk on which ``primary`` removed it), ``w = scoring.probe_weight``; or the
    source support, where it is further past its own threshold."""
    return scored(evidence, primary, scoring)[0]


def scored(
    evidence: Evidence, primary: str, scoring: Scoring
) -> tuple[np.ndarray, np.ndarray, SourceTally | None]:
    """:func:`score`, whether each position is suspicious on its own evidence but targeting
    (see :class:`Scoring`), and the :class:`SourceTally` of that (``None`` without sources)."""
    own_values = voiced = own_score(evidence, primary, scoring)
    if evidence.targeting is not None:  # what its source counts: targeting left out
        voiced = own_score(evidence, primary, scoring, targeting=False)
    own = voiced >= scoring.threshold
    tally = source_tally(evidence, own)
    if tally is None or evidence.source is None or scoring.source_threshold <= 0:
        return own_values, own, tally
    support = tally.support(evidence.source, own)
    out = np.maximum(own_values, support * scoring.threshold / scoring.source_threshold)
    return out, own, tally


def own_score(
    evidence: Evidence, primary: str, scoring: Scoring, targeting: bool = True
) -> np.ndarray:
    """The score on a chunk's own evidence (no source support; nor targeting without it)."""
    rate = _flag_rate(evidence, evidence.flagged[primary])
    w = scoring.probe_weight
    out: np.ndarray = (1 - w) * _isolation(evidence, scoring, targeting) + w * rate
    if _flags_count(evidence, scoring):
        sets = _flag_rate(evidence, evidence.removed_with_set(primary))
        gated = np.where(out >= scoring.flag_gate, sets, 0.0)
        out = np.maximum(out, gated * scoring.threshold / scoring.flag_threshold)
    return out


def _flag_rate(evidence: Evidence, flags: np.ndarray) -> np.ndarray:
    """Per position: the share of the probes retrieving it that removed it (``flags``)."""
    retrieved = evidence.retrieved
    out: np.ndarray = np.divide(flags, retrieved, out=np.zeros(len(flags)), where=retrieved > 0)
    return out


def _flags_count(evidence: Evidence, scoring: Scoring) -> bool:
    """Whether the defense's flags are evidence: asked for, and the probes are a query log."""
    return scoring.flag_threshold > 0 and evidence.closest_query is not None


def _isolation(evidence: Evidence, scoring: Scoring, targeting: bool = True) -> np.ndarray:
    """The isolation, or the wide isolation or (with ``targeting``) the targeting where it is
    further past its own threshold (each on the scale of ``scoring.threshold``)."""
    out: np.ndarray = evidence.isolated
    if evidence.wide is not None and scoring.wide_threshold > 0:
        out = np.maximum(out, evidence.wide * scoring.threshold / scoring.wide_threshold)
    targeted = evidence.targeting if targeting else None
    if targeted is not None and scoring.target_threshold > 0:
        out = np.maximum(out, targeted * scoring.threshold / scoring.target_threshold)
    return out


def reasons(
    i: int,
    evidence: Evidence,
    primary: str,
    scoring: Scoring,
    question: str | None = None,
    source: tuple[str, int, int, float] | None = None,
) -> list[str]:
    """The evidence on chunk position ``i``, in words (``question``: the logged question
    closest to it, when it is targeted; ``source``: its source, how many of the source's other
    chunks are suspicious on their own evidence, how many others it has, and the suspicious
    share of the rest of the knowledge base)."""
    flags, retrieved = int(evidence.flagged[primary][i]), int(evidence.retrieved[i])
    isolated, group = float(evidence.isolated[i]), evidence.group(i)
    closeness = _closeness(isolated, scoring.threshold)
    why = [f"isolation {isolated:.2f}: its nearest neighbours are {closeness}"]
    wide = None if evidence.wide is None else float(evidence.wide[i])
    if wide is not None and scoring.wide_threshold > 0 and wide >= scoring.wide_threshold:
        why.append(
            f"wide isolation {wide:.2f} >= {scoring.wide_threshold}: one of a large set far "
            "closer to each other than to the rest of their neighbourhood"
        )
    targeting = evidence.targeting
    if (
        targeting is not None
        and evidence.closest_query is not None
        and evidence.nearest is not None
        and scoring.target_threshold > 0
        and targeting[i] >= scoring.target_threshold
    ):
        asked = f" {question!r}" if question else ""
        why.append(
            f"targeting {targeting[i]:.2f} >= {scoring.target_threshold}: closer to the logged "
            f"question{asked} (cosine {evidence.closest_query[i]:.2f}) than to any other chunk "
            f"({evidence.nearest[i]:.2f}): written for that question, or the one passage that "
            "answers it; check which"
        )
    if source is not None:
        why.append(source_reason(source, scoring.source_threshold))
    if group is not None:
        why.append(
            f"one of {group['size']} near-duplicates (mean similarity {group['similarity']:.2f})"
        )
    if flags and _flags_count(evidence, scoring):
        sets = int(evidence.removed_with_set(primary)[i])
        why.append(
            f"{primary} removed it on {flags} of the {retrieved} logged questions that retrieved "
            f"it, {sets} with a set (counted from {scoring.flag_threshold:.0%}, where its own "
            f"score is at least {scoring.flag_gate})"
        )
    elif flags:
        why.append(f"{primary} removed it on {flags} of the {retrieved} probes that retrieved it")
    elif retrieved:
        why.append(f"kept by {primary} on all {retrieved} probes that retrieved it")
    else:
        why.append("no probe retrieved it")
    return why


def _closeness(isolated: float, threshold: float) -> str:
    if isolated >= threshold:
        return "a small set far closer to it than the rest of its neighbourhood"
    if isolated >= threshold / 2:
        return "somewhat closer to it than the rest of its neighbourhood"
    return "no closer than the rest of its neighbourhood"
