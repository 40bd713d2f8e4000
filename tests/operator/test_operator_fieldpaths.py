"""API errors about a worker Job or the Service are reported with the TrainingJob's own field paths."""

from __future__ import annotations

from typing import Any

import pytest
from kubetrain_operator.api import fieldpaths
from kubetrain_operator.planning import builders
from operator_fakes import context

pytestmark = pytest.mark.unit

SPEC: dict[str, Any] = {
    "command": ["python", "/app/train.py"],
    "args": ["--lr", "0.1"],
    "nprocPerWorker": 2,
    "workers": 2,
    "env": [
        {"name": "A", "value": "1"},
        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
    ],
    "storage": [
        {"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "cifar"}},
        {"name": "out", "mountPath": "/output", "subPath": "runs", "emptyDir": {}},
    ],
    "nodeSelector": {"pool": "gpu"},
    "podLabels": {"team": "vision"},
}
WITH_OWN_SHM = {
    **SPEC,
    "storage": [{"name": "shm", "mountPath": "/dev/shm", "emptyDir": {"medium": "Memory"}}],
}


def _job(spec: dict[str, Any]) -> dict[str, Any]:
    return builders.build_worker_job(context(spec=spec), 0)


def _user_env_start(spec: dict[str, Any]) -> int:
    return len(_job(spec)["spec"]["template"]["spec"]["containers"][0]["env"]) - len(spec["env"])


C = "spec.template.spec.containers[0]."


@pytest.mark.parametrize(
    ("spec", "child_path", "expected"),
    [
        (SPEC, f"{C}env[{_user_env_start(SPEC)}].value", "spec.env[0].value"),
        (SPEC, f"{C}env[{_user_env_start(SPEC) + 1}].valueFrom.secretKeyRef.key", "spec.env[1].valueFrom.secretKeyRef.key"),
        (SPEC, f"{C}volumeMounts[2].subPath", "spec.storage[1].subPath"),
        (SPEC, "spec.template.spec.volumes[1].persistentVolumeClaim.claimName", "spec.storage[0].persistentVolumeClaim.claimName"),
        (WITH_OWN_SHM, f"{C}volumeMounts[0].mountPath", "spec.storage[0].mountPath"),
        (SPEC, f"{C}command[3]", "spec.command[1]"),
        (SPEC, f"{C}args[1]", "spec.args[1]"),
        (SPEC, f"{C}resources.limits[nvidia.com/gpu]", "spec.resources.limits[nvidia.com/gpu]"),
        (SPEC, f"{C}image", "spec.image"),
        (SPEC, f"{C}imagePullPolicy", "spec.imagePullPolicy"),
        (SPEC, f"{C}ports[0].containerPort", "spec.masterPort"),
        (SPEC, "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution", "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"),
        (SPEC, "spec.template.spec.nodeSelector", "spec.nodeSelector"),
        (SPEC, "spec.template.metadata.labels", "spec.podLabels"),
        (SPEC, "spec.template.metadata.annotations", "spec.podAnnotations"),
    ],
)  # fmt: skip
def test_a_job_path_becomes_the_trainingjob_field_the_user_wrote(
    spec: dict[str, Any], child_path: str, expected: str
) -> None:
    message = f'Job.batch "demo-r0-w0" is invalid: [{child_path}: Invalid value: "x": bad, other: y]'
    translated = fieldpaths.to_trainingjob_fields(message, spec, _job(spec))
    assert translated == f'Job.batch "demo-r0-w0" is invalid: [{expected}: Invalid value: "x": bad, other: y]'


def test_the_operators_own_env_and_volumes_keep_the_jobs_path() -> None:
    """An index into what the operator adds names no field of the user's: it stays as the API said."""
    message = f"{C}env[0].value: Invalid value; spec.template.spec.volumes[0].emptyDir: bad"
    assert fieldpaths.to_trainingjob_fields(message, SPEC, _job(SPEC)) == message


def test_a_service_port_is_the_master_port() -> None:
    service = builders.build_service(context(spec=SPEC))
    message = 'Service "demo" is invalid: spec.ports[0].port: Invalid value: 80'
    assert fieldpaths.to_trainingjob_fields(message, SPEC, service).endswith(
        "spec.masterPort: Invalid value: 80"
    )
