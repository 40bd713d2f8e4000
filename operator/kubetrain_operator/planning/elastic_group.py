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
- Losing the rendezvous store loses the rendezvous itself: that, and only that, restarts the whole group.
  Each store has a name of its own (status.elastic.storeGeneration), so the new group's store is created
  at once, never waiting for the old one's pod stuck on a lost node (old stores are deleted, not waited
  for: a store writes no checkpoint). A store the cluster took away (evicted, its node gone, its Job or
  pod deleted) is a disruption, not counted against maxRestarts; a store that failed on its own is.
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

from kubetrain_operator import api
from kubetrain_operator.api import constants, names
from kubetrain_operator.planning import builders, failure, observe, plans, steps
from kubetrain_operator.planning import status as st
from kubetrain_operator.planning.observe import Worker

Fail = Callable[[str, str, Worker | None], "plans.Plan"]
"""The planner's way to end the job Failed (status, event, cleanup), shared by both group kinds."""


RESTART_WITH_A_NEW_STORE = "restarting the whole group with a new rendezvous store"
"""How a lost rendezvous and a hung group are both ended: a fresh store cannot rebuild the old round."""


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
    attempts: Mapping[int, int],
    jobs: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    departed: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Worker]:
    """Every wanted worker as of its own attempt (`observe.read_worker` for each, `departed` the last
    states of deleted, disrupted pods by Job uid). Jobs and pods are filed
    by worker once: matching each member against every object made a reconcile of W workers cost W x
    (Jobs + pods), a second of CPU per replacement at 256 workers (benchmarks/peers_scale.py)."""
    job_of: dict[tuple[int, int] | None, Mapping[str, Any]] = {}
    for job in jobs:
        job_of.setdefault(observe.worker_key(job), job)
    pods_of: dict[tuple[int, int] | None, list[Mapping[str, Any]]] = {}
    for pod in pods:
        pods_of.setdefault(observe.worker_key(pod), []).append(pod)
    return [
        observe.read_worker(
            index, attempt, job_of.get((attempt, index)), pods_of.get((attempt, index), []), departed
        )
        for index, attempt in sorted(attempts.items())
    ]


def stale_jobs(attempts: Mapping[int, int], jobs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Worker Jobs that are no current member: a replaced attempt, or an index scaled away."""
    current = {(attempt, index) for index, attempt in attempts.items()}
    return [j for j in jobs if not is_rendezvous(j) and observe.worker_key(j) not in current]


def store_generation(status: Mapping[str, Any]) -> int:
    return int((status.get("elastic") or {}).get("storeGeneration") or 0)


def _read_store(
    name: str,
    obs_jobs: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    departed: Mapping[str, Mapping[str, Any]] | None = None,
) -> Worker | None:
    """The current store (the Job named for the current generation), as a worker of index -1."""
    job = next((j for j in obs_jobs if is_rendezvous(j) and plans.name_of(j) == name), None)
    if job is None:
        return None
    uid = job["metadata"].get("uid")
    own = [p for p in pods if is_rendezvous(p) and observe.controlled_by(p, uid)]
    return observe.read_worker(-1, 0, job, own, departed)


def decide_failure(
    spec: api.TrainingJobSpec, worker: Worker, restarts: int, disruptions: int = 0
) -> failure.Decision:
    """What one failed worker of an elastic group means, given the `restarts` and `disruptions` spent so
    far: "restart" (replace it alone, as restart `restarts + 1`, or as one more disruption restart when
    the cluster took it away) or "fail". Shared by the operator and `kubetrain run --local`."""
    if worker.disruption:
        return failure.decide_disruption(spec, worker, disruptions, f"replacing worker {worker.index} alone")
    what = failure.describe_failure(worker)
    if not spec.failure_policy.is_retryable(worker.exit_code):
        return failure.Decision(
            "fail", "NonRetryableExitCode", f"{what}: the exit code is non-retryable (failurePolicy)", worker
        )
    then = f"replacing worker {worker.index} alone"
    return failure.counted_restart(spec, what, restarts, reason="WorkerReplaced", then=then, worker=worker)


def decide_rendezvous_loss(
    spec: api.TrainingJobSpec, store: Worker | str | None, restarts: int, disruptions: int = 0
) -> failure.Decision:
    """What losing the rendezvous store means, given the `restarts` and `disruptions` spent so far:
    "restart" the whole group (a fresh store cannot rebuild the lost rendezvous, so every worker starts
    again from the checkpoints) or "fail" when the budget is spent. A store the cluster took away (its
    pod disrupted, its Job deleted or gone) is a disruption restart; a store that failed by itself counts
    as restart `restarts + 1`. `store` is the store as read (None: its Job is missing), or, from `kubetrain
    run --local`, why it was lost."""
    then = RESTART_WITH_A_NEW_STORE
    if store is None or (isinstance(store, Worker) and (store.disruption or store.deleting)):
        lost = store or Worker(-1, 0, "missing")
        if store is None:
            lost = dataclasses.replace(lost, disruption="JobDeleted")
        return failure.decide_disruption(spec, lost, disruptions, then)
    why = store if isinstance(store, str) else f"the rendezvous store ended: {store.reason or store.phase}"
    return failure.counted_restart(spec, why, restarts, reason="RendezvousLost", then=then, worker=None)


@dataclasses.dataclass
class _Group:
    """One planning pass of an elastic group: what the steps read, and what they move (the attempt counter,
    the restarts, each index's attempt and the members read at them)."""

    obs: plans.Observed
    spec: api.TrainingJobSpec
    out: plans.Plan
    now: datetime
    fail: Fail
    counter: int
    restarts: int
    attempts: dict[int, int]
    members: list[Worker]
    store: Worker | None
    old_stores: list[Mapping[str, Any]]
    """Store Jobs of earlier generations: deleted, never waited for."""
    stale: list[Mapping[str, Any]]

    @property
    def status(self) -> dict[str, Any]:
        return self.out.status

    @property
    def elastic(self) -> api.Elastic:
        assert self.spec.elastic is not None
        return self.spec.elastic

    @property
    def finished(self) -> bool:
        return any(m.phase == "succeeded" for m in self.members)


def plan(
    obs: plans.Observed,
    spec: api.TrainingJobSpec,
    out: plans.Plan,
    now: datetime,
    *,
    ctx: builders.Context,
    fail: Fail,
) -> plans.Plan:
    """Steps 5 to 10 of `planner.plan` for an elastic job; `out.status` already carries the changes of
    the earlier steps (spec checks, suspend, deadline). Each step decides the pass or lets the next go on."""
    status = out.status
    attempts = worker_attempts(status, spec.workers)
    current_store = names.rendezvous_job_name(obs.name, store_generation(status))
    group = _Group(
        obs,
        spec,
        out,
        now,
        fail,
        counter=int(status["restartAttempt"]),
        restarts=int(status["restarts"]),
        attempts=attempts,
        members=read_members(attempts, obs.jobs, obs.pods, obs.departed),
        store=_read_store(current_store, obs.jobs, obs.pods, obs.departed),
        old_stores=[j for j in obs.jobs if is_rendezvous(j) and plans.name_of(j) != current_store],
        stale=stale_jobs(attempts, obs.jobs),
    )
    # 5. The rendezvous store: lost while workers of this group exist, the group starts over; a new group
    # waits for the old one's Jobs to go.
    if (decided := _store(group)) is not None:
        return decided
    # 6. Failures: replace each failed worker alone, within the budget; non-retryable codes fail the job.
    if (failed := _replace_failed(group)) is not None:
        return failed
    # 6b. A hung group (failurePolicy.progressDeadlineSeconds): every member starts over, counted.
    if (hung := _stalled(group)) is not None:
        return hung
    # 7. Scale down: indices at or above spec.workers leave; the counter moves past their names.
    elastic = _scale_down(group)
    # 8. Success: torchrun ends every agent of a finished group; late failures are not replaced.
    if (succeeded := _success(group)) is not None:
        return succeeded
    # 9. Create what is missing: the Service, the store, then each absent worker at its own attempt.
    _create_missing(group, ctx)
    # 10. Where the group stands: who runs, the world size, and whether minWorkers are there.
    _record_group(group, elastic)
    return out


def _store(group: _Group) -> plans.Plan | None:
    obs, out, store, now = group.obs, group.out, group.store, group.now
    out.delete += [plans.deletion("Job", j) for j in group.old_stores if not plans.is_deleting(j)]
    present = [m for m in group.members if m.phase != "missing"]
    store_lost = store is None or store.phase in ("failed", "succeeded") or store.deleting
    if store_lost and present and not group.finished:
        status = group.status
        loss = decide_rendezvous_loss(group.spec, store, group.restarts, steps.disruption_restarts(status))
        return _restart_group(group, loss)
    if store is not None and not store.deleting:
        return None
    # A new group (first start, after a restart or a resume): the old workers go first, any old rank 0
    # writing checkpoints with them, and no namesake's pod may still run. Old stores are not waited for.
    size = group.spec.workers
    workers = [j for j in obs.jobs if not is_rendezvous(j)]
    return steps.retire_old_attempts(
        out, workers, pods=obs.pods, members=group.members, size=size, now=now
    ) or steps.wait_for_lingering_pods(out, obs.lingering_pods, members=group.members, size=size, now=now)


def _stalled(group: _Group) -> plans.Plan | None:
    """Restart the group when its members, all running, made no progress within the deadline: a hung
    collective holds every rank, so no one member can be replaced alone to free it."""
    if group.finished:
        return None
    decision = failure.decide_stall(
        group.spec, group.members, group.restarts, group.now, RESTART_WITH_A_NEW_STORE
    )
    if decision.action == "continue":
        return None
    if decision.action == "restart":
        assert decision.worker is not None
        group.status["lastFailure"] = steps.failure_record(
            decision.worker, decision.worker.attempt, decision.message
        )
    return _restart_group(group, decision)


def _restart_group(group: _Group, decision: failure.Decision) -> plans.Plan:
    """Every worker starts over at a new attempt with a new store (the next generation), as `decision`
    (the rendezvous lost, or the group hung) says; or the job fails when its budget is spent."""
    out, status = group.out, group.status
    generation = store_generation(status)
    if decision.action == "fail":
        return group.fail(decision.reason, decision.message, decision.worker)
    # The old group's record goes (status is merge-patched: each key it had is nulled), the store's
    # generation moves on.
    status["elastic"] = {
        **dict.fromkeys(status.get("elastic") or {}),
        "storeGeneration": generation + 1,
    }
    return steps.restart_whole_group(
        out, group.obs.jobs, decision, attempt=group.counter, restarts=group.restarts, now=group.now
    )


def _replace_failed(group: _Group) -> plans.Plan | None:
    """Each failed worker gets a new attempt of its own index (its replacement is created as missing);
    the job fails instead when the code is not retryable or the budget is spent."""
    failed = [m for m in group.members if m.phase == "failed"]
    if not failed or group.finished:
        return None
    spec = group.spec
    # A non-retryable code anywhere is the root cause; the other failures are usually its peers.
    for member in sorted(
        failed, key=lambda m: bool(m.disruption) or spec.failure_policy.is_retryable(m.exit_code)
    ):
        decision = decide_failure(spec, member, group.restarts, steps.disruption_restarts(group.status))
        if decision.action == "fail":
            return group.fail(decision.reason, decision.message, member)
        group.counter += 1
        if decision.disruption:
            group.status["disruptionRestarts"] = steps.disruption_restarts(group.status) + 1
        else:
            group.restarts += 1
        group.attempts[member.index] = group.counter
        group.status["lastFailure"] = steps.failure_record(member, member.attempt, decision.message)
        group.out.events.append(plans.Event("Warning", decision.reason, decision.message))
        group.out.transitions.append("restarted")
    group.members = [
        m if m.phase != "failed" else Worker(m.index, group.attempts[m.index], "missing")
        for m in group.members
    ]
    group.stale = stale_jobs(group.attempts, group.obs.jobs)
    return None


def _scale_down(group: _Group) -> dict[str, Any]:
    """Delete the stale Jobs (replaced workers, indices above spec.workers) and record the attempts;
    the status's elastic record, which the last step completes."""
    spec, status, out = group.spec, group.status, group.out
    removed = sorted(
        {
            key[1]
            for job in group.stale
            if (key := observe.worker_key(job)) and key[1] >= spec.workers and not plans.is_deleting(job)
        }
    )
    if removed:
        group.counter += 1
        out.events.append(
            plans.Event(
                "Normal",
                "ScaledDown",
                f"spec.workers is {spec.workers}: removing worker {', '.join(map(str, removed))}",
            )
        )
    out.delete += [plans.deletion("Job", j) for j in group.stale if not plans.is_deleting(j)]
    status["restartAttempt"] = group.counter
    status["restarts"] = group.restarts
    elastic: dict[str, Any] = {
        **(status.get("elastic") or {}),
        "workerAttempts": [group.attempts[index] for index in range(spec.workers)],
    }
    status["elastic"] = elastic
    return elastic


def _success(group: _Group) -> plans.Plan | None:
    """Succeeded once a worker finished and none runs any more (or worker 0 did, with Worker0)."""
    if not group.finished:
        return None
    spec, status, out, obs, members = group.spec, group.status, group.out, group.obs, group.members
    running = [m for m in members if m.phase == "running"]
    worker0_done = spec.success_policy == "Worker0" and members[0].phase == "succeeded"
    if running and not worker0_done:
        return None
    st.record_workers(status, members, spec.workers)
    reason = "Worker0Succeeded" if worker0_done else "TrainingFinished"
    message = (
        "worker 0 succeeded (successPolicy Worker0)"
        if worker0_done
        else f"training finished: {sum(m.phase == 'succeeded' for m in members)} workers succeeded"
    )
    st.enter_phase(status, "Succeeded", reason, message, group.now)
    status["completionTime"] = st.timestamp(group.now)
    status["pendingReason"] = None
    status["pendingMessage"] = None
    out.events.append(plans.Event("Normal", "Succeeded", message))
    out.transitions.append("succeeded")
    out.delete += steps.cleanup(spec.run_policy.clean_pod_policy, members, obs.jobs, obs.service)
    out.delete += [
        plans.deletion("Job", j) for j in obs.jobs if is_rendezvous(j) and not plans.is_deleting(j)
    ]
    if spec.run_policy.ttl_seconds_after_finished is not None:
        out.requeue_after = float(spec.run_policy.ttl_seconds_after_finished)
    return out


def _create_missing(group: _Group, ctx: builders.Context) -> None:
    obs, out, status, now = group.obs, group.out, group.status, group.now
    if obs.service is None:
        out.create.append(builders.build_service(ctx))
    if group.store is None:
        out.create.append(builders.build_rendezvous_job(ctx))
    missing = [] if group.finished else [m for m in group.members if m.phase == "missing"]
    out.create += [
        builders.build_worker_job(dataclasses.replace(ctx, restart_attempt=group.attempts[m.index]), m.index)
        for m in missing
    ]
    if missing:
        if status.get("startTime") is None:
            status["startTime"] = st.timestamp(now)
        created = ", ".join(
            names.worker_job_name(obs.name, group.attempts[m.index], m.index) for m in missing
        )
        message = f"created {len(missing)} worker Jobs: {created}"
        # Told by the Created condition, not a Normal event (see whole_group); a replacement has its
        # Restarting event, a new member its MembershipChanged.
        if st.set_condition(status, "Created", True, "WorkersCreated", message, now):
            out.transitions.append("created")


def _record_group(group: _Group, elastic: dict[str, Any]) -> None:
    spec, status, out, obs, members, now = (
        group.spec,
        group.status,
        group.out,
        group.obs,
        group.members,
        group.now,
    )
    policy = group.elastic
    if (stall_check := failure.next_stall_check(spec, members, now)) is not None:
        out.requeue_after = min(out.requeue_after or stall_check, stall_check)
    running = [m.index for m in members if m.phase in ("running", "succeeded")]
    before = elastic.get("members") or []
    world = len(running) * spec.procs_per_worker()
    elastic.update(members=running, worldSize=world)
    if running != before:
        out.events.append(
            plans.Event(
                "Normal",
                "MembershipChanged",
                f"running workers {before} -> {running}: world size {world} "
                f"(minWorkers {policy.min_workers}, maxWorkers {policy.max_workers})",
            )
        )
    st.record_workers(status, members, spec.workers)
    reason = status.get("pendingReason")
    if reason and reason not in st.QUIET_PENDING_REASONS and reason != obs.status.get("pendingReason"):
        out.events.append(plans.Event("Warning", reason, status["pendingMessage"] or ""))
    store = group.store
    if len(running) >= policy.min_workers and store is not None and store.phase == "running":
        message = (
            f"{len(running)} of {spec.workers} workers running (world size {world}; minWorkers "
            f"{policy.min_workers})"
        )
        if not st.enter_phase(status, "Running", "MinWorkersRunning", message, now):
            status["message"] = message
    else:
        message = f"waiting for minWorkers: {len(running)} of {policy.min_workers} running" + (
            f"; {status['pendingMessage']}" if status.get("pendingMessage") else ""
        )
        if status.get("phase") != "Pending":
            reason = status.get("pendingReason") or "WaitingForMinWorkers"
            st.enter_phase(status, "Pending", reason, message, now)
        else:
            status["message"] = message
