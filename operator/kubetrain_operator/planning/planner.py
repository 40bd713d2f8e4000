"""The planner: TrainingJob + observed children + now -> a Plan of actions. Pure.

Level-based: every call derives what should exist from the spec, the previous status (which records the
decisions already taken: restart attempt, restarts, start and completion times) and what exists, so the
shell can run it after any crash (see `plans` for the order in which the shell executes a plan).

`plan` is a short list of numbered steps sharing one `steps.Pass`: a step either decides the pass
(returns the plan) or records what it found and lets the next go on. Steps 1 to 4 are every job's (spec
checks, finished, suspend or Kueue's hold, deadline); steps 5 on are the group's policy: `whole_group`
(a failure restarts the whole group) or, for spec.elastic, `elastic_group` (one failed worker is replaced
alone, spec.workers scales the group). Suspend deletes every worker Job and bumps the attempt the same
way as a restart (Foreground too, so a quick resume waits for the old pods and no old rank 0 writes
checkpoints or progress.json beside the new attempt), without counting a restart.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import pydantic

from kubetrain_operator import api
from kubetrain_operator.api import constants, fieldpaths, names
from kubetrain_operator.planning import (
    admission,
    builders,
    elastic_group,
    gang,
    observe,
    plans,
    queueing,
    steps,
    whole_group,
)
from kubetrain_operator.planning import status as st


def managed_here(body: Mapping[str, Any]) -> bool:
    """Whether the kubetrain operator reconciles this TrainingJob: spec.managedBy is unset or names it.
    Any other controller's TrainingJob is left alone entirely, as the Job controller leaves a Job whose
    managedBy names another (Kueue's MultiKueue runs such jobs on worker clusters)."""
    return (body.get("spec") or {}).get("managedBy") in (None, constants.MANAGED_BY_CONTROLLER)


def plan(obs: plans.Observed, now: datetime, defaults: plans.Defaults | None = None) -> plans.Plan:
    """Decide everything one reconcile of `obs` should do (under the operator's `defaults`)."""
    defaults = defaults or plans.Defaults()
    if recorded := obs.status.get("gangProvider"):
        # The provider this job was given is kept for its life (see status.gangProvider).
        defaults = dataclasses.replace(defaults, gang_provider=recorded)
    out = _steps(obs, now, defaults)
    if st.is_true(out.status, "SpecRefused"):
        out.create = []  # a held job ends by its policies, but nothing is started from a refused spec
    out.delete += _attempt_group_deletions(obs, out.delete, defaults.gang_provider)
    # Any creation after the first (a restart's, a resume's, an elastic replacement's, or children that
    # disappeared) waits for the shell to confirm the owner still exists (see plans.Plan.confirm_owner).
    out.confirm_owner = bool(out.create) and st.is_true(dict(obs.status), "Created")
    return out


def _attempt_group_deletions(
    obs: plans.Observed, deletions: Sequence[plans.Deletion], default_provider: api.GangProvider | None
) -> list[plans.Deletion]:
    """The PodGroups of the restart attempts whose Jobs go (provider kubernetes makes one per attempt):
    deleted with them, so a TrainingJob keeps at most its current attempt's group. The
    podgroup-protection finalizer holds each until its pods are gone. The raw spec is read here: a spec
    the planner refused deletes no Jobs."""
    gang_spec = obs.spec.get("gangScheduling")
    if gang_spec is None or (gang_spec.get("provider") or default_provider) != "kubernetes":
        return []
    deleted = {d.name for d in deletions if d.kind == "Job"}
    attempts = sorted(
        {
            key[0]
            for job in obs.jobs
            if plans.name_of(job) in deleted and (key := observe.worker_key(job)) is not None
        }
    )
    return [
        plans.Deletion(
            "PodGroup",
            names.attempt_pod_group_name(obs.name, attempt),
            api_version=constants.KUBERNETES_SCHEDULING_API,
        )
        for attempt in attempts
    ]


def _steps(obs: plans.Observed, now: datetime, defaults: plans.Defaults) -> plans.Plan:
    """The steps in order; each either decides the pass (returns the plan) or records what it found and
    lets the next one go on."""
    status: dict[str, Any] = copy.deepcopy(dict(obs.status))
    status["observedGeneration"] = obs.generation
    attempt = int(status.get("restartAttempt") or 0)
    restarts = int(status.get("restarts") or 0)
    status.setdefault("restartAttempt", attempt)
    status.setdefault("restarts", restarts)
    out = plans.Plan(status=status)
    phase = status.get("phase")

    # 1. A spec the operator refuses: invalid (the CRD's rules were bypassed, or this operator's checks are
    # stricter than those of the one that accepted it) or not allowed by the operator's flags. A job never
    # started fails; one already accepted is held, and goes on to its end by what can be read of its spec.
    refusal, spec = _check(obs.spec, defaults)
    if refusal is not None:
        _refuse(obs, out, *refusal, now)
    elif st.is_true(status, "SpecRefused"):
        st.set_condition(
            status, "SpecRefused", False, "SpecAccepted", "the spec passes the operator's checks", now
        )
    if spec is None or "failed" in out.transitions:
        return out

    if spec.elastic is not None:
        attempts = elastic_group.worker_attempts(status, spec.workers)
        workers = elastic_group.read_members(attempts, obs.jobs, obs.pods, obs.departed)
        stale = elastic_group.stale_jobs(attempts, obs.jobs)
    else:
        workers = observe.read_workers(spec.workers, attempt, obs.jobs, obs.pods, obs.departed)
        stale = observe.stale_jobs(attempt, obs.jobs)
    st.record_progress(status, observe.read_progress(obs.pods, attempt))
    p = steps.Pass(obs, spec, out, now, defaults, attempt, restarts, list(workers), list(stale))

    # 2. Finished: clean up, then wait for the TTL.
    if phase in api.TERMINAL_PHASES:
        return _finished(p, phase)

    # 3. Suspended, by spec.runPolicy.suspend or until Kueue admits the job.
    queue = queueing.plan_admission(obs, spec, status=status, defaults=defaults, out=out, now=now)
    if spec.run_policy.suspend or queue.hold is not None:
        return _suspended(p, queue)
    if st.is_true(status, "Suspended"):
        _resumed(p, queue)
    if _record_created(status, p.workers, p.current_jobs(), now):
        out.transitions.append("created")

    # 4. Deadline.
    if (deadline_passed := _deadline(p)) is not None:
        return deadline_passed

    ctx = builders.Context(
        owner=builders.Owner(obs.name, obs.namespace, obs.uid),
        spec=spec,
        restart_attempt=attempt,
        default_image=defaults.image,
        default_service_account=defaults.service_account,
        default_gang_provider=defaults.gang_provider,
        placement=queue.placement,
        store_placement=queue.store_placement,
    )
    if ctx.gang_provider is not None:
        status["gangProvider"] = ctx.gang_provider
    out = _elastic(p, queue, ctx) if spec.elastic is not None else whole_group.plan(p, ctx)
    # Kueue's waitForPodsReady reads the Workload's PodsReady condition, which the job's controller keeps.
    workload = obs.workload if queue.admitted_by is not None else None
    if (
        workload is not None
        and out.workload_status is None
        and out.status.get("phase") not in api.TERMINAL_PHASES
        and (ready := queueing.pods_ready(workload, p.workers, now)) is not None
    ):
        out.workload_conditions = queueing.applied(workload, ready)
    return out


def _finished(p: steps.Pass, phase: str) -> plans.Plan:
    """Succeeded or Failed: remove what cleanPodPolicy says, tell Kueue, and delete the TrainingJob once
    its TTL has passed."""
    out, spec, obs = p.out, p.spec, p.obs
    out.delete += steps.cleanup(spec.run_policy.clean_pod_policy, p.workers, obs.jobs, obs.service)
    deleted = {d.name for d in out.delete}
    out.delete += [
        plans.deletion("Job", j)
        for j in p.stale
        if not plans.is_deleting(j) and plans.name_of(j) not in deleted
    ]
    if obs.workload is not None and not queueing.read_admission(obs.workload).finished:
        # Kueue releases the quota of a Finished Workload (what its job reconciler writes for a
        # finished JobSet); the workers still running under cleanPodPolicy None are not counted.
        message = p.status.get("message") or str(phase)
        condition = queueing.finished(obs.workload, phase == "Succeeded", message, p.now)
        out.workload_conditions = queueing.applied(obs.workload, condition)
    ttl = spec.run_policy.ttl_seconds_after_finished
    finished = observe.parse_time(p.status.get("completionTime"))
    if ttl is not None and finished is not None:
        left = ttl - steps.seconds_between(finished, p.now)
        if left <= 0:
            out.delete_self = True
            out.events.append(
                plans.Event("Normal", "Deleting", f"ttlSecondsAfterFinished ({ttl}s) has passed")
            )
        else:
            out.requeue_after = left
    return out


def _suspended(p: steps.Pass, queue: queueing.Queued) -> plans.Plan:
    """Remove the workers; resume (or admission) starts a fresh attempt, not a restart."""
    out, spec, obs, status = p.out, p.spec, p.obs, p.status
    if p.current_jobs():
        status["restartAttempt"] = p.attempt + 1
    out.delete += [plans.deletion("Job", j, "Foreground") for j in obs.jobs if not plans.is_deleting(j)]
    status["startTime"] = None
    if spec.elastic is not None:
        status["elastic"] = None  # a resumed elastic group starts whole, at the new attempt
    status["pendingReason"] = None
    status["pendingMessage"] = None
    status["workers"] = st.worker_counts(())
    status["workersReady"] = f"0/{spec.workers}"
    stopping = f"deleting {len(obs.jobs)} worker Jobs and waiting for their pods to stop"
    if spec.run_policy.suspend or queue.hold is None:
        reason, message = (
            "Suspended",
            f"suspended: {stopping}" if obs.jobs else "suspended: no workers are running",
        )
    else:
        reason, message = queue.hold
        if obs.jobs:
            message = f"{message}; {stopping}"
    before = st.get_condition(status, "Suspended") or {}
    if st.enter_phase(status, "Suspended", reason, message, p.now) or before.get("reason") != reason:
        out.events.append(plans.Event("Normal", reason, message))
    st.set_condition(status, "Suspended", True, reason, message, p.now)
    status["message"] = message
    return out


def _resumed(p: steps.Pass, queue: queueing.Queued) -> None:
    reason, message = "Resumed", "resumed: recreating the workers"
    if queue.admitted_by is not None:
        reason, message = ("Admitted", f"admitted by ClusterQueue {queue.admitted_by}: creating the workers")
    st.set_condition(p.status, "Suspended", False, reason, message, p.now)
    p.out.events.append(plans.Event("Normal", reason, message))


def _deadline(p: steps.Pass) -> plans.Plan | None:
    """Failed once activeDeadlineSeconds have passed since the start; None before."""
    started = observe.parse_time(p.status.get("startTime"))
    deadline = p.spec.run_policy.active_deadline_seconds
    if deadline is None or started is None or deadline - steps.seconds_between(started, p.now) > 0:
        return None
    return p.fail(
        "DeadlineExceeded",
        f"the job ran longer than activeDeadlineSeconds ({deadline}s) since {p.status.get('startTime')}",
    )


def _elastic(p: steps.Pass, queue: queueing.Queued, ctx: builders.Context) -> plans.Plan:
    """An elastic job's steps 5 to 8 are `elastic_group.plan`'s, within what Kueue admitted."""
    spec, status = p.spec, p.status
    admitted = queueing.within_admission(spec, queue)
    out = elastic_group.plan(
        p.obs,
        admitted,
        p.out,
        p.now,
        ctx=dataclasses.replace(ctx, spec=admitted, store_generation=elastic_group.store_generation(status)),
        fail=p.fail,
    )
    if admitted.workers < spec.workers and status.get("phase") not in api.TERMINAL_PHASES:
        held = (
            f"spec.workers is {spec.workers} but Kueue admitted {admitted.workers} workers: the group "
            f"runs {admitted.workers} (an admitted Workload cannot grow); suspend and resume the job "
            f"(runPolicy.suspend) to queue it again at {spec.workers}"
        )
        if held not in (p.obs.status.get("message") or ""):
            out.events.append(plans.Event("Warning", "WorkersAboveAdmission", held))
        status["message"] = f"{status.get('message') or ''}; {held}".lstrip("; ")
    return out


def _record_created(
    status: dict[str, Any],
    workers: Sequence[observe.Worker],
    jobs: Sequence[Mapping[str, Any]],
    now: datetime,
) -> bool:
    """Say that the workers' Jobs were created when they exist and status does not say so yet: the pass
    that created them left its status to a later one (a job's start waits: `st.write_wait`) or died
    before writing it. Dated from the Jobs' creation, and done before any verdict, so a job that ends
    before its first status write still says when it started. Whether it said so now."""
    present = [w.job_name for w in workers if w.phase != "missing" and w.job_name]
    if not present or st.is_true(status, "Created"):
        return False
    created = observe.first_created(jobs) or now
    if status.get("startTime") is None:
        status["startTime"] = st.timestamp(created)
    st.set_condition(status, "Created", True, "WorkersCreated", steps.created_message(present), created)
    return True


REFUSAL_REASONS = ("InvalidSpec", "NotAllowed")


def refusal_verdict(status: Mapping[str, Any]) -> dict[str, Any] | None:
    """The condition saying the operator refuses the spec (Failed before the job started, or SpecRefused
    after), with its reason and message; None when it does not."""
    held = st.get_condition(dict(status), "SpecRefused")
    if held is not None and held.get("status") == "True":
        return held
    failed = st.get_condition(dict(status), "Failed")
    if status.get("phase") == "Failed" and failed is not None and failed.get("reason") in REFUSAL_REASONS:
        return failed
    return None


def _check(
    raw: Mapping[str, Any], defaults: plans.Defaults
) -> tuple[tuple[str, str] | None, api.TrainingJobSpec | None]:
    """(reason, message) when the operator refuses the spec, and the spec as far as it can be read: the
    whole of it when it is valid, else `_readable`'s remainder (None when nothing usable is left)."""
    try:
        spec = api.TrainingJobSpec.model_validate(dict(raw))
    except pydantic.ValidationError as exc:
        return ("InvalidSpec", f"invalid spec: {fieldpaths.spec_error(exc)}"), _readable(raw)
    refused = admission.refusal(spec, defaults.policy) or gang.missing_provider(spec, defaults.gang_provider)
    return (("NotAllowed", refused) if refused is not None else None), spec


READABLE_TRIES = 8
"""How many rounds of refused fields `_readable` sets aside before it gives up."""


def _readable(raw: Mapping[str, Any]) -> api.TrainingJobSpec | None:
    """An invalid spec with the fields it is refused for set aside (their defaults apply): enough to see a
    held job to its end by its policies (outcome, deadline, TTL). Nothing is ever started from it. None
    when a refusal names no field that can be set aside (a required field, or a rule over several)."""
    spec = copy.deepcopy(dict(raw))
    for _ in range(READABLE_TRIES):
        try:
            return api.TrainingJobSpec.model_validate(spec)
        except pydantic.ValidationError as exc:
            if not all(_set_aside(spec, error["loc"]) for error in exc.errors()):
                return None
    return None


def _set_aside(spec: dict[str, Any], loc: Sequence[int | str]) -> bool:
    """Remove the field an error's location names (the deepest one present); whether there was one."""
    node: Any = spec
    parent: Any = None
    key: int | str | None = None
    for part in loc:
        present = (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and part < len(node)
        )
        if present:
            parent, key, node = node, part, node[part]
        else:
            break  # a pydantic branch name (a union's int, str, function-after[...]): not a field
    if parent is None or key is None:
        return False
    del parent[key]
    return True


def _refuse(obs: plans.Observed, out: plans.Plan, reason: str, message: str, now: datetime) -> None:
    """A job never started fails (nothing exists to lose). One the operator already accepted is held: an
    operator upgrade or a flag change must never kill running work, so its workers go on, and the job
    still ends as its policies say (a worker's outcome, the deadline, the TTL, its Kueue Workload
    finished), but no worker is started from the refused spec; the SpecRefused condition and one Warning
    event say why, until the spec passes again (an edit, or the operator rolled back)."""
    status = out.status
    if status.get("phase") is None and not obs.jobs:
        st.enter_phase(status, "Failed", reason, message, now)
        status["completionTime"] = st.timestamp(now)
        out.events.append(plans.Event("Warning", reason, message))
        out.transitions.append("failed")
        return
    failed = st.get_condition(status, "Failed") or {}
    if status.get("phase") == "Failed" and failed.get("reason") in REFUSAL_REASONS:
        return  # refused before it started: said then
    held = (
        f"{message}; its workers are left as they are (running ones keep running) and the job ends as its "
        "policies say, but the operator starts no worker for it until its spec passes again (edit the "
        "field, or roll the operator back)"
    )
    if st.set_condition(status, "SpecRefused", True, reason, held, now):
        out.events.append(plans.Event("Warning", reason, held))
