"""Elastic TrainingJobs on a real API server, reconciled by the operator as a real process.

kwok plays the kubelet (tests/testcluster/kwok.yaml), so these tests stop at what the control plane and
the operator do: the scale subresource and its validation, the rendezvous-store Job, one Job per worker
created, replaced or removed alone, status.elastic and events. What torchrun does with those pods (the
re-rendezvous, training on) is proven with real processes in tests/localrun/test_localrun_elastic.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from testcluster.cluster import Cluster, KubectlError
from testcluster.manifests import trainingjob
from testcluster.operator_process import OperatorProcess
from testcluster.waiting import wait_for

pytestmark = pytest.mark.cluster

HOLD = {"sim.kubetrain.io/hold": "true"}


def _get(cluster: Cluster, namespace: str, *args: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("-n", namespace, "get", *args, "-o", "json"))


def _job_names(cluster: Cluster, namespace: str, name: str) -> set[str]:
    items = _get(cluster, namespace, "jobs", "-l", f"kubetrain.io/job-name={name}")["items"]
    return {j["metadata"]["name"] for j in items if not j["metadata"].get("deletionTimestamp")}


def _wait_jobs(
    cluster: Cluster, namespace: str, name: str, expected: set[str], operator: OperatorProcess
) -> None:
    wait_for(
        lambda: _job_names(cluster, namespace, name) == expected,
        f"Jobs {sorted(expected)}",
        90,
        explain=lambda: f"Jobs {sorted(_job_names(cluster, namespace, name))}\n{operator.log_tail()}",
    )


def _members(cluster: Cluster, namespace: str, name: str) -> list[int] | None:
    return ((_get(cluster, namespace, "tj", name).get("status") or {}).get("elastic") or {}).get("members")


def test_kubectl_scale_adds_and_removes_workers_and_a_lost_worker_is_replaced_alone(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    manifest = trainingjob(
        "stretchy", workers=2, annotations=HOLD, elastic={"minWorkers": 2, "maxWorkers": 3}
    )
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(manifest))
    _wait_jobs(
        cluster, namespace, "stretchy", {"stretchy-rdzv", "stretchy-r0-w0", "stretchy-r0-w1"}, operator
    )
    wait_for(lambda: _members(cluster, namespace, "stretchy") == [0, 1], "members [0, 1]", 90)

    cluster.kubectl("-n", namespace, "scale", "tj/stretchy", "--replicas=3")
    _wait_jobs(
        cluster,
        namespace,
        "stretchy",
        {"stretchy-rdzv", "stretchy-r0-w0", "stretchy-r0-w1", "stretchy-r0-w2"},
        operator,
    )
    wait_for(lambda: _members(cluster, namespace, "stretchy") == [0, 1, 2], "members [0, 1, 2]", 90)

    cluster.kubectl("-n", namespace, "scale", "tj/stretchy", "--replicas=2")
    _wait_jobs(
        cluster, namespace, "stretchy", {"stretchy-rdzv", "stretchy-r0-w0", "stretchy-r0-w1"}, operator
    )

    scale = json.loads(cluster.kubectl("-n", namespace, "get", "--raw", _scale_path(namespace, "stretchy")))
    assert scale["spec"]["replicas"] == 2

    # Worker 0 (the first rendezvous host of a fixed-size job) fails with the retryable code 11: kwok ends
    # its pod so once it is no longer held. Worker 0 alone comes back as a new attempt; worker 1's Job is
    # never touched.
    worker1 = _get(cluster, namespace, "job", "stretchy-r0-w1")["metadata"]["uid"]
    cluster.kubectl(
        "-n",
        namespace,
        "annotate",
        "pod",
        "-l",
        "kubetrain.io/job-name=stretchy,kubetrain.io/worker-index=0",
        "sim.kubetrain.io/hold-",
        "sim.kubetrain.io/exit-code=11",
    )
    wait_for(
        lambda: any(
            n.endswith("-w0") and n != "stretchy-r0-w0" for n in _job_names(cluster, namespace, "stretchy")
        ),
        "a replacement Job for worker 0",
        90,
        explain=operator.log_tail,
    )
    assert _get(cluster, namespace, "job", "stretchy-r0-w1")["metadata"]["uid"] == worker1
    status = _get(cluster, namespace, "tj", "stretchy")["status"]
    assert status["restarts"] == 1 and status["lastFailure"]["worker"] == 0
    events = _get(cluster, namespace, "events", "--field-selector", "involvedObject.name=stretchy")["items"]
    reasons = {e["reason"] for e in events}
    assert {"MembershipChanged", "ScaledDown", "WorkerReplaced"} <= reasons, reasons


def _scale_path(namespace: str, name: str) -> str:
    return f"/apis/kubetrain.io/v1alpha1/namespaces/{namespace}/trainingjobs/{name}/scale"


def test_kubectl_scale_is_refused_for_a_fixed_size_job_and_outside_the_elastic_bounds(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    fixed = trainingjob("fixed", workers=2, annotations=HOLD, runPolicy={"suspend": True})
    elastic = trainingjob(
        "bounded",
        workers=2,
        annotations=HOLD,
        elastic={"minWorkers": 2, "maxWorkers": 3},
        runPolicy={"suspend": True},
    )
    for manifest in (fixed, elastic):
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(manifest))
    for name, replicas, message in (
        ("fixed", 3, "spec.workers is immutable unless spec.elastic is set"),
        (
            "bounded",
            4,
            "spec.workers must lie between spec.elastic.minWorkers and spec.elastic.maxWorkers",
        ),
    ):
        with pytest.raises(KubectlError) as refused:
            cluster.kubectl("-n", namespace, "scale", f"tj/{name}", f"--replicas={replicas}")
        assert message in str(refused.value)


def test_a_store_whose_node_is_deleted_costs_one_re_rendezvous_with_a_new_store_and_no_restart(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    """The node is deleted, as a cloud's node controller does with a lost machine: the pod garbage
    collector fails its pods (DisruptionTarget, DeletionByPodGC). Before, the store's fixed name kept
    the new group waiting on the old store and the loss counted against maxRestarts."""
    [node] = cluster.add_nodes(1, prefix=f"lost-{namespace}", labels={"pool": f"lost-{namespace}"})
    manifest = trainingjob("roaming", workers=2, annotations=HOLD, elastic={"minWorkers": 1, "maxWorkers": 2})
    manifest["spec"]["nodeSelector"] = {"pool": f"lost-{namespace}"}
    manifest["spec"]["runPolicy"] = {"maxRestarts": 0}
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(manifest))
    _wait_jobs(cluster, namespace, "roaming", {"roaming-rdzv", "roaming-r0-w0", "roaming-r0-w1"}, operator)
    wait_for(lambda: _members(cluster, namespace, "roaming") == [0, 1], "members [0, 1]", 90)

    cluster.kubectl("delete", "node", node)

    def restarted() -> dict[str, Any] | None:
        status = _get(cluster, namespace, "tj", "roaming").get("status") or {}
        return status if status.get("disruptionRestarts") else None

    status = wait_for(restarted, "a disruption restart after the node went", 180, explain=operator.log_tail)
    assert status["restarts"] == 0, status
    restarting = next(c for c in status["conditions"] if c["type"] == "Restarting")
    assert restarting["reason"] == "WorkerDisrupted", restarting
    assert "the rendezvous store (pod roaming-rdzv-" in restarting["message"], restarting
    assert status["disruptionRestarts"] == 1, "one lost store, one re-rendezvous"
    assert f"on node {node} was deleted by the pod garbage collector" in restarting["message"], restarting
    assert (status.get("elastic") or {}).get("storeGeneration") == 1, status
    # The new group asks for the pool again; once a node serves it, the new store and workers run there.
    [node] = cluster.add_nodes(1, prefix=f"lost-{namespace}", labels={"pool": f"lost-{namespace}"})
    try:
        _wait_jobs(
            cluster, namespace, "roaming", {"roaming-rdzv-g1", "roaming-r1-w0", "roaming-r1-w1"}, operator
        )
        wait_for(lambda: _members(cluster, namespace, "roaming") == [0, 1], "members [0, 1] again", 90)
        final = _get(cluster, namespace, "tj", "roaming")["status"]
        assert (final["restarts"], final["disruptionRestarts"]) == (0, 1), final
    finally:
        cluster.kubectl("delete", "node", "--wait=false", node, check=False)
