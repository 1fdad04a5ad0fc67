"""Compatibility path: moved to :mod:`ragdefense.defenses.ragdefender` (same objects)."""

from .defenses.ragdefender import *  # noqa: F403
from .defenses.ragdefender import __all__ as __all__
