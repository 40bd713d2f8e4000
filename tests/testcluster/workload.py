"""TrainingJobs in the e2e tests' workload namespace, as a user writes and watches them: the quickstart's
CIFAR job, its status, `kubectl get` columns, its story (describe, pods, events) and its pods."""

from __future__ import annotations

import json
from typing import Any

from testcluster.cluster import Cluster
from testcluster.waiting import wait_for

NAMESPACE = "training"


def trainingjob(name: str, *, epochs: int, workers: int = 2) -> dict[str, Any]:
    """CPU workers on the CIFAR sample, the chart's default trainer image (no spec.image)."""
    return {
        "apiVersion": "kubetrain.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "workers": workers,
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


def get(cluster: Cluster, *args: str) -> dict[str, Any]:
    """`kubectl get ARGS -o json` in the workload namespace."""
    return json.loads(cluster.kubectl("-n", NAMESPACE, "get", *args, "-o", "json"))


def status(cluster: Cluster, name: str) -> dict[str, Any]:
    return get(cluster, "tj", name).get("status") or {}


def story(cluster: Cluster, name: str) -> str:
    return cluster.kubectl("-n", NAMESPACE, "describe", "tj", name, check=False) + cluster.kubectl(
        "-n", NAMESPACE, "get", "pods,jobs,events", check=False
    )


def printed_columns(cluster: Cluster, name: str, namespace: str = NAMESPACE) -> dict[str, str]:
    """`kubectl get tj NAME` as a user reads it: column name -> value, read by the header's positions (an
    empty cell, such as WORLD-SIZE of a job that is not elastic, leaves no gap in a whitespace split)."""
    header, row = cluster.kubectl("-n", namespace, "get", "tj", name).splitlines()[:2]
    starts = [header.index(column) for column in header.split()]
    cells = [row[start:end].strip() for start, end in zip(starts, [*starts[1:], None], strict=True)]
    return dict(zip(header.split(), cells, strict=True))


def wait_phase(cluster: Cluster, name: str, phase: str, timeout: float) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        current = status(cluster, name)
        if current.get("phase") == "Failed" and phase != "Failed":
            raise AssertionError(f"{name} failed:\n{story(cluster, name)}")
        return current if current.get("phase") == phase else None

    return wait_for(reached, f"{name} {phase}", timeout, interval=2, explain=lambda: story(cluster, name))


def pod_of(cluster: Cluster, job: str) -> str:
    """The (first) pod of the Job named `job`."""
    return cluster.kubectl(
        "-n", NAMESPACE, "get", "pods", "-l", f"job-name={job}", "-o", "jsonpath={.items[0].metadata.name}"
    )
