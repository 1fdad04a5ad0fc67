"""LangChain integration of ragdefense: one line in an existing pipeline.

Three ways in, each on your own retriever (alternatives, not steps):

```python
defended = defend(retriever)                       # Consensus, the default
compressed = ContextualCompressionRetriever(       # needs the [classic] extra
    base_compressor=ConsensusCompressor(), base_retriever=retriever
)
chain = RobustRAGChain.from_llm(llm, retriever)    # isolate-then-aggregate answers
```

The adapters only convert types; every algorithm lives in :mod:`ragdefense`.
"""

from ._version import __version__
from .chain import RobustRAGChain, RobustRAGOutput, RobustRAGQuestion
from .compressors import (
    EVENT_NAME,
    AutoDefenseCompressor,
    ConsensusCompressor,
    DefenseCompressor,
    GRADACompressor,
    RAGDefenderCompressor,
)
from .embeddings import RagdefenseEmbeddings
from .redteam import red_team
from .retrievers import DefendedRetriever, defend

__all__ = [
    "EVENT_NAME",
    "AutoDefenseCompressor",
    "ConsensusCompressor",
    "DefendedRetriever",
    "DefenseCompressor",
    "GRADACompressor",
    "RAGDefenderCompressor",
    "RagdefenseEmbeddings",
    "RobustRAGChain",
    "RobustRAGOutput",
    "RobustRAGQuestion",
    "__version__",
    "defend",
    "red_team",
]
