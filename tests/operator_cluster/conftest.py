"""The operator as a real process, watching every namespace of the session's test cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from testcluster import processes
from testcluster.cluster import Cluster
from testcluster.operator_process import OperatorProcess, install_crd


@pytest.fixture(scope="session")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    install_crd(cluster)
    log = Path(tmp_path_factory.mktemp("operator")) / "operator.log"
    process = OperatorProcess(
        cluster,
        log,
        extra_args=("--resync-seconds", "2", "--log-format", "json"),
        metrics_port=processes.free_port(),
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()
