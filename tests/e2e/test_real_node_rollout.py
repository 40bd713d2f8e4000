"""Upgrading the chart with leader election, on a real node: `helm upgrade --wait` finishes and the new
version leads.

The chart's Deployment rolls out one new pod at a time and stops an old one only once the new one is
Ready, so a rollout finishes only if a standby is Ready. The old leader releases the Lease when it is
stopped, so every handover in the rollout is a release: the Lease never passes from one holder to the
next by expiry. One and three replicas differ only in the numbers the render tests check.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from testcluster import node
from testcluster.cluster import Cluster
from testcluster.node import Node
from testcluster.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(2400)]

RELEASE = "kubetrain-ha"
"""Its own release and namespaces, beside the quickstart's `kubetrain` release of the other modules."""
WATCHED = "kubetrain-ha-jobs"
SELECTOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
NEW_TAG = "0.1.0-rollout"
HELM_TIMEOUT = "3m"
"""Far more than a working rollout takes; a rollout waiting on a pod that never turns Ready hits it."""


def helm(
    real_cluster: tuple[Cluster, Node], directory: Path, verb: str, values: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """`helm install|upgrade` of the chart from the cluster's registry."""
    cluster, real_node = real_cluster
    values_path = directory / f"{verb}-values.yaml"
    values_path.write_text(yaml.safe_dump(values))
    return real_node.registry.helm_from_chart(
        cluster, verb, RELEASE, "--namespace", RELEASE, "--create-namespace",
        "--values", str(values_path), "--wait", f"--timeout={HELM_TIMEOUT}",
    )  # fmt: skip


def story(cluster: Cluster) -> str:
    return cluster.kubectl("-n", RELEASE, "get", "deployments,replicasets,pods,events,leases", check=False)


def operator_pods(cluster: Cluster) -> list[dict[str, Any]]:
    return json.loads(cluster.kubectl("-n", RELEASE, "get", "pods", "-l", SELECTOR, "-o", "json"))["items"]


def holder(cluster: Cluster, among: Collection[str]) -> str | None:
    """The Lease's holder when it is one of `among`."""
    name = cluster.kubectl("-n", RELEASE, "get", "lease", RELEASE, "-o", "jsonpath={.spec.holderIdentity}")
    return name if name in among else None


@pytest.fixture
def release(real_cluster: tuple[Cluster, Node]) -> Iterator[str]:
    """The release's name; uninstalled afterwards, so the modules after this one share the node with
    their own operator only."""
    cluster, _ = real_cluster
    try:
        yield RELEASE
    finally:
        helm_bin = str(cluster.bin_dir / "helm")
        subprocess.run(
            [helm_bin, "--kubeconfig", str(cluster.kubeconfig), "uninstall", RELEASE, "--namespace", RELEASE],
            capture_output=True, timeout=120, check=False,
        )  # fmt: skip


@contextlib.contextmanager
def watching_lease(cluster: Cluster, path: Path) -> Iterator[None]:
    """`path` receives the Lease's holder at every change of the Lease meanwhile (a watch)."""
    with path.open("w") as out:
        watch = subprocess.Popen(
            [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig), "-n", RELEASE,
             "get", "lease", RELEASE, "--watch", "-o", 'jsonpath=holder={.spec.holderIdentity}{"\\n"}'],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(lambda: path.read_text().strip(), "the Lease watch to start", 30)
        yield
    finally:
        watch.terminate()
        watch.wait(timeout=10)


def holders(history: Path) -> list[str]:
    """The Lease's holders in the order they held it, an empty string where it was released."""
    seen: list[str] = []
    for line in history.read_text().splitlines():
        assert line.startswith("holder="), history.read_text()
        value = line.removeprefix("holder=")
        if not seen or seen[-1] != value:
            seen.append(value)
    return seen


def test_helm_upgrade_with_two_leader_elected_replicas_finishes_and_the_new_version_leads(
    real_cluster: tuple[Cluster, Node], release: str, tmp_path: Path
) -> None:
    cluster, real_node = real_cluster
    cluster.kubectl("create", "namespace", WATCHED)
    values = {"watchNamespaces": [WATCHED], "replicas": 2, "leaderElection": {"enabled": True}}
    installed = helm(real_cluster, tmp_path, "install", values)
    assert installed.returncode == 0, f"helm install --wait failed:\n{installed.stderr}\n{story(cluster)}"
    old_pods = {pod["metadata"]["name"]: pod for pod in operator_pods(cluster)}
    assert len(old_pods) == 2, story(cluster)
    first = wait_for(lambda: holder(cluster, among=old_pods), "a replica to lead", 60)

    # The new version: the same build under another tag, which changes the pod template as a new
    # release's image would.
    old_image = next(iter(old_pods.values()))["spec"]["containers"][0]["image"]
    new_image = f"{old_image.rsplit(':', 1)[0]}:{NEW_TAG}"
    subprocess.run([str(node.PODMAN), "tag", old_image, new_image], check=True, capture_output=True)
    real_node.push_image(new_image)
    history = tmp_path / "lease-history"
    with watching_lease(cluster, history):
        upgraded = helm(
            real_cluster, tmp_path, "upgrade", {**values, "image": {"operator": {"tag": NEW_TAG}}}
        )
        assert upgraded.returncode == 0, f"helm upgrade --wait failed:\n{upgraded.stderr}\n{story(cluster)}"

        def only_new_pods() -> list[dict[str, Any]]:
            pods = operator_pods(cluster)
            images = {pod["spec"]["containers"][0]["image"] for pod in pods}
            return pods if len(pods) == 2 and images == {new_image} else []

        new_pods = wait_for(only_new_pods, "the old pods to be gone", 90, explain=lambda: story(cluster))
        new_names = {pod["metadata"]["name"] for pod in new_pods}
        leader = wait_for(
            lambda: holder(cluster, among=new_names),
            "a new pod to lead",
            60,
            explain=lambda: story(cluster),
        )
    assert not new_names & old_pods.keys()
    for pod in new_pods:
        status = pod["status"]["containerStatuses"][0]
        assert status["ready"] is True and status["restartCount"] == 0, (pod["metadata"]["name"], status)
    # Every handover was a release by the stopping holder, never a takeover after the Lease expired.
    sequence = holders(history)
    assert sequence[0] == first and sequence[-1] == leader, sequence
    assert all("" in pair for pair in itertools.pairwise(sequence)), sequence
