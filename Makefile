# kubetrain developer entry points. `make demo` and `make test` work on a fresh machine: each creates or
# refreshes the virtualenv and builds (once, cached by version) the Kubernetes binaries the tests use.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv system-packages binaries images test lint unit demo demo-cluster cluster-up cluster-down cluster-status crds

# The stamp is newer than pyproject.toml once its dependencies are installed; editing it reinstalls.
$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[operator,trainer,dev]"
	@touch $@

venv: $(VENV)/.installed

system-packages:
	bash hack/install-system-packages.sh

binaries:
	bash hack/build-k8s.sh

# The operator and trainer images, built with podman from the two Dockerfiles (cached by content).
images: system-packages
	bash hack/build-images.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The whole suite: lint, unit, distributed (multi-process torch), cluster and real-node (e2e) tests.
test: venv system-packages binaries images lint
	$(BIN)/python -m pytest

unit: venv
	$(BIN)/python -m pytest -m unit

demo: venv
	bash hack/demo.sh

# A one-node cluster with real containers, the chart installed, the CPU example trained on it.
demo-cluster: venv system-packages binaries images
	PYTHONPATH=tests $(BIN)/python -m testcluster demo

crds: venv
	$(BIN)/kubetrain crds

cluster-up: venv binaries
	@PYTHONPATH=tests $(BIN)/python -m testcluster up

cluster-down: venv
	@PYTHONPATH=tests $(BIN)/python -m testcluster down

cluster-status: venv
	@PYTHONPATH=tests $(BIN)/python -m testcluster status
