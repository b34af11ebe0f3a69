# Entry points, used by the README's Quickstart and by CI (.ci/run):
#   make demo   installs the package into .venv-demo (the newest transformers line we serve,
#               5.25, with huggingface_hub 2.x, which sees the Hub's `kernel` repositories) and
#               runs the main job
#   make test   installs the three test environments (at once) and the local Hub test server, then
#               runs the tests, each run spread over the cores by pytest-xdist (PYTEST_WORKERS)
#   make lint   installs the test environment, then runs ruff and the type checker (mypy)
#
# The clients we support conflict, so each gets its own environment (docs/transformers.md):
#   .venv      transformers 4.57 with huggingface_hub 0.x: the whole suite runs here (Hub tests
#              that need the `kernel` repo type skip: huggingface_hub 0.x does not know it)
#   .venv-tf5  transformers 5.25 with huggingface_hub 2.x and the olah test server: the Hub tests
#              and the transformers 5.x tests
#   .venv-hf   Hugging Face's own `kernels` client (HF_KERNELS_VERSION), without this package: the
#              interoperability tests (tests/interop) load our kernel repositories through it
#
# torch, triton and numpy, the largest and the same in all three (2 GB unpacked, ~1 CPU-minute
# an environment), are installed once, into .venv-torch, which each environment reads through a
# .pth file in its site-packages (`torch-base.pth`): pip there finds them installed and leaves
# them (a requirement they miss would be installed in the environment itself, ahead of them on
# sys.path). Their console scripts (torchrun) stay in .venv-torch/bin: use `python -m
# torch.distributed.run`. On a machine without torch, the CPU build of torch is installed there
# first: a bare `torch` requirement would otherwise pull a multi-GB CUDA build.

PYTHON ?= python3
# Python writes each module's bytecode the first time a process imports it, even where the
# environment says not to (PYTHONDONTWRITEBYTECODE): the suite starts some hundred processes that
# import the package, torch and transformers, and each would compile what it imports again. pip
# installs without compiling (--no-compile: compiling every module of torch and both transformers
# costs more than a minute of CPU, and the tests import a fraction of them). __pycache__ folders
# are ignored by git.
export PYTHONDONTWRITEBYTECODE :=
PIP_INSTALL := -m pip install -q --no-compile
# What every test process imports, imported once after install so its bytecode is written by
# one process: else the runs' first workers, starting together, each compile the same modules
# (some 15 CPU-seconds a process on the 2-core CI machine).
WARM_IMPORTS := import torch, triton, numpy, transformers, huggingface_hub, pytest, xdist, hypothesis, kernels, kernels.library
VENV ?= .venv
DEMO_VENV ?= .venv-demo
TF5_VENV ?= .venv-tf5
HF_VENV ?= .venv-hf
BASE_VENV ?= .venv-torch
# The newest release of Hugging Face's client that our kernel repositories are checked against.
HF_KERNELS_VERSION ?= 0.19.1
TORCH_CPU_VERSION ?= 2.13.0
PYTEST_ARGS ?=
# pytest-xdist's worker processes of the main run ("auto": one a CPU core; 0 runs in this process).
# Workers take tests one by one and steal queued ones when idle, so a slow test at the end of a
# worker's share does not leave the other cores waiting.
PYTEST_WORKERS ?= auto
# The transformers 5.x run is mostly Hub tests, which wait on the test server and on
# huggingface_hub's retries (about 23 s a request while the server is down). It runs beside the
# main run, which fills the cores while it waits, so it takes one worker a core too: each worker
# more costs its own imports and collection (some 25 CPU-seconds). A PYTEST_WORKERS other than
# auto holds here too.
TF5_WORKERS ?= $(PYTEST_WORKERS)
XDIST := --dist worksteal
# What runs in the transformers 5.x environment (the rest of the suite does not depend on it).
TF5_TESTS ?= tests/repos/hub tests/clients/transformers5 tests/distributed

BIN := $(VENV)/bin
DEMO_BIN := $(DEMO_VENV)/bin
TF5_BIN := $(TF5_VENV)/bin
OLAH := $(abspath $(TF5_BIN))/olah-cli
HF_BIN := $(HF_VENV)/bin
BASE_BIN := $(BASE_VENV)/bin
BASE := $(BASE_VENV)/.installed-base
# Whether torch is installed, without the seconds of importing it.
HAS_TORCH = import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)
# Makes the environment of python $(1) read .venv-torch's packages (after its own).
PURELIB = import sysconfig; print(sysconfig.get_paths()['purelib'])
share_base = $(1) -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'torch-base.pth').write_text('$$($(BASE_BIN)/python -c "$(PURELIB)")\n')"
# A virtual environment $(1) with the newest pip. ensurepip, which `python -m venv` runs, compiles
# every module of the pip it bundles (some 7 CPU-seconds an environment, 4 environments): the
# environment is made without it, and the system's pip (22.3 or later: --python) installs pip
# into it; where that pip is missing or older, ensurepip does after all.
new_venv = echo "new environment $(1)" && $(PYTHON) -m venv --without-pip $(1) && \
	{ $(PYTHON) -m pip --python $(1)/bin/python install -q --no-compile --upgrade pip 2>/dev/null || \
	{ $(1)/bin/python -m ensurepip && $(1)/bin/python $(PIP_INSTALL) --upgrade pip; }; }

.PHONY: install install-test install-tf5 install-hf install-all hub-server demo test test-4 test-5 test-hf test-hf-suite test-hf-suite-update library binaries lint clean

# torch, and triton with numpy, by two pips at once: each is some 13 s of unpacking on one core
# (nothing else runs yet), they share no package (the CPU build of torch does not require
# triton), and neither constrains the other's version.
$(BASE):
	@$(call new_venv,$(BASE_VENV))
	$(BASE_BIN)/python $(PIP_INSTALL) "torch==$(TORCH_CPU_VERSION)" & torch=$$!; \
	$(BASE_BIN)/python $(PIP_INSTALL) "triton>=3.1" numpy; others=$$?; \
	wait $$torch && [ $$others -eq 0 ]
	$(BASE_BIN)/python -c "import torch, triton, numpy"
	@touch $@

$(BIN)/python: | $(BASE)
	@$(call new_venv,$(VENV))
	@$(call share_base,$(BIN)/python)

$(DEMO_BIN)/python: | $(BASE)
	@$(call new_venv,$(DEMO_VENV))
	@$(call share_base,$(DEMO_BIN)/python)

$(TF5_BIN)/python: | $(BASE)
	@$(call new_venv,$(TF5_VENV))
	@$(call share_base,$(TF5_BIN)/python)

$(HF_BIN)/python: | $(BASE)
	@$(call new_venv,$(HF_VENV))
	@$(call share_base,$(HF_BIN)/python)

# Each environment's installed extras are marked by a stamp file inside it, newer than
# pyproject.toml (and this Makefile, which pins versions): a second `make test` or `make lint`
# skips pip (the package itself is installed editable, so source changes need no install), and
# an edit of the requirements installs again.
install: $(DEMO_VENV)/.installed-demo
install-test: $(VENV)/.installed-test
install-tf5: $(TF5_VENV)/.installed-test-tf5
install-hf: $(HF_VENV)/.installed-hf

# The three test environments at once: pip's resolving and unpacking of one overlap
# the others' (the environments share nothing but pip's cache, which pip locks).
install-all:
	$(MAKE) -j3 --output-sync=target install-test install-tf5 install-hf

$(DEMO_VENV)/.installed-demo: $(DEMO_BIN)/python pyproject.toml Makefile
	@$(DEMO_BIN)/python -c "$(HAS_TORCH)" || $(DEMO_BIN)/python $(PIP_INSTALL) "torch==$(TORCH_CPU_VERSION)"
	$(DEMO_BIN)/python $(PIP_INSTALL) -e ".[demo]"
	@touch $@

$(VENV)/.installed-test: $(BIN)/python pyproject.toml Makefile
	@$(BIN)/python -c "$(HAS_TORCH)" || $(BIN)/python $(PIP_INSTALL) "torch==$(TORCH_CPU_VERSION)"
	$(BIN)/python $(PIP_INSTALL) -e ".[test]"
	$(BIN)/python -c "$(WARM_IMPORTS)"
	@touch $@

$(TF5_VENV)/.installed-test-tf5: $(TF5_BIN)/python pyproject.toml Makefile
	@$(TF5_BIN)/python -c "$(HAS_TORCH)" || $(TF5_BIN)/python $(PIP_INSTALL) "torch==$(TORCH_CPU_VERSION)"
	$(TF5_BIN)/python $(PIP_INSTALL) -e ".[test-tf5]"
	$(TF5_BIN)/python -c "$(WARM_IMPORTS)"
	@touch $@

# Hugging Face's client without this package (both are the `kernels` distribution), so the
# interoperability tests import theirs; triton, which the CPU build of torch does not pull in,
# runs our kernels through its interpreter (which needs numpy). Their own test suite's extras
# (sigstore, mktestdocs, pytest-xdist) let `make test-hf-suite-update` run it against their
# client too, which shows which of their tests need the network.
$(HF_VENV)/.installed-hf: $(HF_BIN)/python Makefile
	@$(HF_BIN)/python -c "$(HAS_TORCH)" || $(HF_BIN)/python $(PIP_INSTALL) "torch==$(TORCH_CPU_VERSION)"
	$(HF_BIN)/python $(PIP_INSTALL) "kernels[sigstore]==$(HF_KERNELS_VERSION)" "triton>=3.1" numpy \
		"pytest>=8" "pytest-xdist>=3.2" "mktestdocs>=0.2.5"
	@touch $@

# The Hub-compatible test server (olah) lives in the transformers 5.x environment, whose
# huggingface_hub it accepts; the 4.57 environment's tests start it from there.
hub-server: install-tf5

demo: install
	$(DEMO_BIN)/kernels demo

# The runs side by side, each spread over every core by its workers, their output kept
# apart (--output-sync: each run's printed when it ends). Side by side, the CPU work of one fills
# the time the other spends waiting (the Hub tests wait on the test server and on retries), which
# one after the other left the cores idle. The interoperability tests (a few seconds) run in one
# process; Hugging Face's own suite (test-hf-suite) is the fourth run. The environments install in the same make, so a run starts as soon as its own are
# ready (test-4 needs the 4.57 one and the test server's): the installs leave a core partly idle,
# which the first runs fill.
test:
	$(MAKE) -j3 --output-sync=target test-4 test-5 test-hf test-hf-suite

test-4: install-test hub-server
	KERNELS_TEST_OLAH=$(OLAH) $(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(XDIST) $(PYTEST_ARGS)

test-5: install-tf5
	KERNELS_TEST_OLAH=$(OLAH) $(TF5_BIN)/python -m pytest -n $(TF5_WORKERS) $(XDIST) $(TF5_TESTS) $(PYTEST_ARGS)

test-hf: install-hf
	$(HF_BIN)/python -m pytest tests/interop $(PYTEST_ARGS)

# Hugging Face's own test suite of their client (HF_KERNELS_VERSION), from its sdist (fetched
# once into .cache/hf-suite/), run offline against this package in the transformers 5.x
# environment; the tests of tests/hf_suite/expected_failures.yaml are skipped or strict xfails,
# any other failure fails (docs/hub.md, "How the oracle runs"). HF_SUITE_ARGS: pytest's
# arguments for this run only (a file or -k selection).
HF_SUITE_WORKERS ?= $(PYTEST_WORKERS)
HF_SUITE_ARGS ?=
test-hf-suite: install-tf5
	$(TF5_BIN)/python -m tests.hf_suite.run --workers $(HF_SUITE_WORKERS) $(HF_SUITE_ARGS)

# Refreshes expected_failures.yaml: the suite against ours and against their client (.venv-hf),
# listed reasons kept (tests/hf_suite/update.py).
test-hf-suite-update: install-tf5 install-hf
	$(TF5_BIN)/python -m tests.hf_suite.update --theirs-python $(abspath $(HF_BIN))/python --workers $(HF_SUITE_WORKERS)

# Each kernel repository's build/<variant>/ folders, from its torch-ext/ source and the shared
# files in library/_shared/ (library/build.py), for whoever wants the folders: git ignores them,
# and nothing reads them (the package builds what it loads into a verified cache, the wheel's
# build hook into the wheel, `kernels upload` into a staged copy; docs/writing-kernels.md).
# Needs torch and triton (symbols.json imports each package); LIBRARY_ARGS=--no-symbols does not.
LIBRARY_ARGS ?=
library:
	$(PYTHON) library/build.py $(LIBRARY_ARGS)

# The library's Triton binaries for every Triton version the supported torch releases pin and
# every Python we serve, compiled on this machine's CPU from the launches a GPU capture recorded
# (library/<repo>/binaries-launches.json; docs/writing-kernels.md, Shipped Triton binaries).
# Each Triton is installed for each Python (pip, into ~/.cache/kernels/binaries-build); the
# interpreters must be on PATH. Needs torch and a C compiler in the running environment.
BINARY_TRITONS ?= 3.6.0 3.9.0
BINARY_PYTHONS ?= python3.10 python3.11 python3.12 python3.13
binaries: install-test
	$(BIN)/python library/binaries.py build --triton $(BINARY_TRITONS) --python $(BINARY_PYTHONS)

# Ruff over everything; mypy over the package (its settings: [tool.mypy] in pyproject.toml).
lint: install-test
	$(BIN)/ruff check kernels tests library benchmarks
	$(BIN)/ruff format --check kernels tests library benchmarks
	$(BIN)/python -m mypy

clean:
	rm -rf $(VENV) $(DEMO_VENV) $(TF5_VENV) $(HF_VENV) $(BASE_VENV) .pytest_cache .mypy_cache
