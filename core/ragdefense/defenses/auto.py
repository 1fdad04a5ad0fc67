"""AutoDefense: decide per query which regime the retrieved set is in, then filter with the
defense that holds there (beyond the papers; no LLM call).

RAGDefender assumes the poison is numerous and removes benign passages when it is not; GRADA
assumes it is a minority and promotes it when it is not. AutoDefense reads the regime off the
retrieved set, in this order:

1. **Coordinated groups above the rest**
   (:func:`~ragdefense.defenses.grada.coordinated_groups`): passages nearly identical to each
   other that the retriever also ranks above the others. They are removed; so are the
   passages RAGDefender flags that sit close to them (mean cosine >= ``absorb``), provided no
   passage left over ranks above the groups' mean query similarity (RAGDefender then agrees
   with the groups rather than with a topic cluster). GRADA reranks what is left.
2. **Poisoned majority**: no such group, but RAGDefender's flagged set is itself tight (every
   pair's cosine >= ``majority_tightness``): a coordinated majority the retriever does not rank
   above the rest. RAGDefender's verdicts are kept.
3. **Minority or clean**: otherwise GRADA (HRSIM), which holds against a single poisoned passage
   and costs little on clean retrieval.

The decision and its evidence are in ``estimates["regime"]`` and ``estimates["evidence"]``;
each passage's verdict comes from the defense that decided it. The benchmark pages compare it
with each filter alone (``python -m benchmarks auto``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..embedders import passage_and_query_embeddings
from ..similarity import cosine_matrix, cosine_to, pairs_among
from ..types import DefenseResult, Described, Passage, PassageLike, check_query, to_passages
from .grada import GRADA, CoordinatedGroup, coordinated_groups
from .params import check_embedder, cosines, differences, flags, reals
from .pool import copy_numbers
from .ragdefender import RAGDefender

__all__ = ["AutoDefense"]


class AutoDefense(Described):
    """Regime-deciding filter: GRADA against a minority of poison, RAGDefender against a
    coordinated majority, coordinated groups above the rest peeled first.

    Args:
        embedder: Anything :func:`ragdefense.as_embedder` accepts (``None``: the packaged
            all-MiniLM-L6-v2); passages that carry an embedding are not re-embedded.
        n: Passages GRADA keeps (``None``: half the distinct texts retrieved, as GRADA).
        peel_tightness: The coordinated groups' ``tightness``
            (:func:`~ragdefense.defenses.grada.coordinated_groups`).
        peel_margin: The coordinated groups' ``margin``
            (:func:`~ragdefense.defenses.grada.coordinated_groups`).
        absorb: Mean cosine to the groups above which a passage RAGDefender flags is removed
            with them (``None``: never).
        majority_tightness: Least pairwise cosine within RAGDefender's flagged set for it to be
            trusted when no group stands above the rest (``None``: never; GRADA decides).
        peel: Look for coordinated groups at all (``False``: steps 2-3 only). The switches
            exist for the ablation in ``python -m benchmarks auto``.

    Examples:
        >>> result = AutoDefense().defend("who wrote Hamlet?", passages)  # doctest: +SKIP
        >>> result.estimates["regime"], result.kept                       # doctest: +SKIP
    """

    name = "AutoDefense"
    #: retrieval pool per passage returned, for the adapters that widen retrieval (GRADA's M = 2n)
    pool_factor = 2
    min_pool = 8  # as RAGDefender's, which it consults
    min_passages = 1  # GRADA ranks any pool
    uses_embeddings = True

    def __init__(
        self,
        embedder: Any = None,
        *,
        n: int | None = None,
        peel_tightness: float = 0.9,
        peel_margin: float = 0.02,
        absorb: float | None = 0.8,
        majority_tightness: float | None = 0.85,
        peel: bool = True,
    ) -> None:
        optional = ("absorb", "majority_tightness")
        reals(optional, peel_tightness=peel_tightness, peel_margin=peel_margin, absorb=absorb)
        reals(optional, majority_tightness=majority_tightness)
        flags(peel=peel)
        differences(peel_margin=peel_margin)
        cosines(peel_tightness=peel_tightness, absorb=absorb, majority_tightness=majority_tightness)
        self.embedder = embedder = check_embedder(embedder)
        self.peel_tightness = peel_tightness
        self.peel_margin = peel_margin
        self.absorb = absorb
        self.majority_tightness = majority_tightness
        self.peel = peel
        self.ragdefender = RAGDefender(embedder=embedder)
        self.grada = GRADA(n=n, embedder=embedder)

    @property
    def n(self) -> int | None:
        """Passages GRADA keeps (``None``: half the distinct texts retrieved)."""
        return self.grada.n

    def defend(self, query: str, passages: Sequence[PassageLike]) -> DefenseResult:
        """Filter ``passages`` retrieved for ``query``.

        Returns:
            A :class:`DefenseResult` whose ``estimates`` name the regime found and why, with
            the deciding defense's per-passage verdicts.
        """
        return self.defend_embeddings(query, passages)  # embeds what it needs, once

    def defend_embeddings(
        self,
        query: str,
        passages: Sequence[PassageLike],
        embeddings: Any = None,
        query_embedding: Any = None,
    ) -> DefenseResult:
        """Like :meth:`defend`, with the passages' (and optionally the query's) embeddings."""
        query = check_query(query)
        items = to_passages(passages)
        m = len(items)
        if m < 3:
            result = self.grada.defend_embeddings(query, items, embeddings, query_embedding)
            why = f"only {m} passage(s): no regime to read; GRADA's ranking"
            return _relabel(result, "too few passages", why, {})
        emb, q_emb = passage_and_query_embeddings(
            query, items, self.embedder, embeddings, query_embedding
        )
        sim = cosine_matrix(emb)
        query_sim = cosine_to(emb, q_emb)
        flagged_by_rd = self.ragdefender.defend_embeddings(query, items, emb, q_emb)
        flagged = set(flagged_by_rd.removed_indices)
        texts = copy_numbers(items, emb)  # copies of one text count once
        groups = (
            coordinated_groups(sim, query_sim, self.peel_tightness, self.peel_margin, texts)
            if self.peel
            else []
        )
        evidence: dict[str, Any] = {"ragdefender_flagged": sorted(flagged)}
        if groups:
            return self._groups(query, items, emb, q_emb, sim, query_sim, groups, flagged, evidence)
        once = sorted({texts[i] for i in flagged})  # a page stored twice is no group; one text
        repeated = len(once) == 1 and len(flagged) >= 3  # three times or more is, as in step 1
        tightness = 1.0 if repeated else _least_pairwise(sim, once)
        evidence["flagged_least_cosine"] = tightness
        if (
            tightness is not None
            and self.majority_tightness is not None
            and tightness >= self.majority_tightness
        ):
            why = (
                f"RAGDefender's {len(flagged)} flagged passages are a tight group (every pair's "
                f"cosine >= {tightness:.3f} >= {self.majority_tightness}): a coordinated "
                "majority; its verdicts are kept"
            )
            return _relabel(flagged_by_rd, "poisoned majority", why, evidence)
        return self._minority(query, items, emb, q_emb, tightness, len(flagged), evidence)

    def _groups(
        self,
        query: str,
        items: list[Passage],
        emb: np.ndarray,
        q_emb: np.ndarray,
        sim: np.ndarray,
        query_sim: np.ndarray,
        groups: list[CoordinatedGroup],
        flagged: set[int],
        evidence: dict[str, Any],
    ) -> DefenseResult:
        """Step 1: the coordinated groups go, with RAGDefender's flags close to them unless a
        passage left over ranks above the groups; GRADA reranks the rest."""
        exclude: dict[int, str] = {}
        for g, group in enumerate(groups, start=1):
            for i in group.indices:
                exclude[i] = (
                    f"coordinated group {g} of {len(group.indices)} passages (mean cosine "
                    f"{group.cohesion:.3f} within it; query similarity "
                    f"{group.query_margin:+.3f} above the rest)"
                )
        grouped = sorted(exclude)
        absorbed = {
            i: float(sim[i, grouped].mean())
            for i in sorted(flagged - set(grouped))
            if self.absorb is not None and sim[i, grouped].mean() >= self.absorb
        }
        left = [i for i in range(len(items)) if i not in exclude and i not in absorbed]
        top_left = max((float(query_sim[i]) for i in left), default=-np.inf)
        group_level = float(query_sim[grouped].mean())
        if absorbed and top_left < group_level:
            for i, cos in absorbed.items():
                exclude[i] = (
                    f"flagged by RAGDefender and close to the coordinated group(s) (mean "
                    f"cosine {cos:.3f} >= {self.absorb})"
                )
        elif absorbed:
            evidence["not_absorbed"] = sorted(absorbed)
            evidence["why_not"] = (
                f"a passage left over ranks above the groups (query similarity "
                f"{top_left:.3f} >= {group_level:.3f}): RAGDefender's extra flags are "
                "taken for a topic cluster, not the groups' missed members"
            )
        evidence["groups"] = [list(g.indices) for g in groups]
        result = self.grada.defend_embeddings(query, items, emb, q_emb, exclude=exclude)
        why = (
            f"{len(groups)} coordinated group(s) of {len(grouped)} passage(s) ranked above "
            f"the rest; {len(exclude) - len(grouped)} more removed with them; GRADA "
            "reranks the others"
        )
        return _relabel(result, "coordinated groups", why, evidence)

    def _minority(
        self,
        query: str,
        items: list[Passage],
        emb: np.ndarray,
        q_emb: np.ndarray,
        tightness: float | None,
        n_flagged: int,
        evidence: dict[str, Any],
    ) -> DefenseResult:
        """Step 3: no group and no tight flagged set: a minority at most; GRADA reranks."""
        result = self.grada.defend_embeddings(query, items, emb, q_emb)
        if tightness is None:
            flags = f"RAGDefender flags {n_flagged} passage(s)"
        elif self.majority_tightness is None:
            flags = "the poisoned-majority switch is off"
        else:
            flags = (
                f"RAGDefender's flagged set is not tight (least cosine {tightness:.3f} < "
                f"{self.majority_tightness})"
            )
        why = f"no coordinated group above the rest; {flags}: a minority at most, GRADA reranks"
        return _relabel(result, "minority", why, evidence)


def _least_pairwise(sim: np.ndarray, idx: list[int]) -> float | None:
    """The least cosine between two of ``idx`` (``None`` for fewer than two)."""
    if len(idx) < 2:
        return None
    return float(pairs_among(sim, idx).min())


def _relabel(
    result: DefenseResult, regime: str, why: str, evidence: dict[str, Any]
) -> DefenseResult:
    estimates = {
        "regime": regime,
        "why": why,
        "decided_by": result.defense,
        "evidence": evidence,
        **result.estimates,
    }
    return DefenseResult(
        defense=AutoDefense.name,
        query=result.query,
        verdicts=result.verdicts,
        score_name=f"{result.defense}: {result.score_name}",
        estimates=estimates,
        reranked=result.reranked,
    )
