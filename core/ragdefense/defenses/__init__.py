"""The retrieval-level defenses (no LLM call): :class:`Consensus` (the default),
:class:`RAGDefender`, :class:`GRADA`, :class:`AutoDefense`, :class:`Quarantine` (an audit's
findings before any of them), and :mod:`.registry`, the one table of names and presets."""

from .auto import AutoDefense
from .consensus import Consensus
from .grada import GRADA
from .quarantine import Quarantine
from .ragdefender import RAGDefender

__all__ = ["GRADA", "AutoDefense", "Consensus", "Quarantine", "RAGDefender"]
