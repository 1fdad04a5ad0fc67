"""Compatibility path: moved to :mod:`ragdefense.robustrag.keywords` (same objects)."""

from .robustrag.keywords import *  # noqa: F403
from .robustrag.keywords import __all__ as __all__
