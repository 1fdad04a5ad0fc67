"""LangChain integration of ragdefense: one line in an existing pipeline.

```python
retriever = ContextualCompressionRetriever(
    base_compressor=RAGDefenderCompressor(), base_retriever=retriever
)
retriever = defend(retriever)                      # RAGDefender by default
chain = RobustRAGChain.from_llm(llm, retriever)    # isolate-then-aggregate answers
```

The adapters only convert types; every algorithm lives in :mod:`ragdefense`.
"""

from ._version import __version__
from .chain import RobustRAGChain
from .compressors import (
    AutoDefenseCompressor,
    DefenseCompressor,
    GRADACompressor,
    RAGDefenderCompressor,
)
from .embeddings import RagdefenseEmbeddings
from .redteam import red_team
from .retrievers import DefendedRetriever, defend

__all__ = [
    "AutoDefenseCompressor",
    "DefendedRetriever",
    "DefenseCompressor",
    "GRADACompressor",
    "RAGDefenderCompressor",
    "RagdefenseEmbeddings",
    "RobustRAGChain",
    "__version__",
    "defend",
    "red_team",
]
