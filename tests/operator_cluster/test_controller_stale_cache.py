"""The controller against a real API server and garbage collector, its cache fed in an order chosen here.

The operator's cache hears of TrainingJobs from one informer's watch and of their children from the
others': separate streams, so the children's news can arrive first. These tests drive one `Controller`
in this process (no threads started) and feed its `ClusterCache` as those streams would, in the order
that matters, with the informers' own listing (`Informer.relist`), so the race is played exactly, every
time, against the API server and the garbage collector that the operator meets in a cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import config
from kubetrain_operator.api import constants
from kubetrain_operator.planning import observe, plans
from kubetrain_operator.planning import status as st
from kubetrain_operator.runtime import informer, kube
from kubetrain_operator.runtime.cache import ClusterCache
from kubetrain_operator.runtime.controller import Controller
from testcluster.cluster import Cluster
from testcluster.manifests import trainingjob
from testcluster.operator_process import install_crd
from testcluster.waiting import wait_for

pytestmark = pytest.mark.cluster

WORKERS = 4


class RecordingKube(kube.Kube):
    """The operator's client, recording every child creation the API server accepted."""

    def __init__(self, api_client: Any) -> None:
        super().__init__(api_client)
        self.created: Counter[tuple[str, str]] = Counter()

    def create(self, manifest: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        created = super().create(manifest, timeout)
        if manifest["kind"] != constants.KIND:
            self.created[(manifest["kind"], manifest["metadata"]["name"])] += 1
        return created


@pytest.fixture
def client(cluster: Cluster) -> Iterator[RecordingKube]:
    install_crd(cluster)
    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield RecordingKube(api_client)
    finally:
        api_client.close()


def _listed(client: kube.Kube, kind: str, namespace: str) -> list[dict[str, Any]]:
    return [
        item for items, _ in client.list_pages(kind, namespace, constants.LABEL_JOB_NAME) for item in items
    ]


def _ignore(key: tuple[str, str]) -> None:
    """No reconcile is asked of the informers here: the tests call the controller themselves."""


def _informers_list_again(client: kube.Kube, cache: ClusterCache, namespace: str) -> None:
    """What the children's informers tell the cache: every Service, Job and Pod as the API has them now
    (deletions included); the TrainingJob itself is not touched, as its informer's watch is a stream
    apart."""
    children = informer.informers(client, cache, [namespace], on_trainingjob=_ignore, on_child=_ignore)
    for child_informer in children:
        if child_informer.kind != constants.KIND:
            child_informer.relist()


def _running_job(client: RecordingKube, namespace: str, name: str) -> tuple[Controller, ClusterCache]:
    """A TrainingJob of WORKERS held-running workers, reconciled until Running, its cache complete."""
    manifest = trainingjob(name, workers=WORKERS, annotations={"sim.kubetrain.io/hold": "true"})
    manifest["metadata"]["namespace"] = namespace
    cache = ClusterCache()
    cache.observe(client.create(manifest))
    controller = Controller(  # each reconcile writes what it planned: these tests are about what, not when
        client,
        cache,
        defaults=plans.Defaults(image=manifest["spec"]["image"]),
        status_waits=st.WRITE_AT_ONCE,
    )
    controller.reconcile(namespace, name)
    wait_for(
        lambda: (
            sum(p.get("status", {}).get("phase") == "Running" for p in _listed(client, "Pod", namespace))
            == WORKERS
        ),
        f"{WORKERS} worker pods Running",
    )
    _informers_list_again(client, cache, namespace)
    controller.reconcile(namespace, name)
    body = cache.trainingjob(namespace, name)
    assert body is not None and body["status"]["phase"] == "Running"
    return controller, cache


def test_a_trainingjob_deleted_while_running_gets_no_children_again_when_its_deletion_is_heard_last(
    cluster: Cluster, namespace: str, client: RecordingKube
) -> None:
    """Issue 16's duplicate: the TrainingJob is deleted (background, as kubectl does), the garbage
    collector removes its Service and Jobs, the informers report that, and kopf has not yet reported the
    deletion: the cache holds a running job with every child missing. Nothing may be created for it."""
    controller, cache = _running_job(client, namespace, "doomed")
    uid = cache.trainingjob(namespace, "doomed")["metadata"]["uid"]  # type: ignore[index]
    client.delete(constants.KIND, namespace, "doomed", "Background", uid)
    wait_for(
        lambda: not _listed(client, "Service", namespace) and not _listed(client, "Job", namespace),
        "the garbage collector to remove the deleted TrainingJob's Service and Jobs",
    )
    _informers_list_again(client, cache, namespace)
    assert cache.trainingjob(namespace, "doomed") is not None  # kopf's news of the deletion is late

    outcome = controller.reconcile(namespace, "doomed")

    assert sorted(client.created.values()) == [1] * (1 + WORKERS), client.created
    assert outcome.gone
    assert cache.trainingjob(namespace, "doomed") is None


def test_a_worker_job_deleted_by_hand_is_created_again_and_only_that_one(
    cluster: Cluster, namespace: str, client: RecordingKube
) -> None:
    controller, cache = _running_job(client, namespace, "bruised")
    victim = next(j for j in _listed(client, "Job", namespace) if j["metadata"]["name"].endswith("-w2"))
    client.delete("Job", namespace, victim["metadata"]["name"], "Background", victim["metadata"]["uid"])

    def victim_and_its_pod_gone() -> bool:
        # Background deletion removes the Job first and its pod after (the garbage collector); a pod of no
        # Job of ours may still run under the worker's name, and the controller waits for it by design.
        jobs = {j["metadata"]["name"] for j in _listed(client, "Job", namespace)}
        pods = [
            pod
            for pod in _listed(client, "Pod", namespace)
            if observe.controller_uid(pod) == victim["metadata"]["uid"]
        ]
        return victim["metadata"]["name"] not in jobs and not pods

    wait_for(victim_and_its_pod_gone, "the deleted worker Job and its pod to go")
    _informers_list_again(client, cache, namespace)

    outcome = controller.reconcile(namespace, "bruised")

    assert outcome.plan is not None and [m["metadata"]["name"] for m in outcome.plan.create] == [
        victim["metadata"]["name"]
    ]
    assert client.created[("Job", victim["metadata"]["name"])] == 2
    assert sum(client.created.values()) == 1 + WORKERS + 1
    jobs = {j["metadata"]["name"]: j["metadata"]["uid"] for j in _listed(client, "Job", namespace)}
    assert len(jobs) == WORKERS and jobs[victim["metadata"]["name"]] != victim["metadata"]["uid"]
