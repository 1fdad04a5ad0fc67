"""One module per benchmark setting, each with its runner and its table: ``ragdefender`` (the
RAGDefender paper's setting), ``grada`` (RealtimeQA top 10), ``auto`` (both, with the ablation),
``robustrag`` (with an LLM) and ``demo`` (the built-in knowledge base)."""
