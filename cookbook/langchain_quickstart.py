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
from ragdefense.data import load_demo_kb
from ragdefense.llm import default_llm

kb = load_demo_kb()
docs = [Document(t, metadata={"poison": False}) for q in kb for t in q.benign]
docs += [Document(t, metadata={"poison": True}) for q in kb for t in q.poison]
# Chroma as users start it: a persistent client in a folder (a temporary one here)
client = chromadb.PersistentClient(path=tempfile.mkdtemp(prefix="cookbook-chroma-"))
embeddings = RagdefenseEmbeddings()
store = Chroma.from_documents(docs, embeddings, client=client, collection_name="knowledge")
retriever = store.as_retriever(search_kwargs={"k": 8})

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
# RAGDefender by default; it reads the vectors Chroma already holds for the retrieved documents
# (nothing is embedded again) and keeps its verdict in `metadata["ragdefense"]`.

# %%
defended = defend(retriever)
answer, context = rag(question.question, defended)
print("answer:", answer)
print("hijacked:", question.incorrect_answer in answer)
print(sum(d.metadata["poison"] for d in context), "of", len(context), "passages are poison")
for d in context:
    print("-", d.page_content[:80], "|", d.metadata["ragdefense"]["reason"])

# %% [markdown]
# ## GRADA, and what each defense removed over all questions
#
# `defend(retriever, "grada")` reranks with a graph and keeps half. GRADA assumes the poison is a
# minority of the retrieved set; here it is the majority (5 of 8), and it shows.

# %%
grada = defend(retriever, "grada")
print(f"{'question':58} {'poison':>6} {'after RAGDefender':>18} {'after GRADA':>12}")
for q in kb:
    plain = sum(d.metadata["poison"] for d in retriever.invoke(q.question))
    rd = sum(d.metadata["poison"] for d in defended.invoke(q.question))
    gr = sum(d.metadata["poison"] for d in grada.invoke(q.question))
    print(f"{q.question[:58]:58} {plain:>6} {rd:>18} {gr:>12}")

# %% [markdown]
# ## Red-team your own pipeline before an attacker does
#
# `red_team(store, targets, chain=...)` plants poison for each target question in a **copy** of
# the store (here: a Chroma collection holding the clean knowledge base; the copy is an in-memory
# collection with the same vectors, poison written from templates), runs your chain with and
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
