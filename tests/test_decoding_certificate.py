"""Secure decoding's certificate against brute force: on random benign probability tables,
every answer an attack from a finite family causes (one-hot and mixed next-token rows, an
abstaining context, two-step rows) must be among the certificate's possible answers, and a
certified answer must survive every such attack. Tight cases the bounds certify are pinned
on their own, with the attacks that come closest."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from ragdefense.robustrag import secure_decoding

from .test_decoding import CAN, EOS, PER, SYD, FakeSession, Q, dist, rr

TOKENS = {"can": CAN, "syd": SYD, "per": PER, "eos": EOS}
ANSWERS = {CAN: "Canberra", SYD: "Sydney", PER: "Perth"}


def _attack_rows(rich: bool) -> dict[str, list[np.ndarray]]:
    """Attacker contexts: each token for sure, mixtures of two (ties and near ties with the
    benign sums), an abstaining one; each followed by the end or by another token."""
    firsts = {name: dist(**{name: 1.0}) for name in TOKENS}
    if rich:
        for (x, y), f in itertools.product(itertools.combinations(TOKENS, 2), (0.25, 0.5, 0.75)):
            firsts[f"{x}{f}{y}"] = dist(**{x: f, y: 1 - f})
    out: dict[str, list[np.ndarray]] = {"[atk idk]": [dist(idk=1.0)]}
    for name, row in firsts.items():  # bracketed: the fake session finds a key in the prompt
        out[f"[atk {name}]"] = [row]  # by substring, so no name may hold another
        if rich:
            out[f"[atk {name} then syd]"] = [row, dist(syd=1.0)]
    return out


def _benign(rng: np.random.Generator, m: int, alpha: float) -> dict[str, list[np.ndarray]]:
    tables: dict[str, list[np.ndarray]] = {}
    for i in range(m):
        if rng.random() < 0.15:
            tables[f"c{i}"] = [dist(idk=0.995, can=0.005)]  # abstains
            continue
        weights = rng.dirichlet(np.full(4, alpha))
        first = dist(**dict(zip(TOKENS, (float(w) for w in weights), strict=True)))
        rows = [first] if rng.random() < 0.7 else [first, dist(can=0.6, syd=0.4)]
        tables[f"c{i}"] = rows
    nor = ("can", "syd", "per")[int(rng.integers(3))]
    tables["If you do not know the answer confidently"] = [dist(**{nor: 1.0})]
    return tables


def test_every_attack_row_is_read_as_its_own() -> None:
    """The fake session picks the first key found in a prompt: with one attack's name inside
    another's, every mixed row was read as a one-hot row."""
    attacks = _attack_rows(rich=True)
    both = {**_benign(np.random.default_rng(0), 8, 0.6), **attacks}  # as _attacked looks up
    assert FakeSession(both, list(both)).keys == list(both)


def _attacked(
    tables: dict[str, Any], benign: list[str], attacks: dict[str, Any], k_prime: int,
    attack: str, eta: float,
) -> set[str]:  # fmt: skip
    """Every answer the inference gives under each attack of the family."""
    both = {**tables, **attacks}
    out = set()
    names = list(attacks)
    if attack == "injection":
        for chosen in itertools.combinations_with_replacement(names, k_prime):
            out.add(rr(both, eta=eta).answer(Q, [*benign, *chosen]).answer)
        return out
    for places in itertools.combinations(range(len(benign)), k_prime):
        for chosen in itertools.product(names, repeat=k_prime):
            passages = list(benign)
            for at, name in zip(places, chosen, strict=True):
                passages[at] = name
            out.add(rr(both, eta=eta).answer(Q, passages).answer)
    return out


def _check(seed: int, attack: str, k_prime: int, trials: int) -> tuple[int, int]:
    """Soundness on ``trials`` random tables: (certified, certificates giving possible answers)."""
    rng = np.random.default_rng(seed)
    attacks = _attack_rows(rich=k_prime == 1)
    certified = listed = 0
    for _ in range(trials):
        d = k_prime if attack == "injection" else 2 * k_prime
        m = int(rng.integers(2, 6)) + 3 * (d - 1)  # more contexts against a longer reach
        tables = _benign(rng, m, 0.6 if d == 1 else 0.25)
        benign = [f"c{i}" for i in range(m)]
        eta = float(rng.choice([0.0, 0.1, 0.25, 0.5]))
        gold = ANSWERS[int(rng.choice([CAN, SYD, PER]))]
        passages = benign + ["[atk idk]"] * k_prime if attack == "injection" else benign
        engine = rr({**tables, **_attack_rows(False)}, eta=eta)
        cert = engine.answer(Q, passages, certify=k_prime, gold=gold, attack=attack).certificate
        assert cert is not None
        if cert.possible_answers is None:
            continue
        listed += 1
        caused = _attacked(tables, benign, attacks, k_prime, attack, eta)
        assert caused <= set(cert.possible_answers), (tables, eta, caused, cert)
        if cert.certified:
            certified += 1
            assert all(a == gold for a in caused), (tables, eta, gold, caused, cert)
    return certified, listed


@pytest.mark.parametrize(
    ("attack", "k_prime", "trials"),
    [("injection", 1, 80), ("injection", 2, 40), ("modification", 1, 40)],
)
def test_no_attack_leaves_the_certificates_possible_answers(
    attack: str, k_prime: int, trials: int
) -> None:
    certified, listed = _check(7 + k_prime, attack, k_prime, trials)
    assert listed >= trials // 4 and certified >= 3, (certified, listed)  # the test bites


@pytest.mark.parametrize(
    ("wrong", "attack"),
    [
        (lambda m, k, attack, silent: [(0, m)], "injection"),  # the attacker left out
        (lambda m, k, attack, silent: [(j, m) for j in range(k + 1)], "modification"),  # n = m
        (lambda m, k, attack, silent: [(j, m + j) for j in range(k + 1)], "modification"),
    ],
)
def test_the_brute_force_catches_a_wrong_reach(wrong: Any, attack: str, monkeypatch: Any) -> None:
    """The soundness test above can fail: with the attacker's reach understated (left out,
    the average over the benign contexts alone, a rewrite counted as one injection), it finds
    an answer the certificate did not list or a certified answer an attack changes."""
    monkeypatch.setattr(secure_decoding, "_reach", wrong)
    with pytest.raises(AssertionError):
        _check(8, attack, 1, 80 if attack == "injection" else 40)


def _certificate(tables: dict[str, Any], m: int, eta: float, gold: str) -> Any:
    """Injection k' = 1 over ``m`` benign contexts (the last passage the attacker's place)."""
    passages = [f"c{i}" for i in range(m)] + ["c0"]
    return rr(tables, eta=eta).answer(Q, passages, certify=1, gold=gold).certificate


def test_eta_counts_the_injected_context_in_the_average() -> None:
    """Four contexts at Canberra 0.5125, Sydney 0.4875 (sums 2.05 and 1.95), eta 0.2, the
    no-retrieval answer Canberra: an injected Sydney context makes the averaged gap
    0.9 / 5 = 0.18, within eta, so the fallback answers Canberra. Bounding the average over
    the benign four alone (1 - 0.2 * 4 = 0.2 > 0.1) gave the certificate up."""
    tables = {f"c{i}": [dist(can=0.5125, syd=0.4875)] for i in range(4)}
    tables["If you do not know the answer confidently"] = [dist(can=1.0)]
    cert = _certificate(tables, 4, eta=0.2, gold="Canberra")
    assert cert is not None and cert.certified and cert.possible_answers == ("Canberra",), cert
    attacks = _attack_rows(rich=True)
    assert _attacked(tables, [f"c{i}" for i in range(4)], attacks, 1, "injection", 0.2) == {
        "Canberra"
    }


def test_a_top_token_that_can_never_lead_leaves_the_fallback_alone() -> None:
    """The paper's third case: contexts split between Canberra and Sydney, eta 0.3. No
    injected context can give either a lead above eta over five contexts, so every answer
    is the no-retrieval one (Perth): certified when Perth is right, where the certificate
    used to list the top token too."""
    tables = {f"c{i}": [dist(can=0.5, syd=0.5)] for i in range(4)}
    tables["If you do not know the answer confidently"] = [dist(per=1.0)]
    cert = _certificate(tables, 4, eta=0.3, gold="Perth")
    assert cert is not None and cert.certified and cert.possible_answers == ("Perth",), cert


def test_the_no_retrieval_token_as_runner_up_is_no_rival() -> None:
    """Canberra 0.6 / Perth 0.4 in three contexts, the no-retrieval answer Perth: the
    attacker can at most tip the step to Perth, which the inference falls back to anyway.
    The certificate lists both answers instead of saying the attacker chooses the token."""
    tables = {f"c{i}": [dist(can=0.6, per=0.4)] for i in range(3)}
    tables["If you do not know the answer confidently"] = [dist(per=1.0)]
    cert = _certificate(tables, 3, eta=0.0, gold="Canberra")
    assert cert is not None and not cert.certified
    assert set(cert.possible_answers or ()) == {"Canberra", "Perth"}, cert
    caused = _attacked(tables, ["c0", "c1", "c2"], _attack_rows(rich=True), 1, "injection", 0.0)
    assert caused <= {"Canberra", "Perth"} and "Perth" in caused
