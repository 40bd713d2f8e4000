"""TrainingJob manifests for cluster tests, whose simulated pods obey kwok.yaml's annotations."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


def trainingjob(
    name: str, *, workers: int = 2, annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A small built-in-trainer TrainingJob; `annotations` go on its pods, `spec` overrides fields."""
    return {
        "apiVersion": "kubetrain.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "image": "registry.local/kubetrain-trainer:test",
            "workers": workers,
            "trainer": {"epochs": 1, "data": {"dataset": "fake"}},
            "podAnnotations": annotations or {},
            **spec,
        },
    }


REFUSED_TABLE = Path(__file__).resolve().parents[1] / "operator" / "testdata" / "refused-trainingjobs.yaml"
"""The table of TrainingJobs the API server must refuse (see the file's header)."""


@dataclass(frozen=True)
class RefusedCase:
    """One row of REFUSED_TABLE: a whole manifest, the field its refusal must name, and what refuses it."""

    name: str
    by: str
    field: str
    manifest: dict[str, Any]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def refused_cases() -> list[RefusedCase]:
    """Every row of REFUSED_TABLE with its spec patch applied to the table's base spec."""
    table = yaml.safe_load(REFUSED_TABLE.read_text())
    return [
        RefusedCase(
            name=row["name"],
            by=row["by"],
            field=row["field"],
            manifest={
                "apiVersion": "kubetrain.io/v1alpha1",
                "kind": "TrainingJob",
                "metadata": {"name": row["name"]},
                "spec": merge_patch(table["base"], row["spec"]),
            },
        )
        for row in table["cases"]
    ]


def accepted_trainingjobs() -> list[dict[str, Any]]:
    """Valid TrainingJobs using every field, each structured field in its edge forms (every valueFrom
    source, quantities as integers, milli and binary units, hugepages, a /dev/shm volume, tolerations of
    every shape): the rules that refuse REFUSED_TABLE must let all of these through."""
    full = {
        "image": "registry.local:5000/team/kubetrain_trainer:1.0-rc.1",
        "imagePullPolicy": "IfNotPresent",
        "imagePullSecrets": [{"name": "registry-creds"}],
        "workers": 4,
        "nprocPerWorker": 2,
        "resources": {
            "requests": {"cpu": "500m", "memory": "2Gi", "nvidia.com/gpu": 2, "hugepages-2Mi": "64Mi"},
            "limits": {"cpu": 1, "memory": "2147483648", "nvidia.com/gpu": "2", "ephemeral-storage": "1e9"},
        },
        "command": ["python", "/app/train.py"],
        "args": ["--epochs", "3"],
        "launcher": "torchrun",
        "storage": [
            {
                "name": "data",
                "mountPath": "/data",
                "subPath": "cifar10/train..v2",
                "persistentVolumeClaim": {"claimName": "cifar.v1", "readOnly": True},
            },
            {"name": "out", "mountPath": "/output/..runs", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "shm", "mountPath": "/dev/shm", "emptyDir": {"medium": "Memory", "sizeLimit": 0}},
            {"name": "host", "mountPath": "/mnt/host", "hostPath": {"path": "/var/lib/data", "type": ""}},
        ],
        "env": [
            {"name": "A", "value": "1"},
            {"name": "PETS", "value": "cat"},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {
                "name": "TEAM",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.labels['team']"}},
            },
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}},
            {
                "name": "MEM",
                "valueFrom": {
                    "resourceFieldRef": {
                        "containerName": "worker",
                        "resource": "requests.memory",
                        "divisor": "1Mi",
                    }
                },
            },
            {
                "name": "TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "hub", "key": ".token.v1", "optional": True}},
            },
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "MODE_2"}}},
        ],
        "nodeSelector": {"pool": "gpu", "topology.kubernetes.io/zone": "", "Node.Type": "a100_80GB"},
        "tolerations": [
            {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "example.com/dedicated", "operator": "Equal", "value": "ml"},
            {"operator": "Exists"},
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 30,
            },
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}
                    ]
                }
            }
        },
        "priorityClassName": "high",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "trainer",
        "podLabels": {"team": "vision", "example.com/cost-center": "r-and-d_1"},
        "podAnnotations": {"note": "any text, even with spaces"},
        "successPolicy": "AllWorkers",
        "runPolicy": {
            "maxRestarts": 5,
            "activeDeadlineSeconds": 3600,
            "ttlSecondsAfterFinished": 60,
            "cleanPodPolicy": "All",
            "suspend": True,
        },
        "failurePolicy": {"nonRetryableExitCodes": [2, 3, 4], "retryableExitCodes": [1, 10, 11, 12]},
    }
    digest = {
        "trainer": {},
        "image": "kubetrain@sha256:" + "a" * 64,
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }
    return [
        {
            "apiVersion": "kubetrain.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": name},
            "spec": spec,
        }
        for name, spec in (("every-field", full), ("image-by-digest", digest))
    ]


def bare_podgroup_crd(group: str, version: str) -> dict[str, Any]:
    """A PodGroup CRD of `group` (Volcano's or scheduler-plugins') that stores any object: the operator's
    side of a gang scheduler needs only its API; nothing acts on the objects."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"podgroups.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "podgroups", "singular": "podgroup", "kind": "PodGroup"},
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }
