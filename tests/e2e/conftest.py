"""The real-node cluster the e2e modules share: one control plane with a real kubelet node and the chart
installed, started once per test session (it takes minutes) and only for the modules that ask for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from testcluster import quickstart, workload
from testcluster.cluster import Cluster
from testcluster.node import Node, real_node_cluster


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[tuple[Cluster, Node]]:
    with real_node_cluster() as running:
        yield running


@pytest.fixture(scope="session")
def volumes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The CIFAR sample (read-only data) and an output directory the workers' uid may write."""
    root = tmp_path_factory.mktemp("volumes")
    return {"data": quickstart.extract_sample(root / "data"), "output": root / "output"}


@pytest.fixture(scope="session")
def installed(real_cluster: tuple[Cluster, Node], volumes: dict[str, Path]) -> Cluster:
    """The chart installed as a user would (from a registry, its default images), watching a `restricted`
    namespace that holds the data and output volumes."""
    cluster, node = real_cluster
    quickstart.prepare_namespace(cluster, workload.NAMESPACE, volumes["data"], volumes["output"])
    quickstart.helm_install(cluster, node.registry, [workload.NAMESPACE], logFormat="json")
    return cluster
