"""The README's quickstart on a real-node cluster: the chart installed, a namespace with the two volumes
the examples claim (`cifar10-data` holding the CIFAR sample, `kubetrain-output`). Shared by the e2e tests
and `make demo-cluster`, so what the tests prove is what a newcomer runs."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Any

import yaml

from testcluster import binaries, registry
from testcluster.cluster import Cluster

RELEASE_NAMESPACE = "kubetrain-system"
SAMPLE = binaries.REPO_ROOT / "examples" / "data" / "cifar10-sample.tar.gz"
TRAINER_UID = 1000
"""The trainer image's user: the output volume (a host directory, no fsGroup) must be its own."""


def extract_sample(data_dir: Path) -> Path:
    """The CIFAR sample under `data_dir` (data_dir/cifar10-sample/train/<class>/...)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(SAMPLE) as archive:
        archive.extractall(data_dir, filter="data")
    return data_dir


def volume_pair(namespace: str, claim: str, path: Path, *, read_only: bool) -> list[dict[str, Any]]:
    """A hostPath PersistentVolume bound to the claim `claim` in `namespace` (the claim is what pods
    reference, so the `restricted` Pod Security Standard, which forbids hostPath in pods, holds)."""
    mode = "ReadOnlyMany" if read_only else "ReadWriteOnce"
    volume = f"{namespace}-{claim}"
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": [mode],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(path), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": [mode],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]


def prepare_namespace(cluster: Cluster, namespace: str, data_dir: Path, output_dir: Path) -> None:
    """A namespace enforcing the `restricted` Pod Security Standard with the examples' two claims."""
    output_dir.mkdir(parents=True, exist_ok=True)
    os.chown(output_dir, TRAINER_UID, TRAINER_UID)
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": namespace,
                    "labels": {
                        "pod-security.kubernetes.io/enforce": "restricted",
                        "pod-security.kubernetes.io/enforce-version": "latest",
                    },
                },
            },
            *volume_pair(namespace, "cifar10-data", data_dir, read_only=True),
            *volume_pair(namespace, "kubetrain-output", output_dir, read_only=False),
        ]
    )


def helm_install(
    cluster: Cluster, chart_registry: registry.Registry, watch_namespaces: list[str], **values: Any
) -> str:
    """`helm install kubetrain oci://<the cluster's registry>/charts/kubetrain --version <the chart's>
    -n kubetrain-system --create-namespace --wait`: the chart from a registry, as users install it."""
    values_path = cluster.directory / "quickstart-values.yaml"
    values_path.write_text(yaml.safe_dump({"watchNamespaces": watch_namespaces, **values}))
    result = chart_registry.helm_from_chart(
        cluster, "install", "kubetrain", "--namespace", RELEASE_NAMESPACE, "--create-namespace",
        "--values", str(values_path), "--wait", "--timeout=5m",
    )  # fmt: skip
    if result.returncode != 0:
        story = cluster.kubectl("-n", RELEASE_NAMESPACE, "get", "pods,events", check=False)
        raise RuntimeError(f"helm install failed:\n{result.stdout}{result.stderr}\n{story}")
    return result.stdout
