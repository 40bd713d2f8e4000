"""The test control plane is real: scheduler, job controller, garbage collector and kwok all act."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from testcluster import processes
from testcluster.cluster import Cluster, start_cluster
from testcluster.waiting import wait_for

pytestmark = pytest.mark.cluster


def _job(name: str, annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations or {}, "labels": labels or {}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
                },
            },
        },
    }


def _get(cluster: Cluster, namespace: str, *args: str) -> dict:
    return json.loads(cluster.kubectl("-n", namespace, "get", *args, "-o", "json"))


def _pod_phases(cluster: Cluster, namespace: str, job: str) -> list[str | None]:
    """The phases of the Job's pods: none until the Job controller has created one, which a wait must
    allow for."""
    pods = _get(cluster, namespace, "pods", "-l", f"job-name={job}")["items"]
    return [pod["status"].get("phase") for pod in pods]


def _only_pod(cluster: Cluster, namespace: str, job: str) -> dict:
    pods = _get(cluster, namespace, "pods", "-l", f"job-name={job}")["items"]
    assert len(pods) == 1, f"expected one pod for job {job}, got {len(pods)}"
    return pods[0]


def test_server_reports_its_real_version(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"].startswith("v1.")
    assert version["serverVersion"]["gitVersion"] == version["clientVersion"]["gitVersion"]
    assert int(version["serverVersion"]["minor"]) >= 30


def test_the_workload_api_is_served_and_a_pod_keeps_its_scheduling_group(
    cluster: Cluster, namespace: str
) -> None:
    """GenericWorkload is on in the API server (else it drops spec.schedulingGroup without a word) and
    scheduling.k8s.io/v1beta1 is served (a beta group version the API server leaves off by default)."""
    resources = cluster.kubectl("api-resources", "--api-group=scheduling.k8s.io", "-o", "name").split()
    assert {"workloads.scheduling.k8s.io", "podgroups.scheduling.k8s.io"} <= set(resources), resources
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "grouped", "annotations": {"sim.kubetrain.io/hold": "true"}},
        "spec": {
            "schedulingGroup": {"podGroupName": "not-yet-created"},
            "containers": [{"name": "c", "image": "registry.local/none:1"}],
        },
    }
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(pod))
    stored = _get(cluster, namespace, "pod", "grouped")
    assert stored["spec"]["schedulingGroup"] == {"podGroupName": "not-yet-created"}


def test_kubectl_lists_ready_kwok_nodes(cluster: Cluster) -> None:
    lines = cluster.kubectl("get", "nodes", "-l", "type=kwok", "--no-headers").splitlines()
    assert len(lines) >= 3
    assert all(line.split()[1] == "Ready" for line in lines), lines


def test_batch_job_pod_is_scheduled_runs_and_succeeds(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(_job("ok")))
    cluster.kubectl("-n", namespace, "wait", "--for=condition=Complete", "job/ok", "--timeout=90s")
    pod = _only_pod(cluster, namespace, "ok")
    assert pod["spec"]["nodeName"].startswith("kwok-node-"), "the scheduler bound the pod to a kwok node"
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_pod_made_to_fail_reports_the_chosen_exit_code(cluster: Cluster, namespace: str) -> None:
    job = _job("boom", annotations={"sim.kubetrain.io/exit-code": "42"})
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(job))
    cluster.kubectl("-n", namespace, "wait", "--for=condition=Failed", "job/boom", "--timeout=90s")
    pod = _only_pod(cluster, namespace, "boom")
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 42


def test_fail_attempt_annotation_spares_pods_of_other_attempts(cluster: Cluster, namespace: str) -> None:
    controls = {"sim.kubetrain.io/exit-code": "11", "sim.kubetrain.io/fail-attempt": "0"}
    first = _job("attempt-0", annotations=controls, labels={"kubetrain.io/restart-attempt": "0"})
    second = _job("attempt-1", annotations=controls, labels={"kubetrain.io/restart-attempt": "1"})
    cluster.kubectl(
        "-n",
        namespace,
        "apply",
        "-f",
        "-",
        input_text=json.dumps({"kind": "List", "apiVersion": "v1", "items": [first, second]}),
    )
    cluster.kubectl("-n", namespace, "wait", "--for=condition=Failed", "job/attempt-0", "--timeout=90s")
    cluster.kubectl("-n", namespace, "wait", "--for=condition=Complete", "job/attempt-1", "--timeout=90s")


def test_held_pod_keeps_running_until_deleted(cluster: Cluster, namespace: str) -> None:
    job = _job("held", annotations={"sim.kubetrain.io/hold": "true"})
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(job))
    wait_for(lambda: _pod_phases(cluster, namespace, "held") == ["Running"], what="Running")
    time.sleep(3)  # three times the default run-for: a pod that was not held would have ended by now
    assert _only_pod(cluster, namespace, "held")["status"]["phase"] == "Running"
    cluster.kubectl("-n", namespace, "delete", "job", "held", "--cascade=foreground", "--timeout=60s")
    wait_for(lambda: not _get(cluster, namespace, "pods")["items"], what="the held pod to be deleted")


def test_deleting_an_owner_garbage_collects_its_dependents(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("-n", namespace, "create", "configmap", "owner")
    owner = _get(cluster, namespace, "configmap", "owner")
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    dependent = _job("dependent", annotations={"sim.kubetrain.io/hold": "true"})
    dependent["metadata"]["ownerReferences"] = [reference]
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(dependent))
    wait_for(lambda: _get(cluster, namespace, "pods")["items"], what="the dependent Job's pod")
    cluster.kubectl("-n", namespace, "delete", "configmap", "owner")
    wait_for(
        lambda: (
            not _get(cluster, namespace, "jobs")["items"] and not _get(cluster, namespace, "pods")["items"]
        ),
        what="the garbage collector to delete the Job and its pod",
    )


def test_helm_talks_to_the_cluster(cluster: Cluster) -> None:
    import subprocess

    helm = [str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig)]
    assert (
        "v3."
        in subprocess.run([*helm, "version", "--short"], capture_output=True, text=True, check=True).stdout
    )
    subprocess.run([*helm, "list", "--all-namespaces"], capture_output=True, text=True, check=True)


def test_second_cluster_runs_beside_the_first_and_teardown_leaves_nothing(cluster: Cluster) -> None:
    second = start_cluster(nodes=1)
    try:
        assert second.api_port != cluster.api_port
        assert "kwok-node-0" in second.kubectl("get", "nodes", "-o", "name")
        assert cluster.kubectl("get", "--raw", "/readyz") == "ok", "the first cluster is unaffected"
        pids, directory = dict(second.pids), Path(second.directory)
    finally:
        second.stop()
    assert not [name for name, pid in pids.items() if processes.pid_alive(pid)]
    assert not directory.exists()
