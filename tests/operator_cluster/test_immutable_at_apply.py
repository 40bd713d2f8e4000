"""The group's shape cannot change after creation: the real API server refuses a changed, added or removed
immutable field, naming it, and still takes every change that is allowed (and status writes).

Each change is a server-side dry run of a merge patch, so one object serves every case. The rules are on
the fields themselves (value) and on spec (presence, for fields without a default): see
kubetrain_operator.api.jobspec.add_immutable_rules.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from testcluster.cluster import Cluster
from testcluster.manifests import trainingjob
from testcluster.operator_process import install_crd

pytestmark = pytest.mark.cluster

EVERY_SHAPE_FIELD: dict[str, Any] = {
    "image": "registry.local/train:1",
    "imagePullPolicy": "IfNotPresent",
    "nprocPerWorker": 2,
    "resources": {"requests": {"cpu": "1"}},
    "trainer": None,
    "command": ["python", "train.py"],
    "args": ["--epochs", "1"],
    "launcher": "plain",
    "storage": [{"name": "data", "mountPath": "/data", "emptyDir": {}}],
    "masterPort": 29600,
    "successPolicy": "Worker0",
    "gangScheduling": {"provider": "volcano"},
    "managedBy": "example.com/other-controller",
}
"""A fixed-size job that sets every immutable field but elastic."""

REFUSED: list[tuple[str, str, dict[str, Any]]] = [
    # (object, field the refusal names, spec merge patch)
    ("shaped", "spec.image", {"image": "registry.local/train:2"}),
    ("shaped", "spec.image", {"image": None}),
    ("shaped", "spec.imagePullPolicy", {"imagePullPolicy": "Always"}),
    ("shaped", "spec.imagePullPolicy", {"imagePullPolicy": None}),
    ("shaped", "spec.nprocPerWorker", {"nprocPerWorker": 4}),
    ("shaped", "spec.resources", {"resources": {"requests": {"cpu": "2"}}}),
    ("shaped", "spec.resources", {"resources": None}),
    ("shaped", "spec.command", {"command": ["python", "other.py"]}),
    ("shaped", "spec.args", {"args": ["--epochs", "2"]}),
    ("shaped", "spec.args", {"args": None}),
    ("shaped", "spec.launcher", {"launcher": "torchrun"}),
    ("shaped", "spec.storage", {"storage": [{"name": "data", "mountPath": "/other", "emptyDir": {}}]}),
    ("shaped", "spec.storage", {"storage": None}),
    ("shaped", "spec.masterPort", {"masterPort": 29700}),
    ("shaped", "spec.successPolicy", {"successPolicy": "AllWorkers"}),
    ("shaped", "spec.gangScheduling", {"gangScheduling": {"provider": "scheduler-plugins"}}),
    ("shaped", "spec.gangScheduling", {"gangScheduling": None}),
    ("shaped", "spec.managedBy", {"managedBy": "example.com/third"}),
    ("shaped", "spec.managedBy", {"managedBy": None}),
    ("shaped", "spec.workers", {"workers": 3}),
    ("plain", "spec.image", {"image": None}),
    ("plain", "spec.imagePullPolicy", {"imagePullPolicy": "Never"}),
    ("plain", "spec.resources", {"resources": {"requests": {"cpu": "1"}}}),
    ("plain", "spec.trainer", {"trainer": {"epochs": 2}}),
    ("plain", "spec.trainer", {"trainer": None, "command": ["python", "train.py"]}),
    ("plain", "spec.storage", {"storage": [{"name": "data", "mountPath": "/data", "emptyDir": {}}]}),
    ("plain", "spec.gangScheduling", {"gangScheduling": {}}),
    ("plain", "spec.managedBy", {"managedBy": "example.com/other-controller"}),
    ("plain", "spec.elastic", {"elastic": {"minWorkers": 1, "maxWorkers": 4}}),
    ("elastic", "spec.elastic", {"elastic": {"maxWorkers": 5}}),
    ("elastic", "spec.elastic", {"elastic": None}),
]


def _patch(cluster: Cluster, namespace: str, name: str, patch: dict[str, Any], *extra: str) -> Any:
    return cluster.run_kubectl(
        "-n", namespace, "patch", "trainingjob", name, "--type=merge", "--dry-run=server", "-p", json.dumps(patch),
        *extra,
    )  # fmt: skip


def _trainingjob(name: str) -> dict[str, Any]:
    """The three shapes the tests change: every field with a shape set, the defaults, an elastic job."""
    shapes: dict[str, dict[str, Any]] = {
        "shaped": EVERY_SHAPE_FIELD,
        "plain": {},
        "elastic": {"workers": 2, "elastic": {"minWorkers": 1, "maxWorkers": 4}},
    }
    manifest = trainingjob(name, **shapes[name])
    manifest["spec"] = {k: v for k, v in manifest["spec"].items() if v is not None}
    return manifest


def _apply(cluster: Cluster, namespace: str, *names: str) -> None:
    items = [_trainingjob(name) for name in names]
    cluster.kubectl(
        "-n", namespace, "apply", "-f", "-",
        input_text=json.dumps({"kind": "List", "apiVersion": "v1", "items": items}),
    )  # fmt: skip


def test_every_immutable_field_refuses_a_change_an_addition_and_a_removal_naming_itself(
    cluster: Cluster, namespace: str
) -> None:
    install_crd(cluster)
    _apply(cluster, namespace, "shaped", "plain", "elastic")
    wrong = []
    for name, field, patch in REFUSED:
        result = _patch(cluster, namespace, name, {"spec": patch})
        if result.returncode == 0 or f"{field} is immutable" not in result.stderr:
            wrong.append(
                f"{name} {patch}: expected '{field} is immutable', got: {result.stdout}{result.stderr}"
            )
    assert not wrong, "\n".join(wrong)


def test_what_may_change_still_changes_and_status_writes_pass_the_rules(
    cluster: Cluster, namespace: str
) -> None:
    install_crd(cluster)
    _apply(cluster, namespace, "shaped", "elastic")
    allowed = [
        ("shaped", {"spec": {"podLabels": {"team": "vision"}, "runPolicy": {"maxRestarts": 5}}}),
        ("shaped", {"spec": {"env": [{"name": "A", "value": "1"}], "nodeSelector": {"pool": "gpu"}}}),
        ("shaped", {"spec": {"image": "registry.local/train:1", "command": ["python", "train.py"]}}),
        ("elastic", {"spec": {"workers": 4}}),
    ]
    for name, patch in allowed:
        result = _patch(cluster, namespace, name, patch)
        assert result.returncode == 0, f"{name} {patch}: {result.stderr}"
    status = {"status": {"phase": "Running", "observedGeneration": 1}}
    result = _patch(cluster, namespace, "shaped", status, "--subresource=status")
    assert result.returncode == 0, result.stderr
