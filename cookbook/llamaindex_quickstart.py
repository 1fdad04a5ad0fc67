# %% [markdown]
# # LlamaIndex quickstart: `node_postprocessors=[...]` and the RobustRAG synthesizer
#
# The same poisoned knowledge base in a `VectorStoreIndex` over Chroma (a persistent client in a
# folder, as users start it). `llm=` and `embed_model=` are always passed explicitly: LlamaIndex's
# `Settings` default to OpenAI, and nothing here touches them.

# %%
# offline and quiet: every model is loaded from a pip package
from ragdefense.offline import offline

offline()

# %%
import tempfile
from typing import Any

import chromadb
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.llms import (
    CompletionResponse,
    CompletionResponseGen,
    CustomLLM,
    LLMMetadata,
)
from llama_index.core.schema import TextNode
from llama_index.vector_stores.chroma import ChromaVectorStore

from llama_index.postprocessor.ragdefense import (
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
client = chromadb.PersistentClient(path=tempfile.mkdtemp(prefix="cookbook-chroma-"))
chroma = ChromaVectorStore(chroma_collection=client.get_or_create_collection("knowledge"))
storage = StorageContext.from_defaults(vector_store=chroma)
index = VectorStoreIndex(nodes, storage_context=storage, embed_model=embed)
llm = SmolLM2()
question = kb[0]

# %% [markdown]
# ## Without and with `RAGDefenderPostprocessor`
#
# A postprocessor cannot widen retrieval, so ask for enough nodes (`similarity_top_k=8`; the
# LlamaIndex default is 2). `vector_store=index.vector_store` lets the defense read the vectors
# Chroma holds instead of embedding the retrieved nodes again.

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
    llm=llm,
    similarity_top_k=8,
    node_postprocessors=[
        RAGDefenderPostprocessor(embed_model=embed, vector_store=index.vector_store)
    ],
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

# %% [markdown]
# ## Red-team the index before an attacker does
#
# `red_team(index, targets)` plants poison for each target in a **copy** of the index (for Chroma:
# a collection holding the same vectors in a Chroma client of the red team's own, over a temporary
# folder removed afterwards) and reports which questions are hijacked
# with and without the defense. The user's collection is not touched.

# %%
from llama_index.postprocessor.ragdefense import red_team
from ragdefense import AttackTarget

collection = client.get_or_create_collection("clean")
clean = VectorStoreIndex(
    [TextNode(text=t) for q in kb for t in q.benign],
    storage_context=StorageContext.from_defaults(vector_store=ChromaVectorStore(collection)),
    embed_model=embed,
)
targets = [AttackTarget(q.question, q.incorrect_answer, q.correct_answer) for q in kb[:4]]
size = collection.count()
report = red_team(clean, targets, n_poison=5, k=4)
print(report)
print("collection untouched:", collection.count() == size, f"({size} nodes)")
