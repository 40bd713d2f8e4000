"""Shared fixtures: one real control plane per test session, a fresh namespace per test."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from testcluster.cluster import Cluster, start_cluster


def _interrupt_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # pytest turns KeyboardInterrupt into an orderly shutdown that runs fixture teardown; a plain
    # SIGTERM (CI timeouts, `kill`) would otherwise skip it and leave the cluster's processes behind.
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)


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
