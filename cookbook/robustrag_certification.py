# %% [markdown]
# # RobustRAG: isolated answers, keyword aggregation, and a certificate, step by step

# %%
# offline and quiet: every model is loaded from a pip package
from ragdefense.offline import offline

offline()

# %%
from ragdefense import RobustRAG
from ragdefense.data import load_demo_kb

q = load_demo_kb()[1]
passages = q.benign + q.poison[:1]  # 3 benign passages, 1 injected (retrieval order)
rr = RobustRAG()  # packaged SmolLM2 + spaCy, alpha=0.3, beta=3
answer = rr.answer(q.question, passages)
for r in answer.responses:
    print(f"[{r.index}] {'abstained' if r.abstained else 'answered '} {r.text}")

# %% [markdown]
# **Step 1 — keywords.** From each non-abstaining answer: the answer itself, the lemmas of its
# informative words (ADJ, ADV, NOUN, NUM, PROPN, SYM, X) and the phrases they form. Each answer
# counts a keyword once.

# %%
for kw, count in sorted(answer.keyword_counts.items(), key=lambda kv: -kv[1]):
    print(f"{count}  {kw}")

# %% [markdown]
# **Step 2 — threshold.** With n non-abstaining answers, keywords with count >= mu = min(alpha * n,
# beta) are kept; the LLM answers from them (sorted).

# %%
print("mu =", answer.threshold, "| kept:", answer.kept_keywords)
print("answer:", answer.answer)

# %% [markdown]
# **Step 3 — certificate.** With k' = 1 injected passage the attacker pushes out the bottom
# passage and adds one answer of its own: it can raise any keyword's count by 1. Keywords that stay
# above the threshold are always kept, those that cannot reach it never are; the certificate
# enumerates the rest and asks the LLM for each possible keyword set.

# %%
certified = rr.certify(answer, 1, gold=[q.correct_answer])
c = certified.certificate
assert c is not None  # certify() always attaches one
print("certified:", c.certified)
print("why:", c.reason)
print("always kept:", c.always_kept, "| attacker-controlled:", c.undecided)
print("possible answers:", c.possible_answers)

# %% [markdown]
# With 4 passages, k' = 2 is half of them: an attacker with half the passages decides a vote
# or a keyword count, so no certificate is given there, and it says so.

# %%
refused = rr.certify(answer, 2).certificate
assert refused is not None
print(refused.reason)
