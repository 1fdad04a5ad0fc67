"""The retrieval-level defenses (no LLM call): :class:`RAGDefender`, :class:`GRADA`,
:class:`AutoDefense`, and :mod:`.registry`, the one table of names and presets."""

from .auto import AutoDefense
from .grada import GRADA
from .ragdefender import RAGDefender

__all__ = ["GRADA", "AutoDefense", "RAGDefender"]
