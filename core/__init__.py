"""ragdefense: defenses for RAG pipelines against knowledge-corruption (poisoning) attacks.

Every defense has one verb, ``defend(query, passages) -> DefenseResult``::

    from ragdefense import RAGDefender
    result = RAGDefender().defend("who wrote Hamlet?", ["passage one", "passage two", ...])
    print(result)            # a per-passage table: score, decision, reason
    context = result.kept    # what to give the generator
"""

from .auto import AutoDefense
from .embedders import (
    CallableEmbedder,
    Embedder,
    EmbeddingError,
    LangChainEmbedder,
    LlamaIndexEmbedder,
    SentenceTransformerEmbedder,
    as_embedder,
    default_embedder,
    embed_passages,
)
from .grada import GRADA
from .ragdefender import RAGDefender
from .redteam import AttackTarget, InMemoryKnowledgeBase, RedTeamReport
from .robustrag import RobustAnswer, RobustRAG
from .types import DefenseFailed, DefenseInputError, DefenseResult, Passage, PassageLike, Verdict

__version__ = "0.1.0"

__all__ = [
    "GRADA",
    "AttackTarget",
    "AutoDefense",
    "CallableEmbedder",
    "DefenseFailed",
    "DefenseInputError",
    "DefenseResult",
    "Embedder",
    "EmbeddingError",
    "InMemoryKnowledgeBase",
    "LangChainEmbedder",
    "LlamaIndexEmbedder",
    "Passage",
    "PassageLike",
    "RAGDefender",
    "RedTeamReport",
    "RobustAnswer",
    "RobustRAG",
    "SentenceTransformerEmbedder",
    "Verdict",
    "__version__",
    "as_embedder",
    "default_embedder",
    "embed_passages",
]
