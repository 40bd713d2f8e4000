# kubetrain developer entry points. `make demo` and `make test` work on a fresh machine: each creates or
# refreshes the virtualenv and builds (once, cached by version) the Kubernetes binaries the tests use.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# The version, written once: pyproject.toml's. The images are tagged and the chart packaged with it;
# tests/release/test_version.py fails when any other copy (chart, image defaults, README) drifts from it.
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
# The images' home; `make push` tags them for REGISTRY instead.
IMAGE_REGISTRY := ghcr.io/kubetrain
# docker when a Docker engine answers, else podman as this project runs it (hack/podman, a base made from
# Debian packages: hack/build-images.sh). Asked once, on first use, so other targets never ask docker.
CONTAINER_ENGINE ?= $(eval CONTAINER_ENGINE := $(if $(shell docker info >/dev/null 2>&1 && echo up),docker,podman))$(CONTAINER_ENGINE)
ENGINE_CLI = $(if $(filter docker,$(CONTAINER_ENGINE)),docker,hack/podman)
HELM ?= helm
DIST ?= dist

.PHONY: venv system-packages binaries images node-images push chart push-chart version test lint unit demo demo-cluster cluster-up cluster-down cluster-status crds

# push and push-chart need a destination; say so before building anything.
ifneq ($(filter push push-chart,$(MAKECMDGOALS)),)
ifeq ($(REGISTRY),)
$(error REGISTRY is empty: make push REGISTRY=ghcr.io/you (images), make push-chart REGISTRY=oci://ghcr.io/you/charts)
endif
endif

# The stamp is newer than pyproject.toml once its dependencies are installed; editing it reinstalls.
$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[operator,trainer,dev]"
	@touch $@

venv: $(VENV)/.installed

system-packages:
	bash hack/install-system-packages.sh

# The test cluster's binaries; the tools only some tests need (Kueue, promtool, ...) build on first use.
binaries:
	bash hack/build-k8s.sh

version:
	@echo $(VERSION)

# The operator and trainer images, $(IMAGE_REGISTRY)/kubetrain-<name>:$(VERSION), built from the two
# Dockerfiles with CONTAINER_ENGINE (docker or podman, see above).
images:
	$(if $(filter podman,$(CONTAINER_ENGINE)),bash hack/install-system-packages.sh)
	CONTAINER_ENGINE=$(CONTAINER_ENGINE) bash hack/build-images.sh

# The images the tests' real node pulls, built and pushed to the test cluster's registry (its storage in
# the build cache; a registry on a loopback port takes the push): always podman's, from the project's own
# storage (cached by content), whatever engine `make images` picks.
node-images: venv system-packages
	PYTHONPATH=tests $(BIN)/python -m testcluster push-images

# Both images as $(REGISTRY)/kubetrain-<name>:$(VERSION), e.g. make push REGISTRY=registry.example.com/ml
# (log in first: docker login / hack/podman login).
push: images
	$(ENGINE_CLI) tag $(IMAGE_REGISTRY)/kubetrain-operator:$(VERSION) $(REGISTRY)/kubetrain-operator:$(VERSION)
	$(ENGINE_CLI) tag $(IMAGE_REGISTRY)/kubetrain-trainer:$(VERSION) $(REGISTRY)/kubetrain-trainer:$(VERSION)
	$(ENGINE_CLI) push $(REGISTRY)/kubetrain-operator:$(VERSION)
	$(ENGINE_CLI) push $(REGISTRY)/kubetrain-trainer:$(VERSION)

# The chart as $(DIST)/kubetrain-$(VERSION).tgz (its Chart.yaml carries the same version).
chart:
	$(HELM) package charts/kubetrain --destination $(DIST)

# The packaged chart as an OCI artifact: make push-chart REGISTRY=oci://ghcr.io/you/charts, then
# helm install kubetrain oci://ghcr.io/you/charts/kubetrain --version $(VERSION) (helm registry login first).
push-chart: chart
	$(HELM) push $(DIST)/kubetrain-$(VERSION).tgz $(REGISTRY)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The whole suite: lint, unit, distributed (multi-process torch), cluster and real-node (e2e) tests. Cold,
# the builds overlap: the tools tests build on first use (Kueue among them) start in the background at
# the lowest CPU priority, and the images build beside the Kubernetes binaries (each build holds its own
# lock; warm, all of it is a few seconds of cache checks).
test: venv system-packages lint
	PYTHONPATH=tests $(BIN)/python -m testcluster build-in-background
	$(MAKE) --no-print-directory -j2 binaries node-images
	$(BIN)/python -m pytest

# The fast tests: no Go, no built binary, no cluster, no training run (about a minute on 2 cores).
unit: venv
	$(BIN)/python -m pytest -m "unit and not binaries and not trains"

demo: venv
	bash hack/demo.sh

# A one-node cluster with real containers, the chart installed, the CPU example trained on it.
demo-cluster: venv system-packages binaries node-images
	PYTHONPATH=tests $(BIN)/python -m testcluster demo

crds: venv
	$(BIN)/kubetrain crds

cluster-up: venv binaries
	@PYTHONPATH=tests $(BIN)/python -m testcluster up

cluster-down: venv
	@PYTHONPATH=tests $(BIN)/python -m testcluster down

cluster-status: venv
	@PYTHONPATH=tests $(BIN)/python -m testcluster status
