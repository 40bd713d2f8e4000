"""End to end on a real node: the chart installs the operator from the image we build, and TrainingJobs run
the trainer image as real containers under the `restricted` Pod Security Standard.

Nothing is rewritten for the test: the operator runs in-cluster with its ServiceAccount token through the
`kubernetes` Service, workers find worker 0 by the headless Service's DNS name through CoreDNS, and rank 0
reports progress through the chart's worker ServiceAccount and admission policy.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testcluster import quickstart
from testcluster.cluster import Cluster
from testcluster.node import Node, real_node_cluster
from testcluster.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.slow]

RELEASE_NAMESPACE = quickstart.RELEASE_NAMESPACE
WORKLOAD_NAMESPACE = "training"
TRAINER_UID = quickstart.TRAINER_UID


@pytest.fixture(scope="module")
def real_cluster() -> Iterator[tuple[Cluster, Node]]:
    with real_node_cluster() as running:
        yield running


@pytest.fixture(scope="module")
def volumes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The CIFAR sample (read-only data) and an output directory the workers' uid may write."""
    root = tmp_path_factory.mktemp("volumes")
    return {"data": quickstart.extract_sample(root / "data"), "output": root / "output"}


@pytest.fixture(scope="module")
def installed(real_cluster: tuple[Cluster, Node], volumes: dict[str, Path]) -> Cluster:
    """The chart installed as a user would (its default images), watching a `restricted` namespace that
    holds the data and output volumes."""
    cluster, _ = real_cluster
    quickstart.prepare_namespace(cluster, WORKLOAD_NAMESPACE, volumes["data"], volumes["output"])
    quickstart.helm_install(cluster, [WORKLOAD_NAMESPACE], logFormat="json")
    return cluster


def _trainingjob(name: str, *, epochs: int) -> dict[str, Any]:
    """Two CPU workers on the CIFAR sample, the chart's default trainer image (no spec.image)."""
    return {
        "apiVersion": "kubetrain.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE},
        "spec": {
            "workers": 2,
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "3Gi"}},
            "trainer": {
                "model": "simple_cnn",
                "epochs": epochs,
                "batch_size": 64,
                "device": "cpu",
                "cpu_threads": 1,
                "data": {"dataset": "cifar10", "root": "/data/cifar10-sample", "validation_fraction": 0.1},
                "output_dir": "/output",
                "checkpoint_every_epochs": 1,
            },
            "storage": [
                {
                    "name": "data",
                    "mountPath": "/data",
                    "persistentVolumeClaim": {"claimName": "cifar10-data", "readOnly": True},
                },
                {
                    "name": "output",
                    "mountPath": "/output",
                    "persistentVolumeClaim": {"claimName": "kubetrain-output"},
                },
            ],
            "runPolicy": {"maxRestarts": 2},
        },
    }


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    job = json.loads(cluster.kubectl("-n", WORKLOAD_NAMESPACE, "get", "tj", name, "-o", "json"))
    return job.get("status") or {}


def _story(cluster: Cluster, name: str) -> str:
    return cluster.kubectl("-n", WORKLOAD_NAMESPACE, "describe", "tj", name, check=False) + cluster.kubectl(
        "-n", WORKLOAD_NAMESPACE, "get", "pods,jobs,events", check=False
    )


def _printed_columns(cluster: Cluster, name: str) -> dict[str, str]:
    """`kubectl get tj NAME` as a user reads it: column name -> value."""
    header, row = cluster.kubectl("-n", WORKLOAD_NAMESPACE, "get", "tj", name).splitlines()[:2]
    starts = [header.index(column) for column in header.split()]
    cells = [row[start:end].strip() for start, end in zip(starts, [*starts[1:], None], strict=True)]
    return dict(zip(header.split(), cells, strict=True))


def _wait_phase(cluster: Cluster, name: str, phase: str, timeout: float) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        status = _status(cluster, name)
        if status.get("phase") == "Failed" and phase != "Failed":
            raise AssertionError(f"{name} failed:\n{_story(cluster, name)}")
        return status if status.get("phase") == phase else None

    return wait_for(reached, f"{name} {phase}", timeout, interval=2, explain=lambda: _story(cluster, name))


def test_operator_pod_from_the_built_image_is_ready_live_and_serves_metrics(installed: Cluster) -> None:
    cluster = installed
    pods = json.loads(
        cluster.kubectl(
            "-n", RELEASE_NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/name=kubetrain", "-o", "json"
        )
    )["items"]
    assert len(pods) == 1, [pod["metadata"]["name"] for pod in pods]
    pod = pods[0]
    container = pod["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/kubetrain/kubetrain-operator:0.1.0"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsUser"] == 65532
    assert pod["status"]["containerStatuses"][0]["ready"] is True
    name = pod["metadata"]["name"]
    # The kubelet's startup and liveness probes on /healthz made the container Ready; ask both endpoints
    # from inside the pod as well (exec through the kubelet and containerd's stream server).

    def answer(port: int, path: str) -> str | None:
        fetch = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/{path}').read().decode())"
        result = cluster.run_kubectl("-n", RELEASE_NAMESPACE, "exec", name, "--", "python3", "-c", fetch)
        return result.stdout if result.returncode == 0 else None

    healthz = wait_for(lambda: answer(8081, "healthz"), "the operator's liveness endpoint", 120, interval=2)
    assert healthz.strip(), "the liveness endpoint answers"
    metrics = wait_for(lambda: answer(8080, "metrics"), "the operator's metrics endpoint", 60, interval=2)
    assert "kubetrain_trainingjobs_created_total" in metrics and "kubetrain_workqueue_depth" in metrics


def test_two_workers_find_each_other_by_dns_train_and_leave_artifacts(
    installed: Cluster, volumes: dict[str, Path]
) -> None:
    cluster = installed
    cluster.apply(_trainingjob("dns-ddp", epochs=3))

    def progress_shown() -> dict[str, str] | None:
        columns = _printed_columns(cluster, "dns-ddp")
        return columns if columns.get("EPOCH") and columns.get("TRAIN-LOSS") else None

    columns = wait_for(
        progress_shown,
        "EPOCH and TRAIN-LOSS in kubectl get tj",
        600,
        interval=1,
        explain=lambda: _story(cluster, "dns-ddp"),
    )
    assert columns["PHASE"] in {"Running", "Succeeded"}, columns
    status = _wait_phase(cluster, "dns-ddp", "Succeeded", 600)
    assert status["restarts"] == 0, status

    pod = json.loads(
        cluster.kubectl(
            "-n", WORKLOAD_NAMESPACE, "get", "pods", "-l", "kubetrain.io/job-name=dns-ddp", "-o", "json"
        )
    )["items"][0]
    env = {item["name"]: item.get("value") for item in pod["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == f"dns-ddp-r0-w0.dns-ddp.{WORKLOAD_NAMESPACE}.svc", env["MASTER_ADDR"]
    artifacts = volumes["output"] / "dns-ddp"
    for name in ("model.pt", "metrics.json", "loss_curve.png", "progress.json"):
        assert (artifacts / name).is_file(), (
            f"{name} missing in {sorted(p.name for p in artifacts.iterdir())}"
        )
    assert (artifacts / "model.pt").stat().st_uid == TRAINER_UID
    metrics = json.loads((artifacts / "metrics.json").read_text())
    assert len(metrics["epochs"]) == 3


def test_a_killed_worker_restarts_the_group_once_and_it_resumes_from_the_checkpoint(
    real_cluster: tuple[Cluster, Node], installed: Cluster, volumes: dict[str, Path]
) -> None:
    cluster, node = real_cluster
    cluster.apply(_trainingjob("kill-ddp", epochs=6))
    checkpoints = volumes["output"] / "kill-ddp" / "checkpoints"

    def mid_training() -> bool:
        return (
            checkpoints.is_dir()
            and any(checkpoints.iterdir())
            and _status(cluster, "kill-ddp").get("phase") == "Running"
        )

    wait_for(
        mid_training,
        "a checkpoint while kill-ddp runs",
        600,
        interval=1,
        explain=lambda: _story(cluster, "kill-ddp"),
    )
    os.kill(
        node.container_pid(WORKLOAD_NAMESPACE, _pod_of(cluster, "kill-ddp-r0-w1"), "worker"), signal.SIGKILL
    )

    status = _wait_phase(cluster, "kill-ddp", "Succeeded", 900)
    assert status["restarts"] == 1, status
    jobs = cluster.kubectl(
        "-n", WORKLOAD_NAMESPACE, "get", "jobs", "-l", "kubetrain.io/job-name=kill-ddp", "-o", "name"
    )
    assert sorted(jobs.split()) == ["job.batch/kill-ddp-r1-w0", "job.batch/kill-ddp-r1-w1"], jobs
    log = cluster.kubectl("-n", WORKLOAD_NAMESPACE, "logs", "job/kill-ddp-r1-w0")
    assert "resum" in log.lower(), log[-3000:]
    events = cluster.kubectl(
        "-n", WORKLOAD_NAMESPACE, "get", "events", "--field-selector", "involvedObject.name=kill-ddp"
    )
    assert "Restarting" in events, events


def _pod_of(cluster: Cluster, job: str) -> str:
    return cluster.kubectl(
        "-n",
        WORKLOAD_NAMESPACE,
        "get",
        "pods",
        "-l",
        f"job-name={job}",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    )
