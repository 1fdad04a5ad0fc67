"""Evidence from provenance: one source repeating one claim apart from every other source
(Consensus's step 2), with a text counted once per page of each site that holds it."""

from __future__ import annotations

import numpy as np

from .pool import Pool

__all__ = ["agreement_among", "agreement_between", "holders", "one_voices", "weights_for"]


def holders(
    keep: list[int],
    copy_of: dict[int, list[int]],
    sources: list[str | None],
    documents: list[str | None],
) -> list[dict[str, frozenset[str | None]]]:
    """Per distinct passage: each source holding its text (the passage's and its copies'), with
    the documents of that source that hold it (:func:`~ragdefense.provenance.document_of`). The
    same document ingested twice is one; the same text on several pages of one site is that
    site repeating itself. Sources that are files or ids are their own single document."""
    out = []
    for first in keep:
        docs: dict[str, set[str | None]] = {}
        for i in (first, *copy_of.get(first, [])):
            source = sources[i]
            if source is not None:
                docs.setdefault(source, set()).add(documents[i])
        out.append({source: frozenset(found) for source, found in docs.items()})
    return out


def weights_for(held: list[dict[str, frozenset[str | None]]], source: str) -> np.ndarray:
    """Per passage, how often it counts when ``source`` is judged: its pages of ``source``; any
    other passage once (the other sources' copies count once, as in every other step)."""
    return np.array([len(h[source]) if source in h else 1 for h in held], dtype=float)


def agreement_among(sim: np.ndarray, own: list[int], w: np.ndarray) -> float:
    """Mean cosine over the pairs of documents among the ``own`` passages, passage ``i``
    standing in ``w[i]`` documents (its copies agree with each other fully). With every weight
    1: the mean over pairs of passages."""
    a = w[own]
    n = float(a.sum())
    total = float(a @ sim[np.ix_(own, own)] @ a) - float((a * a * np.diag(sim)[own]).sum())
    return (total + float((a * (a - 1)).sum())) / max(n * (n - 1), 1.0)


def agreement_between(sim: np.ndarray, own: list[int], rest: list[int], w: np.ndarray) -> float:
    """Mean cosine between the documents of ``own`` and those of ``rest`` (weights ``w``)."""
    a, b = w[own], w[rest]
    return float(a @ sim[np.ix_(own, rest)] @ b) / max(float(a.sum() * b.sum()), 1.0)


def one_voices(pool: Pool, voice: float, tightness: float) -> None:
    """Mark the passages of each source on the query's topic that agree with each other more
    than with the other sources by ``voice`` or more (a pair of texts only when their cosine is
    ``tightness`` or more), where two other independent sources still speak. Trusted passages
    are neither judged nor removed; a source's other passages are, unless they agree with one
    of its trusted passages as much as with each other."""
    sim, _, trusted, removed, estimates = pool.unpacked()
    held = pool.held
    # on the query's topic only: one upload planting claims for many questions is judged
    # on the claim it makes here. A source most of whose passages an earlier step removed
    # is judged on all of them (the lone survivor of a planted group still repeats it);
    # any other on what still stands (two chunks of a long document taken for a group do
    # not make the whole document one voice). Support is what still stands
    alive = [i for i in pool.topical if i not in removed]
    by_source: dict[str, list[int]] = {}
    for i in pool.topical:
        for s in held[i]:  # a text copied onto several sites is each one's
            by_source.setdefault(s, []).append(i)
    if len(by_source) < 2:
        return  # one source (or none): support cannot be counted per source
    found: list[str] = []
    marked: list[tuple[int, str, bool]] = []  # (passage, why, speaks with the voice)
    for s, every in by_source.items():
        if len(every) == 1 and len(held[every[0]][s]) < 3:
            continue  # one text on fewer than three pages: no voice (below), at no cost per source
        own = [i for i in every if not trusted[i]]  # trust is per passage: a page, not a host
        rest = [i for i in alive if s not in held[i]]
        n_rest = len({t for i in rest for t in held[i]})
        weights = weights_for(held, s)
        standing = [i for i in own if i not in removed]
        if 2 * weights[standing].sum() >= weights[own].sum():  # half or more still stand
            own = standing
        # a text on several pages of the source counts once per page (holders); one
        # text is a voice only on three pages or more (a page and a copy of it elsewhere on
        # the site are as often one article twice), two texts only when nearly one text
        pages, texts = int(weights[own].sum()), len(own)
        if (texts == 1 and pages < 3) or pages < 2 or n_rest < 2 or not standing:
            continue
        pair = float(sim[own[0], own[1]]) if texts == 2 else None
        if pair is not None and pair < tightness:
            continue
        inner = agreement_among(sim, own, weights)
        across = agreement_between(sim, own, rest, weights)
        # a trusted page of its own that its other pages agree with as much: no lone voice
        vouched = [float(sim[own, t].mean()) for t in every if trusted[t]]
        if inner - max([across, *vouched]) < voice:
            continue
        found.append(s)
        copies = f" ({texts} distinct)" if pages > texts else ""
        tight = "" if pair is None else f"; the two texts {pair:.3f} >= {tightness}"
        why = (
            f"one voice: {pages} passages{copies} of source {s!r} agree with each other "
            f"(mean cosine {inner:.3f}{tight}) more than with {n_rest} other sources "
            f"({across:.3f}) by {inner - across:.3f} >= {voice}"
        )
        for i in standing:  # the rest keep the reason they were removed for
            others = [j for j in own if j != i]
            # a text another source holds too, unlike the source's other texts (they agree
            # with it no more than the other sources do), is that source's as well: a planted
            # page copying an honest one. One that speaks with the voice is part of it,
            # wherever else it is posted (one text repeated is the voice itself)
            alike = (
                not others
                or not rest
                or float(sim[i, others].mean()) - float(sim[i, rest].mean()) >= voice
            )
            marked.append((i, why, alike))
    for i, why, alike in marked:
        if alike or not set(held[i]) - set(found):
            removed[i] = why
    if found:
        estimates["voices"] = found
