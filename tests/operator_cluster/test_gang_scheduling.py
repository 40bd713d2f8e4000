"""Gang scheduling by the real kube-scheduler (the Workload API, GenericWorkload on): two 4-worker
TrainingJobs on room for 6 workers.

Each test gets six kwok nodes of its own (labelled and tainted for its namespace, so no other test's
pods land there), and every worker asks for a whole node's 8 GPUs: room for exactly 6 workers. Workers
run until the test removes their sim.kubetrain.io/hold annotation (kwok then completes them), so "the
first job finishes" happens when the test says, not after a guessed delay.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from testcluster.cluster import Cluster
from testcluster.manifests import trainingjob
from testcluster.operator_process import OperatorProcess
from testcluster.waiting import wait_for

pytestmark = pytest.mark.cluster

POOL_KEY = "gang-test/pool"
HOLD = "sim.kubetrain.io/hold"
WORKERS = 4
NAMES = ("alpha", "beta")


@pytest.fixture
def pool(cluster: Cluster, namespace: str) -> Iterator[str]:
    """Six nodes of one worker each, for this namespace's pods only; deleted afterwards."""
    nodes = cluster.add_nodes(
        6,
        prefix=f"gang-{namespace}",
        gpus=8,
        labels={POOL_KEY: namespace},
        taints=[{"key": POOL_KEY, "value": namespace, "effect": "NoSchedule"}],
    )
    try:
        yield namespace
    finally:
        cluster.kubectl("delete", "node", "--wait=false", *nodes, check=False)


def _job(name: str, pool: str, **spec: Any) -> dict[str, Any]:
    return trainingjob(
        name,
        workers=WORKERS,
        annotations={HOLD: "true"},
        resources={"limits": {"nvidia.com/gpu": "8"}},
        nodeSelector={POOL_KEY: pool},
        tolerations=[{"key": POOL_KEY, "operator": "Equal", "value": pool, "effect": "NoSchedule"}],
        **spec,
    )


def _submit_both(cluster: Cluster, namespace: str, **spec: Any) -> None:
    """Both TrainingJobs in one request: neither has a head start the test gave it."""
    jobs = {"apiVersion": "v1", "kind": "List", "items": [_job(name, namespace, **spec) for name in NAMES]}
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(jobs))


def _pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"kubetrain.io/job-name={name}"
    return json.loads(cluster.kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", "json"))["items"]


def _bound(pods: list[dict[str, Any]]) -> int:
    return sum(1 for pod in pods if pod["spec"].get("nodeName"))


def _refused(pod: dict[str, Any]) -> bool:
    """The scheduler looked at the pod and could not place it."""
    return any(
        c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
        for c in pod["status"].get("conditions") or ()
    )


def _status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    body = json.loads(cluster.kubectl("-n", namespace, "get", "trainingjob", name, "-o", "json"))
    return body.get("status") or {}


def _settled(cluster: Cluster, namespace: str) -> dict[str, list[dict[str, Any]]] | None:
    """Each job's pods once every worker exists and each is bound or refused by the scheduler."""
    pods = {name: _pods(cluster, namespace, name) for name in NAMES}
    every = [pod for group in pods.values() for pod in group]
    if len(every) == 2 * WORKERS and all(pod["spec"].get("nodeName") or _refused(pod) for pod in every):
        return pods
    return None


def test_two_gangs_on_room_for_one_and_a_half_run_one_after_the_other_never_half_each(
    cluster: Cluster, pool: str, operator: OperatorProcess
) -> None:
    namespace = pool
    explain = lambda: f"operator log:\n{operator.log_tail()}"  # noqa: E731
    _submit_both(cluster, namespace, gangScheduling={})  # no provider: the cluster serves the Workload API

    pods = wait_for(
        lambda: _settled(cluster, namespace), "every worker bound or refused", 120, explain=explain
    )
    bound = {name: _bound(group) for name, group in pods.items()}
    assert sorted(bound.values()) == [0, WORKERS], bound  # never 3 + 3
    first, second = sorted(NAMES, key=lambda name: -bound[name])
    wait_for(lambda: _status(cluster, namespace, first).get("phase") == "Running", f"{first} Running", 60)

    # One gang per TrainingJob, no Workload of the Job controller's for the worker Jobs.
    groups = json.loads(cluster.kubectl("-n", namespace, "get", "workloads,podgroups", "-o", "json"))["items"]
    assert sorted((g["kind"], g["metadata"]["name"]) for g in groups) == [
        ("PodGroup", "alpha-r0"),
        ("PodGroup", "beta-r0"),
        ("Workload", "alpha"),
        ("Workload", "beta"),
    ]
    assert {g["spec"]["schedulingPolicy"]["gang"]["minCount"] for g in groups if g["kind"] == "PodGroup"} == {
        WORKERS
    }

    # The waiting job says why, in its status and in `kubectl describe`.
    waiting = wait_for(
        lambda: (s := _status(cluster, namespace, second)).get("pendingReason") == "Unschedulable" and s,
        f"{second} reporting why it waits",
        60,
        explain=explain,
    )
    assert waiting["phase"] == "Pending"
    why = (
        f"gang-scheduled (kubernetes, PodGroup {second}-r0): no worker starts until all {WORKERS} fit at once"
    )
    assert why in waiting["message"], waiting["message"]
    described = " ".join(cluster.kubectl("-n", namespace, "describe", "trainingjob", second).split())
    assert why in described, described

    # The first finishes; then the second gets all of its workers.
    for pod in pods[first]:
        cluster.kubectl("-n", namespace, "annotate", "pod", pod["metadata"]["name"], f"{HOLD}-")
    wait_for(lambda: _status(cluster, namespace, first).get("phase") == "Succeeded", f"{first} done", 90)
    wait_for(
        lambda: _status(cluster, namespace, second).get("phase") == "Running",
        f"{second} Running after {first} finished",
        120,
        explain=explain,
    )
    assert _bound(_pods(cluster, namespace, second)) == WORKERS


def test_without_gang_scheduling_the_same_two_jobs_are_placed_in_part(
    cluster: Cluster, pool: str, operator: OperatorProcess
) -> None:
    """The control case: worker by worker, the six places go to both jobs' pods, so at least one job holds
    GPUs (2 or 3 of them) with a group that cannot start."""
    namespace = pool
    _submit_both(cluster, namespace)
    pods = wait_for(
        lambda: _settled(cluster, namespace),
        "every worker bound or refused",
        120,
        explain=lambda: f"operator log:\n{operator.log_tail()}",
    )
    bound = {name: _bound(group) for name, group in pods.items()}
    assert sum(bound.values()) == 6, bound
    assert any(0 < count < WORKERS for count in bound.values()), bound
    assert not json.loads(cluster.kubectl("-n", namespace, "get", "workloads,podgroups", "-o", "json"))[
        "items"
    ]
