"""Audit a whole knowledge base for planted poison, before any user asks (``ragdefense audit``).

```python
import ragdefense

report = ragdefense.audit("chunks.jsonl", workdir="audit/")   # or a vector store, an index
print(report)                                                # the most suspicious chunks, why
report.write("audit/", ["md", "json", "csv", "parquet", "png"])
```

What it computes is an :class:`AuditSettings` (``audit(kb, AuditSettings(top_m=20))``, or the
same fields as keywords: ``audit(kb, top_m=20)``).

On one machine by default; ``engine="ray"`` runs the same steps on Ray Data.
"""

from .corpus import Batch, Corpus, FileCorpus, ListCorpus, as_corpus, read_queries
from .engines import Engine, LocalEngine, RayEngine
from .evidence import Scoring
from .pipeline import audit
from .probes import derive_probes
from .report import AuditReport, Finding
from .settings import AuditSettings

__all__ = [
    "AuditReport",
    "AuditSettings",
    "Batch",
    "Corpus",
    "Engine",
    "FileCorpus",
    "Finding",
    "ListCorpus",
    "LocalEngine",
    "RayEngine",
    "Scoring",
    "as_corpus",
    "audit",
    "derive_probes",
    "read_queries",
]
