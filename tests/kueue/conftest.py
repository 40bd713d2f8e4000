"""The Kueue suite's own control plane, with an unmodified Kueue release and the operator beside it.

A cluster of its own: Kueue's webhooks intercept every batch Job, and its queues would hold the other
suites' TrainingJobs. The operator starts after Kueue, so it finds Kueue's Workload API served.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kueue_support import FLAVOR_LABELS, kueue_setup
from testcluster import kueue
from testcluster.cluster import Cluster, start_cluster
from testcluster.operator_process import OperatorProcess, install_crd


@pytest.fixture(scope="package")
def kueue_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = start_cluster(nodes=2)
    try:
        install_crd(running)
        running.kubectl("label", "nodes", "--all", *(f"{k}={v}" for k, v in FLAVOR_LABELS.items()))
        with kueue.running_kueue(running, Path(tmp_path_factory.mktemp("kueue"))):
            running.apply(kueue_setup())
            yield running
    finally:
        running.stop_and_verify()


@pytest.fixture(scope="package")
def kueue_operator(
    kueue_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    log = Path(tmp_path_factory.mktemp("operator")) / "operator.log"
    process = OperatorProcess(kueue_cluster, log, extra_args=("--resync-seconds", "2", "--metrics-port", "0"))
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def queue_namespace(kueue_cluster: Cluster) -> Iterator[str]:
    """A namespace with a LocalQueue `team` feeding the ClusterQueue `training`."""
    with kueue_cluster.temporary_namespace("kq") as name:
        kueue_cluster.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "team", "namespace": name},
                "spec": {"clusterQueue": "training"},
            }
        )
        yield name
