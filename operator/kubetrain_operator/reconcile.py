"""The reconcile planner: TrainingJob + observed children + now -> a Plan of actions. Pure.

Level-based: every call derives what should exist from the spec, the previous status (which records the
decisions already taken: restart attempt, restarts, start and completion times) and what exists, so the
shell can run it after any crash. The shell executes a plan in this order: status patch first (so a
decision such as "restart attempt 2" is durable before its effects), then deletions (each guarded by the
uid it was planned from), then creations (which tolerate 409 AlreadyExists for objects this TrainingJob
controls), then events.

Restart protocol: a failure bumps status.restartAttempt and deletes the old attempt's Jobs (Foreground,
so their pods go first); the new attempt's Jobs (new names) are created once the old Jobs are gone, or
after STALE_GRACE_SECONDS when a pod is stuck terminating on a lost node. Suspend deletes every worker
Job and bumps the attempt the same way (Foreground too, so a quick resume waits for the old pods and no
old rank 0 writes checkpoints or progress.json beside the new attempt), without counting a restart.

`_plan` is a short list of numbered steps, one function each (`_finished`, `_suspended`, `_deadline`,
`_old_attempts`, `_verdict`, `_create_missing`, `_record_group`), sharing one `_Pass`: a step either
decides the pass (returns the plan) or records what it found and lets the next go on.

An elastic job (spec.elastic) shares steps 1 to 4 (spec checks, finished, suspend, deadline) and then
follows `membership.plan`: one failed worker is replaced alone, spec.workers scales the group.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import pydantic

from kubetrain_operator import (
    admission,
    api,
    builders,
    constants,
    failure,
    gang,
    membership,
    names,
    observe,
    queueing,
)
from kubetrain_operator import status as st

STALE_GRACE_SECONDS = 120.0
"""How long to wait for an old attempt's Jobs to disappear before starting the next attempt anyway."""
RESYNC_SECONDS = 60.0
"""Reconcile an unfinished job at least this often, even without events."""
WAIT_SECONDS = 2.0
"""Requeue delay while waiting for deletions to finish."""

Propagation = Literal["Foreground", "Background"]


@dataclasses.dataclass(frozen=True)
class Deletion:
    kind: Literal["Job", "Service", "PodGroup"]
    name: str
    propagation: Propagation = "Background"
    uid: str | None = None
    """The uid of the object as observed: the shell deletes only that object (a uid precondition), never
    a namesake created since the observation."""
    api_version: str | None = None
    """For kinds outside the core and batch groups (a restart attempt's PodGroup)."""


def _deletion(
    kind: Literal["Job", "Service"], obj: Mapping[str, Any], propagation: Propagation = "Background"
) -> Deletion:
    return Deletion(kind, obj["metadata"]["name"], propagation, obj["metadata"].get("uid"))


@dataclasses.dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclasses.dataclass
class Observed:
    """The TrainingJob and the children it controls (controller ownerReference with its uid), as read
    from the API; `from_objects` sorts out the rest."""

    name: str
    namespace: str
    uid: str
    spec: Mapping[str, Any]
    status: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    generation: int | None = None
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The TrainingJob's labels: kueue.x-k8s.io/queue-name asks Kueue to admit it (see queueing)."""
    service: Mapping[str, Any] | None = None
    workload: Mapping[str, Any] | None = None
    """The Kueue Workload this TrainingJob controls, when it is queued and the Workload exists."""
    flavors: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """Kueue's ResourceFlavors by name (cluster-scoped, shared by every job)."""
    jobs: Sequence[Mapping[str, Any]] = ()
    pods: Sequence[Mapping[str, Any]] = ()
    taken: Sequence[tuple[str, str]] = ()
    """(kind, name) of children filed under this TrainingJob's name that another object controls, such as
    a deleted namesake's not yet garbage-collected: those names are not free to create."""

    @classmethod
    def from_objects(
        cls,
        body: Mapping[str, Any],
        *,
        services: Sequence[Mapping[str, Any]],
        jobs: Sequence[Mapping[str, Any]],
        pods: Sequence[Mapping[str, Any]],
        workloads: Sequence[Mapping[str, Any]] = (),
        flavors: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Observed:
        """Keep the children this TrainingJob controls; note the names others hold."""
        meta = body.get("metadata", {})
        uid = meta.get("uid", "")
        own_jobs = [j for j in jobs if observe.controlled_by(j, uid)]
        job_uids = {j.get("metadata", {}).get("uid") for j in own_jobs}
        others = [("Service", s) for s in services if not observe.controlled_by(s, uid)]
        others += [("Job", j) for j in jobs if not observe.controlled_by(j, uid)]
        others += [("Workload", w) for w in workloads if not observe.controlled_by(w, uid)]
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace", "default"),
            uid=uid,
            spec=body.get("spec") or {},
            status=body.get("status") or {},
            generation=meta.get("generation"),
            labels=meta.get("labels") or {},
            service=next((s for s in services if observe.controlled_by(s, uid)), None),
            workload=next((w for w in workloads if observe.controlled_by(w, uid)), None),
            flavors=flavors or {},
            jobs=own_jobs,
            # Pods belong to our Jobs; pods of a deleted namesake's Jobs may linger until collected.
            pods=[p for p in pods if observe.controller_uid(p) in job_uids],
            taken=[(kind, _name(obj)) for kind, obj in others],
        )


@dataclasses.dataclass
class Plan:
    status: dict[str, Any]
    """The complete new status; the shell writes it when it differs from the stored one."""
    create: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    delete: list[Deletion] = dataclasses.field(default_factory=list)
    events: list[Event] = dataclasses.field(default_factory=list)
    delete_self: bool = False
    """ttlSecondsAfterFinished has passed: delete the TrainingJob."""
    requeue_after: float | None = None
    """Reconcile again after this many seconds even without events (deadline, TTL, waiting)."""
    transitions: list[str] = dataclasses.field(default_factory=list)
    """Phase-level happenings for metrics: created, restarted, succeeded, failed."""
    workload_spec: dict[str, Any] | None = None
    """A merge patch of the Workload's spec (spec.active follows spec.runPolicy.suspend)."""
    workload_status: dict[str, Any] | None = None
    """The Workload's new status (released after eviction, or Finished); the shell writes it guarded by
    the Workload's resourceVersion, after the TrainingJob's status."""
    confirm_owner: bool = False
    """The creations are not this TrainingJob's first: its status says children were created before (a
    restart's or a resume's new attempt, or children that disappeared). The shell confirms with the API
    server that the TrainingJob still exists before creating them: children also disappear because the
    TrainingJob was deleted and the garbage collector removed them, and the watches that report the
    children's deletions can be ahead of the one that reports the TrainingJob's."""

    def status_changed(self, stored: Mapping[str, Any]) -> bool:
        return st.normalised(dict(stored)) != st.normalised(self.status)


@dataclasses.dataclass(frozen=True)
class Defaults:
    """Operator-level configuration the planner needs."""

    image: str = constants.TRAINER_IMAGE
    service_account: str | None = None
    stale_grace_seconds: float = STALE_GRACE_SECONDS
    resync_seconds: float = RESYNC_SECONDS
    policy: admission.Policy = dataclasses.field(default_factory=admission.Policy)
    gang_provider: api.GangProvider | None = None
    """The gang scheduler for TrainingJobs whose spec.gangScheduling names none: the first the cluster
    served when the operator started (gang.default_provider), None when it served none."""
    kueue: bool = False
    """Whether the cluster serves Kueue's Workload API (checked when the operator starts)."""


def managed_here(body: Mapping[str, Any]) -> bool:
    """Whether the kubetrain operator reconciles this TrainingJob: spec.managedBy is unset or names it.
    Any other controller's TrainingJob is left alone entirely, as the Job controller leaves a Job whose
    managedBy names another (Kueue's MultiKueue runs such jobs on worker clusters)."""
    return (body.get("spec") or {}).get("managedBy") in (None, constants.MANAGED_BY_CONTROLLER)


def spec_error(exc: pydantic.ValidationError) -> str:
    """The first validation errors as `spec.<field>: <message>`, the field written as the API server
    writes it (spec.env[0].name), so the message points into the user's manifest."""
    parts = []
    for err in exc.errors()[:3]:
        loc = "spec"
        for part in err.get("loc", ()):
            if isinstance(part, int):
                loc += f"[{part}]"
            elif not part.startswith("function-") and part not in ("int", "str", "constrained-int"):
                loc += f".{part}"  # the union of a quantity names its branches (int, str): not fields
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def _seconds_between(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


def _is_deleting(obj: Mapping[str, Any]) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


def _name(obj: Mapping[str, Any]) -> str:
    return obj["metadata"]["name"]


def _cleanup(
    policy: str,
    workers: Sequence[observe.Worker],
    jobs: Sequence[Mapping[str, Any]],
    service: Any,
) -> list[Deletion]:
    """What cleanPodPolicy removes once the job finished (or is failing)."""
    if policy == "None":
        return []
    out = []
    running = {w.job_name for w in workers if w.phase in ("pending", "running", "missing")}
    for job in jobs:
        if _is_deleting(job):
            continue
        if policy == "All" or _name(job) in running or observe.worker_key(job) is None:
            out.append(_deletion("Job", job))
    if policy == "All" and service is not None and not _is_deleting(service):
        out.append(_deletion("Service", service))
    return out


def plan(obs: Observed, now: datetime, defaults: Defaults = Defaults()) -> Plan:
    """Decide everything one reconcile of `obs` should do."""
    out = _plan(obs, now, defaults)
    out.delete += _attempt_group_deletions(obs, out.delete, defaults.gang_provider)
    # Any creation after the first (a restart's, a resume's, an elastic replacement's, or children that
    # disappeared) waits for the shell to confirm the owner still exists (see Plan.confirm_owner).
    out.confirm_owner = bool(out.create) and st.is_true(dict(obs.status), "Created")
    return out


def _attempt_group_deletions(
    obs: Observed, deletions: Sequence[Deletion], default_provider: api.GangProvider | None
) -> list[Deletion]:
    """The PodGroups of the restart attempts whose Jobs go (provider kubernetes makes one per attempt):
    deleted with them, so a TrainingJob keeps at most its current attempt's group. The
    podgroup-protection finalizer holds each until its pods are gone. The raw spec is read here: a spec
    the planner refused deletes no Jobs."""
    gang_spec = obs.spec.get("gangScheduling")
    if gang_spec is None or (gang_spec.get("provider") or default_provider) != "kubernetes":
        return []
    deleted = {d.name for d in deletions if d.kind == "Job"}
    attempts = sorted(
        {key[0] for job in obs.jobs if _name(job) in deleted and (key := observe.worker_key(job)) is not None}
    )
    return [
        Deletion(
            "PodGroup",
            names.attempt_pod_group_name(obs.name, attempt),
            api_version=constants.KUBERNETES_SCHEDULING_API,
        )
        for attempt in attempts
    ]


@dataclasses.dataclass
class _Pass:
    """One planning pass: what every step reads, and the plan (`out`, whose `status`) they write."""

    obs: Observed
    spec: api.TrainingJobSpec
    out: Plan
    now: datetime
    defaults: Defaults
    attempt: int
    restarts: int
    workers: list[observe.Worker]
    stale: list[dict[str, Any]]

    @property
    def status(self) -> dict[str, Any]:
        return self.out.status

    def fail(self, reason: str, message: str, blamed: observe.Worker | None = None) -> Plan:
        """End the job Failed: the verdict, its event, the cleanup, and the TTL's wake-up."""
        status, spec = self.status, self.spec
        st.enter_phase(status, "Failed", reason, message, self.now)
        status["completionTime"] = st.timestamp(self.now)
        if blamed is not None:
            status["lastFailure"] = _failure_record(blamed, self.attempt, message)
        st.record_workers(status, self.workers, spec.workers)
        self.out.events.append(Event("Warning", reason, message))
        self.out.transitions.append("failed")
        return self.clean_up_after_the_end()

    def clean_up_after_the_end(self) -> Plan:
        """The children cleanPodPolicy removes at the end, and a wake-up when the TTL runs out."""
        run_policy, obs = self.spec.run_policy, self.obs
        self.out.delete += _cleanup(run_policy.clean_pod_policy, self.workers, obs.jobs, obs.service)
        if run_policy.ttl_seconds_after_finished is not None:
            self.out.requeue_after = float(run_policy.ttl_seconds_after_finished)
        return self.out


def _plan(obs: Observed, now: datetime, defaults: Defaults) -> Plan:
    """The steps in order; each either decides the pass (returns the plan) or records what it found and
    lets the next one go on."""
    status: dict[str, Any] = copy.deepcopy(dict(obs.status))
    status["observedGeneration"] = obs.generation
    attempt = int(status.get("restartAttempt") or 0)
    restarts = int(status.get("restarts") or 0)
    status.setdefault("restartAttempt", attempt)
    status.setdefault("restarts", restarts)
    out = Plan(status=status)
    phase = status.get("phase")

    # 1. A spec the operator refuses: invalid (the CRD's rules were bypassed, or this operator's checks are
    # stricter than those of the one that accepted it) or not allowed by the operator's flags.
    try:
        spec = api.TrainingJobSpec.model_validate(dict(obs.spec))
    except pydantic.ValidationError as exc:
        return _refuse(obs, out, "InvalidSpec", f"invalid spec: {spec_error(exc)}", now)
    refused = admission.refusal(spec, defaults.policy) or gang.missing_provider(spec, defaults.gang_provider)
    if refused is not None:
        return _refuse(obs, out, "NotAllowed", refused, now)
    if st.is_true(status, "SpecRefused"):
        st.set_condition(
            status, "SpecRefused", False, "SpecAccepted", "the spec passes the operator's checks", now
        )

    if spec.elastic is not None:
        attempts = membership.worker_attempts(status, spec.workers)
        workers = membership.read_members(attempts, obs.jobs, obs.pods)
        stale = membership.stale_jobs(attempts, obs.jobs)
    else:
        workers = observe.read_workers(spec.workers, attempt, obs.jobs, obs.pods)
        stale = observe.stale_jobs(attempt, obs.jobs)
    st.record_progress(status, observe.read_progress(obs.pods, attempt))
    p = _Pass(obs, spec, out, now, defaults, attempt, restarts, list(workers), list(stale))

    # 2. Finished: clean up, then wait for the TTL.
    if phase in api.TERMINAL_PHASES:
        return _finished(p, phase)

    # 3. Suspended, by spec.runPolicy.suspend or until Kueue admits the job.
    queue = _queueing(obs, spec, status=status, defaults=defaults, out=out, now=now)
    if spec.run_policy.suspend or queue.hold is not None:
        return _suspended(p, queue)
    if st.is_true(status, "Suspended"):
        _resumed(p, queue)
    if _record_created(status, p.workers, [j for j in obs.jobs if j not in p.stale], now):
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
    )
    if spec.elastic is not None:
        return _elastic(p, queue, ctx)

    # 5. Old attempt's Jobs: delete them, and wait for them to go before starting the next group.
    if (waiting := _old_attempts(p)) is not None:
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
    return out


def _finished(p: _Pass, phase: str) -> Plan:
    """Succeeded or Failed: remove what cleanPodPolicy says, tell Kueue, and delete the TrainingJob once
    its TTL has passed."""
    out, spec, obs = p.out, p.spec, p.obs
    out.delete += _cleanup(spec.run_policy.clean_pod_policy, p.workers, obs.jobs, obs.service)
    out.delete += [
        _deletion("Job", j)
        for j in p.stale
        if not _is_deleting(j) and _name(j) not in {d.name for d in out.delete}
    ]
    if obs.workload is not None and not queueing.read_admission(obs.workload).finished:
        # Kueue releases the quota of a Finished Workload (what its job reconciler writes for a
        # finished JobSet); the workers still running under cleanPodPolicy None are not counted.
        out.workload_status = queueing.finished(
            obs.workload, phase == "Succeeded", p.status.get("message") or str(phase), p.now
        )
    ttl = spec.run_policy.ttl_seconds_after_finished
    finished = observe.parse_time(p.status.get("completionTime"))
    if ttl is not None and finished is not None:
        left = ttl - _seconds_between(finished, p.now)
        if left <= 0:
            out.delete_self = True
            out.events.append(Event("Normal", "Deleting", f"ttlSecondsAfterFinished ({ttl}s) has passed"))
        else:
            out.requeue_after = left
    return out


def _suspended(p: _Pass, queue: _Queued) -> Plan:
    """Remove the workers; resume (or admission) starts a fresh attempt, not a restart."""
    out, spec, obs, status = p.out, p.spec, p.obs, p.status
    current = [j for j in obs.jobs if j not in p.stale]
    if current:
        status["restartAttempt"] = p.attempt + 1
    out.delete += [_deletion("Job", j, "Foreground") for j in obs.jobs if not _is_deleting(j)]
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
        out.events.append(Event("Normal", reason, message))
    st.set_condition(status, "Suspended", True, reason, message, p.now)
    status["message"] = message
    return out


def _resumed(p: _Pass, queue: _Queued) -> None:
    reason, message = "Resumed", "resumed: recreating the workers"
    if queue.admitted_by is not None:
        reason, message = ("Admitted", f"admitted by ClusterQueue {queue.admitted_by}: creating the workers")
    st.set_condition(p.status, "Suspended", False, reason, message, p.now)
    p.out.events.append(Event("Normal", reason, message))


def _deadline(p: _Pass) -> Plan | None:
    """Failed once activeDeadlineSeconds have passed since the start; None before."""
    started = observe.parse_time(p.status.get("startTime"))
    deadline = p.spec.run_policy.active_deadline_seconds
    if deadline is None or started is None or deadline - _seconds_between(started, p.now) > 0:
        return None
    return p.fail(
        "DeadlineExceeded",
        f"the job ran longer than activeDeadlineSeconds ({deadline}s) since {p.status.get('startTime')}",
    )


def _elastic(p: _Pass, queue: _Queued, ctx: builders.Context) -> Plan:
    """An elastic job's steps 5 to 8 are `membership.plan`'s, within what Kueue admitted."""
    spec, status = p.spec, p.status
    admitted = _within_admission(spec, queue)
    out = membership.plan(
        p.obs,
        admitted,
        p.out,
        p.now,
        ctx=dataclasses.replace(ctx, spec=admitted),
        fail=p.fail,
        stale_grace_seconds=p.defaults.stale_grace_seconds,
    )
    if admitted.workers < spec.workers and status.get("phase") not in api.TERMINAL_PHASES:
        held = (
            f"spec.workers is {spec.workers} but Kueue admitted {admitted.workers} workers: the group "
            f"runs {admitted.workers} (an admitted Workload cannot grow); suspend and resume the job "
            f"(runPolicy.suspend) to queue it again at {spec.workers}"
        )
        if held not in (p.obs.status.get("message") or ""):
            out.events.append(Event("Warning", "WorkersAboveAdmission", held))
        status["message"] = f"{status.get('message') or ''}; {held}".lstrip("; ")
    return out


def _old_attempts(p: _Pass) -> Plan | None:
    """Delete the Jobs of earlier attempts; wait (a plan) while any is still going, within the grace."""
    waiting = []
    for job in p.stale:
        if not _is_deleting(job):
            p.out.delete.append(_deletion("Job", job, "Foreground"))
            waiting.append(job)
        else:
            since = observe.parse_time(job["metadata"]["deletionTimestamp"])
            if since is None or _seconds_between(since, p.now) < p.defaults.stale_grace_seconds:
                waiting.append(job)
    if not waiting:
        return None
    message = f"waiting for {len(waiting)} Jobs of earlier attempts to be deleted"
    return _wait_for_old_workers(p.out, message, p.workers, p.spec.workers, p.now)


def _verdict(p: _Pass) -> Plan | None:
    """What the failure and success policies decide (`failure.decide`): fail, restart the group, or
    succeed; None while the group runs on."""
    out, spec, status = p.out, p.spec, p.status
    decision = failure.decide(spec, p.workers, p.restarts)
    if decision.action == "fail":
        return p.fail(decision.reason, decision.message, decision.worker)
    if decision.action == "restart":
        assert decision.worker is not None
        status["restartAttempt"] = p.attempt + 1
        status["restarts"] = p.restarts + 1
        status["lastFailure"] = _failure_record(decision.worker, p.attempt, decision.message)
        st.record_workers(status, p.workers, spec.workers)
        st.enter_phase(status, "Restarting", decision.reason, decision.message, p.now)
        out.events.append(Event("Warning", "Restarting", decision.message))
        out.transitions.append("restarted")
        out.delete += [_deletion("Job", j, "Foreground") for j in p.obs.jobs if not _is_deleting(j)]
        out.requeue_after = WAIT_SECONDS
        return out
    if decision.action == "succeed":
        st.record_workers(status, p.workers, spec.workers)
        st.enter_phase(status, "Succeeded", decision.reason, decision.message, p.now)
        status["completionTime"] = st.timestamp(p.now)
        status["pendingReason"] = None
        status["pendingMessage"] = None
        out.events.append(Event("Normal", "Succeeded", decision.message))
        out.transitions.append("succeeded")
        return p.clean_up_after_the_end()
    return None


def _create_missing(p: _Pass, ctx: builders.Context, missing: Sequence[observe.Worker]) -> Plan | None:
    """Plan the creation of the current attempt's missing objects; a plan that waits instead when a
    namesake this TrainingJob does not control holds one of their names."""
    out, spec, obs, status = p.out, p.spec, p.obs, p.status
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
    blocked = [f"{m['kind']} {m['metadata']['name']}" for m in out.create if (m["kind"], _name(m)) in taken]
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
        return _wait_for_old_workers(out, message, p.workers, spec.workers, p.now)
    if missing:
        if status.get("startTime") is None:
            status["startTime"] = st.timestamp(p.now)
        message = _created_message([names.worker_job_name(obs.name, p.attempt, w.index) for w in missing])
        # A start is told by the Created and Running conditions (message and time), not by Normal
        # events: an Event is one more write per job for what status already says.
        if st.set_condition(status, "Created", True, "WorkersCreated", message, p.now):
            out.transitions.append("created")
    return None


def _record_group(p: _Pass, ctx: builders.Context, missing: Sequence[observe.Worker]) -> None:
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
        out.events.append(Event("Warning", status["pendingReason"], status["pendingMessage"] or ""))
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
        requeue = min(requeue, max(0.5, deadline - _seconds_between(started, now)))
    out.requeue_after = requeue


@dataclasses.dataclass(frozen=True)
class _Queued:
    """Where a TrainingJob stands with Kueue."""

    hold: tuple[str, str] | None = None
    """(reason, message) while Kueue has not admitted it: it stays Suspended, with no workers."""
    placement: builders.Placement | None = None
    """What the admission adds to the worker pods."""
    admitted_by: str | None = None
    """The ClusterQueue that admitted it."""
    admitted_workers: int | None = None
    """How many workers the admission holds quota for: the most an elastic group may run."""


def _queueing(
    obs: Observed,
    spec: api.TrainingJobSpec,
    *,
    status: dict[str, Any],
    defaults: Defaults,
    out: Plan,
    now: datetime,
) -> _Queued:
    """Kueue's verdict on a TrainingJob labelled kueue.x-k8s.io/queue-name, and the Workload writes it
    needs (see queueing). The label counts when the job is new or suspended, or has its Workload: adding
    it to a job already running outside any queue does not stop that job."""
    queue = queueing.queue_name(obs.labels)
    if queue is None or (obs.workload is None and status.get("phase") not in (None, "Suspended")):
        return _Queued()
    if not defaults.kueue:
        return _Queued(
            hold=(
                "KueueNotInstalled",
                f"labelled {constants.KUEUE_QUEUE_LABEL}={queue}, but this cluster served no Kueue Workload "
                f"API ({constants.KUEUE_API}) when the operator started: install Kueue with "
                f"{constants.KUEUE_EXTERNAL_FRAMEWORK} in its integrations.externalFrameworks, then restart "
                "the operator",
            )
        )
    name = queueing.workload_name(obs.name)
    ctx = builders.Context(
        owner=builders.Owner(obs.name, obs.namespace, obs.uid),
        spec=spec,
        default_image=defaults.image,
        default_service_account=defaults.service_account,
    )
    if obs.workload is None:
        if ("Workload", name) in set(obs.taken):
            return _Queued(
                hold=("Queued", f"waiting for Workload {name} of an earlier TrainingJob to be deleted")
            )
        out.create.append(queueing.build_workload(ctx, queue, obs.labels))
        return _Queued(
            hold=("Queued", f"queued in LocalQueue {queue} as Workload {name}: waiting for Kueue to admit it")
        )
    if queueing.is_active(obs.workload) == spec.run_policy.suspend:
        out.workload_spec = {"active": not spec.run_policy.suspend}
    verdict = queueing.read_admission(obs.workload)
    if not verdict.reserved and queueing.pod_set_count(obs.workload) not in (None, spec.workers):
        # An elastic job scaled while it holds no quota: Kueue is to admit the size asked for now (Kueue
        # allows changing pod sets only then).
        out.workload_spec = {**(out.workload_spec or {}), "podSets": queueing.pod_sets(ctx)}
    if verdict.evicted is not None:
        evicted, why = verdict.evicted
        if verdict.reserved and not obs.jobs:
            out.workload_status = queueing.released(obs.workload, verdict, now)
        return _Queued(
            hold=(
                "Evicted",
                f"evicted by Kueue ({evicted}: {why}); waiting in LocalQueue {queue} to be admitted again, "
                "then resuming from the last checkpoint",
            )
        )
    if not verdict.admitted:
        return _Queued(hold=("Queued", f"queued in LocalQueue {queue}: {verdict.waiting}"))
    placement = queueing.placement(verdict, obs.flavors)
    if isinstance(placement, str):
        out.requeue_after = WAIT_SECONDS  # the flavor's watch event wakes no TrainingJob
        return _Queued(hold=("Queued", placement))
    return _Queued(placement=placement, admitted_by=verdict.cluster_queue, admitted_workers=verdict.workers)


def _within_admission(spec: api.TrainingJobSpec, queue: _Queued) -> api.TrainingJobSpec:
    """An elastic job runs at most the workers Kueue admitted: spec.workers above that (a scale-up after
    admission; an admitted Workload's pod sets cannot change) waits for the next admission."""
    if queue.admitted_workers is None or spec.workers <= queue.admitted_workers:
        return spec
    return spec.model_copy(update={"workers": queue.admitted_workers})


def _created_message(job_names: Sequence[str]) -> str:
    last = f" .. {job_names[-1]}" if len(job_names) > 1 else ""
    return f"created {len(job_names)} worker Jobs: {job_names[0]}{last}"


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
    st.set_condition(status, "Created", True, "WorkersCreated", _created_message(present), created)
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


def _refuse(obs: Observed, out: Plan, reason: str, message: str, now: datetime) -> Plan:
    """A job never started fails (nothing exists to lose). One the operator already accepted is held: an
    operator upgrade or a flag change must never kill running work, so its workers are left as they are
    and nothing is created or deleted for it; the SpecRefused condition and one Warning event say why,
    until the spec passes again (an edit, or the operator rolled back) and the job carries on."""
    status = out.status
    if status.get("phase") is None and not obs.jobs:
        st.enter_phase(status, "Failed", reason, message, now)
        status["completionTime"] = st.timestamp(now)
        out.events.append(Event("Warning", reason, message))
        out.transitions.append("failed")
        return out
    failed = st.get_condition(status, "Failed") or {}
    if status.get("phase") == "Failed" and failed.get("reason") in REFUSAL_REASONS:
        return out  # refused before it started: said then
    held = (
        f"{message}; its workers are left as they are (running ones keep running) and the operator "
        "creates or deletes nothing for this TrainingJob until its spec passes again (edit the field, or "
        "roll the operator back)"
    )
    if st.set_condition(status, "SpecRefused", True, reason, held, now):
        out.events.append(Event("Warning", reason, held))
    return out


def _wait_for_old_workers(
    out: Plan, message: str, workers: Sequence[observe.Worker], size: int, now: datetime
) -> Plan:
    """Create nothing until old objects are gone; say so (quietly: they usually go within seconds)."""
    status = out.status
    status["pendingReason"] = "WaitingForOldWorkers"
    status["pendingMessage"] = message
    status["workers"] = st.worker_counts(workers)
    status["workersReady"] = f"0/{size}"
    if not st.is_true(status, "Restarting") and status.get("phase") != "Pending":
        st.enter_phase(status, "Pending", "Pending", message, now)
    out.requeue_after = WAIT_SECONDS
    return out


def _failure_record(worker: observe.Worker, attempt: int, message: str) -> dict[str, Any]:
    return api.WorkerFailure(
        worker=worker.index,
        pod=worker.pod_name,
        exit_code=worker.exit_code,
        reason=worker.reason,
        message=message,
        restart_attempt=attempt,
    ).model_dump(by_alias=True, exclude_none=True)
