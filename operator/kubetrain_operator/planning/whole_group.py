"""The whole-group policy: a fixed-size DDP group restarts whole when a worker fails. Pure.

DDP cannot lose a rank, so a failure bumps status.restartAttempt and retires the old attempt's Jobs
(`steps.retire_old_attempts`: Foreground, so their pods go first, guarded by uid); the new attempt's Jobs
(new names) are created once the old ones are gone, however long a pod stuck terminating on a lost node
takes (one attempt runs at a time), and once no pod of a namesake can still run. The failure and success
policies themselves are `failure.decide`.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubetrain_operator.api import names
from kubetrain_operator.planning import builders, failure, gang, observe, plans, steps
from kubetrain_operator.planning import status as st


def plan(p: steps.Pass, ctx: builders.Context) -> plans.Plan:
    """Steps 5 to 8 of `planner.plan` for a fixed-size group; each either decides the pass (returns the
    plan) or records what it found and lets the next go on."""
    # 5. Old attempt's Jobs: delete them, and wait for them to go before starting the next group.
    waiting = steps.retire_old_attempts(
        p.out,
        p.stale,
        pods=p.obs.pods,
        members=p.workers,
        size=p.spec.workers,
        now=p.now,
    )
    if waiting is not None:
        return waiting
    # 6. Failure and success policies.
    if (decided := _verdict(p)) is not None:
        return decided
    # 7. Create what is missing of the current attempt.
    missing = [w for w in p.workers if w.phase == "missing"]
    if (blocked := _create_missing(p, ctx, missing)) is not None:
        return blocked
    # 8. Where the group stands.
    _record_group(p, ctx, missing)
    return p.out


def _verdict(p: steps.Pass) -> plans.Plan | None:
    """What the failure and success policies decide (`failure.decide`): fail, restart the group, or
    succeed; None while the group runs on."""
    out, spec, status = p.out, p.spec, p.status
    decision = failure.decide(spec, p.workers, p.restarts, steps.disruption_restarts(status))
    if decision.action == "continue":
        decision = failure.decide_stall(spec, p.workers, p.restarts, p.now)
    if decision.action == "fail":
        return p.fail(decision.reason, decision.message, decision.worker)
    if decision.action == "restart":
        assert decision.worker is not None
        status["lastFailure"] = steps.failure_record(decision.worker, p.attempt, decision.message)
        st.record_workers(status, p.workers, spec.workers)
        return steps.restart_whole_group(
            out, p.obs.jobs, decision, attempt=p.attempt, restarts=p.restarts, now=p.now
        )
    if decision.action == "succeed":
        st.record_workers(status, p.workers, spec.workers)
        st.enter_phase(status, "Succeeded", decision.reason, decision.message, p.now)
        status["completionTime"] = st.timestamp(p.now)
        status["pendingReason"] = None
        status["pendingMessage"] = None
        out.events.append(plans.Event("Normal", "Succeeded", decision.message))
        out.transitions.append("succeeded")
        return p.clean_up_after_the_end()
    return None


def _create_missing(
    p: steps.Pass, ctx: builders.Context, missing: Sequence[observe.Worker]
) -> plans.Plan | None:
    """Plan the creation of the current attempt's missing objects; a plan that waits instead when a
    namesake this TrainingJob does not control holds one of their names."""
    out, spec, obs, status = p.out, p.spec, p.obs, p.status
    if missing and (
        lingering := steps.wait_for_lingering_pods(
            out, obs.lingering_pods, members=p.workers, size=spec.workers, now=p.now
        )
    ):
        return lingering
    # The gang's objects go with what they belong to, so no request is spent checking on them: the
    # TrainingJob's (the Workload; a volcano or scheduler-plugins PodGroup) with the Service, an attempt's
    # PodGroup with that attempt's first Jobs. The shell creates them before the Service and Jobs, so no
    # worker pod waits for a missing group, and takes a 409 for one of ours as done.
    if obs.service is None:
        workload = builders.build_workload(ctx)
        out.create += ([workload] if workload else []) + [builders.build_service(ctx)]
    group = builders.build_pod_group(ctx)
    per_attempt = ctx.gang_provider in gang.PER_ATTEMPT_GROUPS
    if group is not None and (len(missing) == spec.workers if per_attempt else obs.service is None):
        out.create.append(group)
    out.create += [builders.build_worker_job(ctx, w.index) for w in missing]
    taken = set(obs.taken)
    blocked = [
        f"{m['kind']} {m['metadata']['name']}" for m in out.create if (m["kind"], plans.name_of(m)) in taken
    ]
    if blocked:
        # A namesake deleted with background propagation leaves its children to the garbage collector:
        # create nothing (a 409 would not be ours) until its objects are gone. Orphans are not adopted
        # (that would take patch rights on Jobs and Services); the message says to delete them.
        out.create = []
        more = f" and {len(blocked) - 3} more" if len(blocked) > 3 else ""
        message = (
            f"waiting for {', '.join(blocked[:3])}{more} to be deleted: this TrainingJob does not control "
            f"them (usually an earlier TrainingJob named {obs.name}, whose children the garbage collector "
            "has not removed yet, does; delete them if they were orphaned)"
        )
        return steps.wait_for_old_workers(out, message, p.workers, spec.workers, p.now)
    if missing:
        if status.get("startTime") is None:
            status["startTime"] = st.timestamp(p.now)
        message = steps.created_message(
            [names.worker_job_name(obs.name, p.attempt, w.index) for w in missing]
        )
        # A start is told by the Created and Running conditions (message and time), not by Normal
        # events: an Event is one more write per job for what status already says.
        if st.set_condition(status, "Created", True, "WorkersCreated", message, p.now):
            out.transitions.append("created")
    return None


def _record_group(p: steps.Pass, ctx: builders.Context, missing: Sequence[observe.Worker]) -> None:
    """Where the group stands: worker counts, why it waits (a Warning when that is actionable and new),
    the phase, and when to look again (the resync, or the deadline if sooner)."""
    out, spec, obs, status, now = p.out, p.spec, p.obs, p.status, p.now
    st.record_workers(status, p.workers, spec.workers)
    if ctx.gang_provider is not None and status["pendingReason"] == "Unschedulable":
        status["pendingMessage"] = gang.waiting_message(
            ctx.gang_provider, obs.name, p.attempt, spec.workers, status["pendingMessage"]
        )
    if missing and status["pendingReason"] is None and obs.status.get("pendingReason") == "FailedCreate":
        # The controller recorded why creating workers failed; keep saying so until they exist.
        status["pendingReason"] = "FailedCreate"
        status["pendingMessage"] = obs.status.get("pendingMessage")
    reason = status.get("pendingReason")
    if reason and reason not in st.QUIET_PENDING_REASONS and reason != obs.status.get("pendingReason"):
        out.events.append(plans.Event("Warning", status["pendingReason"], status["pendingMessage"] or ""))
    if st.group_running(p.workers):
        message = f"all {spec.workers} workers are running (restart attempt {p.attempt})"
        st.enter_phase(status, "Running", "AllWorkersRunning", message, now)
    elif st.is_true(status, "Restarting"):
        status["phase"] = "Restarting"
    else:
        reason = status.get("pendingReason") or "WorkersPending"
        message = status.get("pendingMessage") or (
            f"waiting for {st.worker_counts(p.workers)['pending']} of {spec.workers} workers to start"
        )
        if status.get("phase") != "Pending":
            st.enter_phase(status, "Pending", reason, message, now)
        else:
            status["message"] = message

    requeue = p.defaults.resync_seconds
    deadline = spec.run_policy.active_deadline_seconds
    if deadline is not None and status.get("startTime"):
        started = observe.parse_time(status["startTime"]) or now
        requeue = min(requeue, max(0.5, deadline - steps.seconds_between(started, now)))
    if (stall_check := failure.next_stall_check(spec, p.workers, now)) is not None:
        requeue = min(requeue, stall_check)
    out.requeue_after = requeue
