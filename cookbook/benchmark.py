# %% [markdown]
# # Benchmark: every retrieval-level defense on the built-in poisoned knowledge base
#
# `ragdefense bench demo` from Python, then a plot. The shared benchmark data (RAGDefender setting)
# is used when present (`RAGDEFENSE_DATA` or `../../shared/data`), and skipped cleanly otherwise.

# %%
# offline and quiet: every model is loaded from a pip package
from ragdefense.offline import offline

offline()

# %%
# %matplotlib inline
import matplotlib.pyplot as plt

from ragdefense.bench import demo_table

rows, table = demo_table()
print(table)

# %%
names = [r["defense"] for r in rows]
fig, ax = plt.subplots(figsize=(8, 3))
ax.barh(names, [r["poison_share"] for r in rows], color="tab:red")
ax.set_xlabel("poison share of the context (lower is better)")
ax.invert_yaxis()
plt.tight_layout()
plt.show()

# %%
import os
from pathlib import Path

from ragdefense.bench import data_dir, ragdefender_table

folder = data_dir(os.environ.get("RAGDEFENSE_DATA") or Path.cwd().parents[1] / "shared" / "data")
if folder is None:
    print("benchmark data not found: skipping the RAGDefender setting")
else:
    _, table = ragdefender_table(folder, datasets=["nq"], ratios=[1, 4], limit=10, timing_queries=0)
    print(table)
