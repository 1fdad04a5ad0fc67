from __future__ import annotations

import json

import pytest

from ragdefense import DefenseInputError, DefenseResult, Passage, Verdict
from ragdefense.types import to_passages


def test_to_passages_accepts_strings_and_passages() -> None:
    p = Passage("b", id="x", score=0.5, metadata={"k": 1})
    out = to_passages(["a", p])
    assert out[0] == Passage("a")
    assert out[1] is p


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (None, "got None"),
        ("a string", "got str"),
        (["ok", 3], "passage 1: expected Passage or str, got int"),
        ([Passage(text=None)], "passage 0: text must be str"),  # type: ignore[arg-type]
    ],
)
def test_to_passages_rejects_bad_input(bad: object, message: str) -> None:
    with pytest.raises(DefenseInputError, match=message):
        to_passages(bad)  # type: ignore[arg-type]


def _result() -> DefenseResult:
    ps = [Passage(f"passage {i}") for i in range(3)]
    return DefenseResult(
        defense="X",
        query="q",
        verdicts=(
            Verdict(0, ps[0], True, 0.1, "kept: fine", rank=1),
            Verdict(1, ps[1], False, 0.9, "removed: bad"),
            Verdict(2, ps[2], True, 0.2, "kept: fine", rank=0),
        ),
        score_name="s",
        estimates={"n_adv": 1},
    )


def test_result_views_follow_ranks() -> None:
    r = _result()
    assert [p.text for p in r.kept] == ["passage 2", "passage 0"]
    assert r.kept_indices == [2, 0]
    assert r.removed_indices == [1]
    assert [p.text for p in r.removed] == ["passage 1"]


def test_result_table_and_dict() -> None:
    r = _result()
    table = str(r)
    assert "kept 2 of 3" in table and "REMOVED" in table and "removed: bad" in table
    assert "n_adv=1" in table
    d = json.loads(json.dumps(r.to_dict()))
    assert d["verdicts"][1]["kept"] is False
    assert d["estimates"] == {"n_adv": 1}
    assert all(len(line) <= 3 + 2 + 8 + 2 + 12 + 2 + 1 for line in r.to_table(1).splitlines()[2::2])
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="width must be a positive int"):
            r.to_table(bad)  # type: ignore[arg-type]


def test_a_result_reads_in_one_line_at_the_prompt_and_as_a_table_in_ipython() -> None:
    """The dataclass repr (what a REPL shows) held every passage's text and metadata on one
    line; IPython showed the same."""
    r = _result()
    assert repr(r) == "<DefenseResult X: kept [2, 0] of 3, removed [1], query 'q'>"
    long = DefenseResult("X", "why " * 40, r.verdicts, "s")
    assert len(repr(long)) < 140 and "passage" not in repr(long)

    class Printer:
        def __init__(self) -> None:
            self.out = ""

        def text(self, value: str) -> None:
            self.out += value

    shown = Printer()
    r._repr_pretty_(shown, False)
    assert shown.out == r.to_table()


def test_to_dict_is_strict_json_whatever_a_custom_defense_puts_in_it() -> None:
    """Arrays holding NaN, sets and NumPy integers in a result a user's defense builds went
    through ``to_dict`` as they were: ``json.dumps(allow_nan=False)`` refused them."""
    import dataclasses

    import numpy as np

    verdict = Verdict(0, Passage("a"), True, 0.5, "kept", rank=0, details={"d": np.array([np.inf])})
    verdict = dataclasses.replace(verdict, index=np.int64(0), rank=np.int64(0))
    estimates = {"arr": np.array([np.nan, 1.0]), "set": {2, 1}}
    result = DefenseResult("mine", "q", (verdict,), "s", estimates=estimates)
    out = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert out["estimates"] == {"arr": [None, 1.0], "set": [1, 2]}
    assert out["verdicts"][0]["rank"] == 0 and out["verdicts"][0]["details"] == {"d": [None]}


def test_a_printed_result_escapes_what_would_drive_a_terminal() -> None:
    # a planted passage's ESC sequence hid the line saying it was removed, or rewrote it
    planted = "Paris \x1b[8mis in Italy\x1b[0m\u202e"
    result = DefenseResult(
        "t", "q?", (Verdict(0, Passage(planted), False, 1.0, "removed: \x1b[2Kplanted"),), "s"
    )
    table = result.to_table(width=80)
    assert "\x1b" not in table and "\u202e" not in table
    assert "\\x1b[8mis in Italy" in table and "\\x1b[2Kplanted" in table
