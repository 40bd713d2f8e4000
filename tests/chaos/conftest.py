"""The chaos suite's own control plane and the watchers its tests judge the operator by.

The suite starts a cluster of its own (not the session's): one test stops and restarts its API server,
and the load of a few hundred worker pods should not slow the other suites' tests. Its API server keeps
an audit log of the writes an operator makes (`chaos_support.AUDIT_POLICY`), so a test can tell which
replica wrote what, and when.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from chaos_support import AUDIT_POLICY
from testcluster.cluster import Cluster, start_cluster
from testcluster.operator_process import OperatorProcess, install_crd

OPERATOR_ARGS = ("--metrics-port", "0", "--resync-seconds", "2")


@pytest.fixture(scope="package")
def audit_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the chaos cluster's API server writes its audit log (JSON lines)."""
    return tmp_path_factory.mktemp("audit") / "audit.log"


@pytest.fixture(scope="package")
def chaos_cluster(audit_log: Path) -> Iterator[Cluster]:
    policy = audit_log.with_name("policy.yaml")
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    audit_flags = [f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}"]
    running = start_cluster(nodes=4, extra_args={"kube-apiserver": audit_flags})
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
