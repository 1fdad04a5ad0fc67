"""Write the cookbook notebooks and execute them, saving their outputs.

Run from the repository root: ``.venv/bin/python cookbook/build.py``. The test suite executes
the committed notebooks again (tests/test_cookbook.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).parent


def md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(text.strip())


def code(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(text.strip())


QUIET = code("""
# offline, quiet: every model is loaded from a pip package
import os
import warnings

for key, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
                   "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(key, value)
warnings.filterwarnings("ignore", message="IProgress not found")
""")

LANGCHAIN = [
    md("""
# LangChain quickstart: a hijacked RAG pipeline, and the one-line fix

An ordinary LangChain pipeline (in-memory vector store, the packaged all-MiniLM-L6-v2, the
packaged SmolLM2-135M-Instruct as the model) over a knowledge base into which an attacker has
planted five PoisonedRAG-style passages per question. Everything runs offline.
"""),
    QUIET,
    code("""
from langchain_core.documents import Document
from langchain_core.runnables import RunnableLambda
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_ragdefense import RagdefenseEmbeddings, defend
from ragdefense.demo import load_demo_kb
from ragdefense.llm import default_llm

kb = load_demo_kb()
docs = [Document(t, metadata={"poison": False}) for q in kb for t in q.benign]
docs += [Document(t, metadata={"poison": True}) for q in kb for t in q.poison]
store = InMemoryVectorStore.from_documents(docs, RagdefenseEmbeddings())
retriever = store.as_retriever(search_kwargs={"k": 8})

smol = default_llm()  # SmolLM2-135M-Instruct, converted once from the packaged GGUF
llm = RunnableLambda(lambda prompt: smol.generate([str(prompt)])[0].text)

def rag(question, retriever):
    context = retriever.invoke(question)
    prompt = ("Context:\\n" + "\\n".join(d.page_content for d in context)
              + f"\\n\\nAnswer in a few words.\\nQuestion: {question}\\nAnswer:")
    return llm.invoke(prompt), context

question = kb[0]
print(question.question, "| correct:", question.correct_answer, "| attacker:", question.incorrect_answer)
"""),
    md("## Without defense: the retriever hands the model mostly poison"),
    code("""
answer, context = rag(question.question, retriever)
print("answer:", answer)
print("hijacked:", question.incorrect_answer in answer)
print(sum(d.metadata["poison"] for d in context), "of", len(context), "passages are poison")
"""),
    md(
        "## The one-line fix: `retriever = defend(retriever)` (RAGDefender, the store's own embeddings)"
    ),
    code("""
defended = defend(retriever)
answer, context = rag(question.question, defended)
print("answer:", answer)
print("hijacked:", question.incorrect_answer in answer)
print(sum(d.metadata["poison"] for d in context), "of", len(context), "passages are poison")
for d in context:
    print("-", d.page_content[:80], "|", d.metadata["ragdefense"]["reason"])
"""),
    md("""
## GRADA, and what each defense removed over all questions

`defend(retriever, "grada")` reranks with a graph and keeps half. GRADA assumes the poison is a
minority of the retrieved set; here it is the majority (5 of 8), and it shows.
"""),
    code("""
grada = defend(retriever, "grada")
print(f"{'question':58} {'poison':>6} {'after RAGDefender':>18} {'after GRADA':>12}")
for q in kb:
    plain = sum(d.metadata["poison"] for d in retriever.invoke(q.question))
    rd = sum(d.metadata["poison"] for d in defended.invoke(q.question))
    gr = sum(d.metadata["poison"] for d in grada.invoke(q.question))
    print(f"{q.question[:58]:58} {plain:>6} {rd:>18} {gr:>12}")
"""),
    md("""
## Red-team your own pipeline before an attacker does

`red_team(store, targets, chain=...)` plants poison for each target question in a **copy** of
the store (here: the clean knowledge base, poison written from templates), runs your chain with
and without the defense, and reports which questions were hijacked. Your store is not touched.
"""),
    code("""
from langchain_ragdefense import red_team
from ragdefense import AttackTarget

clean = InMemoryVectorStore.from_documents(
    [d for d in docs if not d.metadata["poison"]], RagdefenseEmbeddings()
)
targets = [AttackTarget(q.question, q.incorrect_answer, q.correct_answer) for q in kb[:4]]

def my_chain(retriever):  # your chain, built around whatever retriever it is given
    return RunnableLambda(lambda question: rag(question, retriever)[0])

size = len(clean.store)
report = red_team(clean, targets, n_poison=5, k=8, chain=my_chain)
print(report)
print("store untouched:", len(clean.store) == size)
"""),
]

LLAMAINDEX = [
    md("""
# LlamaIndex quickstart: `node_postprocessors=[...]` and the RobustRAG synthesizer

The same poisoned knowledge base in a `VectorStoreIndex`. `llm=` and `embed_model=` are always
passed explicitly: LlamaIndex's `Settings` default to OpenAI, and nothing here touches them.
"""),
    QUIET,
    code("""
from typing import Any

from llama_index.core import VectorStoreIndex
from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
from llama_index.core.schema import TextNode

from llamaindex_ragdefense import RAGDefenderPostprocessor, RagdefenseEmbedding, RobustRAGSynthesizer
from ragdefense.demo import load_demo_kb
from ragdefense.llm import default_llm

smol = default_llm()

class SmolLM2(CustomLLM):
    \"\"\"The packaged SmolLM2-135M-Instruct as a LlamaIndex LLM.\"\"\"

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="SmolLM2-135M-Instruct")

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=smol.generate([prompt])[0].text or "")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any):
        yield self.complete(prompt)

kb = load_demo_kb()
nodes = [TextNode(text=t, metadata={"poison": False}) for q in kb for t in q.benign]
nodes += [TextNode(text=t, metadata={"poison": True}) for q in kb for t in q.poison]
embed = RagdefenseEmbedding()
index = VectorStoreIndex(nodes, embed_model=embed)
llm = SmolLM2()
question = kb[0]
"""),
    code("""
plain = index.as_query_engine(llm=llm, similarity_top_k=8).query(question.question)
print("no defense :", plain, "|", sum(n.node.metadata["poison"] for n in plain.source_nodes), "poison of", len(plain.source_nodes))
engine = index.as_query_engine(llm=llm, similarity_top_k=8, node_postprocessors=[RAGDefenderPostprocessor(embed_model=embed)])
defended = engine.query(question.question)
print("RAGDefender:", defended, "|", sum(n.node.metadata["poison"] for n in defended.source_nodes), "poison of", len(defended.source_nodes))
"""),
    md("""
## RobustRAG synthesizer

RobustRAG answers from each passage in isolation and aggregates securely; it is robust when the
attacker controls a few of the k passages (here: 1 poison among 4).
"""),
    code("""
rq = kb[1]
small = VectorStoreIndex([TextNode(text=t) for t in rq.benign + rq.poison[:1]], embed_model=embed)
engine = small.as_query_engine(llm=llm, similarity_top_k=4, response_synthesizer=RobustRAGSynthesizer(llm=llm, certify=1))
response = engine.query(rq.question)
print(response.metadata["ragdefense"])
"""),
]

CERTIFICATION = [
    md("""
# RobustRAG: isolated answers, keyword aggregation, and a certificate, step by step
"""),
    QUIET,
    code("""
from ragdefense import RobustRAG
from ragdefense.demo import load_demo_kb

q = load_demo_kb()[1]
passages = q.benign + q.poison[:1]     # 3 benign passages, 1 injected (retrieval order)
rr = RobustRAG()                        # packaged SmolLM2 + spaCy, alpha=0.3, beta=3
answer = rr.answer(q.question, passages)
for r in answer.responses:
    print(f"[{r.index}] {'abstained' if r.abstained else 'answered '} {r.text}")
"""),
    md("""
**Step 1 — keywords.** From each non-abstaining answer: the answer itself, the lemmas of its
informative words (ADJ, ADV, NOUN, NUM, PROPN, SYM, X) and the phrases they form. Each answer
counts a keyword once.
"""),
    code("""
for kw, count in sorted(answer.keyword_counts.items(), key=lambda kv: -kv[1]):
    print(f"{count}  {kw}")
"""),
    md("""
**Step 2 — threshold.** With n non-abstaining answers, keywords with count >= mu = min(alpha * n,
beta) are kept; the LLM answers from them (sorted).
"""),
    code("""
print("mu =", answer.threshold, "| kept:", answer.kept_keywords)
print("answer:", answer.answer)
"""),
    md("""
**Step 3 — certificate.** With k' = 1 injected passage the attacker pushes out the bottom
passage and adds one answer of its own: it can raise any keyword's count by 1. Keywords that stay
above the threshold are always kept, those that cannot reach it never are; the certificate
enumerates the rest and asks the LLM for each possible keyword set.
"""),
    code("""
certified = rr.certify(answer, 1, gold=[q.correct_answer])
c = certified.certificate
print("certified:", c.certified)
print("why:", c.reason)
print("always kept:", c.always_kept, "| attacker-controlled:", c.undecided)
print("possible answers:", c.possible_answers)
"""),
    md("With 4 passages, k' = 2 is half of them: no certificate is possible, and it says so."),
    code("""
print(rr.certify(answer, 2).certificate.reason)
"""),
]

BENCHMARK = [
    md("""
# Benchmark: every retrieval-level defense on the built-in poisoned knowledge base

`ragdefense bench demo` from Python, then a plot. The shared benchmark data (RAGDefender setting)
is used when present (`RAGDEFENSE_DATA` or `../../shared/data`), and skipped cleanly otherwise.
"""),
    QUIET,
    code("""
%matplotlib inline
import matplotlib.pyplot as plt

from ragdefense.bench import demo_table

rows, table = demo_table()
print(table)
"""),
    code("""
names = [r["defense"] for r in rows]
fig, ax = plt.subplots(figsize=(8, 3))
ax.barh(names, [r["poison_share"] for r in rows], color="tab:red")
ax.set_xlabel("poison share of the context (lower is better)")
ax.invert_yaxis()
plt.tight_layout()
plt.show()
"""),
    code("""
import os
from pathlib import Path

from ragdefense.bench import data_dir, ragdefender_table

folder = data_dir(os.environ.get("RAGDEFENSE_DATA") or Path.cwd().parents[1] / "shared" / "data")
if folder is None:
    print("benchmark data not found: skipping the RAGDefender setting")
else:
    _, table = ragdefender_table(folder, datasets=["nq"], ratios=[1, 4], limit=10, timing_queries=0)
    print(table)
"""),
]

NOTEBOOKS = {
    "langchain_quickstart.ipynb": LANGCHAIN,
    "llamaindex_quickstart.ipynb": LLAMAINDEX,
    "robustrag_certification.ipynb": CERTIFICATION,
    "benchmark.ipynb": BENCHMARK,
}


def build(names: list[str]) -> None:
    for name in names:
        nb = nbformat.v4.new_notebook()
        nb.cells = NOTEBOOKS[name]
        nb.metadata["kernelspec"] = {
            "name": "python3",
            "display_name": "Python 3",
            "language": "python",
        }
        NotebookClient(
            nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}
        ).execute()
        nbformat.write(nb, HERE / name)
        print("written", HERE / name)


if __name__ == "__main__":
    build(sys.argv[1:] or list(NOTEBOOKS))
