"""Steps both group policies take (`whole_group`, `elastic_group`), written once. Pure.

A policy that reached into another's private helpers is how one copy of "retire the old attempt" lost its
uid precondition; every step either policy needs lives here, and neither policy imports the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from kubetrain_operator import api
from kubetrain_operator.planning import failure, observe, plans
from kubetrain_operator.planning import status as st


def seconds_between(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


def cleanup(
    policy: str,
    workers: Sequence[observe.Worker],
    jobs: Sequence[Mapping[str, Any]],
    service: Any,
) -> list[plans.Deletion]:
    """What cleanPodPolicy removes once the job finished (or is failing)."""
    if policy == "None":
        return []
    out = []
    running = {w.job_name for w in workers if w.phase in ("pending", "running", "missing")}
    for job in jobs:
        if plans.is_deleting(job):
            continue
        if policy == "All" or plans.name_of(job) in running or observe.worker_key(job) is None:
            out.append(plans.deletion("Job", job))
    if policy == "All" and service is not None and not plans.is_deleting(service):
        out.append(plans.deletion("Service", service))
    return out


@dataclasses.dataclass
class Pass:
    """One planning pass: what every step reads, and the plan (`out`, whose `status`) they write."""

    obs: plans.Observed
    spec: api.TrainingJobSpec
    out: plans.Plan
    now: datetime
    defaults: plans.Defaults
    attempt: int
    restarts: int
    workers: list[observe.Worker]
    stale: list[dict[str, Any]]

    @property
    def status(self) -> dict[str, Any]:
        return self.out.status

    def current_jobs(self) -> list[dict[str, Any]]:
        """The worker Jobs that are not stale, told apart by identity: `in` on a list of Jobs would compare
        whole dicts, Jobs x stale Jobs of them in a restart of a large group."""
        stale = {id(job) for job in self.stale}
        return [job for job in self.obs.jobs if id(job) not in stale]

    def fail(self, reason: str, message: str, blamed: observe.Worker | None = None) -> plans.Plan:
        """End the job Failed: the verdict, its event, the cleanup, and the TTL's wake-up."""
        status, spec = self.status, self.spec
        st.enter_phase(status, "Failed", reason, message, self.now)
        status["completionTime"] = st.timestamp(self.now)
        if blamed is not None:
            status["lastFailure"] = failure_record(blamed, self.attempt, message)
        st.record_workers(status, self.workers, spec.workers)
        self.out.events.append(plans.Event("Warning", reason, message))
        self.out.transitions.append("failed")
        return self.clean_up_after_the_end()

    def clean_up_after_the_end(self) -> plans.Plan:
        """The children cleanPodPolicy removes at the end, and a wake-up when the TTL runs out."""
        run_policy, obs = self.spec.run_policy, self.obs
        self.out.delete += cleanup(run_policy.clean_pod_policy, self.workers, obs.jobs, obs.service)
        if run_policy.ttl_seconds_after_finished is not None:
            self.out.requeue_after = float(run_policy.ttl_seconds_after_finished)
        return self.out


def retire_old_attempts(
    out: plans.Plan,
    jobs: Sequence[Mapping[str, Any]],
    *,
    pods: Sequence[Mapping[str, Any]],
    members: Sequence[observe.Worker],
    size: int,
    now: datetime,
) -> plans.Plan | None:
    """Retire an earlier attempt's Jobs, the one way both policies do it: delete each (Foreground, so the
    Job stays until its pods are gone; guarded by its uid, so a namesake created since is never hit) and
    wait (a plan) while any is still there, however long: one attempt runs at a time, as Kubernetes keeps
    one pod per StatefulSet ordinal. A pod on an unreachable node is gone when its node is deleted or the
    pod is force-deleted; the wait names the pods still there and their nodes, and says so for those past
    their grace period. None once the Jobs are gone: the next attempt may start."""
    waiting = []
    for job in jobs:
        if not plans.is_deleting(job):
            out.delete.append(plans.deletion("Job", job, "Foreground"))
        waiting.append(job)
    if not waiting:
        return None
    message = f"waiting for {len(waiting)} Jobs of earlier attempts to be deleted"
    uids = {job["metadata"].get("uid") for job in waiting}
    left = [pod for pod in pods if observe.controller_uid(pod) in uids]
    if left:
        message += f": {pods_still_there(left, now)}"
    return wait_for_old_workers(out, message, members, size, now)


def wait_for_lingering_pods(
    out: plans.Plan,
    lingering: Sequence[Mapping[str, Any]],
    *,
    members: Sequence[observe.Worker],
    size: int,
    now: datetime,
) -> plans.Plan | None:
    """Create no worker while a pod no Job of ours controls may still run under our name (a namesake's,
    an orphan): it would train beside the new group, write the same checkpoints and answer to the same
    hostnames. None when there is none."""
    if not lingering:
        return None
    there = pods_still_there(lingering, now)
    message = f"waiting for pods of an earlier TrainingJob of this name to end: {there}"
    return wait_for_old_workers(out, message, members, size, now)


def pods_still_there(pods: Sequence[Mapping[str, Any]], now: datetime) -> str:
    """`pods a on node-1, b on node-2 still there`, and for a pod past the end of its grace period (its
    kubelet has not confirmed it stopped: the node may be unreachable) how it goes."""
    named = ", ".join(_pod_and_node(pod) for pod in pods[:3])
    text = f"pods {named}{f' and {len(pods) - 3} more' if len(pods) > 3 else ''} still there"
    overdue = [pod for pod in pods if _past_grace(pod, now)]
    if overdue:
        pod = overdue[0]
        text += (
            f"; {plans.name_of(pod)} is past its grace period, so its node may be unreachable: it goes when "
            "the node is deleted, or by `kubectl delete pod "
            f"{plans.name_of(pod)} --force --grace-period=0` once you know it no longer runs"
        )
    return text


def _past_grace(pod: Mapping[str, Any], now: datetime) -> bool:
    """The API server sets deletionTimestamp to the deletion request's time plus its grace period."""
    deadline = observe.parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
    return deadline is not None and deadline < now


def _pod_and_node(pod: Mapping[str, Any]) -> str:
    return f"{plans.name_of(pod)} on {(pod.get('spec') or {}).get('nodeName') or 'no node'}"


def restart_whole_group(
    out: plans.Plan,
    jobs: Sequence[Mapping[str, Any]],
    decision: failure.Decision,
    *,
    attempt: int,
    restarts: int,
    now: datetime,
) -> plans.Plan:
    """Start the whole group over as attempt `attempt + 1`, counted as restart `restarts + 1` (or, for a
    disruption, as one more of status.disruptionRestarts): the decision goes into status (written first,
    so it is durable before its effects), every Job goes (Foreground, guarded by its uid), and a later
    pass creates the new attempt once they are gone (`retire_old_attempts`)."""
    status = out.status
    status["restartAttempt"] = attempt + 1
    if decision.disruption:
        status["disruptionRestarts"] = disruption_restarts(status) + 1
    else:
        status["restarts"] = restarts + 1
    st.enter_phase(status, "Restarting", decision.reason, decision.message, now)
    out.events.append(plans.Event("Warning", "Restarting", decision.message))
    out.transitions.append("restarted")
    out.delete += [plans.deletion("Job", j, "Foreground") for j in jobs if not plans.is_deleting(j)]
    out.requeue_after = plans.WAIT_SECONDS
    return out


def wait_for_old_workers(
    out: plans.Plan, message: str, workers: Sequence[observe.Worker], size: int, now: datetime
) -> plans.Plan:
    """Create nothing until old objects are gone; say so (quietly: they usually go within seconds)."""
    status = out.status
    status["pendingReason"] = "WaitingForOldWorkers"
    status["pendingMessage"] = message
    status["workers"] = st.worker_counts(workers)
    status["workersReady"] = f"0/{size}"
    if not st.is_true(status, "Restarting") and status.get("phase") != "Pending":
        st.enter_phase(status, "Pending", "Pending", message, now)
    out.requeue_after = plans.WAIT_SECONDS
    return out


def disruption_restarts(status: Mapping[str, Any]) -> int:
    """The restarts disruptions caused so far (absent until the first)."""
    return int(status.get("disruptionRestarts") or 0)


def failure_record(worker: observe.Worker, attempt: int, message: str) -> dict[str, Any]:
    """The status's lastFailure for `worker`, every field present: the status is merge-patched, and a
    field left out would keep the previous failure's value (a pod name and exit code of an earlier attempt
    beside this failure's message); a None removes it."""
    return api.WorkerFailure(
        worker=worker.index,
        pod=worker.pod_name,
        exit_code=worker.exit_code,
        reason=worker.reason,
        message=message,
        restart_attempt=attempt,
        node=worker.node,
        disruption=worker.disruption,
    ).model_dump(by_alias=True)


def created_message(job_names: Sequence[str]) -> str:
    last = f" .. {job_names[-1]}" if len(job_names) > 1 else ""
    return f"created {len(job_names)} worker Jobs: {job_names[0]}{last}"
