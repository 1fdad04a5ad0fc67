"""The one name -> defense table, and the adapter fields derived from it."""

from __future__ import annotations

import typing
from typing import Any

import pytest

from ragdefense import GRADA, AutoDefense, RAGDefender
from ragdefense.defenses.registry import PRESETS, names, parameters, preset
from ragdefense.defenses.registry import defense as build
from ragdefense.integration.adapter import defense_fields


def test_names_and_aliases() -> None:
    assert names()[:4] == ["consensus", "strict", "ragdefender", "grada"]
    assert preset("RAGDefender") is preset("rag_defender") is PRESETS["ragdefender"]
    assert build("grada_peel").peel is True
    assert build("grada-hrsim-ebd").hrsim_base == "ebd"
    assert isinstance(build("auto"), AutoDefense)
    with pytest.raises(ValueError, match="unknown defense 'nope'"):
        build("nope")


def test_bad_parameters_fail_at_construction_with_the_names() -> None:
    with pytest.raises(TypeError, match=r"ragdefender has no parameter 'q'.*min_passages"):
        build("ragdefender", q=1)
    with pytest.raises(ValueError, match="p must be > 0"):
        build("ragdefender", p=-1.0)
    assert build("grada-bm25", n=3).n == 3  # preset values and the caller's both apply


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("consensus", {"margin": None}, "margin must be a finite number, got None"),
        ("consensus", {"tightness": "0.9"}, "tightness must be a finite number"),
        ("consensus", {"embedder": 5}, "cannot use int as an embedder"),
        ("grada-peel", {"peel_margin": None}, "peel_margin must be a finite number"),
        ("auto", {"peel_margin": None}, "peel_margin must be a finite number"),
        ("ragdefender", {"m": 2.5}, "m must be an int, got 2.5"),
        ("grada", {"max_iter": 1.5}, "max_iter must be an int"),
        ("grada", {"n": True}, "n must be an int or None, got True"),
        ("grada", {"alpha": float("nan")}, "alpha must be a finite number, got nan"),
        ("grada", {"max_iter": 0}, "max_iter >= 1"),
        ("ragdefender", {"p": float("inf")}, "p must be a finite number"),
        (
            "consensus",
            {"tightness": 10**5000},
            "tightness must be a finite number, got an int past",
        ),
        ("consensus", {"support": "no"}, "support must be True or False"),
        ("grada", {"peel": "no"}, "peel must be True or False"),
    ],
)
def test_a_parameter_of_the_wrong_type_fails_at_construction(
    name: str, params: dict[str, Any], message: str
) -> None:
    """Each was accepted, then failed inside numpy at the first defend() (or ran oddly)."""
    with pytest.raises((TypeError, ValueError), match=message):
        build(name, **params)


def test_whole_numbers_from_a_config_file_are_counts() -> None:
    """``{"n": 4.0}`` as JSON or YAML writes it: taken as the count 4."""
    assert build("grada", n=4.0, max_iter=50.0).n == 4
    assert build("ragdefender", m=5.0).m == 5 and build("consensus", min_group=3.0).min_group == 3
    with pytest.raises(TypeError, match=r"n must be an int or None, got 4\.5"):
        build("grada", n=4.5)


@pytest.mark.parametrize("cls", [RAGDefender, GRADA, AutoDefense])
def test_every_parameter_is_described(cls: type) -> None:
    described = parameters(cls, simple_only=False)
    assert described and all(p.description for p in described), [
        p.name for p in described if not p.description
    ]
    assert "embedder" not in {p.name for p in described}


def test_presets_show_their_own_defaults() -> None:
    peel = {p.name: p.default for p in defense_fields("grada-peel")}
    assert peel["peel"] is True and peel["similarity"] == "hrsim"
    assert "bm25" not in peel  # an object, not a plain value: not an adapter field


def _own_fields(cls: Any, base: Any) -> dict[str, Any]:
    return {k: f for k, f in cls.model_fields.items() if k not in base.model_fields}


def _adapter_classes() -> list[tuple[str, Any, Any]]:
    import langchain_ragdefense as lc
    import llama_index.postprocessor.ragdefense as li

    named = {"consensus": "Consensus", "ragdefender": "RAGDefender", "grada": "GRADA"}
    out = []
    for name in ("consensus", "ragdefender", "grada", "auto"):
        stem = named.get(name, "AutoDefense")
        out.append((name, getattr(lc, f"{stem}Compressor"), lc.DefenseCompressor))
        out.append((name, getattr(li, f"{stem}Postprocessor"), li.DefensePostprocessor))
    return out


@pytest.mark.parametrize(
    ("name", "cls", "base"), _adapter_classes(), ids=lambda v: getattr(v, "__name__", v)
)
def test_adapter_fields_are_written_out_and_match_the_core(name: str, cls: Any, base: Any) -> None:
    """(#28) each per-defense class declares its fields in its own body (seen by IDEs and type
    checkers), and a test holds them to the core's parameters: names, types, defaults."""
    fields = _own_fields(cls, base)
    core = {p.name: p for p in defense_fields(name)}
    assert list(fields) == list(core)
    hints = typing.get_type_hints(cls)
    for field_name, f in fields.items():
        assert hints[field_name] == core[field_name].annotation, field_name
        assert f.default == core[field_name].default, field_name
        assert f.description == core[field_name].description and f.description
        assert field_name in cls.__annotations__  # declared in the class body, not generated
    made = cls()
    assert type(made.core).__name__ == type(build(name)).__name__
    assert made.defense == name and cls.model_fields["defense"].frozen


@pytest.mark.parametrize(
    ("name", "cls", "base"), _adapter_classes(), ids=lambda v: getattr(v, "__name__", v)
)
def test_changing_a_field_changes_the_defense(name: str, cls: Any, base: Any) -> None:
    """(#28) ``c = GRADACompressor(n=3); c.n = 5`` used to leave the core at 3: the core is
    built again from the current fields, ``params`` edited in place included."""
    made = cls()
    first = made.core
    assert made.core is first  # unchanged fields: the same core, its caches kept
    field_name, value = {
        "consensus": ("margin", 0.07),
        "ragdefender": ("m", 7),
        "grada": ("n", 5),
        "auto": ("n", 5),
    }[name]
    setattr(made, field_name, value)
    assert made.core is not first and getattr(made.core, field_name) == value
    generic = base(defense=name, params={field_name: value})
    generic.params[field_name] = 2 * value
    assert getattr(generic.core, field_name) == 2 * value


def test_the_front_door() -> None:
    """(#28) one front door: names, the default, and any object with ``defend``: returned as it
    is when it declares the contract, else given its defaults; parameters only with a name."""
    import ragdefense
    from ragdefense import Consensus, Defense, DefenseResult

    assert isinstance(ragdefense.defense(), Consensus)
    assert ragdefense.defense("grada-peel", n=5).n == 5
    own = GRADA()
    assert ragdefense.defense(own) is own and isinstance(own, Defense)

    class Mine:
        pool_factor = 3

        def defend(self, query: str, passages: Any) -> DefenseResult:
            return RAGDefender(embedder=lambda t: [[1.0, float(i)] for i in range(len(t))]).defend(
                query, passages
            )

    wrapped = ragdefense.defense(Mine())
    assert isinstance(wrapped, Defense)
    assert (wrapped.name, wrapped.pool_factor, wrapped.min_pool, wrapped.min_passages) == (
        "Mine",
        3,
        0,
        1,
    )
    with pytest.raises(TypeError, match="only a defense name takes parameters"):
        ragdefense.defense(own, n=3)
    with pytest.raises(TypeError, match="not a defense"):
        ragdefense.defense(42)
    Mine.pool_factor = 0  # type: ignore[assignment]
    with pytest.raises(TypeError, match=r"Mine.pool_factor must be an int >= 1, got 0"):
        ragdefense.defense(Mine())

    class Complete(Mine):  # declares every attribute: returned as it is, checked all the same
        name = "complete"
        pool_factor = 2
        min_pool = -5
        min_passages = 1

    with pytest.raises(TypeError, match=r"complete.min_pool must be an int >= 0, got -5"):
        ragdefense.defense(Complete())
    Complete.min_pool = 0
    assert ragdefense.defense(Complete()).min_pool == 0


def test_adapters_validate_at_construction() -> None:
    from langchain_ragdefense import DefenseCompressor, GRADACompressor, RAGDefenderCompressor
    from llama_index.postprocessor.ragdefense import GRADAPostprocessor, RAGDefenderPostprocessor

    for bad in (
        lambda: RAGDefenderCompressor(p=-1.0),
        lambda: GRADACompressor(alpha=-1.0),
        lambda: RAGDefenderPostprocessor(min_passages=1),
        lambda: GRADAPostprocessor(damping=2.0),
        lambda: DefenseCompressor(defense="nope"),
    ):
        with pytest.raises(ValueError):
            bad()
    assert GRADAPostprocessor(hrsim_base="ebd").core.hrsim_base == "ebd"  # was not exposed
    assert DefenseCompressor(defense="grada-peel").core.peel is True


def test_a_custom_defense_keeps_its_embedding_path_and_fallback_through_the_front_door() -> None:
    """An object without the sizes was wrapped with ``defend`` alone: its ``defend_embeddings``
    (the retriever's vectors), ``uses_embeddings`` and fail-open ``fallback`` were dropped."""

    class Mine:
        name = "mine"
        uses_embeddings = True

        def defend(self, query: str, passages: Any) -> Any:
            raise AssertionError("the vectors were given")

        def defend_embeddings(self, query: str, passages: Any, *vectors: Any) -> str:
            return "embeddings"

        def fallback(self, query: str, passages: Any) -> str:
            return "fallback"

    made: Any = build(Mine())
    assert made.uses_embeddings is True
    assert made.defend_embeddings("q", ["a"], None, None) == "embeddings"
    assert made.fallback("q", ["a"]) == "fallback"
    with pytest.raises(AttributeError):
        made.not_there  # noqa: B018


def test_a_defense_shows_the_parameters_it_was_made_with() -> None:
    """A defense printed as ``<...Consensus object at 0x...>``: nothing told two apart; a
    quarantine's repr listed every id and digest it holds."""
    from ragdefense import Quarantine
    from ragdefense.similarity import BM25

    assert repr(build()) == "Consensus()"  # the defaults are not repeated
    assert repr(build("grada-peel", n=5)) == "GRADA(n=5, peel=True)"
    assert repr(build("consensus", margin=0.2)) == "Consensus(margin=0.2)"
    assert repr(build("grada", bm25=BM25(k1=1.2))) == (
        "GRADA(bm25=BM25(k1=1.2, b=0.75, corpus='retrieved'))"
    )
    assert repr(RAGDefender(p=0.9)) == "RAGDefender(p=0.9)"
    ids = frozenset(f"chunk-{i}" for i in range(1000))
    held = repr(Quarantine(build("strict"), ids, ids, dict.fromkeys(ids, "planted")))
    assert held.startswith("Quarantine(defense=RAGDefender(), ids=<1000 items>, digests=<1000")
    assert len(held) < 150


def test_a_defense_shown_from_its_own_constructor_is_made_once() -> None:
    """Showing a defense compares it with one made with the defaults; a subclass whose
    constructor shows itself was made again and again, to the recursion limit."""
    from ragdefense import Consensus

    made: list[int] = []

    class Audited(Consensus):
        def __init__(self, tightness: float = 0.9, **kwargs: Any) -> None:
            made.append(1)
            super().__init__(tightness=tightness, **kwargs)
            self.note = repr(self)

    assert Audited(tightness=0.7).note.startswith("Audited(")
    assert len(made) <= 2  # itself, and at most one made with the defaults
