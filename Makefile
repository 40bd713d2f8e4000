# kubetrain developer entry points. `make demo` and `make test` work on a fresh machine: each creates or
# refreshes the virtualenv and builds (once, cached by version) the Kubernetes binaries the tests use.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv binaries test lint unit demo cluster-up cluster-down cluster-status crds

# The stamp is newer than pyproject.toml once its dependencies are installed; editing it reinstalls.
$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[operator,trainer,dev]"
	@touch $@

venv: $(VENV)/.installed

binaries:
	bash hack/build-k8s.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The whole suite: lint, unit, distributed (multi-process torch) and cluster tests.
test: venv binaries lint
	$(BIN)/python -m pytest

unit: venv
	$(BIN)/python -m pytest -m unit

demo: venv
	bash hack/demo.sh

crds: venv
	$(BIN)/kubetrain crds

cluster-up: venv binaries
	@PYTHONPATH=tests $(BIN)/python -m testcluster up

cluster-down: venv
	@PYTHONPATH=tests $(BIN)/python -m testcluster down

cluster-status: venv
	@PYTHONPATH=tests $(BIN)/python -m testcluster status
