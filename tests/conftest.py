"""Shared fixtures (one real control plane per test session, a fresh namespace per test, the built helm)
and the rule that every test says what it runs.

Each test carries at least one of the markers in KINDS (pyproject.toml describes them), so that `make unit`
(`-m "unit and not binaries and not trains"`) selects what it claims and no test runs only in `make test`
by accident; a test that takes a built tool's fixture must be marked `binaries`.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from testcluster import binaries
from testcluster.cluster import Cluster, start_cluster

KINDS = ("unit", "binaries", "trains", "distributed", "cluster", "e2e")
"""What a test needs to run; every test names at least one."""
BINARY_FIXTURES = frozenset({"helm_bin", "promtool", "actionlint"})
"""Fixtures that build a Go tool on first use (hack/build-*.sh): a test that takes one is marked `binaries`
(or `cluster` or `e2e`, which need the built control plane anyway)."""


def _interrupt_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # pytest turns KeyboardInterrupt into an orderly shutdown that runs fixture teardown; a plain
    # SIGTERM (CI timeouts, `kill`) would otherwise skip it and leave the cluster's processes behind.
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    # A shell starts a background job (`make test &`, nohup) with SIGINT ignored, and an ignored signal
    # stays ignored in every child across exec: the tests that press Ctrl-C on a kubetrain command would
    # find it deaf. A handled signal is reset to its default at exec, so handling it here gives each child
    # the SIGINT a terminal gives it.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse the session, before any selection by marker, when a test does not say what it runs."""
    unsaid = [item.nodeid for item in items if not any(item.get_closest_marker(kind) for kind in KINDS)]
    unbuilt = [
        item.nodeid
        for item in items
        if BINARY_FIXTURES & set(getattr(item, "fixturenames", ()))
        and not any(item.get_closest_marker(kind) for kind in ("binaries", "cluster", "e2e"))
    ]
    problems = [f"{nodeid}: marked none of {', '.join(KINDS)}" for nodeid in unsaid]
    problems += [
        f"{nodeid}: builds a Go tool but is not marked binaries (nor cluster, e2e)" for nodeid in unbuilt
    ]
    if problems:
        raise pytest.UsageError("tests that do not say what they run:\n  " + "\n  ".join(problems))


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    """helm v3 from the cached Kubernetes binaries (hack/build-k8s.sh: built once, like the control plane)."""
    return binaries.ensure_binaries() / "helm"


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A control plane with three Ready kwok nodes, stopped (and checked to be gone) at session end."""
    running = start_cluster(nodes=3)
    try:
        yield running
    finally:
        running.stop_and_verify()


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace of its own for each test, deleted afterwards (without waiting for finalization)."""
    with cluster.temporary_namespace("t") as name:
        yield name
