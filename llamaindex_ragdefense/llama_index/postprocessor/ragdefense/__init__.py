"""LlamaIndex integration of ragdefense.

```python
engine = RetrieverQueryEngine.from_args(defend(index), llm=llm)  # fetches the pool, returns k
engine = index.as_query_engine(
    llm=llm, similarity_top_k=8, node_postprocessors=[ConsensusPostprocessor()]
)
engine = index.as_query_engine(llm=llm, response_synthesizer=RobustRAGSynthesizer(llm=llm))
engine = RobustRAGQueryEngine.from_args(index.as_retriever(similarity_top_k=10), llm=llm)
```

Pass ``llm=`` (and ``embed_model=`` when building the index) explicitly: LlamaIndex's
``Settings`` default to OpenAI, and nothing here touches them. The adapters only convert types;
every algorithm lives in :mod:`ragdefense`.
"""

from ._version import __version__
from .embeddings import RagdefenseEmbedding
from .postprocessors import (
    AutoDefensePostprocessor,
    ConsensusPostprocessor,
    DefensePostprocessor,
    DefenseRemovedEvent,
    GRADAPostprocessor,
    RAGDefenderPostprocessor,
)
from .redteam import red_team
from .retrievers import DefendedRetriever, defend
from .synthesizer import RobustRAGQueryEngine, RobustRAGSynthesizer

__all__ = [
    "AutoDefensePostprocessor",
    "ConsensusPostprocessor",
    "DefendedRetriever",
    "DefensePostprocessor",
    "DefenseRemovedEvent",
    "GRADAPostprocessor",
    "RAGDefenderPostprocessor",
    "RagdefenseEmbedding",
    "RobustRAGQueryEngine",
    "RobustRAGSynthesizer",
    "__version__",
    "defend",
    "red_team",
]
