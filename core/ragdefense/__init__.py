"""ragdefense: defenses for RAG pipelines against knowledge-corruption (poisoning) attacks.

Every defense has one verb, ``defend(query, passages) -> DefenseResult``::

    from ragdefense import RAGDefender
    result = RAGDefender().defend("who wrote Hamlet?", ["passage one", "passage two", ...])
    print(result)            # a per-passage table: score, decision, reason
    context = result.kept    # what to give the generator

and one front door turns a name into a defense: ``ragdefense.defense()`` (the default),
``ragdefense.defense("grada-peel", n=5)``.

``import ragdefense`` loads nothing heavy: each name below is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__

# public name -> the module that defines it
_EXPORTS = {
    "AuditReport": "auditing",
    "AuditSettings": "auditing",
    "audit": "auditing",
    "AutoDefense": "defenses.auto",
    "Consensus": "defenses.consensus",
    "GRADA": "defenses.grada",
    "Quarantine": "defenses.quarantine",
    "RAGDefender": "defenses.ragdefender",
    "defense": "defenses.registry",
    "CallableEmbedder": "embedders",
    "Embedder": "embedders",
    "EmbeddingError": "embedders",
    "LangChainEmbedder": "embedders",
    "LlamaIndexEmbedder": "embedders",
    "SentenceTransformerEmbedder": "embedders",
    "as_embedder": "embedders",
    "default_embedder": "embedders",
    "embed_passages": "embedders",
    "AttackTarget": "redteam",
    "InMemoryKnowledgeBase": "redteam",
    "RedTeamReport": "redteam",
    "RobustAnswer": "robustrag.types",
    "RobustRAG": "robustrag.engine",
    "KeywordAggregation": "robustrag.keyword_aggregation",
    "MajorityVote": "robustrag.majority_vote",
    "SecureDecoding": "robustrag.secure_decoding",
    "Defense": "types",
    "DefenseFailed": "types",
    "DefenseInputError": "types",
    "QueryInputError": "types",
    "DefenseResult": "types",
    "Passage": "types",
    "PassageLike": "types",
    "Verdict": "types",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ragdefense' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:  # static view of the lazy names, for type checkers and IDEs
    from .auditing import AuditReport as AuditReport
    from .auditing import AuditSettings as AuditSettings
    from .auditing import audit as audit
    from .defenses.auto import AutoDefense as AutoDefense
    from .defenses.consensus import Consensus as Consensus
    from .defenses.grada import GRADA as GRADA
    from .defenses.quarantine import Quarantine as Quarantine
    from .defenses.ragdefender import RAGDefender as RAGDefender
    from .defenses.registry import defense as defense
    from .embedders import CallableEmbedder as CallableEmbedder
    from .embedders import Embedder as Embedder
    from .embedders import EmbeddingError as EmbeddingError
    from .embedders import LangChainEmbedder as LangChainEmbedder
    from .embedders import LlamaIndexEmbedder as LlamaIndexEmbedder
    from .embedders import SentenceTransformerEmbedder as SentenceTransformerEmbedder
    from .embedders import as_embedder as as_embedder
    from .embedders import default_embedder as default_embedder
    from .embedders import embed_passages as embed_passages
    from .redteam import AttackTarget as AttackTarget
    from .redteam import InMemoryKnowledgeBase as InMemoryKnowledgeBase
    from .redteam import RedTeamReport as RedTeamReport
    from .robustrag.engine import RobustRAG as RobustRAG
    from .robustrag.keyword_aggregation import KeywordAggregation as KeywordAggregation
    from .robustrag.majority_vote import MajorityVote as MajorityVote
    from .robustrag.secure_decoding import SecureDecoding as SecureDecoding
    from .robustrag.types import RobustAnswer as RobustAnswer
    from .types import Defense as Defense
    from .types import DefenseFailed as DefenseFailed
    from .types import DefenseInputError as DefenseInputError
    from .types import DefenseResult as DefenseResult
    from .types import Passage as Passage
    from .types import PassageLike as PassageLike
    from .types import QueryInputError as QueryInputError
    from .types import Verdict as Verdict
