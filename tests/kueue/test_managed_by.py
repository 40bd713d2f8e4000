"""spec.managedBy: a TrainingJob another controller manages (MultiKueue's dispatcher, say) is left alone."""

from __future__ import annotations

import json

import pytest
from testcluster.cluster import Cluster
from testcluster.manifests import trainingjob
from testcluster.operator_process import OperatorProcess
from testcluster.waiting import wait_for

pytestmark = pytest.mark.cluster


def test_a_trainingjob_managed_by_another_controller_gets_no_workers_and_no_status_written(
    kueue_cluster: Cluster, queue_namespace: str, kueue_operator: OperatorProcess
) -> None:
    """Applied together with one the operator runs: once that one has finished (so both were reconciled
    from the same events), the other still has neither status nor children."""
    elsewhere = trainingjob("elsewhere", workers=2, managedBy="kueue.x-k8s.io/multikueue")
    ours = trainingjob("ours", workers=2, annotations={"sim.kubetrain.io/run-for": "1s"})
    for manifest in (elsewhere, ours):
        kueue_cluster.kubectl("-n", queue_namespace, "apply", "-f", "-", input_text=json.dumps(manifest))

    def get(*args: str) -> dict:
        return json.loads(kueue_cluster.kubectl("-n", queue_namespace, "get", *args, "-o", "json"))

    wait_for(
        lambda: (get("trainingjob", "ours").get("status") or {}).get("phase") == "Succeeded",
        "the operator's own TrainingJob to succeed",
        90,
        explain=kueue_operator.log_tail,
    )
    assert get("trainingjob", "elsewhere")["status"] == {"phase": "Pending"}  # the CRD's default only
    for kind in ("jobs", "services", "workloads.kueue.x-k8s.io"):
        assert get(kind, "-l", "kubetrain.io/job-name=elsewhere")["items"] == []
    edited = kueue_cluster.run_kubectl(
        "-n",
        queue_namespace,
        "patch",
        "trainingjob",
        "elsewhere",
        "--type=merge",
        "-p",
        '{"spec":{"managedBy":null}}',
    )
    assert edited.returncode != 0 and "spec.managedBy is immutable" in edited.stderr
