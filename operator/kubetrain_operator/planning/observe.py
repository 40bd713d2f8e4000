"""Read the observed children (batch Jobs and their pods) into one `Worker` per worker index.

Pure: takes the dicts the API returned, never calls it. Pods are read before Jobs because they know more
(exit codes, why a pod is pending, the progress annotation) and change first; a Job's own conditions are
the fallback when its pod is gone.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

from kubetrain_trainer import contract, termination

from kubetrain_operator.api import constants

WorkerPhase = Literal["missing", "pending", "running", "succeeded", "failed"]

WAITING_REASONS = (
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
)
"""Container waiting reasons worth reporting as status.pendingReason (ContainerCreating is not)."""


@dataclasses.dataclass(frozen=True)
class Worker:
    """What the cluster says about one worker of one restart attempt."""

    index: int
    attempt: int
    phase: WorkerPhase
    job_name: str | None = None
    pod_name: str | None = None
    ready: bool = False
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    deleting: bool = False
    finished_at: str | None = None
    node: str | None = None
    disruption: str | None = None
    """Why the cluster took this worker away (its pod's DisruptionTarget reason), None if it did not."""
    started_at: str | None = None
    """When its container started running (the kubelet's startedAt)."""
    step: int | None = None
    step_at: str | None = None
    """The optimizer step count and when the worker last made progress, from its heartbeat annotation."""


def scheduler_message(message: str | None) -> str | None:
    """The scheduler's reason without its echoes: it appends what preemption found, which for a missing
    claim repeats the end of the sentence before ('persistentvolumeclaim "data" not found. not found').
    A sentence that only repeats the end of the previous one is dropped."""
    if not message:
        return message
    kept: list[str] = []
    for sentence in message.split(". "):
        if kept and sentence.strip(" .") and kept[-1].rstrip(" .").endswith(sentence.strip(" .")):
            continue
        kept.append(sentence)
    return ". ".join(kept)


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return obj.get("metadata", {}).get("labels") or {}


def _int_label(obj: Mapping[str, Any], key: str) -> int | None:
    try:
        return int(_labels(obj)[key])
    except (KeyError, ValueError):
        return None


def worker_key(obj: Mapping[str, Any]) -> tuple[int, int] | None:
    """(restart attempt, worker index) from a Job's or pod's labels; None for foreign objects."""
    attempt = _int_label(obj, constants.LABEL_RESTART_ATTEMPT)
    index = _int_label(obj, constants.LABEL_WORKER_INDEX)
    if attempt is None or index is None:
        return None
    return attempt, index


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid of the object's controller (its ownerReference with controller: true), if any."""
    for ref in obj.get("metadata", {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return ref.get("uid")
    return None


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether `uid` is the object's controller: only then is it ours to count, adopt, wait for or
    delete (an owner that is not the controller, or a namesake's object, is someone else's)."""
    return bool(uid) and controller_uid(obj) == uid


def _condition(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for cond in obj.get("status", {}).get("conditions") or ():
        if cond.get("type") == type_ and cond.get("status") == "True":
            return cond
    return None


def has_ended(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's containers can no longer run: its phase is Succeeded or Failed. A pod being
    deleted has not ended until then (a pod on an unreachable node stays Running, maybe truly running)."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _container_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or ()
    for status in statuses:
        if status.get("name") == constants.CONTAINER_NAME:
            return status
    return statuses[0] if statuses else {}


def _newest(objs: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    ordered = sorted(objs, key=lambda o: o.get("metadata", {}).get("creationTimestamp") or "")
    return ordered[-1] if ordered else None


DISRUPTION_CONDITION = "DisruptionTarget"
"""The pod condition the API server, scheduler, taint manager, pod GC and kubelet set on a pod they are
about to take away; its reason says which of them did."""

POD_FAILURE_POLICY = "PodFailurePolicy"
"""The Job condition reason when a podFailurePolicy rule failed the Job; the worker Jobs' one rule matches
DisruptionTarget, and the Job controller's message names the condition."""


def disruption_of(pod: Mapping[str, Any]) -> str | None:
    """The pod's DisruptionTarget reason (or the condition's name when it has none) while the condition is
    True: the cluster, not the worker, ended or is ending it."""
    cond = _condition(pod, DISRUPTION_CONDITION)
    if cond is None:
        return None
    return cond.get("reason") or DISRUPTION_CONDITION


def read_pod(pod: Mapping[str, Any], index: int, attempt: int, job_name: str | None) -> Worker:
    meta = pod.get("metadata", {})
    status = pod.get("status", {})
    phase = status.get("phase") or "Pending"
    container = _container_status(pod)
    state = container.get("state") or {}
    terminated = state.get("terminated")
    base = {
        "index": index,
        "attempt": attempt,
        "job_name": job_name,
        "pod_name": meta.get("name"),
        "node": (pod.get("spec") or {}).get("nodeName"),
        "disruption": disruption_of(pod),
    }
    if phase == "Succeeded" or (terminated and terminated.get("exitCode") == 0):
        return Worker(
            phase="succeeded", exit_code=0, finished_at=(terminated or {}).get("finishedAt"), **base
        )
    if phase == "Failed" or terminated:
        terminated = terminated or {}
        message = (terminated.get("message") or status.get("message") or "").strip() or None
        record = termination.parse_record(message)
        return Worker(
            phase="failed",
            # A launcher (torchrun) exits 1 for any failed child: the child's recorded code decides.
            exit_code=termination.recorded_exit_code(terminated.get("exitCode"), message),
            reason=terminated.get("reason") or status.get("reason") or "Failed",
            message=(record.message or None) if record else message,
            finished_at=terminated.get("finishedAt"),
            **base,
        )
    if phase == "Running":
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
        )
        step, step_at = read_heartbeat(pod)
        started_at = (state.get("running") or {}).get("startedAt")
        return Worker(phase="running", ready=ready, started_at=started_at, step=step, step_at=step_at, **base)
    # Pending: say why, most specific first.
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in WAITING_REASONS:
        return Worker(phase="pending", reason=waiting["reason"], message=waiting.get("message"), **base)
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return Worker(
                phase="pending",
                reason=cond.get("reason") or "Unschedulable",
                message=scheduler_message(cond.get("message")),
                **base,
            )
    scheduled = any(c.get("type") == "PodScheduled" for c in status.get("conditions") or ())
    if not scheduled and not pod.get("spec", {}).get("nodeName"):
        scheduler = pod.get("spec", {}).get("schedulerName") or "default-scheduler"
        return Worker(
            phase="pending",
            reason="WaitingForScheduler",
            message=f"no scheduler has looked at the pod yet (schedulerName {scheduler})",
            **base,
        )
    return Worker(phase="pending", reason=waiting.get("reason"), message=waiting.get("message"), **base)


def read_worker(
    index: int,
    attempt: int,
    job: Mapping[str, Any] | None,
    pods: Iterable[Mapping[str, Any]],
    departed: Mapping[str, Mapping[str, Any]] | None = None,
) -> Worker:
    """One worker's state from its Job (None when missing) and the pods carrying its labels; `departed`
    (Job uid -> the last state of its deleted, disrupted pod) speaks for a failed Job's pod once it is
    gone."""
    if job is None:
        return Worker(index=index, attempt=attempt, phase="missing")
    job_name = job.get("metadata", {}).get("name")
    deleting = bool(job.get("metadata", {}).get("deletionTimestamp"))
    pod = _newest(pods)
    worker = read_pod(pod, index, attempt, job_name) if pod is not None else None
    if worker is not None and worker.phase in ("succeeded", "failed"):
        return dataclasses.replace(worker, deleting=deleting)
    if _condition(job, "Complete") or _condition(job, "SuccessCriteriaMet"):
        return Worker(
            index=index, attempt=attempt, phase="succeeded", job_name=job_name, exit_code=0, deleting=deleting
        )
    failed = _condition(job, "Failed") or _condition(job, "FailureTarget")
    if failed and worker is None and departed:
        # The pod is gone, but the watch's last copy of it says who took it, from where, and how it ended.
        last = departed.get(job.get("metadata", {}).get("uid") or "")
        worker = read_pod(last, index, attempt, job_name) if last is not None else None
        if worker is not None and worker.phase == "failed":
            return dataclasses.replace(worker, deleting=deleting)
    if failed:
        reason = failed.get("reason") or "JobFailed"
        message = failed.get("message")
        # The pod is gone; the Job's podFailurePolicy verdict still says whether the cluster took it.
        by_policy = reason == POD_FAILURE_POLICY and DISRUPTION_CONDITION in (message or "")
        disruption = (worker.disruption if worker else None) or (DISRUPTION_CONDITION if by_policy else None)
        return Worker(
            index=index,
            attempt=attempt,
            phase="failed",
            job_name=job_name,
            pod_name=worker.pod_name if worker else None,
            reason=reason,
            message=message,
            deleting=deleting,
            finished_at=failed.get("lastTransitionTime"),
            node=worker.node if worker else None,
            disruption=disruption,
        )
    if deleting:
        # Only the operator deletes Jobs of the current attempt, and then it moves to another attempt:
        # a current Job being deleted was deleted by someone else, and its worker is lost.
        return Worker(
            index=index,
            attempt=attempt,
            phase="failed",
            job_name=job_name,
            pod_name=worker.pod_name if worker else None,
            reason="JobDeleted",
            message=f"worker Job {job_name} was deleted",
            deleting=True,
        )
    if worker is not None:
        return worker
    return Worker(
        index=index,
        attempt=attempt,
        phase="pending",
        job_name=job_name,
        reason="PodNotCreated",
        message=(
            f"the Job controller has not created a pod for {job_name} yet (see `kubectl describe job "
            f"{job_name}`)"
        ),
    )


def read_workers(
    workers: int,
    attempt: int,
    jobs: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    departed: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Worker]:
    """Every worker 0..workers-1 of `attempt`, from the TrainingJob's (already owner-filtered) children
    and the last states of their deleted, disrupted pods (`departed`, by Job uid)."""
    jobs_by_index: dict[int, Mapping[str, Any]] = {}
    for job in jobs:
        key = worker_key(job)
        if key and key[0] == attempt:
            jobs_by_index[key[1]] = job
    pods_by_index: dict[int, list[Mapping[str, Any]]] = {}
    for pod in pods:
        key = worker_key(pod)
        if key and key[0] == attempt:
            pods_by_index.setdefault(key[1], []).append(pod)
    return [
        read_worker(i, attempt, jobs_by_index.get(i), pods_by_index.get(i, ()), departed)
        for i in range(workers)
    ]


def stale_jobs(attempt: int, jobs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Jobs of other attempts (or with unreadable labels): they must go before the next group starts."""
    out = []
    for job in jobs:
        key = worker_key(job)
        if key is None or key[0] != attempt:
            out.append(job)
    return out


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def first_created(jobs: Iterable[Mapping[str, Any]]) -> datetime | None:
    """When the first of `jobs` was created (their creationTimestamp), None when none says."""
    times = [parse_time(j.get("metadata", {}).get("creationTimestamp")) for j in jobs]
    return min((t for t in times if t is not None), default=None)


def read_heartbeat(pod: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """(step, stepAt) from the worker's kubetrain.io/heartbeat annotation; (None, None) when it has none
    or it does not parse (a worker's own report is never trusted to be well-formed)."""
    raw = (pod.get("metadata", {}).get("annotations") or {}).get(contract.HEARTBEAT_ANNOTATION)
    try:
        data = json.loads(raw) if raw else None
    except ValueError:
        return None, None
    if not isinstance(data, dict) or parse_time(data.get("stepAt")) is None:
        return None, None
    step = data.get("step")
    return (step if _is_int(step) else None), data["stepAt"]


def read_progress(pods: Iterable[Mapping[str, Any]], attempt: int | None = None) -> dict[str, Any] | None:
    """The newest valid progress report (annotation kubetrain.io/progress), rank 0's pod preferred."""
    best: tuple[tuple[int, str], dict[str, Any]] | None = None
    for pod in pods:
        raw = (pod.get("metadata", {}).get("annotations") or {}).get(contract.PROGRESS_ANNOTATION)
        if not raw:
            continue
        try:
            data = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        key = worker_key(pod)
        rank0 = 1 if key and key[1] == 0 and (attempt is None or key[0] == attempt) else 0
        order = (rank0, str(data.get("updatedAt") or ""))
        if best is None or order > best[0]:
            best = (order, data)
    if best is None:
        return None
    data = best[1]
    out: dict[str, Any] = {}
    numbers = (
        ("epoch", int),
        ("epochs", int),
        ("step", int),
        ("loss", float),
        ("validationLoss", float),
        ("accuracy", float),
        ("imagesPerSecond", float),
    )
    for key, kind in numbers:
        value = data.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = kind(value)
    if isinstance(data.get("updatedAt"), str):
        out["updatedAt"] = data["updatedAt"]
    resumed = data.get("resumedFrom")
    if isinstance(resumed, dict) and all(_is_int(resumed.get(k)) for k in ("attempt", "epoch", "step")):
        out["resumedFrom"] = {k: resumed[k] for k in ("attempt", "epoch", "step")}
    return out or None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
