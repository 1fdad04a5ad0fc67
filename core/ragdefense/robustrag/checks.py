"""What RobustRAG checks before any LLM call: its installed dependencies, prompt templates
and certification arguments (found later, each would waste the calls already made)."""

from __future__ import annotations

import dataclasses
import math
import numbers
import string
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "TEMPLATE_FIELDS",
    "TEMPLATE_NEEDS",
    "check_alike",
    "check_attack",
    "check_certify",
    "check_count",
    "check_installed",
    "check_real",
    "check_templates",
    "deciding",
]


def check_installed(llm: Any, aggregation: str, nlp: Any) -> None:
    """What the defaults need, checked at construction with the install command (found at the
    first answer it would be a raw ModuleNotFoundError, or every answer "I don't know")."""
    from importlib.util import find_spec

    if nlp is not None and not callable(nlp):
        raise TypeError(
            f"nlp must be a loaded spaCy pipeline (spacy.load({nlp!r}) if a name), got "
            f"{type(nlp).__name__}"
        )
    if aggregation == "keyword" and nlp is None and find_spec("spacy") is None:
        raise ImportError(
            "RobustRAG's keyword aggregation extracts keywords with spaCy: pip install "
            "'ragdefense[nlp]' (or pass nlp=, or aggregation='majority' / 'decoding')"
        )
    if llm is None:
        from ..llm.huggingface import check_packaged_llm

        check_packaged_llm()
    elif isinstance(llm, str):  # a model's name: nothing here can call it
        raise TypeError(
            f"llm={llm!r} is a name, not a model: pass the model object (a LangChain chat "
            "model, a LlamaIndex LLM, a transformers model, a callable str -> str, or a "
            "ragdefense LLM), or None for the packaged SmolLM2"
        )
    else:
        from ..llm import as_llm

        wrapped = as_llm(llm)  # a wrong kind of object refused now, not at the first answer
        if aggregation == "decoding" and not wrapped.supports_token_probs:
            raise ValueError(
                f"secure decoding needs next-token probabilities, which {type(llm).__name__} "
                "does not give: pass a transformers model (or None for the packaged SmolLM2), "
                "or aggregation='keyword' / 'majority'"
            )


#: what the engine fills in each template it takes (``str.format`` fields): a template may use
#: any of them, and must use those :data:`TEMPLATE_NEEDS` names
TEMPLATE_FIELDS: dict[str, tuple[str, ...]] = {
    "isolated_prompt": ("context", "query"),
    "keyword_prompt": ("keywords", "query"),
    "choice_prompt": ("context", "query", "choices", "letters"),
    "no_retrieval_prompt": ("query",),
}
#: the fields an answer rests on, where not every field (a multiple-choice prompt may leave
#: out the letters)
TEMPLATE_NEEDS: dict[str, tuple[str, ...]] = {"choice_prompt": ("context", "query", "choices")}


def check_templates(**templates: str) -> None:
    """Each template (by its name in :data:`TEMPLATE_FIELDS`) formats with its placeholders (a
    typo found at the first answer would waste a batch of LLM calls) and uses the ones the
    answer rests on (a prompt without the passage or the keywords would be answered from the
    model's memory, and certified)."""
    for label, template in templates.items():
        fields = TEMPLATE_FIELDS[label]
        names = ", ".join("{" + f + "}" for f in fields)
        try:
            template.format(**dict.fromkeys(fields, ""))
            used = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise ValueError(
                f"{label} cannot be filled ({type(exc).__name__}: {exc}): it may use {names} "
                "(double other braces: {{ }})"
            ) from None
        missing = [f for f in TEMPLATE_NEEDS.get(label, fields) if f not in used]
        if missing:
            raise ValueError(
                f"{label} does not use {', '.join('{' + f + '}' for f in missing)}: the "
                f"answer rests on it (it may use {names})"
            )


def check_real(**settings: Any) -> None:
    """Each setting (by its name) is a finite real number, else ``TypeError`` (a bool or not a
    number) or ``ValueError`` (NaN or infinite): a NaN passes every range check (``nan < 0`` is
    False) and would make every comparison with it false."""
    for name, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number, got {type(value).__name__}: {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")


def check_count(**settings: Any) -> None:
    """Each setting (by its name) is an int, not a bool, else ``TypeError``: a float cap (NaN
    or infinity) would make every comparison with it false, or bound nothing."""
    for name, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")


def check_engine(
    max_new_tokens: Any, timeout: Any, max_passage_chars: Any, isolated_prompt: str
) -> None:
    """A :class:`~ragdefense.robustrag.RobustRAG`'s own settings, each of its type and range
    (``True`` is no cap of 1 character, nor a timeout of 1 second)."""
    check_count(max_new_tokens=max_new_tokens)
    check_count(**({} if max_passage_chars is None else {"max_passage_chars": max_passage_chars}))
    unbounded = timeout is None or timeout == math.inf  # no limit
    check_real(**({} if unbounded else {"timeout": timeout}))
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds (or None), got {timeout!r}")
    if max_passage_chars is not None and max_passage_chars < 1:
        raise ValueError(f"max_passage_chars must be >= 1 (or None), got {max_passage_chars}")
    check_templates(isolated_prompt=isolated_prompt)


def check_attack(attack: str) -> None:
    if attack not in ("injection", "modification"):
        raise ValueError(f"attack must be 'injection' or 'modification', got {attack!r}")


def check_certify(k_prime: Any, attack: str, gold: Any, *, optional: bool = True) -> Any:
    """Certification arguments checked up front (a wrong type found after every isolated call
    would waste them all); ``k_prime`` may be ``None`` (no certificate) where ``optional``.
    Returns ``k_prime`` as a plain int (a NumPy integer too), or ``None``."""
    if k_prime is None and not optional:
        raise TypeError("certify needs k' (an int: the injected passages to withstand)")
    whole = isinstance(k_prime, numbers.Integral) and not isinstance(k_prime, bool)
    if k_prime is not None and not whole:
        raise TypeError(f"certify (k') must be an int, got {type(k_prime).__name__}: {k_prime!r}")
    k_prime = None if k_prime is None else int(k_prime)
    if k_prime is not None and k_prime < 1:
        raise ValueError(f"certify (k') must be >= 1 (None: no certificate), got {k_prime}")
    check_attack(attack)
    golds = [gold] if isinstance(gold, str) else gold
    if gold is not None and (
        not isinstance(golds, Sequence) or not all(isinstance(g, str) for g in golds)
    ):
        raise TypeError(f"gold must be a str or a sequence of str, got {type(gold).__name__}")
    return k_prime


def check_alike(result: Any, aggregation: Any, engine: Mapping[str, Any]) -> None:
    """A certificate covers an answer only under the settings it was aggregated with: another
    aggregation, the same with other settings (another alpha, beta, eta or gamma), or an
    engine with other :func:`deciding` settings (the certificate's own calls and decoding use
    the certifying engine's) could answer otherwise, and is refused."""
    if not result.responses:
        return
    if result.aggregation != aggregation.name:
        raise ValueError(
            f"this answer was aggregated by {result.aggregation!r}: certify it with a "
            f"RobustRAG whose aggregation is the same (this one's: {aggregation.name!r})"
        )
    given, own = dict(result.engine or engine), dict(engine)
    if result.settings is not None:
        given.update(_answering(result.settings))
        own.update(_answering(aggregation))
    differ = [
        f"{k}={_shown(given.get(k))} (this one's {_shown(v)})"
        for k, v in own.items()
        if given.get(k) != v
    ]
    if differ:
        raise ValueError(
            f"this answer was given with other settings: {', '.join(differ)}; certify it "
            "with a RobustRAG of the settings it was given with"
        )


def deciding(engine: Any) -> dict[str, Any]:
    """The settings of a :class:`~.engine.RobustRAG` engine, beside its aggregation's, that
    decide an answer: its length cap, isolated prompt and passage cut."""
    return {
        "max_new_tokens": engine.max_new_tokens,
        "isolated_prompt": engine.isolated_prompt,
        "max_passage_chars": engine.max_passage_chars,
    }


def _shown(value: Any, most: int = 60) -> str:
    """``value``'s repr, a long one (a prompt template) cut."""
    text = repr(value)
    return text if len(text) <= most else f"{text[: most - 3]}..."


#: settings that bound a certification's work, not the answer: they may differ
_BUDGETS = frozenset({"max_undecided", "max_certify_calls", "max_certify_responses"})


def _answering(settings: Any) -> dict[str, Any]:
    """The settings of an aggregation that decide its answer."""
    return {
        f.name: getattr(settings, f.name)
        for f in dataclasses.fields(settings)
        if f.name not in _BUDGETS
    }
