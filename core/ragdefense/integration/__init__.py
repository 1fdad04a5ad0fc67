"""The adapter contract: what the framework adapters (LangChain, LlamaIndex) use of the core,
one module per concern:

- :mod:`.adapter`: the core defense behind a compressor or postprocessor (built from its fields,
  run fail-open or fail-closed, warning once when handed too few passages), the fields the
  per-defense classes declare, the RobustRAG engine behind a chain or synthesizer;
- :mod:`.retrieval`: how much a defended retriever fetches (the pool, the rounds);
- :mod:`.records`: the items checked, the namespaced metadata on returned copies, the report
  of what was removed;
- :mod:`.vectors`: the vectors a store already holds for the retrieved documents.

Adapters use these modules and the public names of :mod:`ragdefense`; the core reaches the
adapters only through :mod:`ragdefense.plugins`.
"""
