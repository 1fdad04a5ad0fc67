"""Alias of :mod:`llama_index.postprocessor.ragdefense` (the import path of earlier releases).

``import llamaindex_ragdefense`` and ``from llamaindex_ragdefense.postprocessors import ...`` give
the same objects as the LlamaIndex-style path.
"""

import importlib
import sys

from llama_index.postprocessor.ragdefense import *  # noqa: F403
from llama_index.postprocessor.ragdefense import __all__ as __all__
from llama_index.postprocessor.ragdefense import __version__ as __version__

for _sub in ("embeddings", "postprocessors", "redteam", "retrievers", "synthesizer", "vectors"):
    _module = importlib.import_module(f"llama_index.postprocessor.ragdefense.{_sub}")
    sys.modules[f"{__name__}.{_sub}"] = _module
    globals()[_sub] = _module
