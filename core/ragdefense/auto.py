"""Compatibility path: moved to :mod:`ragdefense.defenses.auto` (same objects)."""

from .defenses.auto import *  # noqa: F403
from .defenses.auto import __all__ as __all__
