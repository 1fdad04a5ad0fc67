"""Compatibility path: moved to :mod:`ragdefense.defenses.grada` (same objects)."""

from .defenses.grada import *  # noqa: F403
from .defenses.grada import __all__ as __all__
