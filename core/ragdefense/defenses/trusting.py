"""Consensus's step 3: untrusted passages that contradict what the user trusts."""

from __future__ import annotations

from .pool import Pool

__all__ = ["contradicting"]


def contradicting(pool: Pool, tightness: float, anchor: float | None) -> None:
    """Evidence 3: untrusted passages answering the query apart from every trusted one on
    the query's topic (trusted passages about something else are no reference for that),
    and near-copies of any trusted passage ranked above it (a trusted text edited toward
    the query; a faithful copy says nothing the trusted one does not)."""
    sim, qs, trusted, removed, estimates = pool.unpacked()
    every = [i for i, t in enumerate(trusted) if t]
    if not every:
        return
    topical = set(pool.topical) if anchor is not None else set()
    anchors = [i for i in every if i in topical]
    found = []
    for i in range(len(qs)):
        if trusted[i] or i in removed:
            continue
        copied = [j for j in every if sim[i, j] >= tightness and qs[i] > qs[j]]
        nearest = float(sim[i, anchors].max()) if anchors else 0.0
        if copied:
            j = max(copied, key=lambda t: float(sim[i, t]))
            removed[i] = (
                f"an edited copy of a trusted passage: cosine {sim[i, j]:.3f} >= "
                f"{tightness} to it, ranked above it (query similarity {qs[i]:.3f} > "
                f"{qs[j]:.3f})"
            )
        elif anchors and anchor is not None and qs[i] - nearest >= anchor:
            removed[i] = (
                f"contradicts the trusted passages: query similarity {qs[i]:.3f} exceeds "
                f"its best cosine to a trusted passage ({nearest:.3f}) by "
                f"{qs[i] - nearest:.3f} >= {anchor}"
            )
        else:
            continue
        found.append(i)
    if found:
        estimates["contradicting"] = found
