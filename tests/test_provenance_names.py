"""Sources in one spelling: a file key's name keeps its case against trust too, a host is one
source however it is spelled (Unicode or its ASCII form), an address embedded in a scheme-less
one does not make it a name of its own, and a key named in another case reads as in auto."""

from __future__ import annotations

from typing import Any

import pytest

from ragdefense import Passage
from ragdefense.provenance import document_of, is_trusted_by, source_of


def _trusted(trusted: set[str], metadata: dict[str, Any], key: str | None = "auto") -> bool:
    passage = Passage("text", metadata=metadata)
    return is_trusted_by(trusted, key)(passage, source_of(passage, key))


def test_trusting_a_file_does_not_trust_another_named_in_another_case() -> None:
    # file keys keep the case ("Main.py" and "main.py" are two files): trust reads them so too
    assert not _trusted({"Main.py"}, {"file_name": "main.py"})
    assert not _trusted({"www.Main.py"}, {"file_name": "main.py"})
    assert not _trusted({"Handbook.v2"}, {"file_path": "handbook.v2"})
    assert _trusted({"Main.py"}, {"file_name": "Main.py"})
    assert _trusted({"handbook.v2"}, {"file_path": "handbook.v2"})
    # a host-like value under "source" is a host, lowercased on both sides as before
    assert _trusted({"Handbook.v2"}, {"source": "handbook.v2"})
    assert _trusted({"https://www.who.int/"}, {"url": "https://who.int/news"})


@pytest.mark.parametrize(
    "value",
    [
        "https://bücher.example/a",
        "https://xn--bcher-kva.example/b",
        "https://BÜCHER.example/c",
        "https://www.bücher.example./d",
        "bücher.example/e",
    ],
)
def test_an_internationalised_host_is_one_source_however_spelled(value: str) -> None:
    assert source_of(Passage("x", metadata={"url": value})) == "xn--bcher-kva.example"
    assert _trusted({"bücher.example"}, {"url": value})
    assert _trusted({"https://xn--bcher-kva.example"}, {"url": value})
    assert not _trusted({"example"}, {"url": value})
    assert source_of(Passage("x", metadata={"source": "Bücher.Example"})) == (
        "xn--bcher-kva.example"
    )


@pytest.mark.parametrize(
    ("metadata", "document"),
    [
        ({"url": "who.int/redirect?to=https://evil.com"}, "who.int/redirect"),
        ({"link": "//who.int/r?u=http://x.org"}, "who.int/r"),
        ({"url": "https://who.int/redirect?to=https://evil.com"}, "who.int/redirect"),
    ],
)
def test_an_address_inside_a_schemeless_one_leaves_it_a_page_of_its_host(
    metadata: dict[str, Any], document: str
) -> None:
    passage = Passage("x", metadata=metadata)
    assert source_of(passage) == "who.int"
    assert document_of(passage) == document
    assert _trusted({"who.int"}, metadata)
    assert not _trusted({"evil.com"}, metadata) and not _trusted({"x.org"}, metadata)


def test_a_key_named_in_another_case_is_read_as_its_kind() -> None:
    web = {"URL": "who.int/news/1"}
    assert source_of(Passage("x", metadata=web), "URL") == source_of(Passage("x", metadata=web))
    assert source_of(Passage("x", metadata={"Url": "//who.int/news/1"}), "Url") == "who.int"
    files = {"FILE_NAME": "Who.int"}  # a file key keeps the case, named or found
    assert source_of(Passage("x", metadata=files), "FILE_NAME") == "Who.int"
    assert source_of(Passage("x", metadata=files)) == "Who.int"
    assert not _trusted({"who.int"}, files, "FILE_NAME")


def test_an_internationalised_host_is_spelled_as_browsers_spell_it() -> None:
    # IDNA 2003 (Python's codec) maps these onto other, real domains; browsers do not
    assert not _trusted({"boss.com"}, {"url": "https://boß.com/offer"})
    assert not _trusted({"paypal.com"}, {"url": "https://pay\u200dpal.com/login"})
    assert _trusted({"xn--bo-hia.com"}, {"url": "https://boß.com/offer"})
    assert _trusted({"straße.de"}, {"url": "https://xn--strae-oqa.de/x"})
    assert _trusted({"who.int"}, {"url": "https://\uff37\uff28\uff2f.int/x"})  # full-width
    assert _trusted({"localhost:8000"}, {"source": "LOCALHOST:8000"})
    assert source_of(Passage("x", metadata={"source": "報告.文件"})) == "報告.文件"  # a name


def test_a_trusted_page_written_with_spaces_around_it_trusts_that_page_only() -> None:
    for entry in (" https://github.com/myorg/docs", "\thttps://github.com/myorg/docs\n"):
        assert not _trusted({entry}, {"url": "https://github.com/attacker/repo"})
        assert _trusted({entry}, {"url": "https://github.com/myorg/docs/a"})


def test_an_address_under_a_file_key_is_trusted_by_its_host() -> None:
    address = {"file_path": "https://www.who.int/docs/report.pdf"}
    assert source_of(Passage("x", metadata=address)) == "who.int"
    assert _trusted({"www.who.int"}, address) and _trusted({"WHO.int"}, address)
    assert not _trusted({"www.who.int"}, {"file_path": "who.int"})  # a file's name, as written


@pytest.mark.parametrize(
    ("entry", "metadata"),
    [
        ("kb/handbook", {"source": "kb/handbook/leave.md"}),  # a LangChain DirectoryLoader's
        ("./kb/handbook/", {"source": "kb/handbook/leave.md"}),
        ("/srv/kb/handbook", {"file_path": "/srv/kb/handbook/2024/leave.pdf"}),  # LlamaIndex's
        ("C:\\kb\\handbook", {"source": "C:\\kb\\handbook\\leave.pdf"}),
        ("s3://acme-docs/policies/", {"source": "s3://acme-docs/policies/leave.pdf"}),
        ("s3://acme-docs", {"source": "s3://acme-docs/policies/leave.pdf"}),
        ("file:///srv/kb/handbook", {"source": "file:///srv/kb/handbook/leave.pdf"}),
        ("docs/", {"source": "docs/leave.md"}),  # one level, written as a folder
        ("kb.v2/notes", {"source": "kb.v2/notes/leave.md"}),
    ],
)
def test_a_trusted_folder_trusts_the_files_under_it(entry: str, metadata: dict[str, str]) -> None:
    assert _trusted({entry}, metadata)


@pytest.mark.parametrize(
    ("entry", "metadata"),
    [
        ("kb/handbook", {"source": "kb/handbook-drafts/leave.md"}),  # a prefix, not a folder
        ("kb/handbook", {"source": "kb/handbook/../uploads/leave.md"}),
        ("/srv/kb/handbook", {"file_path": "/srv/kb/uploads/x.pdf"}),
        # a storage key is opaque: this one is written under uploads/, as the store reads it
        ("s3://acme-docs/policies", {"source": "s3://acme-docs/uploads/../policies/x.pdf"}),
        ("s3://acme-docs", {"source": "s3://acme-docs-evil/x.pdf"}),
        ("file:///srv/kb/handbook", {"source": "file:///srv/kb/handbook/%2e%2e/up/x.pdf"}),
        ("kb/handbook", {"source": "https://kb/handbook/x"}),  # a web address: its host
        ("kb/handbook", {"file_name": "handbook"}),
        ("file:///C:/kb/handbook", {"source": "file:///C:/kb/handbook/..\\..\\secret.md"}),
        ("file:///C:/kb/handbook", {"source": "file:///C:/kb/handbook/..%5c..%5csecret.md"}),
        # a scheme-less page is trusted by the page rule, which reads escapes as servers do
        ("github.com/acme/handbook", {"source": "github.com/acme/handbook/..%2f..%2fother"}),
        ("10.0.0.1/admin", {"source": "10.0.0.1/admin/%2e%2e/x"}),
        ("who.int/", {"source": "who.int/x"}),  # a host written with its slash: no folder
        # off Windows a backslash is part of a name: this is a file of uploads/
        ("/srv/kb/handbook", {"file_path": "/srv/kb/uploads/x\\..\\..\\handbook\\a.md"}),
        ("/srv/kb/handbook/a.md", {"file_path": "/srv/kb/uploads/x\\..\\..\\handbook\\a.md"}),
        ("file:///srv/kb/handbook", {"source": "file:///srv/kb/uploads/..%5Chandbook%5Cx.md"}),
        # stores differ on dot segments in keys (HDFS, SFTP resolve them; S3 does not)
        ("hdfs://nn/kb/handbook", {"source": "hdfs://nn/kb/handbook/../uploads/x.md"}),
        ("s3://acme/policies", {"source": "s3://acme/policies/../uploads/x.md"}),
        # a file URL fsspec writes and opens without decoding: one file name in uploads/
        ("file:///srv/kb/handbook", {"source": "file:///srv/kb/uploads/%2e%2e%2fhandbook%2fa.md"}),
        ("file:///srv/kb/handbook", {"source": "file:///srv/kb/uploads/%2e%2e/handbook/a.md"}),
        # both separators, no drive: off Windows a file of /srv/kb
        ("/srv/kb/handbook", {"file_path": "/srv/kb/handbook\\evil.md"}),
        # urlopen drops a fragment or query before opening: this opens uploads/evil.md
        ("file:///srv/kb/handbook", {"source": "file:///srv/uploads/e.md#/../../kb/handbook/x"}),
        ("file:///srv/kb/handbook", {"source": "file:///srv/uploads/e.md?/../../kb/handbook/x"}),
        ("s3://b/kb/handbook", {"source": "s3://b/kb/handbook/%2e%2e/x.pdf"}),
        # a web address names a host, never a local folder of that name
        ("https://who.int", {"file_path": "who.int/evil.md"}),
    ],
)
def test_a_trusted_folder_trusts_nothing_beside_it(entry: str, metadata: dict[str, str]) -> None:
    assert not _trusted({entry}, metadata)


@pytest.mark.parametrize(
    "entry",
    ["/", "s3://", "file:///", " / ", "file://localhost/", "C:/", "C:\\", "s3:/", "file:/", "./"],
)
def test_a_trusted_root_is_refused(entry: str) -> None:
    with pytest.raises(ValueError, match="root"):
        is_trusted_by({entry}, cwd="/srv/app")


@pytest.mark.parametrize(
    ("entry", "cwd"),
    [
        ("../", "/srv"),
        ("../", "C:\\app"),
        ("kb/..", "/"),
        ("../..", "\\\\server\\share\\app"),  # never above a share
        ("//server/share/", "/"),
        ("\\\\server\\share", "/"),
        ("file://server/share/", "/"),
    ],
)
def test_a_relative_folder_that_is_a_root_from_the_working_folder_is_refused(
    entry: str, cwd: str
) -> None:
    with pytest.raises(ValueError, match="root"):
        is_trusted_by({entry}, cwd=cwd)


def test_a_trusted_folder_keeps_its_files_through_the_default_defense() -> None:
    from ragdefense import Consensus

    texts = ["Leave is 25 days a year.", "Parental leave is 16 weeks.", "Leave is 40 days."]
    sources = ["kb/handbook/leave.md", "kb/handbook/family.md", "uploads/leave.md"]
    passages = [Passage(t, metadata={"source": s}) for t, s in zip(texts, sources, strict=True)]
    result = Consensus(trusted={"kb/handbook/"}).defend("How many days of leave?", passages)
    assert result.estimates["trusted"] == [0, 1]


def test_a_relative_folder_is_also_read_from_the_working_folder(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    absolute = f"{tmp_path}/kb/handbook/leave.pdf"
    assert _trusted({"kb/handbook"}, {"file_path": absolute})
    assert _trusted({"kb/handbook"}, {"source": "kb/handbook/leave.pdf"})  # as written, too
    assert not _trusted({"kb/handbook"}, {"file_path": "/elsewhere/kb/handbook/leave.pdf"})
    assert not _trusted({"../handbook"}, {"file_path": absolute})
    other = Passage("text", metadata={"file_path": "/elsewhere/kb/handbook/leave.pdf"})
    assert is_trusted_by({"kb/handbook"}, cwd="/elsewhere")(other, source_of(other))


def test_a_defense_reads_a_relative_folder_from_the_working_folder_of_each_query(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trusted test is cached per setting: the working folder is part of the setting."""
    from ragdefense import Consensus

    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    texts = ["Leave is 25 days a year.", "Parental leave is 16 weeks.", "Leave is 40 days."]
    defense = Consensus(trusted={"kb/handbook"})
    for here in (first, second):
        monkeypatch.chdir(here)
        passages = [
            Passage(t, metadata={"file_path": f"{where}/kb/handbook/{i}.md"})
            for i, (t, where) in enumerate(zip(texts, (first, second, here), strict=True))
        ]
        found = defense.defend("How many days of leave?", passages).estimates["trusted"]
        assert found == ([0, 2] if here == first else [1, 2])


def test_the_cached_trust_test_reads_the_working_folder_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its cache key and its folders came from two reads of the working folder: a ``chdir``
    in another thread between them cached one folder's test under the other's key."""
    import os

    from ragdefense.defenses.trusting import trust_of

    folders = iter(["/first", "/second", "/third"])
    monkeypatch.setattr(os, "getcwd", lambda: next(folders))
    test = trust_of({"kb/only-this-test"}, "auto")
    assert test.folders == {"kb/only-this-test", "/first/kb/only-this-test"}  # type: ignore[attr-defined]


def test_a_long_source_value_is_read_as_a_short_one() -> None:
    """Readings of source values are kept (a store's documents come back query after query),
    but for values too long to be a name: those are read each time, the same way."""
    from ragdefense.provenance import _normal_text

    long_path = "kb/" + "x" * 3000 + "/a.pdf"
    before = _normal_text.cache_info().currsize
    passage = Passage("text", metadata={"file_path": long_path, "url": None})
    assert source_of(passage) == document_of(passage) == long_path
    assert _normal_text.cache_info().currsize == before
    page = Passage("text", metadata={"url": "https://who.int/news/" + "n" * 3000})
    assert source_of(page) == "who.int" and document_of(page) == "who.int/news/" + "n" * 3000


@pytest.mark.parametrize(
    ("entry", "metadata"),
    [
        ("..\\kb\\handbook\\a.pdf", {"file_path": "..\\kb\\handbook\\a.pdf"}),  # the very string
        ("C:/kb/handbook", {"file_path": "C:/kb/handbook\\a.pdf"}),  # a drive opens it: Windows
        ("file:///srv/my kb/handbook", {"source": "file:///srv/my%20kb/handbook/a.pdf"}),
        ("s3://b/kb/handbook", {"source": "s3://b/kb/handbook/a%2Fb.pdf"}),  # one level deeper
    ],
)
def test_an_unambiguous_or_identical_path_is_trusted(entry: str, metadata: dict[str, str]) -> None:
    assert _trusted({entry}, metadata)


def test_a_storage_folder_with_dot_segments_is_refused() -> None:
    """A key read with its dot segments resolved never holds one: it would trust nothing."""
    for entry in ("s3://acme/a/../policies", "s3://acme/a/%2e%2e/policies"):
        with pytest.raises(ValueError, match="segments"):
            is_trusted_by({entry})


def test_a_relative_folder_never_climbs_above_the_working_folders_drive() -> None:
    assert is_trusted_by({"../../kb"}, cwd="C:\\app").folders == {  # type: ignore[attr-defined]
        "../../kb",
        "C:/kb",
    }
    windows = Passage("text", metadata={"file_path": "C:\\kb\\handbook\\a.pdf"})
    assert is_trusted_by({"C:\\kb\\handbook"})(windows, source_of(windows))


def test_a_storage_address_is_one_source_whatever_its_schemes_case() -> None:
    upper, lower = ({"source": f"{s}://acme/policies/leave.pdf"} for s in ("S3", "s3"))
    assert source_of(Passage("x", metadata=upper)) == source_of(Passage("x", metadata=lower))
    assert source_of(Passage("x", metadata=upper)) == "s3://acme/policies/leave.pdf"
    assert source_of(Passage("x", metadata={"source": "s3://Acme/A.pdf"})) == "s3://Acme/A.pdf"


def test_a_dot_segment_beside_a_backslash_never_turns_a_file_into_a_host() -> None:
    """(review) ``uploads/..\\who.int`` (off Windows, a file of ``uploads`` whose name an
    uploader chose) was resolved to ``who.int``: trusted by ``{"who.int"}`` and one voice with
    the host; ``uploads/x\\..\\..\\kb\\handbook\\a.md`` one voice with the trusted file."""
    for value in ("uploads/..\\who.int", "x\\..\\who.int"):
        assert source_of(Passage("x", metadata={"source": value})) == value  # as written
        assert not _trusted({"who.int"}, {"source": value})
    assert not _trusted({"leave.md"}, {"file_path": "uploads/..\\leave.md"})
    climbed = Passage("x", metadata={"source": "uploads/x\\..\\..\\kb\\handbook\\a.md"})
    assert source_of(climbed) != "kb/handbook/a.md"
    assert source_of(Passage("x", metadata={"source": "kb\\handbook\\a.md"})) == "kb/handbook/a.md"
    assert _trusted({"kb/handbook"}, {"source": "kb\\handbook\\a.md"})  # one spelling: still


def test_odd_addresses_and_entries_are_read_or_refused_never_a_crash() -> None:
    """(review) A lone surrogate in a URL's path raised ``UnicodeEncodeError`` from
    ``document_of`` (and so from the default defense); ``"*.who.int"``, an allow-list's
    spelling, trusted nothing without a word."""
    from ragdefense.addresses import held_by

    assert document_of(Passage("x", metadata={"url": "https://who.int/\ud800"})) == (
        "who.int/%ED%A0%80"
    )
    page = {"url": "https://who.int/x/\ud800"}
    assert _trusted({"https://who.int/x"}, page) and not _trusted({"https://who.int/y"}, page)
    for entry in ("*.who.int", " *who.int", "https://*.who.int/news"):
        with pytest.raises(ValueError, match="is a pattern, not a source: name each host"):
            is_trusted_by({entry})
    # the pages and folders holding a path, found without writing out its every prefix
    assert held_by({"a", "a/b", "a/bc", "b", ""}, "a/b/c") == {"a", "a/b"}
    assert held_by({"a/b"}, "a/b") == {"a/b"} and held_by({"a/b/"}, "a/b") == set()
    assert held_by({""}, "/a") == {""} and held_by(frozenset({"a", "a/b"}), "a/b/c") == {"a", "a/b"}
    deep = "https://who.int/x/" + "a/" * 3000
    assert _trusted({"https://who.int/x"}, {"url": deep})
    assert not _trusted({"https://who.int/x/b"}, {"url": deep})


def test_a_trusted_web_page_trusts_web_addresses_only() -> None:
    """(review) Trusting ``https://who.int/news`` trusted a local file
    ``who.int/news/x.md`` (its folders named like the page) and an id ``who.int/news/x``:
    values a passage's own source reads as paths, not as the page's host."""
    page = {"https://who.int/news"}
    for meta in ({"file_path": "who.int/news/x.md"}, {"doc_id": "who.int/news/x"}):
        assert not _trusted(page, meta), meta
    for meta in ({"url": "who.int/news/x"}, {"source": "https://www.who.int/news/x"}):
        assert _trusted(page, meta), meta
    assert not _trusted(page, {"url": "https://who.int/newsroom"})


def test_an_address_trusts_a_site_only_and_a_file_name_no_site() -> None:
    """Found by a review: ``https://who.int`` trusted an upload saved as ``who.int`` (a file
    key's value, or ``./who.int`` under ``source``), and ``leave.md``, a file's name, trusted
    the site ``https://leave.md`` (``.md`` is a country's domain anyone can register)."""
    site = {"https://who.int"}
    assert _trusted(site, {"source": "https://www.who.int/news/1"})
    assert _trusted(site, {"source": "who.int"})  # a host label, as hand-written sources hold
    assert not _trusted(site, {"file_name": "who.int"})
    assert not _trusted(site, {"source": "./who.int"})
    assert not _trusted(site, {"source": "../uploads/who.int"})
    assert not _trusted({"leave.md"}, {"url": "https://leave.md/policy"})
    assert not _trusted({"leave.md"}, {"source": "https://leave.md/policy"})
    assert _trusted({"leave.md"}, {"file_name": "leave.md"})  # the file it names
    assert _trusted({"leave.md"}, {"source": "leave.md"})
    assert not _trusted({"https://leave.md"}, {"file_name": "leave.md"})
    assert _trusted({"https://leave.md"}, {"url": "https://leave.md/policy"})
    # a bare name that is a host and a file's name alike trusts both (documented)
    assert _trusted({"who.int"}, {"file_name": "who.int"})
    assert _trusted({"who.int"}, {"url": "https://who.int/x"})
    # (diff review) a Path is a file whatever it is named: it trusts no site
    from pathlib import Path

    assert not _trusted({Path("./who.int")}, {"url": "https://who.int/x"})  # type: ignore[arg-type]
    assert _trusted({Path("./who.int")}, {"file_name": "who.int"})  # type: ignore[arg-type]
    # a bare value under "source" may name the file a loader read: "./install.sh" trusts it
    assert _trusted({"./install.sh"}, {"source": "install.sh"})
    assert not _trusted({"./install.sh"}, {"url": "https://install.sh/x"})


def test_a_source_longer_than_any_host_name_is_kept_as_written() -> None:
    """Each label of a non-ASCII host was converted to punycode in pure Python: a planted
    1 MB ``source`` of one-letter labels cost seconds on every query retrieving it. Past 253
    characters no DNS name is read (none is that long): the value is one opaque source."""
    from ragdefense.addresses import host_name

    long = "Ü." * 200 + "com"
    assert host_name(long) == long.lower()
    assert host_name("Bücher.example") == "xn--bcher-kva.example"  # a real host as before
    assert source_of(Passage("x", metadata={"source": "https://" + long})) == long.lower()


def test_a_source_value_that_cannot_be_printed_is_no_source() -> None:
    """A ``source`` that ``str()`` cannot print (a dict nested past Python's recursion limit)
    raised ``RecursionError`` from every default call retrieving that passage."""
    import ragdefense

    nested: dict[str, Any] = {}
    for _ in range(5000):
        nested = {"a": nested}

    class Broken:
        def __str__(self) -> str:
            raise ValueError("no text")

    for value in (nested, Broken()):
        assert source_of(Passage("x", metadata={"source": value})) is None
    passages = [Passage(f"text {i}", metadata={"source": nested}) for i in range(4)]
    assert len(ragdefense.defense("consensus").defend("text?", passages).kept) == 4


def test_a_trust_predicate_copies_only_what_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every metadata value was deep-copied for the ``trusted=`` predicate on every call:
    a record holding a large value (a layout, a vector) cost a copy per passage per query.
    Each value is copied as it is read, and the caller's still cannot be changed."""
    import copy

    import ragdefense

    copied: list[Any] = []
    deepcopy = copy.deepcopy
    monkeypatch.setattr(copy, "deepcopy", lambda v, *a: copied.append(v) or deepcopy(v, *a))
    layout = [{"x": i} for i in range(1000)]
    passages = [
        Passage(f"text {i}", metadata={"reviewed": i == 0, "layout": layout}) for i in range(4)
    ]

    def reviewed(metadata: Any) -> bool:
        assert isinstance(metadata, dict) and "layout" in metadata and len(metadata) == 2
        return bool(metadata.get("reviewed"))

    guard = ragdefense.defense("consensus", trusted=reviewed)
    assert guard.defend("text?", passages).estimates["trusted"] == [0]
    assert layout not in copied and copied  # the flags read were copied, the layout never


def test_a_trust_predicate_copying_the_metadata_as_a_dict_leaves_the_callers() -> None:
    """The copy handed to a ``trusted=`` predicate copied its values when read through its
    own methods only: ``dict(m)`` or ``{**m}`` (CPython's fast path) handed over the caller's
    nested values, which the predicate then changed."""
    import pickle

    import ragdefense

    metadata = [{"tags": ["a"], "reviewed": i == 0, "n": {"seen": 0}} for i in range(4)]
    passages = [Passage(f"text {i}", metadata=m) for i, m in enumerate(metadata)]

    def meddling(m: Any) -> bool:
        for copy in (dict(m), {**m}, m | {}, dict(m.items())):
            copy["tags"].append("b")
            copy["n"]["seen"] += 1
        assert {"reviewed": m["reviewed"]}.items() <= m.items()  # a view, as a dict's
        assert pickle.loads(pickle.dumps(m)) == m
        return bool(m.popitem() and m.get("reviewed"))

    guard = ragdefense.defense("consensus", trusted=meddling)
    assert guard.defend("text?", passages).estimates["trusted"] == [0]
    assert all(m["tags"] == ["a"] and m["n"] == {"seen": 0} for m in metadata)


def test_a_path_parameter_cannot_climb_out_of_a_trusted_page() -> None:
    # Tomcat and Jetty (Confluence, Jira) drop each segment's ";params": "..;" is ".." there
    page = {"https://github.com/acme/handbook"}
    for climbing in ("..;", "..;x=1", "..;/..;"):
        source = f"https://github.com/acme/handbook/{climbing}/evil"
        assert not _trusted(page, {"source": source}), source
    assert _trusted(page, {"source": "https://github.com/acme/handbook/leave;v=2"})
    assert _trusted(page, {"source": "https://github.com/acme/handbook/leave"})
