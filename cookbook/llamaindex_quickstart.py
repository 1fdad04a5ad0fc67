# %% [markdown]
# # LlamaIndex quickstart: `node_postprocessors=[...]` and the RobustRAG synthesizer
#
# The same poisoned knowledge base in a `VectorStoreIndex`. `llm=` and `embed_model=` are always
# passed explicitly: LlamaIndex's `Settings` default to OpenAI, and nothing here touches them.

# %%
# offline and quiet: every model is loaded from a pip package
from ragdefense.offline import offline

offline()

# %%
from typing import Any

from llama_index.core import VectorStoreIndex
from llama_index.core.llms import (
    CompletionResponse,
    CompletionResponseGen,
    CustomLLM,
    LLMMetadata,
)
from llama_index.core.schema import TextNode

from llamaindex_ragdefense import (
    RAGDefenderPostprocessor,
    RagdefenseEmbedding,
    RobustRAGSynthesizer,
)
from ragdefense.data import load_demo_kb
from ragdefense.llm import default_llm

smol = default_llm()


class SmolLM2(CustomLLM):
    """The packaged SmolLM2-135M-Instruct as a LlamaIndex LLM."""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="SmolLM2-135M-Instruct")

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=smol.generate([prompt])[0].text or "")

    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        yield self.complete(prompt)


kb = load_demo_kb()
nodes = [TextNode(text=t, metadata={"poison": False}) for q in kb for t in q.benign]
nodes += [TextNode(text=t, metadata={"poison": True}) for q in kb for t in q.poison]
embed = RagdefenseEmbedding()
index = VectorStoreIndex(nodes, embed_model=embed)
llm = SmolLM2()
question = kb[0]

# %%
plain = index.as_query_engine(llm=llm, similarity_top_k=8).query(question.question)
print(
    "no defense :",
    plain,
    "|",
    sum(n.node.metadata["poison"] for n in plain.source_nodes),
    "poison of",
    len(plain.source_nodes),
)
engine = index.as_query_engine(
    llm=llm, similarity_top_k=8, node_postprocessors=[RAGDefenderPostprocessor(embed_model=embed)]
)
defended = engine.query(question.question)
print(
    "RAGDefender:",
    defended,
    "|",
    sum(n.node.metadata["poison"] for n in defended.source_nodes),
    "poison of",
    len(defended.source_nodes),
)

# %% [markdown]
# ## RobustRAG synthesizer
#
# RobustRAG answers from each passage in isolation and aggregates securely; it is robust when the
# attacker controls a few of the k passages (here: 1 poison among 4).

# %%
rq = kb[1]
small = VectorStoreIndex([TextNode(text=t) for t in rq.benign + rq.poison[:1]], embed_model=embed)
engine = small.as_query_engine(
    llm=llm, similarity_top_k=4, response_synthesizer=RobustRAGSynthesizer(llm=llm, certify=1)
)
response = engine.query(rq.question)
print((response.metadata or {})["ragdefense"])
