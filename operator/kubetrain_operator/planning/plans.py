"""What one planning pass reads and what it decides: the observed TrainingJob and children in, a Plan out.

The planner's vocabulary, shared by every policy (`whole_group`, `elastic_group`), by Kueue's admission
step (`queueing`) and by the shell that executes a plan (`runtime.controller`). The shell runs a plan in
this order: status patch first (so a decision such as "restart attempt 2" is durable before its effects),
then deletions (each guarded by the uid it was planned from), then creations (which tolerate 409
AlreadyExists for objects this TrainingJob controls), then events.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from kubetrain_operator import api
from kubetrain_operator.api import constants
from kubetrain_operator.planning import admission, observe
from kubetrain_operator.planning import status as st

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


def deletion(
    kind: Literal["Job", "Service"], obj: Mapping[str, Any], propagation: Propagation = "Background"
) -> Deletion:
    """Delete `obj` as observed: only that object (its uid), never a namesake created since."""
    return Deletion(kind, obj["metadata"]["name"], propagation, obj["metadata"].get("uid"))


def is_deleting(obj: Mapping[str, Any]) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


def name_of(obj: Mapping[str, Any]) -> str:
    return obj["metadata"]["name"]


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
    lingering_pods: Sequence[Mapping[str, Any]] = ()
    """Pods filed under this TrainingJob's name that none of its Jobs controls and that have not ended: a
    deleted namesake's, or an orphan whose Job went without it. They may still run and write the same
    checkpoints, and the headless Service publishes their addresses under the workers' hostnames."""
    departed: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """Job uid -> the last state of its pod the cluster took away and deleted (the watch's final copy,
    see runtime.cache): a Job failed by its podFailurePolicy keeps only the verdict, this says who took
    the pod, from which node, and how it exited."""

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
        departed: Mapping[str, Mapping[str, Any]] | None = None,
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
            taken=[(kind, name_of(obj)) for kind, obj in others],
            lingering_pods=[
                p for p in pods if observe.controller_uid(p) not in job_uids and not observe.has_ended(p)
            ],
            departed={uid: pod for uid, pod in (departed or {}).items() if uid in job_uids},
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
    """The Workload's status after an eviction (its quota reservation released, as Kueue's job reconciler
    writes it); the shell merge-patches it guarded by the Workload's resourceVersion, after the
    TrainingJob's status."""
    workload_conditions: list[dict[str, Any]] | None = None
    """The Workload conditions the operator owns (PodsReady, Finished), applied server-side under its own
    field manager: Kueue's conditions, in the same list (a map keyed by type), stay Kueue's."""
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
    resync_seconds: float = RESYNC_SECONDS
    policy: admission.Policy = dataclasses.field(default_factory=admission.Policy)
    gang_provider: api.GangProvider | None = None
    """The gang scheduler for TrainingJobs whose spec.gangScheduling names none: the first the cluster
    served when the operator started (gang.default_provider), None when it served none."""
    kueue: bool = False
    """Whether the cluster serves Kueue's Workload API (checked when the operator starts)."""
