"""Compatibility path: this module moved to :mod:`ragdefense.bench.suite` (same objects)."""

from .bench.datasets import available_datasets
from .bench.suite import *  # noqa: F403
from .bench.suite import __all__ as _suite_all

__all__ = [*_suite_all, "available_datasets"]
