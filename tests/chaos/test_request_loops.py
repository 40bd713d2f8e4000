"""Requests counted in the API server's audit log, where a fake client could not prove their absence."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from chaos_support import trainingjob, writes_by
from testcluster.cluster import Cluster
from testcluster.operator_process import OperatorProcess
from testcluster.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

OPERATOR = "kubetrain-operator/"
"""The operator's user agent starts so (then its version and replica identity)."""


def test_a_finished_kubernetes_gang_job_is_deleted_by_its_ttl_with_no_request_loop(
    chaos_cluster: Cluster,
    chaos_namespace: str,
    operator_factory: Callable[..., OperatorProcess],
    audit_log: Path,
) -> None:
    """Its gang Workload (scheduling.k8s.io) was once filed with Kueue's: a finished job then patched a
    Kueue Workload status that does not exist, got 404, and asked again five times a second, for ever,
    and its TTL never applied."""
    operator = operator_factory()
    since = datetime.now(UTC).replace(microsecond=0)
    manifest = trainingjob("gang-done", annotations={"sim.kubetrain.io/run-for": "1s"})
    manifest["spec"]["gangScheduling"] = {"provider": "kubernetes"}
    manifest["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = 3
    chaos_cluster.kubectl("-n", chaos_namespace, "apply", "-f", "-", input_text=json.dumps(manifest))

    def deleted() -> bool:
        found = chaos_cluster.kubectl("-n", chaos_namespace, "get", "tj", "--ignore-not-found", "-o", "name")
        return "gang-done" not in found

    wait_for(deleted, "gang-done to be deleted by its TTL", 90, explain=operator.log_tail)
    time.sleep(5)  # a loop would go on writing after the job is gone
    writes = writes_by(audit_log, OPERATOR, since)
    assert any(w.startswith("create workloads/gang-done") for w in writes), writes
    assert [w for w in writes if w.startswith(("patch workloads", "update workloads"))] == [], writes
    assert len(writes) < 20, writes
