"""The real node gets the project's images as a real cluster's node does: its kubelet pulls them.

The pod names the image as the chart does (`ghcr.io/kubetrain/...`, no imagePullPolicy, so Kubernetes'
IfNotPresent), and nothing but a pull can put it on the node: the test first removes it from the node's
containerd. ghcr.io itself is out of reach, so the pull succeeds only through the registry mirror that
sends `ghcr.io` to the cluster's own registry, where the tests pushed the image they built.
"""

from __future__ import annotations

import json

import pytest
from kubetrain_operator.api import constants
from testcluster.cluster import Cluster
from testcluster.node import Node
from testcluster.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.slow]


def test_a_pod_with_the_charts_image_name_and_default_pull_policy_starts_by_pulling_it(
    real_cluster: tuple[Cluster, Node],
) -> None:
    cluster, node = real_cluster
    image = constants.OPERATOR_IMAGE
    node.ctr("images", "remove", image)
    with cluster.temporary_namespace("pull") as namespace:
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "pulled", "namespace": namespace},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": image, "command": ["python3", "-c", "pass"]}],
                },
            }
        )

        def story() -> str:
            return cluster.kubectl("-n", namespace, "get", "pod,events", "-o", "wide", check=False)

        def phase() -> str:
            return cluster.kubectl("-n", namespace, "get", "pod", "pulled", "-o", "jsonpath={.status.phase}")

        assert wait_for(lambda: phase() in {"Succeeded", "Failed"}, "the pod to finish", 180, explain=story)
        pod = json.loads(cluster.kubectl("-n", namespace, "get", "pod", "pulled", "-o", "json"))
        assert pod["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
        assert pod["status"]["phase"] == "Succeeded", story()
        events = json.loads(
            cluster.kubectl("-n", namespace, "get", "events", "--field-selector=reason=Pulled", "-o", "json")
        )["items"]
        messages = [event["message"] for event in events]
        assert any(message.startswith(f'Successfully pulled image "{image}"') for message in messages), (
            messages
        )
