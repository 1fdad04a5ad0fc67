# %% [markdown]
# # Benchmark: every retrieval-level defense on the built-in poisoned knowledge base
#
# `python -m benchmarks demo` from Python, then a plot. The harness lives in the repository's
# `benchmarks/` folder (it is not in the wheels): run this notebook from a checkout. The shared
# benchmark data (RAGDefender setting) is used when present (`RAGDEFENSE_DATA` or
# `../../shared/data`), and skipped cleanly otherwise.

# %%
# offline and quiet: every model is loaded from a pip package
import sys
from pathlib import Path

from ragdefense.offline import offline

offline()
# the repository root, where benchmarks/ lives: this folder's parent in the notebook, the
# working folder itself when the source runs from the root
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "benchmarks").is_dir())
sys.path.insert(0, str(ROOT))

# %%
# %matplotlib inline
import matplotlib.pyplot as plt

from benchmarks import demo_table

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

from benchmarks import data_dir, ragdefender_table

folder = data_dir(os.environ.get("RAGDEFENSE_DATA") or ROOT.parent / "shared" / "data")
if folder is None:
    print("benchmark data not found: skipping the RAGDefender setting")
else:
    _, table = ragdefender_table(folder, datasets=["nq"], ratios=[1, 4], limit=10, timing_queries=0)
    print(table)
