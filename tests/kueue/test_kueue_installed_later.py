"""Kueue installed under a running operator: noticed without a restart.

A cluster of its own, without Kueue when the operator starts. A queued TrainingJob (it carries Kueue's
queue-name label) waits saying Kueue is not installed and creates no worker. Then the unmodified Kueue
release is installed and started. The operator asks the API server again every REDISCOVERY_SECONDS, and
once it finds Kueue it starts the Workload informers and plans the held job again. The job gets its
Workload, is admitted, and runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubetrain_operator.runtime import discovery
from kueue_support import FLAVOR_LABELS, kueue_setup
from testcluster import kueue
from testcluster.cluster import Cluster, start_cluster
from testcluster.manifests import trainingjob
from testcluster.operator_process import OperatorProcess, install_crd
from testcluster.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def bare_cluster() -> Iterator[Cluster]:
    running = start_cluster(nodes=1)
    try:
        install_crd(running)
        running.kubectl("label", "nodes", "--all", *(f"{k}={v}" for k, v in FLAVOR_LABELS.items()))
        yield running
    finally:
        running.stop_and_verify()


def test_a_queued_job_waits_for_kueue_and_is_admitted_once_kueue_is_installed_without_an_operator_restart(
    bare_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = bare_cluster
    operator = OperatorProcess(cluster, tmp_path / "operator.log", extra_args=("--resync-seconds", "2"))
    operator.start()
    try:
        with cluster.temporary_namespace("late") as namespace:
            manifest = trainingjob(
                "queued",
                workers=2,
                annotations={"sim.kubetrain.io/hold": "true"},
                resources={"requests": {"cpu": "1"}},
            )
            manifest["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team"}
            cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(manifest))

            def status() -> dict:
                body = cluster.kubectl("-n", namespace, "get", "trainingjob", "queued", "-o", "json")
                return json.loads(body).get("status") or {}

            def held() -> dict | None:
                conditions = {c["type"]: c for c in status().get("conditions") or ()}
                suspended = conditions.get("Suspended") or {}
                return suspended if suspended.get("reason") == "KueueNotInstalled" else None

            condition = wait_for(held, "the queued job held for want of Kueue", 60, explain=operator.log_tail)
            assert "install Kueue" in condition["message"], condition
            assert status()["phase"] == "Suspended"
            assert cluster.kubectl("-n", namespace, "get", "jobs", "-o", "name") == ""

            with kueue.running_kueue(cluster, tmp_path / "kueue"):
                cluster.apply(kueue_setup())
                cluster.apply(
                    {
                        "apiVersion": "kueue.x-k8s.io/v1beta2",
                        "kind": "LocalQueue",
                        "metadata": {"name": "team", "namespace": namespace},
                        "spec": {"clusterQueue": "training"},
                    }
                )
                running = wait_for(
                    lambda: (s := status()).get("phase") == "Running" and s,
                    "the job admitted and Running once Kueue is there",
                    discovery.REDISCOVERY_SECONDS + 120,
                    interval=2,
                    explain=operator.log_tail,
                )
                assert running["restarts"] == 0, running
                workloads = json.loads(
                    cluster.kubectl("-n", namespace, "get", "workloads.kueue.x-k8s.io", "-o", "json")
                )
                admitted = [
                    w
                    for w in workloads["items"]
                    if any(
                        c["type"] == "Admitted" and c["status"] == "True"
                        for c in (w.get("status") or {}).get("conditions", [])
                    )
                ]
                assert len(admitted) == 1, workloads
                assert "Kueue found" in operator.log_tail(1_000_000), operator.log_tail()
    finally:
        operator.stop()
