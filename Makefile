# Two entry points for a newcomer: `make quickstart` (the embedded ladder on CPU) and `make test`.
# Both create .venv and install into it on first use, with constraints.txt pinning torch to the CPU wheel.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# pip byte-compiles every module it installs (torch, sympy, transformers, ...: about 40 CPU-seconds, over a third of
# the install); with --no-compile Python compiles only the modules a command imports, on first use (about 10 s, once).
# Where Python never writes bytecode (PYTHONDONTWRITEBYTECODE set, as in many container images) pip compiles as usual:
# there every command would otherwise compile its imports again.
PIP_NO_COMPILE := $(if $(PYTHONDONTWRITEBYTECODE),,--no-compile)
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check $(PIP_NO_COMPILE) -c constraints.txt
# Two stamps: the quickstart needs the package alone (about 20 s less to install on a fresh clone); the tests, the
# linter, the documentation site and the optional integrations they cover need the extras too.
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
DEV_EXTRAS ?= test,wandb,hello-agents
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: quickstart test install clean embedded-base

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PIP_INSTALL) -e ".[$(DEV_EXTRAS)]"
	touch $(DEV_STAMP)

install: $(DEV_STAMP)

quickstart: $(STAMP)
	$(VENV)/bin/agentic-rl quickstart $(ARGS)

# Test tiers (pyproject.toml markers): `make test` runs unit + stage tests; `make test TIERS="unit or stage or slow"`
# runs every tier (what CI runs).
TIERS ?= unit or stage
test: $(DEV_STAMP)
	$(PY) -m pytest -m "$(TIERS)" $(PYTEST_ARGS)

# Rebuilds the embedded base shipped in the package (two pretraining phases, about two CPU hours; one thread, for a
# bit-identical rebuild).
embedded-base: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) scripts/build_embedded_base.py $(ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
