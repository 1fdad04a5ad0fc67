"""Consensus: the default defense. It removes a passage only on evidence that it was planted
for the query, counts support per source where documents say where they come from, and lets
trusted sources win (beyond the papers; no LLM call). The threat model it assumes: in the pool
the one line fetches, honest passages outnumber one attacker's. Under that assumption clean
retrieval must come through, so each removal needs one of four pieces of evidence:

1. **Coordinated groups above the rest** (:func:`~ragdefense.defenses.grada.coordinated_groups`):
   passages nearly identical to each other that the retriever also ranks above the others.
   Benign near-duplicates (syndicated news) form tight groups too, but are not lifted above
   their neighbours; passages written for the query are. Passages that restate a removed group's
   claim (cosine ``absorb`` or more to one of its members) and rank with it go too. And, by
   the words (:mod:`~ragdefense.defenses.quotes`): the passages quoting the user's question
   word for word where three or more documents do, as PoisonedRAG's passages open with the
   question they target (where the user words it otherwise, nothing is quoted).
2. **One voice repeating itself** (only with provenance): the passages of one source that
   agree with each other more than with every other source, in a pool where at least two other
   independent sources speak (passages on the query's topic only, see step 4); a source judged
   on two passages only when they are nearly one text (``tightness``): two pages of one outlet
   on one story stand apart from the rest as often as a planted pair. Chunks of one long
   document must also repeat one claim apart from the rest. A source more than half of whose
   passages step 1 already removed is judged on all of them (its escaped planted passage goes).
   Copies of one text count once everywhere else; here they count once per document of the
   source that holds them (:func:`~ragdefense.provenance.document_of`): one page or file
   ingested twice repeats nothing, one site posting one text on three pages or more repeats
   itself. Beside the embeddings, the words (:mod:`~ragdefense.defenses.claims`): a term
   that a source states on nearly every one of its pages, and no other source mentions,
   where three or more silent sources outnumber those stating it (a planted answer must be
   stated, whatever the wording around it). Documents count, not chunks: a long file repeats
   its own subject.
3. **Contradicting what you trust** (only with ``trusted=``): an untrusted passage closer to
   the query than to every trusted passage by ``anchor`` or more answers the question its own
   way; one that agrees with or adds to the trusted passages stays. An untrusted near-copy of
   a trusted passage (cosine ``tightness`` or more) that the retriever ranks above it goes:
   a trusted text edited toward the query (a faithful copy adds nothing the original lacks).
4. **Unsupported** (GRADA's signal, used as a veto): a passage the retriever ranks in the top half
   of what is left while the other passages' support (HRSIM PageRank over BM25) ranks it in the
   bottom half. A lone passage written for the query mimics the query and nothing else. Lower-ranked
   passages are never dropped by this step, so it cannot empty a poisoned majority of its benign
   passages and refill the context from below. It needs a pool (``min_pool`` distinct passages
   or more, what the adapters fetch, of which ``min_support`` or more on the query's topic,
   ``min_vote`` or more left by the earlier steps: over fewer "the bottom half" says little), and
   only passages at least half as similar to the query as the best one take part (the rest of a
   small store's pool is about other topics, which HRSIM would otherwise reward for being unlike the
   query), and they must agree on something (mean cosine ``min_agreement`` or more: facts that
   merely share a subject support nothing in particular). A passage is judged only where it shares
   the others' subject (mean cosine ``min_agreement`` or more to them): a store's one chunk on the
   question, among chunks about a neighbouring story, is unsupported because nothing else speaks of
   its subject, not because it mimics the query; a lone planted passage kept apart from the others'
   subject passes this step for the same reason (and where the store holds no honest passage on the
   question, the vote has nothing to go by). ``support=False`` turns it off.

Copies of one text count once (in step 2, once per document), and one stands for the others
in the context (:func:`~.pool.one_of_each`; ``keep_copies=True`` keeps them all): a copy tells
the generator nothing new, and planted copies would fill its slots. Trusted passages are never
removed (but as copies of one trusted text), and a group that holds one is never evidence.
What it does not do: tell a poisoned *majority* from a benign one without provenance, unless its
passages quote the question. That is the ``"strict"`` mode's job (RAGDefender), chosen by name.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..embedders import passage_and_query_embeddings
from ..provenance import AUTO, Trust, document_of, no_source_read, sources_of
from ..similarity import cosine_matrix, cosine_to, pairs_among
from ..types import DefenseResult, Described, PassageLike, check_query, to_passages
from .claims import repeated_claims
from .grada import GRADA, coordinated_groups
from .params import check_embedder, check_given, cosines, differences, flags, integers, reals
from .pool import Pool, apart_from, consensus_result, distinct, map_back, one_of_each, text_numbers
from .quotes import quoting
from .trusting import contradicting, trust_flags, trust_test
from .voices import holders, one_voices

__all__ = ["Consensus"]


class Consensus(Described):
    """Remove planted passages on evidence (coordinated, one voice, contradicting what you
    trust, unsupported); count support per source.

    Args:
        embedder: Anything :func:`ragdefense.as_embedder` accepts (``None``: the packaged
            all-MiniLM-L6-v2); passages that carry an embedding are not re-embedded.
        tightness: Least average cosine within a coordinated group, between the two passages
            of a source that make one voice, and from an untrusted passage to the trusted one
            it copies.
        min_group: Fewest passages a coordinated group holds (a pair is as often one
            document's two chunks that answer the question as a planted pair).
        margin: Least query similarity by which a coordinated group must exceed the rest.
        absorb: Cosine to a removed group's member above which a passage ranking with the
            group is removed with it (``None``: never).
        voice: Least excess of a source's own agreement over its agreement with the other
            sources for its passages to count as one voice repeating itself (``None``: never).
        claims: Judge sources by the terms they repeat alone too (step 2, with provenance).
        quotes: Remove the passages quoting the question word for word where three or more
            documents do (step 1).
        keep_copies: Keep every copy of a kept text (the same text up to spacing, case and
            accents); by default one stands for the others, and the context holds it once.
        source_key: Metadata key naming a passage's source (``"auto"``: the first of
            :data:`ragdefense.provenance.SOURCE_KEYS` present; ``None``: provenance off). A
            pool in which no passage holds it is noted, and warned of once (a misspelling
            would turn provenance off).
        trusted: Sources never removed (but as copies of one trusted text), or a predicate on
            a passage's metadata (one it fails on is untrusted, and named in the estimates).
        anchor: Least excess of an untrusted passage's query similarity over its best cosine
            to a trusted passage for it to count as contradicting them (``None``: never; the
            edited-copy rule of step 3 does not use it).
        support: Drop the top-ranked passages the others do not support (step 4).
        min_passages: Below this many distinct passages nothing is removed but by trust (step 3:
            a trusted passage to compare with) and copies of one text (one stands for them);
            for a blank query with no query embedding given, nothing but copies (it ranks
            nothing). A note says so.

    Examples:
        >>> result = Consensus().defend("who wrote Hamlet?", passages)  # doctest: +SKIP
        >>> print(result)                                                # doctest: +SKIP
    """

    name = "Consensus"
    #: retrieval pool per passage returned: twice what the context needs, so that what is
    #: removed is replaced by the next benign passage
    pool_factor = 2
    #: attacks plant ~5 passages per target: a smaller pool may hold no benign passage
    min_pool = 8
    #: fewest distinct passages on the query's topic the support vote (step 4) needs: over
    #: fewer, "the bottom half" is one or two passages, and the best answer, which resembles
    #: the query most, lands there about as often as a planted one
    min_support = 6
    #: fewest of them the earlier steps must leave for the vote (two in each half): over three,
    #: the honest ones left once an attacker's set went, the least supported is often an answer
    min_vote = 4
    #: least mean cosine among the passages voting in step 4 (scattered facts rank nothing),
    #: and from a passage to the others for it to be judged there (a lone subject is no claim)
    min_agreement = 0.35
    uses_embeddings = True

    def __init__(
        self,
        embedder: Any = None,
        *,
        tightness: float = 0.9,
        margin: float = 0.02,
        min_group: int = 2,
        absorb: float | None = 0.85,
        voice: float | None = 0.15,
        claims: bool = True,
        quotes: bool = True,
        keep_copies: bool = False,
        source_key: str | None = AUTO,
        trusted: Trust = None,
        anchor: float | None = 0.05,
        support: bool = True,
        min_passages: int = 3,
    ) -> None:
        reals(("absorb", "voice", "anchor"), tightness=tightness, margin=margin, absorb=absorb)
        reals(("absorb", "voice", "anchor"), voice=voice, anchor=anchor)
        integers(min_group=min_group, min_passages=min_passages)
        flags(support=support, claims=claims, quotes=quotes, keep_copies=keep_copies)
        embedder = check_embedder(embedder)
        cosines(tightness=tightness, absorb=absorb)
        differences(margin=margin, voice=voice, anchor=anchor)
        if min_passages < 2 or min_group < 2:
            raise ValueError("min_passages and min_group must be >= 2")
        self.embedder = embedder
        self.tightness = tightness
        self.margin = margin
        self.min_group = int(min_group)
        self.absorb = absorb
        self.voice = voice
        self.claims = claims
        self.quotes = quotes
        self.keep_copies = keep_copies
        self.source_key = source_key
        self.trusted = trusted
        trust_test(trusted, source_key)  # checked now; built again per call from the fields
        self.anchor = anchor
        self.support = support
        self.min_passages = int(min_passages)
        self._grada = GRADA()
        self._unread_said = False  # whether a pool's unread provenance was warned of

    def defend(self, query: str, passages: Sequence[PassageLike]) -> DefenseResult:
        """Filter ``passages`` retrieved for ``query``.

        Returns:
            A :class:`DefenseResult`: the kept passages in input order (a copy standing for
            others in the first one's place), each passage's query similarity, its source,
            and the evidence for every removal.
        """
        return self.defend_embeddings(query, passages)

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
        sources = sources_of(items, self.source_key)  # trust: the fields as they are now
        trusted, said = trust_flags(self.trusted, self.source_key, items, sources)
        unread = no_source_read([p.metadata for p in items], sources, self.source_key, self.trusted)
        if unread:  # a misspelled key must not turn provenance off silently: said once
            if not self._unread_said:
                warnings.warn(unread, UserWarning, stacklevel=2)
            said["provenance"], self._unread_said = unread, True
        # every step ranks by the query: a blank one (with no embedding given) ranks nothing
        blank = not query.strip() and query_embedding is None
        # copies of one passage (a document ingested twice) are one passage here: they are no
        # coordinated group, and their verdict is their original's; a kept text stays once
        keep, copy_of = distinct(items, embeddings)
        if copy_of:
            said["copies"] = copy_of
        few = len(keep) < self.min_passages  # copies count once
        if (few and not (any(trusted) and len(keep) > 1)) or blank:
            check_given(embeddings, query_embedding, items)  # unused, still checked
            why = f"only {len(keep)} distinct passage(s): nothing to compare ({self.min_passages}+)"
            if len(keep) == 1 and m >= self.min_passages:
                why = "only copies of one passage: nothing to compare"
            if blank:
                why = "the query is blank: nothing to rank the passages by, none judged"
            note = {"note": why, **said}
            left = self._copies(copy_of, trusted, sources, {}, note)  # nothing was judged
            return consensus_result(
                self.name, query, items, np.full(m, np.nan), sources, trusted, {}, note, left
            )
        emb, q_emb = passage_and_query_embeddings(
            query, items, self.embedder, embeddings, query_embedding
        )
        full_sim, full_qs = cosine_matrix(emb), cosine_to(emb, q_emb)
        # distinct texts given one direction (a broken or stub model): the vectors tell nothing
        flat = full_sim[np.ix_(keep, keep)].min() > 1 - 1e-6
        if not np.abs(emb).any() or not np.abs(q_emb).any() or flat:
            why = "every embedding (or the query's) is the zero vector, or all point one way"
            note = {"note": why + ": no direction to compare", **said}
            left = self._copies(copy_of, trusted, sources, {}, note)  # nothing was judged
            return consensus_result(
                self.name, query, items, np.zeros(m), sources, trusted, {}, note, left
            )
        if zero := [i for i in range(m) if not np.abs(emb[i]).any()]:
            said["zero_vectors"] = zero  # no direction: set aside as off the topic, not judged
        pool = Pool(
            [items[i] for i in keep],
            full_sim[np.ix_(keep, keep)],
            full_qs[keep],
            [sources[i] for i in keep],
            [any(trusted[j] for j in [i, *copy_of.get(i, [])]) for i in keep],
            holders(keep, copy_of, sources, [document_of(p, self.source_key) for p in items]),
        )
        if not few:  # below min_passages, a trusted passage is compared with (step 3) alone
            self._groups(pool)
            if self.quotes:
                quoting(pool, query)
            self._voices(pool, query)
        contradicting(pool, self.tightness, self.anchor)
        estimates = pool.estimates
        if few:
            estimates["note"] = f"only {len(keep)} distinct texts: compared with the trusted alone"
        floor, name = max((self.min_pool, "min_pool"), (self.min_passages, "min_passages"))
        if self.support and len(keep) < floor:  # copies once
            estimates["support"] = f"skipped: {len(keep)} distinct texts, under {name}={floor}"
        elif self.support and len(pool.topical) < self.min_support:
            why = f"{len(pool.topical)} distinct passages on the query's topic"
            estimates["support"] = f"skipped: {why}, fewer than min_support={self.min_support}"
        elif self.support:
            self._support(query, pool)
        removed = map_back(pool.removed, keep, copy_of, estimates)
        left = self._copies(copy_of, trusted, sources, removed, estimates)
        if "unsupported_apart" in estimates:  # a spared text's copies left out are not spared
            estimates["unsupported_apart"] = [
                i for i in estimates["unsupported_apart"] if i not in left
            ]
        estimates["sources"] = len({s for s in sources if s is not None}) or None
        estimates.update(said)
        return consensus_result(
            self.name, query, items, full_qs, sources, trusted, removed, estimates, left
        )

    def _copies(
        self,
        copy_of: dict[int, list[int]],
        trusted: list[bool],
        sources: list[str | None],
        removed: dict[int, str],
        estimates: dict[str, Any],
    ) -> dict[int, int]:
        """The copies left out, each mapped to the copy standing for its text
        (:func:`~.pool.one_of_each`): none with ``keep_copies``."""
        if self.keep_copies:
            return {}
        judged = frozenset([*estimates.get("voices", ()), *estimates.get("claims", {})])
        return one_of_each(copy_of, trusted, sources, removed, judged)

    def _groups(self, pool: Pool) -> None:
        """Evidence 1: coordinated groups above the rest, and the passages restating them. The
        most lifted group that counts as evidence (no trusted member, ``min_group`` or more)
        always goes; others while at most half of the pool (rounded up) goes: honest passages
        outnumber the attacker's, so peeling past half is about something else (a tight topic)."""
        sim, qs, trusted, removed, estimates = pool.unpacked()
        # copies shown apart (Passage.shown) are one text, and two copies are no group
        groups = coordinated_groups(sim, qs, self.tightness, self.margin, text_numbers(pool.items))
        cap = half = (len(qs) + 1) // 2
        found: list[list[int]] = []
        for group in groups:
            members = list(group.indices)
            if any(trusted[i] for i in members) or len(members) < self.min_group:
                continue  # a group holding a trusted passage agrees with it
            new = [i for i in members if i not in removed]  # some restated an earlier group
            if found and len(removed) + len(new) > cap:  # the most lifted group always goes
                estimates["groups_not_removed"] = f"more than half of the pool ({half})"
                break
            found.append(members)
            g = len(found)  # its number in estimates["groups"], skipped groups not counted
            cap = max(cap, len(members))
            for i in new:
                removed[i] = (
                    f"coordinated group {g} of {len(members)} passages ranked above the rest "
                    f"(mean cosine {group.cohesion:.3f} within it; query similarity "
                    f"{group.query_margin:+.3f} above the others)"
                )
            if self.absorb is None:
                continue
            floor = float(qs[members].min())
            for i in sorted(range(len(qs)), key=lambda i: (-qs[i], i)):  # by rank, not input
                if i in removed or trusted[i] or qs[i] < floor - self.margin:
                    continue
                best = float(sim[i, members].max())
                if best >= self.absorb and len(removed) < cap:
                    removed[i] = (
                        f"restates coordinated group {g} (cosine {best:.3f} >= {self.absorb} to "
                        "a member) and ranks with it"
                    )
        if found:
            estimates["groups"] = found

    def _support(self, query: str, pool: Pool) -> None:
        """Step 4: a passage the retriever ranks in the top half of what is left that the
        others' support (GRADA's PageRank) ranks in the bottom half is dropped: it resembles the
        query more than anything the other passages say. Lower-ranked passages are never
        dropped here, so a context is never refilled from below at their expense."""
        sim, qs, trusted, removed, estimates = pool.unpacked()
        items = pool.items
        aside = pool.aside  # off the query's topic, or without terms: neither vote nor judged
        left = [i for i in range(len(items)) if i not in removed and i not in aside]
        if len(left) < self.min_vote:
            estimates["support"] = (
                f"skipped: {len(left)} passages on the query's topic left after the earlier "
                f"steps, fewer than min_vote={self.min_vote}"
            )
            return
        agreement = float(pairs_among(sim, left).mean())
        if agreement < self.min_agreement:
            estimates["support"] = (
                f"skipped: the {len(left)} passages on the query's topic agree on nothing "
                f"(mean cosine {agreement:.3f}, below min_agreement={self.min_agreement})"
            )
            return
        ranked = self._grada.defend_embeddings(query, items, exclude={**aside, **removed})
        scores = np.array([ranked.verdicts[i].score for i in left])
        if "note" in ranked.estimates or np.ptp(scores) < 1e-9:  # the order would be the input's
            estimates["support"] = "no support to compare: no passage supports another more"
            return
        half = (len(left) + 1) // 2
        by_query = sorted(left, key=lambda i: (-qs[i], i))[:half]
        score = {v.index: v.score for v in ranked.verdicts}
        by_support = sorted(left, key=lambda i: (-round(score[i], 12), -qs[i], i))  # ties: query
        low = set(by_support[len(left) - len(left) // 2 :])
        dropped, apart = [], []
        for i in by_query:
            if i not in low or trusted[i]:
                continue
            if apart_from(sim, i, left, self.min_agreement):
                apart.append(i)  # nothing else speaks of its subject: no evidence either way
            else:
                dropped.append(i)
                removed[i] = (
                    f"unsupported: ranked {by_query.index(i) + 1} of {len(left)} by query "
                    f"similarity, but {by_support.index(i) + 1} of {len(left)} by the other "
                    f"passages' support (PageRank {score[i]:.4f}, HRSIM)"
                )
        if dropped:
            estimates["unsupported"] = dropped
        if apart:
            estimates["unsupported_apart"] = apart

    def _voices(self, pool: Pool, query: str) -> None:
        """Evidence 2: one source repeating one claim apart from every other source."""
        if self.voice is not None:
            one_voices(pool, self.voice, self.tightness)
        if self.claims:
            repeated_claims(pool, query)
