"""Routed search (``AuditSettings(route=r)``): shards cut by k-means of the vectors, each chunk
and probe searched in its ``r`` nearest shards only; the same findings as the exhaustive search
where the neighbours share cells, a partition of the chunks, and resumable like the rest."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.settings.audit_scale import SyntheticCorpus, neighbour_recall
from ragdefense import CallableEmbedder
from ragdefense.auditing import AuditSettings, ListCorpus, Scoring, audit
from ragdefense.auditing.routing import centroids, nearest_shards
from ragdefense.auditing.steps import ShardIndex, shard_hits
from ragdefense.auditing.workdir import Workdir, part_name, route_file
from tests.conftest import bag_of_words
from tests.test_audit import toy_corpus


@pytest.fixture
def toy() -> CallableEmbedder:
    return CallableEmbedder(bag_of_words)


def test_nearest_shards_are_ordered_and_the_first_is_the_own_shard() -> None:
    centres = np.eye(4, dtype=np.float32)
    vectors = np.array([[0.1, 0.9, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    np.testing.assert_array_equal(nearest_shards(vectors, centres, 3), [[1, 2, 0], [0, 1, 2]])


def test_routed_shards_partition_the_chunks_and_a_shard_searches_only_its_own(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    texts, ids, _ = toy_corpus()
    audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", part_size=16, shards=4,
          route=2)  # fmt: skip
    wd = Workdir(tmp_path / "w")
    sizes = wd.noted("part_sizes")
    centres = np.asarray(wd.read_array("route/centroids.npy"))
    assert centres.shape == (4, wd.noted("dim"))
    np.testing.assert_allclose(np.linalg.norm(centres, axis=1), 1, atol=1e-5)
    shards = [ShardIndex(wd, range(len(sizes)), sizes, "flat", cell) for cell in range(4)]
    held = np.concatenate([s.ids for s in shards if s.ids is not None])
    assert sorted(held.tolist()) == list(range(len(texts)))  # every chunk in exactly one shard
    every = np.concatenate([wd.read_array(f"{part_name('chunks', p)}.npy") for p in range(2)])
    own = np.concatenate([wd.read_array(route_file("chunks", p))[:, 0] for p in range(len(sizes))])
    for cell, shard in enumerate(shards):
        _, positions = shard.search(every, 3)
        assert set(np.asarray(own)[positions[positions >= 0]]) <= {cell}
    # a chunk was searched in its two shards and no other, a suspect in every shard
    suspects = set(np.asarray(wd.read_array("route/suspects.npy")).tolist())
    assert suspects and len(suspects) < len(texts) // 4
    filled = [s for s in range(4) if shards[s].size]
    start = 0
    for p in range(len(sizes)):
        hits = [shard_hits(wd, f"search/{s}-of-4/chunks-{p:05d}.npz")[1] for s in filled]
        searched = sum((h[:, 0] >= 0).astype(int) for h in hits)
        stored = [wd.read_arrays(f"search/{s}-of-4/chunks-{p:05d}.npz")["rows"] for s in filled]
        assert sum(map(len, stored)) == searched.sum()  # a shard keeps the rows it searched
        suspect = np.isin(np.arange(start, start + sizes[p]), list(suspects))
        assert np.all(searched[suspect] == len(filled))
        assert np.all(searched[~suspect] <= 2) and np.all(searched[~suspect] >= 1)
        start += sizes[p]


def test_a_routed_audit_finds_what_the_exhaustive_one_finds(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    texts, ids, planted = toy_corpus()
    whole = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "a", part_size=16)
    routed = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "r", part_size=16,
                   shards=6, route=2)  # fmt: skip
    assert routed.stats["shards"] == 6 and routed.stats["route"] == 2
    assert whole.stats["route"] is None
    assert {f.id for f in routed.top(len(planted))} == planted
    assert {f.id for f in routed.suspicious} >= planted


def test_routing_keeps_the_neighbours_of_clustered_vectors(minilm: object, tmp_path: Path) -> None:
    """On the audit-scale corpus (topics of about 50 chunks), 8 k-means shards searched 3 at a
    time keep nearly every exact neighbour and every planted set of 3-5 the exhaustive audit
    flags."""
    corpus = SyntheticCorpus(6_000, spacing=1_000)
    settings = AuditSettings(max_probes=50, part_size=500, index="flat")
    report = audit(corpus, settings, workdir=tmp_path / "w", shards=8, route=3)
    assert report.stats["route"] == 3
    assert neighbour_recall(tmp_path / "w", n_shards=8, sample=400) >= 0.9
    flagged = {f.id for f in report.suspicious}
    sets = [i for size in (3, 5) for i in corpus.planted[size]]
    assert sum(i in flagged for i in sets) >= 0.9 * len(sets)


def test_route_is_checked_recorded_and_off_when_it_covers_every_shard(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="route"):
        AuditSettings(route=0)
    with pytest.raises(ValueError, match="shards"):
        AuditSettings(shards=0)
    texts, ids, _ = toy_corpus()
    every = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", part_size=16,
                  shards=2, route=2)  # fmt: skip
    assert every.stats["route"] is None and not (tmp_path / "w" / "route").exists()
    with pytest.raises(ValueError, match="route"):  # a resumed audit keeps its search
        audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", part_size=16,
              shards=2, route=1)  # fmt: skip
    again = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", part_size=16,
                  shards=2, route=1, fresh=True)  # fmt: skip
    assert again.stats["route"] == 1 and (tmp_path / "w" / "route" / "centroids.npy").exists()


def test_contiguous_shards_are_at_most_one_per_part(toy: CallableEmbedder, tmp_path: Path) -> None:
    texts, ids, _ = toy_corpus()
    report = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", shards=50)
    assert report.stats["shards"] == 1  # one part of 512


def test_centroids_are_seeded(toy: CallableEmbedder, tmp_path: Path) -> None:
    texts, ids, _ = toy_corpus()
    audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", part_size=16)
    wd = Workdir(tmp_path / "w")
    sizes = wd.noted("part_sizes")
    first, again = centroids(wd, sizes, 5), centroids(wd, sizes, 5)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, centroids(wd, sizes, 5, seed=1))


def test_cli_routes_when_asked(tmp_path: Path) -> None:
    import json

    from ragdefense.cli import main
    from ragdefense.data import demo_documents

    kb = tmp_path / "kb.jsonl"
    kb.write_text(
        "".join(
            json.dumps({"id": str(i), "text": t}) + "\n"
            for i, (t, _) in enumerate(demo_documents())
        )
    )
    args = ["audit", str(kb), "--workdir", str(tmp_path / "w"), "--quiet", "--format", "json"]
    assert main([*args, "--shards", "4", "--route", "2"]) == 0
    manifest = json.loads((tmp_path / "w" / "manifest.json").read_text())
    assert manifest["params"]["shards"] == 4 and manifest["params"]["route"] == 2
    report = json.loads((tmp_path / "w" / "report.json").read_text())
    assert report["stats"]["route"] == 2 and report["stats"]["shards"] == 4


def _merged(folder: Path, positions: list[int], k: int) -> dict[int, list[int]]:
    """The merged neighbour lists (positions) of ``positions`` in an audit's folder."""
    from ragdefense.auditing.steps import merged_hits
    from ragdefense.auditing.workdir import locate, part_starts

    wd = Workdir(folder)
    starts = part_starts(wd.noted("part_sizes"))
    out = {}
    for position in positions:
        part, offset = locate(starts, position)
        _, found = merged_hits(wd, "chunks", part, int(wd.noted("shards")), k)
        out[position] = [int(x) for x in found[offset]]
    return out


def test_suspects_are_rechecked_in_every_shard_and_scored_on_exact_neighbours(
    minilm: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Routing misses neighbours of the scattered synthetic topics, and a chunk whose neighbours
    were missed looks isolated: without the recheck the routed audit flags benign chunks the
    exhaustive one does not; with it, every suspect's neighbours are the exhaustive ones and
    those false flags go."""
    from ragdefense.auditing import pipeline

    corpus = SyntheticCorpus(6_000, spacing=1_000)
    settings = AuditSettings(max_probes=50, part_size=500, index="flat", wide_neighbours=0)
    exact = audit(corpus, settings, workdir=tmp_path / "e")
    routed = audit(corpus, settings, workdir=tmp_path / "r", shards=12, route=2)
    assert "recheck" in routed.stats["stage_seconds"]
    suspects = np.asarray(Workdir(tmp_path / "r").read_array("route/suspects.npy")).tolist()
    assert suspects
    assert _merged(tmp_path / "r", suspects, 11) == _merged(tmp_path / "e", suspects, 11)
    monkeypatch.setattr(pipeline, "recheck_suspects", lambda *a, **k: None)
    unchecked = audit(corpus, settings, workdir=tmp_path / "u", shards=12, route=2)
    planted = {i for ids in corpus.planted.values() for i in ids}

    def benign(report: Any) -> set[str]:
        return {f.id for f in report.suspicious} - planted

    assert len(benign(unchecked)) > len(benign(routed))
    assert benign(routed) <= benign(unchecked) | benign(exact)


def test_a_saved_hnsw_index_is_read_back_for_the_recheck_then_removed(
    toy: CallableEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragdefense.auditing import steps

    pytest.importorskip("faiss")
    texts, ids, planted = toy_corpus()
    built: list[bool] = []
    original = steps.ShardIndex.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(kwargs.get("build", args[5] if len(args) > 5 else True))
        original(self, *args, **kwargs)

    monkeypatch.setattr(steps.ShardIndex, "__init__", spy)
    report = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", part_size=16,
                   shards=4, route=1, index="hnsw")  # fmt: skip
    assert {f.id for f in report.top(len(planted))} == planted
    assert False in built  # a recheck read a saved index instead of building one
    assert not list((tmp_path / "w" / "search").glob("*/index.faiss"))  # removed once used
    again = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", part_size=16,
                  shards=4, route=1, index="hnsw")  # fmt: skip
    assert [f.id for f in again.findings] == [f.id for f in report.findings]  # resumed


def test_more_shards_than_distinct_vectors_leaves_empty_shards_that_search_nothing(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    """Ten copies of two texts in eight shards: most cells stay empty, and the audit still runs
    and scores every chunk; no group mixes the two texts."""
    texts = ["volcano lava eruption magma crater"] * 10 + ["piano concert orchestra violin"] * 10
    ids = [f"c{i}" for i in range(20)]
    report = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", part_size=4,
                   shards=8, route=2, wide_neighbours=0, neighbours=5)  # fmt: skip
    assert report.stats["route"] == 2 and len(report.findings) == 20
    groups: dict[str, set[str]] = {}
    for f in report.findings:
        assert np.isfinite(f.score)
        if f.group:
            groups.setdefault(f.group["id"], set()).add(f.text)
    assert all(len(held) == 1 for held in groups.values())


def _rows_stored(folder: Path) -> list[np.ndarray]:
    return [np.load(f)["rows"] for f in sorted(folder.glob("search/*/chunks-*.npz"))]


def test_a_recheck_resumed_or_rescored_searches_each_row_once(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    """A recheck killed after some shards resumes without storing a row twice; an audit resumed
    with a lower threshold adds its new suspects, searched in a new round."""
    texts, ids, planted = toy_corpus()
    args = {"embedder": toy, "workdir": tmp_path / "w", "part_size": 16, "shards": 4, "route": 1}
    first = audit(ListCorpus(texts, ids), **args)
    assert all(len(np.unique(r)) == len(r) for r in _rows_stored(tmp_path / "w"))
    (tmp_path / "w" / "search" / "1-of-4" / "rechecked-1.json").unlink()  # killed before it
    again = audit(ListCorpus(texts, ids), **args)
    assert [(f.id, f.score) for f in again.findings] == [(f.id, f.score) for f in first.findings]
    assert all(len(np.unique(r)) == len(r) for r in _rows_stored(tmp_path / "w"))
    wd = Workdir(tmp_path / "w")
    before = set(np.asarray(wd.read_array("route/suspects.npy")).tolist())
    lower = audit(ListCorpus(texts, ids), scoring=Scoring(threshold=0.05), **args)
    after = set(np.asarray(wd.read_array("route/suspects.npy")).tolist())
    assert after > before and wd.noted("recheck_round") == 2
    assert (tmp_path / "w" / "search" / "0-of-4" / "rechecked-2.json").is_file()
    assert all(len(np.unique(r)) == len(r) for r in _rows_stored(tmp_path / "w"))
    assert {f.id for f in lower.suspicious} >= planted


def test_no_file_is_replaced_while_it_is_mapped(
    toy: CallableEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows refuses to replace a file the process has memory-mapped: a second recheck round
    wrote its suspects over the list it had just read mapped (simulated here through Linux's
    list of mapped files)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("reads the mapped files from /proc/self/maps (Linux)")
    real = os.replace

    def refused_if_mapped(src: Any, dst: Any) -> None:
        target = os.path.abspath(dst)
        if any(line.endswith(" " + target) for line in maps.read_text().splitlines()):
            raise PermissionError(13, "the file is mapped", target)
        real(src, dst)

    texts, ids, _ = toy_corpus()
    args = {"embedder": toy, "workdir": tmp_path / "w", "part_size": 16, "shards": 4, "route": 1}
    audit(ListCorpus(texts, ids), **args)
    monkeypatch.setattr(os, "replace", refused_if_mapped)
    lower = audit(ListCorpus(texts, ids), scoring=Scoring(threshold=0.05), **args)
    assert Workdir(tmp_path / "w").noted("recheck_round") == 2 and lower.findings


def test_routed_search_without_faiss(toy: CallableEmbedder, tmp_path: Path, no_faiss: None) -> None:
    texts, ids, planted = toy_corpus()
    report = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "n",
                   part_size=16, shards=4, route=2)  # fmt: skip
    assert report.stats["route"] == 2
    assert {f.id for f in report.top(len(planted))} == planted


def test_a_route_that_cannot_route_is_named(
    toy: CallableEmbedder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    texts, ids, _ = toy_corpus()
    with caplog.at_level("WARNING", logger="ragdefense"):
        report = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", route=2)
    assert report.stats["route"] is None  # one worker here: one shard
    assert "every shard is searched" in caplog.text and "shards=" in caplog.text


def test_shards_cut_to_the_parts_are_named(
    toy: CallableEmbedder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``shards=`` past the parts of chunks was cut to them without a word (``route=`` warns)."""
    texts, ids, _ = toy_corpus()
    with caplog.at_level("WARNING", logger="ragdefense"):
        report = audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "w", shards=5)
    assert report.stats["shards"] == 1 and "shards=5 over 1 part(s)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="ragdefense"):
        audit(ListCorpus(texts, ids), embedder=toy, workdir=tmp_path / "p", part_size=16, shards=2)
    assert "shards=" not in caplog.text  # as many parts as asked: nothing cut


def test_a_route_reaching_fewer_chunks_than_the_neighbours_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from ragdefense.auditing.routing import effective_route

    with caplog.at_level("WARNING", logger="ragdefense"):
        assert effective_route(2, 8, 800, needed=41) == 2  # about 200 chunks per search
        assert "neighbours" not in caplog.text
        assert effective_route(1, 96, 96, needed=41) == 1  # one chunk per shard: isolated
    assert "reaches about 1 chunks per search, fewer than the 41 neighbours" in caplog.text


def test_an_audit_resumed_with_other_scoring_rechecks_its_own_suspects(
    toy: CallableEmbedder, tmp_path: Path
) -> None:
    """Only a new threshold made new suspects: resumed with other scoring at the same
    threshold, chunks suspicious under it were scored on routed neighbours alone (a benign
    chunk looked isolated). The resumed report is the fresh one's."""
    texts, ids, _ = toy_corpus()
    args = {"embedder": toy, "part_size": 8, "shards": 4, "route": 1}
    scoring = Scoring(wide_threshold=0.2, min_group=2)
    audit(ListCorpus(texts, ids), workdir=tmp_path / "w", **args)
    resumed = audit(ListCorpus(texts, ids), workdir=tmp_path / "w", scoring=scoring, **args)
    fresh = audit(ListCorpus(texts, ids), workdir=tmp_path / "f", scoring=scoring, **args)
    assert [(f.id, round(f.score, 6)) for f in resumed.findings] == [
        (f.id, round(f.score, 6)) for f in fresh.findings
    ]


def test_a_recheck_killed_between_its_two_writes_resumes_to_the_fresh_report(
    toy: CallableEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new suspects' list was written before their round was noted: killed in between,
    the next run took the list as searched and never rechecked them. Killed after the first
    of the two writes, whichever it is, the resumed report is the fresh one's."""

    class Killed(BaseException):
        pass

    texts, ids, _ = toy_corpus()
    args = {"embedder": toy, "part_size": 8, "shards": 4, "route": 1}
    scoring = Scoring(wide_threshold=0.2, min_group=2)
    audit(ListCorpus(texts, ids), workdir=tmp_path / "w", **args)
    fresh = audit(ListCorpus(texts, ids), workdir=tmp_path / "f", scoring=scoring, **args)
    note, write = Workdir.note, Workdir.write_array

    def noted(self: Workdir, key: str, value: Any) -> None:
        note(self, key, value)
        if key == "recheck_round" and value >= 2:
            raise Killed

    def written(self: Workdir, name: str, value: Any) -> None:
        again = name == "route/suspects.npy" and self.has(name)
        write(self, name, value)
        if again:
            raise Killed

    monkeypatch.setattr(Workdir, "note", noted)
    monkeypatch.setattr(Workdir, "write_array", written)
    with pytest.raises(Killed):
        audit(ListCorpus(texts, ids), workdir=tmp_path / "w", scoring=scoring, **args)
    monkeypatch.setattr(Workdir, "note", note)
    monkeypatch.setattr(Workdir, "write_array", write)
    resumed = audit(ListCorpus(texts, ids), workdir=tmp_path / "w", scoring=scoring, **args)
    assert [(f.id, round(f.score, 6)) for f in resumed.findings] == [
        (f.id, round(f.score, 6)) for f in fresh.findings
    ]


def test_a_planted_set_in_a_routed_cell_of_its_own_is_found(tmp_path: Path) -> None:
    """A tight planted set that k-means puts in a cell of its own sees only its own members:
    the neighbours in other cells, unseen, count as far, so the set is a suspect and is
    rechecked (read as no neighbours, its isolation was 0 and it went unseen)."""
    rng = np.random.default_rng(0)
    topics = [c + 0.9 * rng.normal(size=(100, 64)) for c in rng.normal(size=(5, 64))]
    planted = rng.normal(size=64) + 0.15 * rng.normal(size=(6, 64))
    vectors = np.vstack([*topics, planted]).astype(np.float32)
    texts = [f"benign chunk {i} topic {i // 100}" for i in range(500)]
    texts += [f"planted {j}: Marlowe" for j in range(6)]
    ids = [f"b{i}" for i in range(500)] + [f"p{j}" for j in range(6)]

    def embed(batch: list[str]) -> np.ndarray:  # the probes
        return np.vstack([np.random.default_rng(len(t)).normal(size=64) for t in batch])

    corpus = ListCorpus(texts, ids, None, vectors)
    report = audit(corpus, embedder=embed, workdir=tmp_path / "w", part_size=128, index="flat",
                   shards=8, route=1)  # fmt: skip
    assert {f.id for f in report.suspicious} == set(ids[500:])
