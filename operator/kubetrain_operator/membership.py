"""The elastic membership policy (spec.elastic): one worker lost is one worker replaced. Pure.

A fixed-size group restarts whole because DDP cannot lose a rank. An elastic group runs under torchrun's
c10d rendezvous, whose store lives in a pod of its own (`builders.build_rendezvous_job`), so the
survivors of a lost worker re-rendezvous by themselves; the operator only keeps the membership whole:

- Each worker index has its own attempt (status.elastic.workerAttempts; a new index starts at
  status.restartAttempt), which names its Job `<base>-r<attempt>-w<index>`. A worker that fails with a
  retryable code gets a new attempt (status.restartAttempt is the counter, so names never repeat) and a
  new Job; no other worker
  is touched. Each replacement counts one restart against runPolicy.maxRestarts; the failure that finds
  the budget spent fails the job with reason RestartLimitExceeded, naming the worker and its exit code.
  A non-retryable code fails the job at once, as in a fixed-size group.
- spec.workers is the desired count (kubectl scale): missing indices are created, indices at or above
  it are deleted (and the counter moves on, so a later scale-up never reuses a name still terminating).
- Losing the rendezvous store loses the rendezvous itself: that, and only that, restarts the whole group
  (counted like a replacement), waiting for the old Jobs to go first since the store's name is fixed.
- Training is over when a worker succeeded (torchrun ends every agent of a finished group together): no
  worker is replaced or created after that, and the job Succeeds once none is still running (or at once
  when worker 0 succeeded under successPolicy Worker0).
- The job runs while at least minWorkers workers run; with fewer it is Pending, with the reason of the
  first worker that is not running (Unschedulable...), and carries on when capacity returns. Every change
  of the running set is a MembershipChanged event and status.elastic says who runs and the world size.

The status patch is written before any deletion or creation (as for every plan), so a new attempt number
is durable before its Job exists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from kubetrain_operator import api, builders, constants, failure, names, observe, reconcile
from kubetrain_operator import status as st
from kubetrain_operator.observe import Worker

Fail = Callable[[str, str, Worker | None], "reconcile.Plan"]
"""reconcile's way to end the job Failed (status, event, cleanup), shared by both group kinds."""


def worker_attempts(status: Mapping[str, Any], workers: int) -> dict[int, int]:
    """The attempt of each wanted worker index's current Job. Kept as a list, which a status merge patch
    replaces whole (a map's removed keys would linger)."""
    counter = int(status.get("restartAttempt") or 0)
    recorded = (status.get("elastic") or {}).get("workerAttempts") or []
    return {index: int(recorded[index]) if index < len(recorded) else counter for index in range(workers)}


def is_rendezvous(obj: Mapping[str, Any]) -> bool:
    """Whether a Job or pod is an elastic job's rendezvous store."""
    labels = obj.get("metadata", {}).get("labels") or {}
    return labels.get(constants.LABEL_ROLE) == constants.ROLE_RENDEZVOUS


def read_members(
    attempts: Mapping[int, int], jobs: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]
) -> list[Worker]:
    """Every wanted worker as of its own attempt (`observe.read_worker` for each)."""
    out = []
    for index, attempt in sorted(attempts.items()):
        job = next((j for j in jobs if observe.worker_key(j) == (attempt, index)), None)
        own = [p for p in pods if observe.worker_key(p) == (attempt, index)]
        out.append(observe.read_worker(index, attempt, job, own))
    return out


def stale_jobs(attempts: Mapping[int, int], jobs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Worker Jobs that are no current member: a replaced attempt, or an index scaled away."""
    current = {(attempt, index) for index, attempt in attempts.items()}
    return [j for j in jobs if not is_rendezvous(j) and observe.worker_key(j) not in current]


def _deleting(obj: Mapping[str, Any]) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


def _read_store(obs_jobs: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]) -> Worker | None:
    job = next((j for j in obs_jobs if is_rendezvous(j)), None)
    if job is None:
        return None
    return observe.read_worker(-1, 0, job, [p for p in pods if is_rendezvous(p)])


def decide_failure(spec: api.TrainingJobSpec, worker: Worker, restarts: int) -> failure.Decision:
    """What one failed worker of an elastic group means, given `restarts` spent so far: "restart" (replace
    it alone, as restart `restarts + 1`) or "fail". Shared by the operator and `kubetrain run --local`."""
    what = failure.describe_failure(worker)
    if not spec.failure_policy.is_retryable(worker.exit_code):
        return failure.Decision(
            "fail", "NonRetryableExitCode", f"{what}: the exit code is non-retryable (failurePolicy)", worker
        )
    limit = spec.run_policy.max_restarts
    return _budget_spent(what, restarts, limit, worker) or failure.Decision(
        "restart",
        "WorkerReplaced",
        f"{what}; replacing worker {worker.index} alone (restart {restarts + 1} of {limit})",
        worker,
    )


def decide_rendezvous_loss(spec: api.TrainingJobSpec, why: str, restarts: int) -> failure.Decision:
    """What losing the rendezvous store means, given `restarts` spent so far: "restart" the whole group (a
    fresh store cannot rebuild the lost rendezvous, so every worker starts again from the checkpoints), as
    restart `restarts + 1`, or "fail" when the budget is spent. Shared by the operator and `kubetrain run
    --local`."""
    limit = spec.run_policy.max_restarts
    return _budget_spent(why, restarts, limit) or failure.Decision(
        "restart", "RendezvousLost", f"{why}; restarting the whole group (restart {restarts + 1} of {limit})"
    )


def _budget_spent(
    what: str, restarts: int, limit: int, worker: failure.Worker | None = None
) -> failure.Decision | None:
    """The failing decision once `restarts` has reached maxRestarts; None while the budget lasts."""
    if restarts < limit:
        return None
    return failure.Decision(
        "fail",
        "RestartLimitExceeded",
        f"{what}; the restart budget is spent ({restarts} of maxRestarts {limit})",
        worker,
    )


def plan(
    obs: reconcile.Observed,
    spec: api.TrainingJobSpec,
    out: reconcile.Plan,
    now: datetime,
    *,
    ctx: builders.Context,
    fail: Fail,
    stale_grace_seconds: float,
) -> reconcile.Plan:
    """Steps 5 to 8 of `reconcile.plan` for an elastic job; `out.status` already carries the changes of
    the earlier steps (spec checks, suspend, deadline)."""
    status = out.status
    assert spec.elastic is not None
    counter = int(status["restartAttempt"])
    restarts = int(status["restarts"])
    attempts = worker_attempts(status, spec.workers)
    members = read_members(attempts, obs.jobs, obs.pods)
    store = _read_store(obs.jobs, obs.pods)
    stale = stale_jobs(attempts, obs.jobs)
    present = [m for m in members if m.phase != "missing"]
    finished = any(m.phase == "succeeded" for m in members)

    def restart_group(why: str) -> reconcile.Plan:
        decision = decide_rendezvous_loss(spec, why, restarts)
        if decision.action == "fail":
            return fail(decision.reason, decision.message, None)
        status["restartAttempt"] = counter + 1
        status["restarts"] = restarts + 1
        status["elastic"] = None
        st.enter_phase(status, "Restarting", decision.reason, decision.message, now)
        out.events.append(reconcile.Event("Warning", "Restarting", decision.message))
        out.transitions.append("restarted")
        out.delete += [
            reconcile.Deletion("Job", j["metadata"]["name"], "Foreground", j["metadata"].get("uid"))
            for j in obs.jobs
            if not _deleting(j)
        ]
        out.requeue_after = reconcile.WAIT_SECONDS
        return out

    # 5. The rendezvous store: lost while workers of this group exist, the group starts over.
    store_lost = store is None or store.phase in ("failed", "succeeded") or store.deleting
    if store_lost and present and not finished:
        why = "the rendezvous store's Job is missing"
        if store is not None:
            why = f"the rendezvous store ended: {store.reason or store.phase}"
        return restart_group(why)
    if store is None or store.deleting:
        # A new group (first start, after a restart or a resume): the old Jobs go first, the store's
        # fixed name and any old rank 0 writing checkpoints with them.
        waiting = []
        for job in obs.jobs:
            if not _deleting(job):
                out.delete.append(reconcile.Deletion("Job", job["metadata"]["name"], "Foreground"))
                waiting.append(job)
            else:
                since = observe.parse_time(job["metadata"]["deletionTimestamp"])
                if since is None or (now - since).total_seconds() < stale_grace_seconds:
                    waiting.append(job)
        if waiting:
            message = f"waiting for {len(waiting)} Jobs of earlier attempts to be deleted"
            return reconcile._wait_for_old_workers(out, message, members, spec.workers, now)

    # 6. Failures: replace each failed worker alone, within the budget; non-retryable codes fail the job.
    failed = [m for m in members if m.phase == "failed"]
    if failed and not finished:
        # A non-retryable code anywhere is the root cause; the other failures are usually its peers.
        for member in sorted(failed, key=lambda m: spec.failure_policy.is_retryable(m.exit_code)):
            decision = decide_failure(spec, member, restarts)
            if decision.action == "fail":
                return fail(decision.reason, decision.message, member)
            counter += 1
            restarts += 1
            attempts[member.index] = counter
            status["lastFailure"] = reconcile._failure_record(member, member.attempt, decision.message)
            out.events.append(reconcile.Event("Warning", decision.reason, decision.message))
            out.transitions.append("restarted")
        members = [
            m if m.phase != "failed" else Worker(m.index, attempts[m.index], "missing") for m in members
        ]
        stale = stale_jobs(attempts, obs.jobs)

    # 7. Scale down: indices at or above spec.workers leave; the counter moves past their names.
    removed = sorted(
        {
            key[1]
            for job in stale
            if (key := observe.worker_key(job)) and key[1] >= spec.workers and not _deleting(job)
        }
    )
    if removed:
        counter += 1
        out.events.append(
            reconcile.Event(
                "Normal",
                "ScaledDown",
                f"spec.workers is {spec.workers}: removing worker {', '.join(map(str, removed))}",
            )
        )
    out.delete += [reconcile._deletion("Job", j) for j in stale if not _deleting(j)]
    status["restartAttempt"] = counter
    status["restarts"] = restarts
    elastic: dict[str, Any] = {
        **(status.get("elastic") or {}),
        "workerAttempts": [attempts[index] for index in range(spec.workers)],
    }
    status["elastic"] = elastic

    # 8. Success: torchrun ends every agent of a finished group; late failures are not replaced.
    if finished:
        running = [m for m in members if m.phase in ("pending", "running")]
        worker0_done = spec.success_policy == "Worker0" and members[0].phase == "succeeded"
        if worker0_done or not [m for m in running if m.phase == "running"]:
            st.record_workers(status, members, spec.workers)
            reason = "Worker0Succeeded" if worker0_done else "TrainingFinished"
            message = (
                "worker 0 succeeded (successPolicy Worker0)"
                if worker0_done
                else f"training finished: {sum(m.phase == 'succeeded' for m in members)} workers succeeded"
            )
            st.enter_phase(status, "Succeeded", reason, message, now)
            status["completionTime"] = st.timestamp(now)
            status["pendingReason"] = None
            status["pendingMessage"] = None
            out.events.append(reconcile.Event("Normal", "Succeeded", message))
            out.transitions.append("succeeded")
            out.delete += reconcile._cleanup(spec.run_policy.clean_pod_policy, members, obs.jobs, obs.service)
            out.delete += [
                reconcile._deletion("Job", j) for j in obs.jobs if is_rendezvous(j) and not _deleting(j)
            ]
            if spec.run_policy.ttl_seconds_after_finished is not None:
                out.requeue_after = float(spec.run_policy.ttl_seconds_after_finished)
            return out

    # 9. Create what is missing: the Service, the store, then each absent worker at its own attempt.
    if obs.service is None:
        out.create.append(builders.build_service(ctx))
    if store is None:
        out.create.append(builders.build_rendezvous_job(ctx))
    missing = [] if finished else [m for m in members if m.phase == "missing"]
    out.create += [
        builders.build_worker_job(dataclasses.replace(ctx, restart_attempt=attempts[m.index]), m.index)
        for m in missing
    ]
    if missing:
        if status.get("startTime") is None:
            status["startTime"] = st.timestamp(now)
        created = ", ".join(names.worker_job_name(obs.name, attempts[m.index], m.index) for m in missing)
        message = f"created {len(missing)} worker Jobs: {created}"
        # Told by the Created condition, not a Normal event (see reconcile); a replacement has its
        # Restarting event, a new member its MembershipChanged.
        if st.set_condition(status, "Created", True, "WorkersCreated", message, now):
            out.transitions.append("created")

    # 10. Where the group stands: who runs, the world size, and whether minWorkers are there.
    running = [m.index for m in members if m.phase in ("running", "succeeded")]
    before = elastic.get("members") or []
    world = len(running) * spec.procs_per_worker()
    elastic.update(members=running, worldSize=world)
    if running != before:
        out.events.append(
            reconcile.Event(
                "Normal",
                "MembershipChanged",
                f"running workers {before} -> {running}: world size {world} "
                f"(minWorkers {spec.elastic.min_workers}, maxWorkers {spec.elastic.max_workers})",
            )
        )
    st.record_workers(status, members, spec.workers)
    reason = status.get("pendingReason")
    if reason and reason not in st.QUIET_PENDING_REASONS and reason != obs.status.get("pendingReason"):
        out.events.append(reconcile.Event("Warning", reason, status["pendingMessage"] or ""))
    if len(running) >= spec.elastic.min_workers and store is not None and store.phase == "running":
        message = (
            f"{len(running)} of {spec.workers} workers running (world size {world}; minWorkers "
            f"{spec.elastic.min_workers})"
        )
        if not st.enter_phase(status, "Running", "MinWorkersRunning", message, now):
            status["message"] = message
    else:
        message = f"waiting for minWorkers: {len(running)} of {spec.elastic.min_workers} running" + (
            f"; {status['pendingMessage']}" if status.get("pendingMessage") else ""
        )
        if status.get("phase") != "Pending":
            reason = status.get("pendingReason") or "WaitingForMinWorkers"
            st.enter_phase(status, "Pending", reason, message, now)
        else:
            status["message"] = message
    return out
