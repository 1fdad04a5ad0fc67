"""The research harness that reproduces the README's tables from the shared data (not shipped:
it lives in the repository, runs as ``python -m benchmarks <setting>`` or ``make bench``, and is
tested): data (:mod:`.datasets`), cases (:mod:`.cases`), running defenses on them
(:mod:`.runner`), tables (:mod:`.report`), one module per benchmark setting (:mod:`.settings`),
the suite (:mod:`.suite`) and the command line (:mod:`.cli`).

The names below are importable from ``benchmarks`` (each loads its module on first use).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "datasets": (
        "BUNDLES DataError QARecord available_datasets data_dir load_poisonedrag load_qa "
        "load_ragdefender load_realtimeqa"
    ),
    "cases": (
        "RAGDEFENDER_BASE RAGDEFENDER_K Case attack_passages demo_cases ragdefender_cases "
        "realtimeqa_cases retrieved_case suite_cases"
    ),
    "runner": (
        "CaseDefense CaseOutcome context_indices evaluate no_defense on_case progress_bar "
        "resolve_defense run_case run_cases summarize"
    ),
    "report": "cell markdown_table plot_rows",
    "settings.ragdefender": "RAGDEFENDER_REFERENCE ragdefender_table run_ragdefender_bench",
    "settings.grada": "GRADA_REFERENCE grada_table grada_variants run_realtimeqa_bench",
    "settings.auto": "auto_table auto_variants",
    "settings.robustrag": "robustrag_table",
    "settings.demo": "demo_table",
    "suite": "DEFAULT_DEFENSES DEFENSES SuiteResult run_suite",
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names.split()}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'benchmarks' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
