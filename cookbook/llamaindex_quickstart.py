# %% [markdown]
# # LlamaIndex quickstart: `defend(index)`, node postprocessors and the RobustRAG synthesizer
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
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import TextNode
from llama_index.vector_stores.chroma import ChromaVectorStore

from llama_index.postprocessor.ragdefense import (
    ConsensusPostprocessor,
    RAGDefenderPostprocessor,
    RagdefenseEmbedding,
    RobustRAGSynthesizer,
    defend,
)
from ragdefense.data import demo_documents, load_demo_kb
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
# LlamaIndex readers record where a document came from (file_name, url, ...): here "source"
# (reference sites for the benign passages, one upload for the planted ones). Only the text is
# embedded, and the demo's labels stay out of the prompt.
nodes = [
    TextNode(
        text=text,
        metadata=meta,
        excluded_embed_metadata_keys=["q", "poison", "source"],
        excluded_llm_metadata_keys=["q", "poison"],
    )
    for text, meta in demo_documents()
]
embed = RagdefenseEmbedding()
client = chromadb.PersistentClient(path=tempfile.mkdtemp(prefix="cookbook-chroma-"))
chroma = ChromaVectorStore(chroma_collection=client.get_or_create_collection("knowledge"))
storage = StorageContext.from_defaults(vector_store=chroma)
index = VectorStoreIndex(nodes, storage_context=storage, embed_model=embed)
llm = SmolLM2()
question = kb[0]


def show(label: str, response: Any) -> None:
    """The answer, and how many of the nodes it was given are planted."""
    nodes = response.source_nodes
    poison = sum(n.node.metadata["poison"] for n in nodes)
    print(f"{label}: {str(response).strip()[:70]!r} | {poison} poison of {len(nodes)}")


# %% [markdown]
# ## Without a defense, then the one line: `defend(index)`
#
# LlamaIndex retrieves 2 nodes by default: here both are planted. `defend(index)` returns a
# retriever that asks the index for the pool the defense needs (twice `similarity_top_k`, at least
# 8), removes what it has evidence against and returns at most `similarity_top_k` nodes. The
# default (Consensus) reads the nodes' `source`, so the five planted passages of one upload count
# as one voice; it reads the vectors Chroma holds instead of embedding the nodes again.

# %%
show("no defense", index.as_query_engine(llm=llm).query(question.question))
defended = RetrieverQueryEngine.from_args(defend(index), llm=llm).query(question.question)
show("defend(index)", defended)
for n in defended.source_nodes:
    print("-", n.node.get_content()[:70], "|", n.node.metadata["ragdefense"]["reason"])

# %% [markdown]
# ## As a node postprocessor, and the other modes
#
# A postprocessor cannot widen retrieval, so ask for enough nodes (`similarity_top_k=8`).
# `vector_store=index.vector_store` lets it read the vectors Chroma holds. The modes by name, as
# with `defend(index, "strict")`: `"strict"` (RAGDefender) assumes a poisoned majority without
# sources, at a cost on clean retrieval.

# %%
for label, post in [
    ("Consensus (default)", ConsensusPostprocessor(vector_store=index.vector_store)),
    ("RAGDefender (strict)", RAGDefenderPostprocessor(vector_store=index.vector_store)),
]:
    engine = index.as_query_engine(llm=llm, similarity_top_k=8, node_postprocessors=[post])
    show(label, engine.query(question.question))

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
