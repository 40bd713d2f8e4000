"""The chaos suite's own control plane and the watchers its tests judge the operator by.

The suite starts a cluster of its own (not the session's): one test stops and restarts its API server,
and the load of a few hundred worker pods should not slow the other suites' tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from testcluster.cluster import Cluster, start_cluster
from testcluster.operator_process import OperatorProcess, install_crd

OPERATOR_ARGS = ("--metrics-port", "0", "--resync-seconds", "2")


@pytest.fixture(scope="package")
def chaos_cluster() -> Iterator[Cluster]:
    running = start_cluster(nodes=4)
    try:
        install_crd(running)
        yield running
    finally:
        running.stop_and_verify()


@pytest.fixture
def chaos_namespace(chaos_cluster: Cluster) -> Iterator[str]:
    with chaos_cluster.temporary_namespace("chaos") as name:
        yield name


@pytest.fixture
def operator_factory(chaos_cluster: Cluster, tmp_path: Path) -> Iterator[Callable[..., OperatorProcess]]:
    started: list[OperatorProcess] = []

    def make(*extra: str) -> OperatorProcess:
        process = OperatorProcess(
            chaos_cluster, tmp_path / "operator.log", extra_args=(*OPERATOR_ARGS, *extra)
        )
        process.start()
        started.append(process)
        return process

    yield make
    for process in started:
        process.stop()
