"""Kueue admission of a TrainingJob as one unit: its Workload, and what the Workload's state means. Pure.

Why this route. Kueue admits only kinds it has an integration for. Its built-in integrations (batch Job,
JobSet, Kubeflow jobs) are Go code inside Kueue (`pkg/controller/jobframework`); labelling the worker
Jobs instead would make each worker its own Workload, admitted one by one: no gang. An unmodified Kueue
release admits a custom kind through `integrations.externalFrameworks` ("TrainingJob.v1alpha1.kubetrain.io"):
Kueue then treats TrainingJob as a known owner kind and leaves its job controller's part to the kind's own
controller, here the operator. The operator does for a TrainingJob what Kueue's jobframework reconciler
does for a JobSet:

- it creates one Workload, controlled by the TrainingJob, whose one pod set `workers` has count =
  spec.workers and the worker pod template (resources, node selector, tolerations, affinity), queued in
  the LocalQueue named by the kueue.x-k8s.io/queue-name label, with the priority of the
  kueue.x-k8s.io/priority-class label (a WorkloadPriorityClass) or of spec.priorityClassName;
- while the Workload holds no quota its pod sets follow the spec (a queued job's node selector,
  tolerations, affinity or priority class edited, `kubectl scale` on a queued elastic job): Kueue judges
  what the workers will ask for;
- an elastic job (spec.elastic) is admitted at its current size, and once admitted the group runs at
  most the admitted count (Kueue forbids changing an admitted Workload's pod sets): a scale-down frees
  workers at once, a scale-up beyond the admission waits until the job is admitted again; its
  rendezvous store is a second pod set, `rendezvous`, placed on the flavor assigned to it;
- the TrainingJob stays suspended (no workers) until the Workload is Admitted; its workers then get the
  assigned flavors' nodeLabels as node selector and their tolerations (podset.FromAssignment), and the
  kueue.x-k8s.io/podset label;
- Evicted (preemption, a deactivated or stopped queue, ...) suspends it: the workers are deleted as for
  spec.runPolicy.suspend, and once none is left the quota reservation is cleared (status.admission
  removed, QuotaReserved False, Requeued) so Kueue can queue it again; readmission resumes it from its
  checkpoints as a new restart attempt, not counted as a restart;
- once the Workload exists it governs the job to its end: a queue-name label removed or changed later
  is not followed, so no edit of the TrainingJob runs it outside the quota it is queued for;
- spec.runPolicy.suspend true deactivates the Workload (spec.active false), so a held job holds no quota;
- a finished TrainingJob marks its Workload Finished, which releases the quota;
- the conditions the operator owns (PodsReady, Finished) are applied server-side under its field manager,
  leaving Kueue's own conditions to Kueue; the release after an eviction rewrites the reservation as
  Kueue's job reconciler does, guarded by the Workload's resourceVersion.

Kueue's own side of the bargain (read in pkg/controller/jobframework/reconciler.go): a worker Job owned
by a TrainingJob that carries a queue-name label has a Kueue-managed ancestor, so Kueue never gives it a
Workload of its own and never suspends it while the TrainingJob's Workload is admitted.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from kubetrain_operator import api
from kubetrain_operator.api import constants, names
from kubetrain_operator.planning import builders, observe, plans
from kubetrain_operator.planning import status as st

POD_SET = "workers"
"""The name of the Workload's pod set of workers."""
STORE_POD_SET = "rendezvous"
"""An elastic job's second pod set: its rendezvous store's one pod, admitted with the workers."""

PODS_READY = "PodsReady"
"""The Workload condition Kueue's waitForPodsReady reads (see `pods_ready`)."""
APPLIED_CONDITIONS = (PODS_READY, "Finished")
"""The Workload conditions the operator applies server-side (`applied`)."""

REQUEUED_ON = ("Preempted", "NodeFailures")
"""Eviction reasons after which Kueue's job reconciler marks the Workload Requeued True (it queues the
Workload again at once); after any other eviction Requeued is False and Kueue decides when."""


def queue_name(labels: Mapping[str, str] | None) -> str | None:
    """The LocalQueue a TrainingJob asks for, or None when Kueue is not to admit it."""
    return (labels or {}).get(constants.KUEUE_QUEUE_LABEL) or None


def workload_queue(workload: Mapping[str, Any]) -> str | None:
    """The LocalQueue a Workload was queued in."""
    return (workload.get("spec") or {}).get("queueName") or None


def workload_name(job_name: str) -> str:
    """The TrainingJob's Workload: named like its Service, one per TrainingJob."""
    return names.service_name(job_name)


def priority_class_ref(labels: Mapping[str, str] | None, spec: api.TrainingJobSpec) -> dict[str, str] | None:
    """Where the Workload's priority comes from, as Kueue's integrations take it: the
    kueue.x-k8s.io/priority-class label (a WorkloadPriorityClass) first, else the workers'
    priorityClassName (a PriorityClass); None for neither (priority 0)."""
    workload_class = (labels or {}).get(constants.KUEUE_PRIORITY_LABEL)
    if workload_class:
        return {"group": constants.KUEUE_GROUP, "kind": "WorkloadPriorityClass", "name": workload_class}
    if spec.priority_class_name:
        return {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": spec.priority_class_name}
    return None


def pod_sets(ctx: builders.Context) -> list[dict[str, Any]]:
    """The Workload's pod sets: `workers`, spec.workers of them. The pod template is worker 0's without its
    environment (ranks and the trainer config tell Kueue nothing and would make the Workload large):
    Kueue reads resources and scheduling constraints from it."""
    template = builders.build_pod_template(ctx, 0)
    for container in template["spec"]["containers"]:
        container.pop("env", None)
    sets = [{"name": POD_SET, "count": ctx.spec.workers, "template": template}]
    store = builders.build_rendezvous_job(ctx)
    if store is not None:
        sets.append({"name": STORE_POD_SET, "count": 1, "template": _store_template(store, template)})
    return sets


def _store_template(store: Mapping[str, Any], workers: Mapping[str, Any]) -> dict[str, Any]:
    """The store pod's template as Kueue is to count it: its requests only in the resources the workers
    request, which the ClusterQueue covers (the workers could not be admitted otherwise); a resource it
    does not cover would keep the whole job from being admitted for a pod of 100m CPU."""
    template = json.loads(json.dumps(store["spec"]["template"]))
    covered = {
        resource
        for container in workers["spec"]["containers"]
        for resource in ((container.get("resources") or {}).get("requests") or {})
    }
    for container in template["spec"]["containers"]:
        container.pop("env", None)
        requests = (container.get("resources") or {}).get("requests") or {}
        container["resources"] = {"requests": {k: v for k, v in requests.items() if k in covered}}
    return template


def pod_set_count(workload: Mapping[str, Any]) -> int | None:
    """How many workers the Workload asks Kueue for (None: no `workers` pod set)."""
    for pod_set in (workload.get("spec") or {}).get("podSets") or ():
        if pod_set.get("name") == POD_SET:
            return int(pod_set.get("count", 1))
    return None


def pod_set_shapes(sets: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """What Kueue admits a pod set by: its name and count, and its template's scheduling constraints and
    resources. Compared with what the spec asks now, to re-sync a queued Workload."""
    shapes = []
    for pod_set in sets:
        pod_spec = (pod_set.get("template") or {}).get("spec") or {}
        containers = tuple(
            (c.get("name"), json.dumps(c.get("resources") or {}, sort_keys=True))
            for c in (*pod_spec.get("initContainers", ()), *pod_spec.get("containers", ()))
        )
        constraints = tuple(
            json.dumps(pod_spec.get(key), sort_keys=True)
            for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName")
        )
        shapes.append((pod_set.get("name"), int(pod_set.get("count", 1)), containers, constraints))
    return shapes


def build_workload(ctx: builders.Context, queue: str, labels: Mapping[str, str] | None) -> dict[str, Any]:
    """The TrainingJob's Workload: every worker in one pod set, so Kueue admits the group or nothing.

    spec.priority is left to the shell, which resolves priorityClassRef to its value (an API read).
    """
    workload_labels = {
        **builders.selector_labels(ctx.owner.name),
        constants.LABEL_MANAGED_BY: constants.MANAGED_BY,
    }
    if names.is_label_value(ctx.owner.uid):
        workload_labels[constants.KUEUE_JOB_UID_LABEL] = ctx.owner.uid
    spec: dict[str, Any] = {
        "queueName": queue,
        "active": not ctx.spec.run_policy.suspend,
        "podSets": pod_sets(ctx),
    }
    ref = priority_class_ref(labels, ctx.spec)
    if ref is not None:
        spec["priorityClassRef"] = ref
    return {
        "apiVersion": constants.KUEUE_API,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(ctx.owner.name),
            "namespace": ctx.owner.namespace,
            "labels": workload_labels,
            "annotations": {constants.ANNOTATION_JOB_NAME: ctx.owner.name},
            "ownerReferences": [builders.owner_reference(ctx.owner)],
        },
        "spec": spec,
    }


@dataclasses.dataclass(frozen=True)
class Admission:
    """What a Workload's status says for its TrainingJob."""

    admitted: bool
    """Admitted True and not Evicted: the workers may run."""
    reserved: bool
    """QuotaReserved True: the Workload holds quota (an evicted one until the operator clears it)."""
    evicted: tuple[str, str] | None
    """(reason, message) of Evicted True: the workers must stop."""
    finished: bool
    cluster_queue: str | None
    flavors: tuple[str, ...]
    """The ResourceFlavors assigned to the workers' pod set, in admission order, without repeats."""
    store_flavors: tuple[str, ...]
    """Those assigned to an elastic job's store pod set (none when the Workload has no such set)."""
    workers: int | None
    """How many workers the admission holds quota for (the assignment's count, else the pod set's)."""
    waiting: str
    """Why it is not admitted, in Kueue's words where Kueue gave any."""


def _condition(workload: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for cond in (workload.get("status") or {}).get("conditions") or ():
        if cond.get("type") == type_:
            return cond
    return None


def _true(workload: Mapping[str, Any], type_: str) -> bool:
    cond = _condition(workload, type_)
    return cond is not None and cond.get("status") == "True"


def read_admission(workload: Mapping[str, Any]) -> Admission:
    """Kueue's verdict, read from the conditions Kueue's scheduler and workload controller write
    (QuotaReserved, Admitted, Evicted, Finished) and from status.admission's flavor assignment."""
    status = workload.get("status") or {}
    admission = status.get("admission") or {}
    flavors: dict[str, list[str]] = {POD_SET: [], STORE_POD_SET: []}
    workers = None
    for assignment in admission.get("podSetAssignments") or ():
        name = assignment.get("name")
        if name == POD_SET:
            workers = assignment.get("count", pod_set_count(workload))
        for flavor in (assignment.get("flavors") or {}).values():
            if name in flavors and flavor not in flavors[name]:
                flavors[name].append(flavor)
    evicted = _condition(workload, "Evicted")
    eviction = None
    if evicted is not None and evicted.get("status") == "True":
        eviction = (evicted.get("reason") or "Evicted", evicted.get("message") or "")
    reserved = _condition(workload, "QuotaReserved")
    queue = (workload.get("spec") or {}).get("queueName")
    if reserved is not None and reserved.get("status") == "True":
        waiting = (
            f"quota reserved in ClusterQueue {admission.get('clusterQueue')}: waiting for admission checks"
        )
    elif reserved is not None and reserved.get("message"):
        waiting = f"{reserved.get('reason')}: {reserved['message']}"
    else:
        waiting = f"waiting for Kueue to admit Workload {workload['metadata']['name']} (LocalQueue {queue})"
    return Admission(
        admitted=_true(workload, "Admitted") and eviction is None,
        reserved=reserved is not None and reserved.get("status") == "True",
        evicted=eviction,
        finished=_true(workload, "Finished"),
        cluster_queue=admission.get("clusterQueue"),
        flavors=tuple(flavors[POD_SET]),
        store_flavors=tuple(flavors[STORE_POD_SET]),
        workers=workers,
        waiting=waiting,
    )


def placement(
    admission: Admission,
    flavors: Mapping[str, Mapping[str, Any]],
    assigned: Sequence[str] | None = None,
    pod_set: str = POD_SET,
) -> builders.Placement | str:
    """What the flavors assigned to a pod set (the workers' unless `assigned` says) add to each of its
    pods, as Kueue's podset.FromAssignment computes it (their nodeLabels as node selector, their
    tolerations) plus the kueue.x-k8s.io/podset label; or why it cannot be known yet (a flavor the cache
    does not hold yet)."""
    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    for name in admission.flavors if assigned is None else assigned:
        flavor = flavors.get(name)
        if flavor is None:
            return f"waiting for ResourceFlavor {name}, assigned by ClusterQueue {admission.cluster_queue}"
        spec = flavor.get("spec") or {}
        node_selector.update(spec.get("nodeLabels") or {})
        tolerations += [dict(t) for t in spec.get("tolerations") or () if t not in tolerations]
    return builders.Placement(
        node_selector=node_selector, tolerations=tolerations, labels={constants.KUEUE_PODSET_LABEL: pod_set}
    )


def released(workload: Mapping[str, Any], admission: Admission, now: datetime) -> dict[str, Any]:
    """The Workload status after its evicted workers have stopped: no admission, QuotaReserved and
    Admitted False, Requeued as Kueue's job reconciler writes it (True after preemption or node
    failures). The shell writes it guarded by the Workload's resourceVersion."""
    assert admission.evicted is not None
    reason, message = admission.evicted
    status: dict[str, Any] = {"admission": None, "conditions": _conditions(workload)}
    st.set_condition(status, "Requeued", reason in REQUEUED_ON, reason, message, now)
    st.set_condition(status, "QuotaReserved", False, "Pending", message, now)
    st.set_condition(status, "Admitted", False, "NoReservation", "The workload has no reservation", now)
    if any(c.get("type") == PODS_READY for c in status["conditions"]):
        # The next admission starts its workers afresh: Kueue's timeout, not its recovery timeout.
        st.set_condition(status, PODS_READY, False, "WaitForStart", "the workers were stopped", now)
    return status


def finished(workload: Mapping[str, Any], succeeded: bool, message: str, now: datetime) -> dict[str, Any]:
    """The Workload condition of a finished TrainingJob: Finished True, so Kueue releases the quota."""
    reason = "Succeeded" if succeeded else "Failed"
    return _owned_condition(workload, "Finished", True, reason=reason, message=message, now=now)


def applied(workload: Mapping[str, Any], changed: dict[str, Any]) -> list[dict[str, Any]]:
    """What one server-side apply of the operator's conditions names: `changed`, and every other
    condition of APPLIED_CONDITIONS the Workload has, as it is. Server-side apply removes the fields its
    manager stops naming; an entry whose type another manager owns too (the merge patch of `released`
    rewrites every condition) then keeps its type alone, and the API server refuses that Workload's every
    later write (422: the condition's status, reason, message and time are required). Applying only
    Finished after a PodsReady did that to every preempted or suspended job: its Workload never
    finished and kept its quota."""
    kept = [
        c
        for c in _conditions(workload)
        if c.get("type") in APPLIED_CONDITIONS and c.get("type") != changed["type"]
    ]
    return [*kept, changed]


def _owned_condition(
    workload: Mapping[str, Any], type_: str, true: bool, *, reason: str, message: str, now: datetime
) -> dict[str, Any]:
    """One condition the operator applies, dated as set_condition dates a change."""
    status: dict[str, Any] = {"conditions": _conditions(workload)}
    st.set_condition(status, type_, true, reason, message, now)
    return next(c for c in status["conditions"] if c["type"] == type_)


def pods_ready(
    workload: Mapping[str, Any], workers: Sequence[observe.Worker], now: datetime
) -> dict[str, Any] | None:
    """The admitted Workload's PodsReady condition kept from the workers, or None when it already says
    so. Kueue's waitForPodsReady evicts an admitted Workload whose PodsReady is not True within its
    timeout, and for a kind it has no built-in integration for it leaves that condition to the
    kind's controller: without it every TrainingJob would be evicted, requeued and evicted again. The
    reasons are Kueue's (Started or Recovered when every worker is ready or done; WaitForStart before the
    first time, WaitForRecovery after a worker was lost), since Kueue's recovery timeout reads them."""
    before = next((c for c in _conditions(workload) if c.get("type") == PODS_READY), None)
    earlier = (before or {}).get("reason")
    counts = st.worker_counts(workers)
    waiting = len(workers) - counts["ready"] - counts["succeeded"]
    if workers and not waiting:
        ready, reason = True, "Recovered" if earlier in ("WaitForRecovery", "Recovered") else "Started"
        message = f"all {len(workers)} workers are ready or done"
    elif before is None:
        return None  # Kueue reads no condition as waiting for the start: no request spent saying so
    else:
        lost = before.get("status") == "True" or earlier == "WaitForRecovery"
        ready, reason = False, "WaitForRecovery" if lost else "WaitForStart"
        message = f"{waiting} of {len(workers)} workers are not ready"
    if before is not None and before.get("status") == str(ready) and earlier == reason:
        return None
    return _owned_condition(workload, PODS_READY, ready, reason=reason, message=message, now=now)


def _conditions(workload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Workload's conditions, copied: a released status is written whole (a merge patch replaces
    lists)."""
    return [dict(c) for c in (workload.get("status") or {}).get("conditions") or ()]


def is_active(workload: Mapping[str, Any]) -> bool:
    """spec.active, true unless set false (Kueue's default): false makes Kueue evict and not admit it."""
    return (workload.get("spec") or {}).get("active", True) is not False


@dataclasses.dataclass(frozen=True)
class Queued:
    """Where a TrainingJob stands with Kueue."""

    hold: tuple[str, str] | None = None
    """(reason, message) while Kueue has not admitted it: it stays Suspended, with no workers."""
    placement: builders.Placement | None = None
    """What the admission adds to the worker pods."""
    store_placement: builders.Placement | None = None
    """What it adds to an elastic job's store pod, when the Workload has the store's pod set."""
    admitted_by: str | None = None
    """The ClusterQueue that admitted it."""
    admitted_workers: int | None = None
    """How many workers the admission holds quota for: the most an elastic group may run."""


def plan_admission(
    obs: plans.Observed,
    spec: api.TrainingJobSpec,
    *,
    status: dict[str, Any],
    defaults: plans.Defaults,
    out: plans.Plan,
    now: datetime,
) -> Queued:
    """Kueue's verdict on a TrainingJob labelled kueue.x-k8s.io/queue-name, and the Workload writes it
    needs (see queueing). The label counts when the job is new or suspended: adding it to a job already
    running outside any queue does not stop that job. Once the job has its Workload, the Workload governs
    it to the end, whatever its label says later: removing or changing the label must not let a queued job
    run outside the quota it waits for (a Job that Kueue suspended stays suspended when its queue name is
    removed, too)."""
    labelled = queue_name(obs.labels)
    if obs.workload is None:
        if labelled is None or status.get("phase") not in (None, "Suspended"):
            return Queued()
        queue = labelled
    else:
        queue = workload_queue(obs.workload) or labelled or ""
    if not defaults.kueue:
        return Queued(
            hold=(
                "KueueNotInstalled",
                f"labelled {constants.KUEUE_QUEUE_LABEL}={queue}, but this cluster served no Kueue Workload "
                f"API ({constants.KUEUE_API}): install Kueue with {constants.KUEUE_EXTERNAL_FRAMEWORK} in "
                "its integrations.externalFrameworks; the operator notices it within a minute",
            )
        )
    name = workload_name(obs.name)
    ctx = builders.Context(
        owner=builders.Owner(obs.name, obs.namespace, obs.uid),
        spec=spec,
        default_image=defaults.image,
        default_service_account=defaults.service_account,
    )
    if obs.workload is None:
        if ("Workload", name) in set(obs.taken):
            return Queued(
                hold=("Queued", f"waiting for Workload {name} of an earlier TrainingJob to be deleted")
            )
        out.create.append(build_workload(ctx, queue, obs.labels))
        return Queued(
            hold=("Queued", f"queued in LocalQueue {queue} as Workload {name}: waiting for Kueue to admit it")
        )
    if is_active(obs.workload) == spec.run_policy.suspend:
        out.workload_spec = {"active": not spec.run_policy.suspend}
    verdict = read_admission(obs.workload)
    wanted = pod_sets(ctx)
    if not verdict.reserved and pod_set_shapes(obs.workload["spec"].get("podSets") or []) != pod_set_shapes(
        wanted
    ):
        # Changed while it holds no quota (an elastic job scaled; node selector, tolerations, affinity or
        # priority class edited): Kueue is to admit what the workers will ask for, not what they asked
        # for when queued (Kueue allows changing pod sets only while no quota is reserved).
        out.workload_spec = {**(out.workload_spec or {}), "podSets": wanted}
    if verdict.evicted is not None:
        evicted, why = verdict.evicted
        if verdict.reserved and not obs.jobs:
            out.workload_status = released(obs.workload, verdict, now)
        return Queued(
            hold=(
                "Evicted",
                f"evicted by Kueue ({evicted}: {why}); waiting in LocalQueue {queue} to be admitted again, "
                "then resuming from the last checkpoint",
            )
        )
    if not verdict.admitted:
        governed = ""
        if labelled != queue:
            governed = (
                f"; its {constants.KUEUE_QUEUE_LABEL} label says {labelled or 'nothing'}, but Workload "
                f"{name} is queued in {queue} and governs the job until it ends (delete and re-create the "
                "TrainingJob to queue it elsewhere)"
            )
        return Queued(hold=("Queued", f"queued in LocalQueue {queue}: {verdict.waiting}{governed}"))
    where = placement(verdict, obs.flavors)
    store_where = None
    if verdict.store_flavors:
        store_where = placement(verdict, obs.flavors, verdict.store_flavors, STORE_POD_SET)
    for unknown in (where, store_where):
        if isinstance(unknown, str):
            out.requeue_after = plans.WAIT_SECONDS  # the flavor's watch event wakes no TrainingJob
            return Queued(hold=("Queued", unknown))
    assert not isinstance(where, str) and not isinstance(store_where, str)
    return Queued(
        placement=where,
        store_placement=store_where,
        admitted_by=verdict.cluster_queue,
        admitted_workers=verdict.workers,
    )


def within_admission(spec: api.TrainingJobSpec, queue: Queued) -> api.TrainingJobSpec:
    """An elastic job runs at most the workers Kueue admitted: spec.workers above that (a scale-up after
    admission; an admitted Workload's pod sets cannot change) waits for the next admission."""
    if queue.admitted_workers is None or spec.workers <= queue.admitted_workers:
        return spec
    return spec.model_copy(update={"workers": queue.admitted_workers})
