# %% [markdown]
# # LangChain quickstart: a hijacked RAG pipeline, and the one-line fix
#
# An ordinary LangChain pipeline (a Chroma vector store on disk, the packaged all-MiniLM-L6-v2,
# the packaged SmolLM2-135M-Instruct as the model) over a knowledge base into which an attacker
# has planted five PoisonedRAG-style passages per question. Everything runs offline.

# %%
# offline and quiet: every model is loaded from a pip package
from ragdefense.offline import offline

offline()

# %%
import tempfile

import chromadb
from langchain_chroma import Chroma
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda

from langchain_ragdefense import RagdefenseEmbeddings, defend
from ragdefense.data import demo_documents, load_demo_kb
from ragdefense.llm import default_llm

kb = load_demo_kb()
# metadata["source"] as LangChain loaders write it: the benign passages come from reference
# sites, the planted ones from one uploaded file
docs = [Document(text, metadata=meta) for text, meta in demo_documents()]
# Chroma as users start it: a persistent client in a folder (a temporary one here)
client = chromadb.PersistentClient(path=tempfile.mkdtemp(prefix="cookbook-chroma-"))
embeddings = RagdefenseEmbeddings()
store = Chroma.from_documents(docs, embeddings, client=client, collection_name="knowledge")
retriever = store.as_retriever()  # LangChain's default: 4 documents

smol = default_llm()  # SmolLM2-135M-Instruct, converted once from the packaged GGUF


def generate(prompt: str) -> str:
    return smol.generate([str(prompt)])[0].text or ""


llm = RunnableLambda(generate)


def rag(question: str, retriever: BaseRetriever) -> tuple[str, list[Document]]:
    context = retriever.invoke(question)
    prompt = (
        "Context:\n"
        + "\n".join(d.page_content for d in context)
        + f"\n\nAnswer in a few words.\nQuestion: {question}\nAnswer:"
    )
    return llm.invoke(prompt), context


question = kb[0]
print(
    question.question,
    "| correct:",
    question.correct_answer,
    "| attacker:",
    question.incorrect_answer,
)

# %% [markdown]
# ## Without defense: the retriever hands the model mostly poison

# %%
answer, context = rag(question.question, retriever)
print("answer:", answer)
print("hijacked:", question.incorrect_answer in answer)
print(sum(d.metadata["poison"] for d in context), "of", len(context), "passages are poison")

# %% [markdown]
# ## The one-line fix: `retriever = defend(retriever)`
#
# Consensus, the default: it asks the store for a pool of 8 (twice k, at least 8), removes what
# it has evidence against, and returns at most k: here the question's three honest passages,
# once its five planted ones are gone. It reads the documents' `source`, so the five planted
# passages of one upload count as one voice; it reads the vectors Chroma already holds (nothing
# is embedded again) and keeps its verdict in `metadata["ragdefense"]`.

# %%
defended = defend(retriever)
answer, context = rag(question.question, defended)
print("answer:", answer)
print("hijacked:", question.incorrect_answer in answer)
print(sum(d.metadata["poison"] for d in context), "of", len(context), "passages are poison")
for d in context:
    print("-", d.page_content[:80], "|", d.metadata["ragdefense"]["reason"])

# %% [markdown]
# ## The other modes, and what each left over all questions
#
# Here the poison is the majority of what is retrieved (5 of 8 per question). Read as text alone
# (`source_key=None`), the default does not claim that threat model; with the sources it does.
# `"strict"` (RAGDefender) handles a poisoned majority without sources, at a cost on clean
# retrieval; `"grada"` assumes a minority, and it shows.

# %%
modes = {
    "default": defended,
    "text only": defend(retriever, source_key=None),
    "strict": defend(retriever, "strict"),
    "grada": defend(retriever, "grada"),
}
print(f"{'question':50} {'none':>5}", *(f"{m:>9}" for m in modes))
for q in kb:
    plain = sum(d.metadata["poison"] for d in retriever.invoke(q.question))
    left = [sum(d.metadata["poison"] for d in r.invoke(q.question)) for r in modes.values()]
    print(f"{q.question[:50]:50} {plain:>5}", *(f"{n:>9}" for n in left))

# %% [markdown]
# ## Red-team your own pipeline before an attacker does
#
# `red_team(store, targets, chain=...)` plants poison for each target question in a **copy** of
# the store (here: a Chroma collection holding the clean knowledge base; the copy is a collection
# with the same vectors in a Chroma client of the red team's own, over a temporary folder removed
# afterwards; poison written from templates), runs your chain with and
# without the defense, and reports which questions were hijacked. Your collection is not touched.

# %%
from langchain_ragdefense import red_team
from ragdefense import AttackTarget

benign = [d for d in docs if not d.metadata["poison"]]
clean = Chroma.from_documents(benign, embeddings, client=client, collection_name="clean")
targets = [AttackTarget(q.question, q.incorrect_answer, q.correct_answer) for q in kb[:4]]


def my_chain(retriever: BaseRetriever) -> RunnableLambda[str, str]:
    """Your chain, built around whatever retriever it is given."""

    def answer(question: str) -> str:
        return rag(question, retriever)[0]

    return RunnableLambda(answer)


size = clean._collection.count()
report = red_team(clean, targets, n_poison=5, k=8, chain=my_chain)
print(report)
print("collection untouched:", clean._collection.count() == size, f"({size} documents)")
