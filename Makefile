# Two entry points, used by the README's Quickstart and by CI (.ci/run):
#   make demo   installs the package into .venv and runs the main job
#   make test   installs the package with its test extra, the local Hub test server, and runs the tests
#
# On a machine without torch, the CPU build of torch is installed first: a bare `torch`
# requirement would otherwise pull a multi-GB CUDA build.

PYTHON ?= python3
VENV ?= .venv
HUB_VENV ?= .venv-hub
TORCH_CPU_VERSION ?= 2.13.0
OLAH_VERSION ?= 0.5.4
PYTEST_ARGS ?=

BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

.PHONY: install install-test hub-server demo test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

install: $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null || $(PIP) install -q "torch==$(TORCH_CPU_VERSION)"
	$(PIP) install -q -e ".[demo]"

install-test: $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null || $(PIP) install -q "torch==$(TORCH_CPU_VERSION)"
	$(PIP) install -q -e ".[test]"

# The Hub-compatible test server (olah) needs a newer huggingface_hub than transformers 4.57
# allows, so it lives in a virtual environment of its own; the tests start it from there.
$(HUB_VENV)/bin/olah-cli:
	$(PYTHON) -m venv $(HUB_VENV)
	$(HUB_VENV)/bin/python -m pip install -q --upgrade pip
	$(HUB_VENV)/bin/python -m pip install -q "olah==$(OLAH_VERSION)"

hub-server: $(HUB_VENV)/bin/olah-cli

demo: install
	$(BIN)/kernels demo

test: install-test hub-server
	KERNELS_TEST_OLAH=$(abspath $(HUB_VENV))/bin/olah-cli $(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install-test
	$(BIN)/ruff check kernels tests library benchmarks
	$(BIN)/ruff format --check kernels tests library benchmarks

clean:
	rm -rf $(VENV) $(HUB_VENV) .pytest_cache
