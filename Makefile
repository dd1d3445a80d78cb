# Two commands do all the set-up on a fresh machine:
#   make demo   creates .venv, installs nemo-telemetry, runs the main job
#   make test   creates/updates .venv, installs what the tests need, runs the whole suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip

.PHONY: demo test install install-test browser clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Stamp files: reinstall only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install --quiet -e '.[ray,http,plot]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(PIP) install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# The HTML waterfall is tested in Debian's Chromium; install it where missing (needs root).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); \
	  else echo "chromium is missing and this is not root: install Debian's chromium package"; fi; }

# The main job: an instrumented GRPO run on this machine, then its goodput report (kept in demo-out/).
demo: install
	$(BIN)/nemo-telemetry demo

test: install-test browser
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info
