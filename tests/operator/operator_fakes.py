"""Factories for the API objects the operator reads: TrainingJobs, worker Jobs and pods, as dicts."""

from __future__ import annotations

import copy
import json
from typing import Any

from kubetrain_operator.api import TrainingJobSpec, constants, names
from kubetrain_operator.planning import builders, plans

UID = "0f0e0d0c-1111-2222-3333-444455556666"
NS = "team-a"
T0 = "2026-01-01T00:00:00Z"


def trainer_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"workers": 2, "trainer": {"epochs": 2}}
    spec.update(overrides)
    return spec


def command_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"workers": 2, "command": ["python", "/app/train.py"]}
    spec.update(overrides)
    return spec


def trainingjob(
    name: str = "demo", spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": UID,
            "generation": 1,
            "resourceVersion": "100",
            "creationTimestamp": T0,
        },
        "spec": copy.deepcopy(spec if spec is not None else trainer_spec()),
        "status": copy.deepcopy(status or {}),
    }


def context(name: str = "demo", spec: dict[str, Any] | None = None, attempt: int = 0) -> builders.Context:
    return builders.Context(
        owner=builders.Owner(name, NS, UID),
        spec=TrainingJobSpec.model_validate(spec if spec is not None else trainer_spec()),
        restart_attempt=attempt,
        default_image="registry.local/kubetrain:test",
    )


def job(
    index: int,
    attempt: int = 0,
    *,
    name: str = "demo",
    condition: str | None = None,
    reason: str | None = None,
    deleting: str | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    """A worker Job as the API returns it; condition is Complete or Failed."""
    out = builders.build_worker_job(context(name, attempt=attempt), index)
    out["metadata"]["uid"] = f"job-{attempt}-{index}"
    out["metadata"]["creationTimestamp"] = T0
    if deleting:
        out["metadata"]["deletionTimestamp"] = deleting
    status: dict[str, Any] = {}
    if condition:
        status["conditions"] = [
            {"type": condition, "status": "True", "reason": reason or condition, "lastTransitionTime": T0}
        ]
        if message:
            status["conditions"][0]["message"] = message
    out["status"] = status
    return out


def pod(
    index: int,
    attempt: int = 0,
    *,
    name: str = "demo",
    phase: str = "Pending",
    ready: bool = False,
    exit_code: int | None = None,
    reason: str | None = None,
    waiting: str | None = None,
    unschedulable: str | None = None,
    finished_at: str = "2026-01-01T00:10:00Z",
    progress: dict[str, Any] | None = None,
    pod_reason: str | None = None,
    unscheduled: bool = False,
    node: str | None = None,
    disruption: str | None = None,
) -> dict[str, Any]:
    """A worker pod in a given state (phase Running/Pending/Succeeded/Failed); `disruption` is the reason
    of a DisruptionTarget condition, as the API server, scheduler or kubelet set it."""
    template = builders.build_pod_template(context(name, attempt=attempt), index)
    job_name = names.worker_job_name(name, attempt, index)
    meta = copy.deepcopy(template["metadata"])
    meta.update(name=f"{job_name}-abcde", namespace=NS, creationTimestamp=T0)
    meta["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job_name,
            "uid": f"job-{attempt}-{index}",
            "controller": True,
        }
    ]
    if progress is not None:
        meta.setdefault("annotations", {})["kubetrain.io/progress"] = json.dumps(progress)
    container: dict[str, Any] = {"name": constants.CONTAINER_NAME, "state": {}}
    status: dict[str, Any] = {"phase": phase, "conditions": [], "containerStatuses": [container]}
    if phase == "Running":
        container["state"] = {"running": {"startedAt": T0}}
        status["conditions"].append({"type": "Ready", "status": "True" if ready else "False"})
    elif phase in ("Succeeded", "Failed"):
        code = exit_code if exit_code is not None else (0 if phase == "Succeeded" else 1)
        container["state"] = {
            "terminated": {
                "exitCode": code,
                "reason": reason or ("Completed" if code == 0 else "Error"),
                "finishedAt": finished_at,
            }
        }
        if pod_reason:
            status["reason"] = pod_reason
            container["state"] = {}
    else:
        status["conditions"].append({"type": "PodScheduled", "status": "True"})
        if waiting:
            container["state"] = {"waiting": {"reason": waiting, "message": f"{waiting}: details"}}
        if unschedulable:
            status["conditions"] = []
            status["conditions"].append(
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": unschedulable,
                }
            )
    if unscheduled:
        status["conditions"] = []
    if disruption:
        status["conditions"].append(
            {"type": "DisruptionTarget", "status": "True", "reason": disruption, "message": "m"}
        )
    spec = dict(template["spec"], nodeName=node) if node else template["spec"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def service(name: str = "demo") -> dict[str, Any]:
    out = builders.build_service(context(name))
    out["metadata"]["uid"] = "svc-uid"
    return out


def observed(
    spec: dict[str, Any] | None = None,
    *,
    status: dict[str, Any] | None = None,
    jobs: list[dict[str, Any]] | None = None,
    pods: list[dict[str, Any]] | None = None,
    with_service: bool = True,
    name: str = "demo",
    departed: dict[str, dict[str, Any]] | None = None,
) -> plans.Observed:
    return plans.Observed.from_objects(
        trainingjob(name, spec, status),
        services=[service(name)] if with_service else [],
        jobs=jobs or [],
        pods=pods or [],
        departed=departed,
    )


def running_status(**more: Any) -> dict[str, Any]:
    """The status of a job whose attempt-0 group runs, with `more` on top."""
    return {
        "startTime": "2026-01-01T00:30:00Z",
        "restartAttempt": 0,
        "restarts": 0,
        "phase": "Running",
        "conditions": [{"type": "Running", "status": "True", "reason": "AllWorkersRunning", "message": "m"}],
        **more,
    }
