"""The operator's watch events against a real API server: each object as the server serves it, less the
managedFields that `watchstream.without_managed_fields` cuts from the line before parsing (the server's
own encoding of built-in kinds and of custom resources, field keys with brackets and quotes included)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import config
from kubetrain_operator.api import constants
from kubetrain_operator.runtime import kube
from testcluster.cluster import Cluster
from testcluster.manifests import trainingjob
from testcluster.operator_process import install_crd
from testcluster.waiting import wait_for

pytestmark = pytest.mark.cluster

AWKWARD_ENV = [
    {"name": "A]B", "value": "1"},  # a bracket inside managedFields' keys
    {"name": 'Q"]', "value": "2"},  # an escaped quote before one
    {"name": "PLAIN", "value": 'x ] " \\ y'},
]


@pytest.fixture
def client(cluster: Cluster) -> Iterator[kube.Kube]:
    install_crd(cluster)
    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield kube.Kube(api_client)
    finally:
        api_client.close()


def _job(namespace: str) -> dict[str, Any]:
    container = {"name": "c", "image": "registry.local/stand-in:1", "env": AWKWARD_ENV}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "awkward", "namespace": namespace, "annotations": {"note": 'a ] " \\'}},
        "spec": {
            "template": {
                "metadata": {"annotations": {"sim.kubetrain.io/run-for": "600s"}},  # kwok.yaml: keeps running
                "spec": {"restartPolicy": "Never", "containers": [container]},
            }
        },
    }


def _served(client: kube.Kube, kind: str, namespace: str) -> dict[str, dict[str, Any]]:
    return {
        item["metadata"]["uid"]: item for items, _ in client.list_pages(kind, namespace) for item in items
    }


def _running_pod(client: kube.Kube, namespace: str) -> bool:
    pods = _served(client, "Pod", namespace).values()
    return any((pod.get("status") or {}).get("phase") == "Running" for pod in pods)


@pytest.mark.parametrize("kind", ["Job", "Pod", constants.KIND])
def test_a_watch_event_carries_the_object_as_served_less_its_managed_fields(
    cluster: Cluster, client: kube.Kube, namespace: str, kind: str
) -> None:
    client.create(_job(namespace))
    client.create({**trainingjob("awkward"), "metadata": {"name": "awkward", "namespace": namespace}})
    wait_for(lambda: _running_pod(client, namespace), timeout=60, what="the Job's pod running")

    def compared() -> bool:
        """Whether every object was seen at the same version by the listing and the watch (a pod's
        status may move between the two: then again)."""
        served = _served(client, kind, namespace)
        events = list(client.watch(kind, namespace, None, "", timeout_seconds=1))
        seen = {
            event["object"]["metadata"]["uid"]: event["object"]
            for event in events
            if event["type"] != "BOOKMARK"
        }
        if seen.keys() != served.keys() or any(
            seen[uid]["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]
            for uid, body in served.items()
        ):
            return False
        for uid, body in served.items():
            assert body["metadata"]["managedFields"], "the server keeps managedFields: nothing to cut"
            expected = {
                **body,
                "metadata": {k: v for k, v in body["metadata"].items() if k != "managedFields"},
            }
            assert seen[uid] == expected | {"kind": seen[uid]["kind"], "apiVersion": seen[uid]["apiVersion"]}
        return True

    wait_for(compared, timeout=30, what=f"{kind} listed and watched at one version")
