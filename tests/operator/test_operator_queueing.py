"""A TrainingJob labelled kueue.x-k8s.io/queue-name, planned against the states of its Kueue Workload."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from kubetrain_operator.api import constants
from kubetrain_operator.planning import planner, plans, queueing
from kubetrain_operator.planning.observe import Worker
from operator_fakes import NS, UID, job, pod, trainer_spec, trainingjob

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, 1, 0, 0, tzinfo=UTC)
KUEUE = plans.Defaults(image="img:test", kueue=True)
FLAVOR = {
    "apiVersion": constants.KUEUE_API,
    "kind": "ResourceFlavor",
    "metadata": {"name": "pool-a", "uid": "flavor-uid"},
    "spec": {
        "nodeLabels": {"pool": "a"},
        "tolerations": [{"key": "pool", "operator": "Equal", "value": "a", "effect": "NoSchedule"}],
    },
}


def _queued_job(
    spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None, **labels: str
) -> dict[str, Any]:
    body = trainingjob(
        spec=spec or trainer_spec(workers=4, resources={"requests": {"cpu": "1"}}), status=status
    )
    body["metadata"]["labels"] = {constants.KUEUE_QUEUE_LABEL: "team-a", **labels}
    return body


def _workload(
    *conditions: tuple[str, str, str, str], admitted_flavor: str | None = None, **spec: Any
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [
            {"type": t, "status": s, "reason": r, "message": m, "lastTransitionTime": "2026-01-01T00:00:00Z"}
            for t, s, r, m in conditions
        ]
    }
    if admitted_flavor is not None:
        status["admission"] = {
            "clusterQueue": "cluster-queue",
            "podSetAssignments": [{"name": "workers", "flavors": {"cpu": admitted_flavor}, "count": 4}],
        }
    return {
        "apiVersion": constants.KUEUE_API,
        "kind": "Workload",
        "metadata": {
            "name": "demo",
            "namespace": NS,
            "uid": "wl-uid",
            "resourceVersion": "7",
            "ownerReferences": [{"kind": constants.KIND, "name": "demo", "uid": UID, "controller": True}],
        },
        "spec": {"queueName": "team-a", **spec},
        "status": status,
    }


ADMITTED = (
    ("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cluster-queue"),
    ("Admitted", "True", "Admitted", "The workload is admitted"),
)
PREEMPTED = (
    "Evicted",
    "True",
    "Preempted",
    "Preempted to accommodate a workload (UID: x) due to prioritization in the ClusterQueue",
)


def _plan(
    body: dict[str, Any],
    workload: dict[str, Any] | None = None,
    *,
    jobs: list[dict[str, Any]] | None = None,
    defaults: plans.Defaults = KUEUE,
) -> plans.Plan:
    obs = plans.Observed.from_objects(
        body,
        services=[],
        jobs=jobs or [],
        pods=[],
        workloads=[workload] if workload is not None else [],
        flavors={"pool-a": FLAVOR},
    )
    return planner.plan(obs, NOW, defaults)


def test_a_queued_job_creates_one_workload_for_all_its_workers_and_waits_suspended() -> None:
    plan = _plan(_queued_job())
    assert [m["kind"] for m in plan.create] == ["Workload"]
    workload = plan.create[0]
    assert workload["spec"]["queueName"] == "team-a"
    assert workload["spec"]["active"] is True
    [pod_set] = workload["spec"]["podSets"]
    assert pod_set["name"] == "workers" and pod_set["count"] == 4
    [container] = pod_set["template"]["spec"]["containers"]
    assert container["resources"]["requests"] == {"cpu": "1"}
    assert "env" not in container
    assert workload["metadata"]["ownerReferences"][0]["uid"] == UID
    assert workload["metadata"]["labels"][constants.LABEL_JOB_NAME] == "demo"
    assert plan.status["phase"] == "Suspended"
    suspended = next(c for c in plan.status["conditions"] if c["type"] == "Suspended")
    assert suspended["reason"] == "Queued"
    assert "queued in LocalQueue team-a" in plan.status["message"]


@pytest.mark.parametrize(
    ("conditions", "said"),
    [
        ((), "waiting for Kueue to admit Workload demo (LocalQueue team-a)"),
        (
            (
                (
                    "QuotaReserved",
                    "False",
                    "Pending",
                    "couldn't assign flavors to pod set workers: insufficient quota for cpu in flavor pool-a, request > maximum capacity (8 > 4)",
                ),
            ),
            "Pending: couldn't assign flavors to pod set workers: insufficient quota for cpu",
        ),
        (
            (
                ("QuotaReserved", "True", "QuotaReserved", "reserved"),
                ("Admitted", "False", "UnsatisfiedChecks", ""),
            ),
            "waiting for admission checks",
        ),
    ],
)
def test_a_job_kueue_has_not_admitted_stays_suspended_saying_kueues_reason(
    conditions: tuple[tuple[str, str, str, str], ...], said: str
) -> None:
    plan = _plan(_queued_job(), _workload(*conditions))
    assert plan.create == [] and plan.delete == []
    assert plan.status["phase"] == "Suspended"
    assert said in plan.status["message"]
    assert said in next(c for c in plan.status["conditions"] if c["type"] == "Suspended")["message"]


def test_admission_creates_the_workers_on_the_flavors_nodes() -> None:
    status = {
        "phase": "Suspended",
        "conditions": [{"type": "Suspended", "status": "True", "reason": "Queued", "message": "queued"}],
    }
    spec = trainer_spec(
        workers=4, resources={"requests": {"cpu": "1"}}, nodeSelector={"zone": "z1", "pool": "b"}
    )
    plan = _plan(_queued_job(spec, status), _workload(*ADMITTED, admitted_flavor="pool-a"))
    jobs = [m for m in plan.create if m["kind"] == "Job"]
    assert len(jobs) == 4
    for created in jobs:
        template = created["spec"]["template"]
        assert template["spec"]["nodeSelector"] == {"zone": "z1", "pool": "a"}
        assert template["spec"]["tolerations"] == FLAVOR["spec"]["tolerations"]
        assert template["metadata"]["labels"][constants.KUEUE_PODSET_LABEL] == "workers"
    assert plan.status["phase"] == "Pending"
    assert [e.reason for e in plan.events][:1] == ["Admitted"]
    assert "admitted by ClusterQueue cluster-queue" in plan.events[0].message


def test_an_admission_to_a_flavor_not_yet_cached_waits_for_it() -> None:
    plan = _plan(_queued_job(), _workload(*ADMITTED, admitted_flavor="pool-z"))
    assert plan.create == []
    assert "waiting for ResourceFlavor pool-z" in plan.status["message"]
    assert plan.requeue_after == plans.WAIT_SECONDS


def test_eviction_stops_the_workers_and_keeps_the_reservation_until_they_are_gone() -> None:
    running = {"phase": "Running", "restartAttempt": 0, "restarts": 0}
    workload = _workload(*ADMITTED, PREEMPTED, admitted_flavor="pool-a")
    plan = _plan(_queued_job(status=running), workload, jobs=[job(i) for i in range(4)])
    assert sorted(d.name for d in plan.delete) == [f"demo-r0-w{i}" for i in range(4)]
    assert all(d.propagation == "Foreground" for d in plan.delete)
    assert plan.workload_status is None
    assert plan.status["phase"] == "Suspended"
    assert plan.status["restartAttempt"] == 1 and plan.status["restarts"] == 0
    assert "evicted by Kueue (Preempted" in plan.status["message"]


@pytest.mark.parametrize(("reason", "requeued"), [("Preempted", "True"), ("InactiveWorkload", "False")])
def test_once_the_evicted_workers_are_gone_the_reservation_is_released(reason: str, requeued: str) -> None:
    suspended = {"phase": "Suspended", "restartAttempt": 1, "restarts": 0}
    evicted = ("Evicted", "True", reason, "evicted")
    plan = _plan(_queued_job(status=suspended), _workload(*ADMITTED, evicted, admitted_flavor="pool-a"))
    status = plan.workload_status
    assert status is not None and status["admission"] is None
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False"
    assert by_type["Admitted"]["status"] == "False"
    assert by_type["Requeued"]["status"] == requeued
    assert by_type["Evicted"]["status"] == "True"  # Kueue resets it when it admits the Workload again


@pytest.mark.parametrize(("phase", "reason"), [("Succeeded", "Succeeded"), ("Failed", "Failed")])
def test_a_finished_job_marks_its_workload_finished_once(phase: str, reason: str) -> None:
    done = {"phase": phase, "message": "done", "completionTime": "2026-01-01T00:59:00Z"}
    workload = _workload(*ADMITTED, admitted_flavor="pool-a")
    plan = _plan(_queued_job(status=done), workload)
    assert plan.workload_status is None, "only the operator's own condition is written, by apply"
    [finished] = plan.workload_conditions or []
    assert (finished["type"], finished["status"], finished["reason"]) == ("Finished", "True", reason)
    workload["status"]["conditions"].append(finished)
    assert _plan(_queued_job(status=done), workload).workload_conditions is None


def test_a_finished_job_applies_its_workloads_pods_ready_again_beside_finished() -> None:
    """Server-side apply drops what its manager stops naming: Finished applied alone after a PodsReady
    left a preempted job's PodsReady with its type alone, and every later Workload write was refused."""
    done = {"phase": "Succeeded", "message": "done", "completionTime": "2026-01-01T00:59:00Z"}
    pods_ready = ("PodsReady", "True", "Recovered", "all 4 workers are ready or done")
    workload = _workload(*ADMITTED, PREEMPTED, pods_ready, admitted_flavor="pool-a")
    applied = _plan(_queued_job(status=done), workload).workload_conditions or []
    assert [(c["type"], c["status"], c["reason"]) for c in applied] == [
        ("PodsReady", "True", "Recovered"),
        ("Finished", "True", "Succeeded"),
    ]
    assert applied[0] == next(c for c in workload["status"]["conditions"] if c["type"] == "PodsReady")


def test_suspending_a_queued_job_deactivates_its_workload_and_resuming_activates_it() -> None:
    held = _plan(
        _queued_job(trainer_spec(workers=4, runPolicy={"suspend": True})),
        _workload(*ADMITTED, admitted_flavor="pool-a"),
    )
    assert held.workload_spec == {"active": False}
    assert held.status["phase"] == "Suspended"
    queued_pod_sets = _plan(_queued_job()).create[0]["spec"]["podSets"]
    resumed = _plan(_queued_job(), _workload(active=False, podSets=queued_pod_sets))
    assert resumed.workload_spec == {"active": True}


def test_a_new_suspended_job_gets_an_inactive_workload() -> None:
    plan = _plan(_queued_job(trainer_spec(workers=2, runPolicy={"suspend": True})))
    assert plan.create[0]["spec"]["active"] is False


@pytest.mark.parametrize(
    ("labels", "spec", "ref"),
    [
        (
            {constants.KUEUE_PRIORITY_LABEL: "high"},
            {"priorityClassName": "low"},
            {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "high"},
        ),
        (
            {},
            {"priorityClassName": "low"},
            {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "low"},
        ),
        ({}, {}, None),
    ],
)
def test_the_workload_priority_comes_from_the_label_else_the_priority_class(
    labels: dict[str, str], spec: dict[str, Any], ref: dict[str, str] | None
) -> None:
    plan = _plan(_queued_job(trainer_spec(workers=2, **spec), **labels))
    assert plan.create[0]["spec"].get("priorityClassRef") == ref


def test_without_kueue_a_queued_job_waits_and_says_what_to_install() -> None:
    plan = _plan(_queued_job(), defaults=plans.Defaults(image="img:test"))
    assert plan.create == []
    assert plan.status["phase"] == "Suspended"
    assert constants.KUEUE_EXTERNAL_FRAMEWORK in plan.status["message"]


def test_a_queue_label_added_to_a_running_job_does_not_stop_it() -> None:
    running = {"phase": "Running", "restartAttempt": 0, "restarts": 0}
    plan = _plan(_queued_job(status=running), jobs=[job(i) for i in range(4)])
    assert plan.delete == [] and [m["kind"] for m in plan.create] == ["Service"]
    assert plan.status["phase"] != "Suspended"


@pytest.mark.parametrize("label", [None, "team-b"], ids=["label removed", "label changed"])
def test_a_queued_job_stays_governed_by_its_workload_when_its_queue_label_is_removed_or_changed(
    label: str | None,
) -> None:
    """Otherwise any tenant who may edit their TrainingJob runs it outside the ClusterQueue's quota."""
    body = _queued_job(status={"phase": "Suspended", "restartAttempt": 0, "restarts": 0})
    if label is None:
        del body["metadata"]["labels"][constants.KUEUE_QUEUE_LABEL]
    else:
        body["metadata"]["labels"][constants.KUEUE_QUEUE_LABEL] = label
    plan = _plan(body, _workload(("QuotaReserved", "False", "Pending", "insufficient quota")))
    assert plan.create == [] and plan.status["phase"] == "Suspended"
    assert "Workload demo is queued in team-a and governs the job" in plan.status["message"]


def test_an_admitted_job_whose_queue_label_is_removed_runs_on_under_its_admission() -> None:
    body = _queued_job()
    del body["metadata"]["labels"][constants.KUEUE_QUEUE_LABEL]
    plan = _plan(body, _workload(*ADMITTED, admitted_flavor="pool-a"))
    workers = [m for m in plan.create if m["kind"] == "Job"]
    assert len(workers) == 4
    assert all(m["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "a"} for m in workers)


def test_a_namesakes_workload_is_waited_for_not_claimed() -> None:
    other = _workload()
    other["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    plan = _plan(_queued_job(), other)
    assert plan.create == [] and plan.workload_status is None
    assert "of an earlier TrainingJob" in plan.status["message"]


@pytest.mark.parametrize(
    ("managed_by", "here"),
    [(None, True), (constants.MANAGED_BY_CONTROLLER, True), ("kueue.x-k8s.io/multikueue", False)],
)
def test_only_trainingjobs_managed_by_kubetrain_are_reconciled(managed_by: str | None, here: bool) -> None:
    body = trainingjob()
    if managed_by is not None:
        body["spec"]["managedBy"] = managed_by
    assert planner.managed_here(body) is here


def test_kueues_admission_reading_lists_each_flavor_once() -> None:
    workload = copy.deepcopy(_workload(*ADMITTED))
    workload["status"]["admission"] = {
        "clusterQueue": "cq",
        "podSetAssignments": [
            {"name": "workers", "flavors": {"cpu": "pool-a", "memory": "pool-a", "nvidia.com/gpu": "gpu"}}
        ],
    }
    verdict = queueing.read_admission(workload)
    assert verdict.admitted and verdict.flavors == ("pool-a", "gpu")


ELASTIC = {"minWorkers": 2, "maxWorkers": 4}


def _elastic_queued(workers: int, status: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = trainer_spec(workers=workers, resources={"requests": {"cpu": "1"}}, elastic=ELASTIC)
    return _queued_job(spec, status)


@pytest.mark.parametrize(
    ("conditions", "patched"),
    [((), True), (ADMITTED, False)],
    ids=["queued-follows-spec-workers", "admitted-pod-sets-are-immutable"],
)
def test_a_scaled_elastic_job_is_queued_at_its_new_size_until_quota_is_reserved(
    conditions: tuple[tuple[str, str, str, str], ...], patched: bool
) -> None:
    queued = _plan(_elastic_queued(2))
    workload = _workload(*conditions, podSets=queued.create[0]["spec"]["podSets"])
    plan = _plan(_elastic_queued(3), workload)
    pod_sets = (plan.workload_spec or {}).get("podSets")
    if patched:
        assert pod_sets is not None
        assert [(p["name"], p["count"]) for p in pod_sets] == [("workers", 3), ("rendezvous", 1)]
    else:
        assert pod_sets is None


def test_an_admitted_elastic_job_runs_at_most_the_admitted_workers_and_says_why() -> None:
    admitted = _workload(*ADMITTED, admitted_flavor="pool-a")
    admitted["status"]["admission"]["podSetAssignments"][0]["count"] = 2
    running = {"phase": "Running", "restartAttempt": 0, "restarts": 0}
    plan = _plan(_elastic_queued(3, running), admitted)
    created = sorted(m["metadata"]["name"] for m in plan.create if m["kind"] == "Job")
    assert created == ["demo-r0-w0", "demo-r0-w1", "demo-rdzv"], "no third worker beyond the admission"
    assert "spec.workers is 3 but Kueue admitted 2 workers" in plan.status["message"]
    assert [e.reason for e in plan.events].count("WorkersAboveAdmission") == 1
    again = _plan(_elastic_queued(3, plan.status), admitted)
    assert "WorkersAboveAdmission" not in [e.reason for e in again.events], "said once, not every reconcile"

    scaled_down = _plan(_elastic_queued(2, running), admitted)
    assert "Kueue admitted" not in (scaled_down.status.get("message") or "")


READY, NOT_READY, DONE = (
    Worker(0, 0, "running", ready=True),
    Worker(1, 0, "pending"),
    Worker(2, 0, "succeeded"),
)
PODS_READY_STATES = {
    # (PodsReady before as (status, reason) or None, workers) -> (status, reason) written, or None: no write
    "all ready: Started": (None, [READY, DONE], ("True", "Started")),
    "not ready yet: no condition is Kueue's WaitForStart, no write": (None, [READY, NOT_READY], None),
    "a worker lost after the start: WaitForRecovery": (
        ("True", "Started"),
        [READY, NOT_READY],
        ("False", "WaitForRecovery"),
    ),
    "still recovering: no write": (("False", "WaitForRecovery"), [NOT_READY], None),
    "ready again: Recovered": (("False", "WaitForRecovery"), [READY, READY], ("True", "Recovered")),
    "released and readmitted, not ready: no write": (("False", "WaitForStart"), [NOT_READY], None),
    "released and readmitted, ready: Started": (("False", "WaitForStart"), [READY], ("True", "Started")),
    "still ready: no write": (("True", "Started"), [READY], None),
}


@pytest.mark.parametrize(
    ("before", "workers", "written"), PODS_READY_STATES.values(), ids=PODS_READY_STATES.keys()
)
def test_the_workloads_pods_ready_condition_follows_the_workers_in_kueues_terms(
    before: tuple[str, str] | None, workers: list[Worker], written: tuple[str, str] | None
) -> None:
    """Kueue's waitForPodsReady evicts an admitted Workload whose PodsReady is not True in time."""
    conditions = [(t, s, r, m) for t, s, r, m in ADMITTED]
    if before is not None:
        conditions.append(("PodsReady", *before, "m"))
    pods_ready = queueing.pods_ready(_workload(*conditions), workers, NOW)
    if written is None:
        assert pods_ready is None
        return
    assert pods_ready is not None and pods_ready["type"] == "PodsReady"
    assert (pods_ready["status"], pods_ready["reason"]) == written


def test_an_admitted_job_whose_workers_are_all_ready_tells_kueue_so() -> None:
    running = {"phase": "Running", "restartAttempt": 0, "restarts": 0}
    workload = _workload(*ADMITTED, admitted_flavor="pool-a")
    obs = plans.Observed.from_objects(
        _queued_job(status=running),
        services=[],
        jobs=[job(i) for i in range(4)],
        pods=[pod(i, phase="Running", ready=True) for i in range(4)],
        workloads=[workload],
        flavors={"pool-a": FLAVOR},
    )
    plan = planner.plan(obs, NOW, KUEUE)
    assert plan.workload_status is None, "Kueue's conditions are not rewritten"
    [pods_ready] = plan.workload_conditions or []
    assert (pods_ready["type"], pods_ready["status"], pods_ready["reason"]) == (
        "PodsReady",
        "True",
        "Started",
    )


def test_releasing_an_evicted_workload_sets_pods_ready_back_to_waiting_for_the_start() -> None:
    """So the next admission gets Kueue's start timeout, not the recovery timeout of a lost worker."""
    workload = _workload(
        *ADMITTED, PREEMPTED, ("PodsReady", "True", "Started", "m"), admitted_flavor="pool-a"
    )
    status = queueing.released(workload, queueing.read_admission(workload), NOW)
    [pods_ready] = [c for c in status["conditions"] if c["type"] == "PodsReady"]
    assert (pods_ready["status"], pods_ready["reason"]) == ("False", "WaitForStart")


def _job_asking(**scheduling: Any) -> dict[str, Any]:
    return _queued_job(trainer_spec(workers=4, resources={"requests": {"cpu": "1"}}, **scheduling))


@pytest.mark.parametrize(
    "edit",
    [
        {"nodeSelector": {"pool": "b"}},
        {"tolerations": [{"key": "pool", "operator": "Exists", "effect": "NoSchedule"}]},
        {"priorityClassName": "urgent"},
        {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
    ],
    ids=["node-selector", "tolerations", "priority-class", "affinity"],
)
@pytest.mark.parametrize(
    ("conditions", "resynced"),
    [((), True), (ADMITTED, False)],
    ids=["queued-pod-sets-follow-the-spec", "reserved-pod-sets-are-left-alone"],
)
def test_a_queued_jobs_scheduling_edits_reach_its_workload_until_quota_is_reserved(
    edit: dict[str, Any], conditions: tuple[tuple[str, str, str, str], ...], resynced: bool
) -> None:
    queued = _plan(_job_asking())
    workload = _workload(*conditions, podSets=queued.create[0]["spec"]["podSets"])
    assert (_plan(_job_asking(), workload).workload_spec or {}).get("podSets") is None, "nothing changed"
    pod_sets = (_plan(_job_asking(**edit), workload).workload_spec or {}).get("podSets")
    if not resynced:
        assert pod_sets is None
        return
    assert pod_sets is not None
    [key] = edit
    assert pod_sets[0]["template"]["spec"][key] == edit[key]
    assert pod_sets[0]["count"] == 4
