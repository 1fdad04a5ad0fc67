"""The one name -> defense table, and the adapter fields derived from it."""

from __future__ import annotations

from typing import Any

import pytest

from ragdefense import GRADA, AutoDefense, RAGDefender
from ragdefense.defenses.registry import PRESETS, build, names, parameters, preset
from ragdefense.integration import defense_fields, make_defense


def test_names_and_aliases() -> None:
    assert names()[:4] == ["consensus", "strict", "ragdefender", "grada"]
    assert preset("RAGDefender") is preset("rag_defender") is PRESETS["ragdefender"]
    assert build("grada_peel").peel is True
    assert build("grada-hrsim-ebd").hrsim_base == "ebd"
    assert isinstance(make_defense("auto"), AutoDefense)
    with pytest.raises(ValueError, match="unknown defense 'nope'"):
        build("nope")


def test_bad_parameters_fail_at_construction_with_the_names() -> None:
    with pytest.raises(TypeError, match=r"ragdefender has no parameter 'q'.*min_passages"):
        build("ragdefender", q=1)
    with pytest.raises(ValueError, match="p must be > 0"):
        build("ragdefender", p=-1.0)
    assert build("grada-bm25", n=3).n == 3  # preset values and the caller's both apply


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


@pytest.mark.parametrize("name", ["ragdefender", "grada", "auto"])
def test_langchain_fields_are_the_core_parameters(name: str) -> None:
    from langchain_ragdefense import (
        AutoDefenseCompressor,
        DefenseCompressor,
        GRADACompressor,
        RAGDefenderCompressor,
    )

    cls = {"ragdefender": RAGDefenderCompressor, "grada": GRADACompressor}.get(
        name, AutoDefenseCompressor
    )
    fields = _own_fields(cls, DefenseCompressor)
    assert list(fields) == [p.name for p in defense_fields(name)]
    assert all(f.description for f in fields.values())
    compressor = cls(**{next(iter(fields)): fields[next(iter(fields))].default})
    assert type(compressor.core).__name__ == type(build(name)).__name__


@pytest.mark.parametrize("name", ["ragdefender", "grada", "auto"])
def test_llamaindex_fields_are_the_core_parameters(name: str) -> None:
    from llamaindex_ragdefense import (
        AutoDefensePostprocessor,
        DefensePostprocessor,
        GRADAPostprocessor,
        RAGDefenderPostprocessor,
    )

    cls = {"ragdefender": RAGDefenderPostprocessor, "grada": GRADAPostprocessor}.get(
        name, AutoDefensePostprocessor
    )
    fields = _own_fields(cls, DefensePostprocessor)
    assert list(fields) == [p.name for p in defense_fields(name)]
    assert all(f.description for f in fields.values())
    assert cls.class_name() == cls.__name__


def test_adapters_validate_at_construction() -> None:
    from langchain_ragdefense import DefenseCompressor, GRADACompressor, RAGDefenderCompressor
    from llamaindex_ragdefense import GRADAPostprocessor, RAGDefenderPostprocessor

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
