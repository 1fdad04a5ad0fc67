"""Import cost: wall time of ``import <module>`` in a fresh interpreter (median of repeats), for
the core and the adapters. ``import ragdefense`` loads nothing heavy: the names it exports load
their modules on first use."""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from ..report import markdown_table

__all__ = ["import_table"]

MODULES = (
    "ragdefense",
    "ragdefense.defenses",
    "ragdefense.robustrag",
    "langchain_ragdefense",
    "llama_index.postprocessor.ragdefense",
)

_PROBE = "import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"


def import_seconds(module: str, repeats: int = 5) -> list[float]:
    """Seconds to import ``module`` in ``repeats`` fresh interpreters."""
    out = []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", _PROBE.format(module=module)],
            capture_output=True,
            text=True,
            check=True,
        )
        out.append(float(done.stdout.strip().splitlines()[-1]))
    return out


def import_table(
    modules: Sequence[str] = MODULES, repeats: int = 5
) -> tuple[list[dict[str, Any]], str]:
    """Median and worst import time of each module (a fresh interpreter per import)."""
    rows = []
    for module in modules:
        try:
            times = import_seconds(module, repeats)
        except subprocess.CalledProcessError as exc:  # an adapter whose framework is missing
            rows.append({"module": module, "error": exc.stderr.strip().splitlines()[-1]})
            continue
        rows.append({"module": module, "median_s": statistics.median(times), "max_s": max(times)})
    table = [
        [r["module"], f"{r['median_s']:.3f}", f"{r['max_s']:.3f}"]
        if "error" not in r
        else [r["module"], "-", r["error"]]
        for r in rows
    ]
    lines = [
        f"Import time in a fresh interpreter, {repeats} runs each (seconds):",
        "",
        *markdown_table(["module", "median", "max"], table),
    ]
    return rows, "\n".join(lines)
