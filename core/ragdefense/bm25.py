"""Compatibility path: moved to :mod:`ragdefense.similarity` (same objects)."""

from .similarity import *  # noqa: F403
from .similarity import __all__ as __all__
