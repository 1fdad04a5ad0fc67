"""``python -m benchmarks audit-scale``: the synthetic corpus it streams, the neighbour recall it
reports, and the 100M plan it works out from its rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.settings.audit_scale import SyntheticCorpus, neighbour_recall, plan, scale_table
from ragdefense.auditing import audit


def test_synthetic_corpus_is_the_same_every_time_and_plants_tight_sets() -> None:
    corpus = SyntheticCorpus(12_000, spacing=2_000)
    first = list(corpus.batches(1_000))
    again = list(SyntheticCorpus(12_000, spacing=2_000).batches(1_000))
    assert sum(len(b.ids) for b in first) == 12_000
    assert first[3].texts == again[3].texts
    np.testing.assert_array_equal(first[3].vectors, again[3].vectors)
    assert sorted(corpus.planted) == [1, 3, 5, 10, 20]
    vectors = np.concatenate([b.vectors for b in first])
    index = {i: n for n, i in enumerate(x for b in first for x in b.ids)}
    members = [index[i] for i in corpus.planted[5][:5]]  # one set of five
    inside = vectors[members] @ vectors[members].T
    topic = corpus.topic[members[0]]
    benign = [i for i in np.flatnonzero(corpus.topic == topic) if i not in members][:5]
    outside = vectors[members] @ vectors[benign].T
    assert inside[np.triu_indices(5, 1)].min() > 0.85  # close to each other
    assert 0.3 < outside.mean() < 0.7  # on their topic, as far as its other chunks


def test_small_synthetic_audit_finds_sets_and_exact_search_recalls_everything(
    minilm: object, tmp_path: Path
) -> None:
    corpus = SyntheticCorpus(6_000, spacing=1_000)
    report = audit(corpus, workdir=tmp_path / "w", max_probes=50, part_size=500, index="flat")
    flagged = {f.id for f in report.suspicious}
    sets = [i for size in (3, 5) for i in corpus.planted[size]]
    assert sum(i in flagged for i in sets) >= 0.9 * len(sets)
    assert neighbour_recall(tmp_path / "w", n_shards=1, sample=200) == 1.0


def _rows(search_s: float) -> list[dict[str, object]]:
    return [
        {"chunks": 1_000_000, "engine": "local", "total s": 900.0, "peak MB (driver)": 2_000},
        {"chunks": 1_000_000, "engine": "ray x2", "search s": search_s, "peak MB (worker)": 3_000},
    ]


def test_plan_for_100m_follows_the_measured_rate() -> None:
    assert plan(_rows(1_000.0)[:1]) == []  # no Ray run: no plan
    slow, fast = "\n".join(plan(_rows(1_000.0))), "\n".join(plan(_rows(500.0)))
    assert "2,000 chunk-in-shard searches" in fast and "1,000 chunk-in-shard searches" in slow

    def hours(text: str) -> list[float]:
        import re

        return [float(h.replace(",", "")) for h in re.findall(r"about ([\d,.]+) hours", text)]

    assert hours(slow) == pytest.approx([2 * h for h in hours(fast)], rel=0.02)
    everywhere, routed = hours(slow)
    # 1e8 chunks x 64 shards / (1,000 per worker-second x 64 workers), slowed by
    # log(1.5625e6) / log(5e5)
    assert everywhere == pytest.approx(1e8 * 64 / 1_000 / 64 / 3600 * 1.0868, rel=0.01)
    assert routed == pytest.approx(everywhere * 3 / 64, rel=0.05)


def test_plan_names_a_measured_routed_run_and_old_rows_search_every_shard() -> None:
    rows = _rows(1_000.0)
    base = {"chunks": 300_000, "engine": "ray x2", "setup": "ray", "search s": 500.0}
    routed = {**base, "setup": "ray-routed", "search s": 400.0, "shards": 16, "route": 3}
    routed.update({"largest shard": 1.4, "neighbour recall@10": 0.7, "search": "3 of 16 shards"})
    text = "\n".join(plan([*rows, base, routed]))
    assert "16 shards searched 3 per chunk: 400.0 s" in text
    assert "against 500.0 s searching every shard" in text and "recall@10 0.7" in text
    # the routed run never stands for the every-shard rate
    assert "\n".join(plan(rows)).split("Search, routed")[0] == text.split("Search, routed")[0]
    table = scale_table([{**rows[0], "shards": 1}, routed])
    assert "| every shard (1) |" in table and "| 3 of 16 shards |" in table
