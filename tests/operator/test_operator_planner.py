"""The planner: status and actions for every combination of worker Job and pod states."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubetrain_operator.planning import admission, planner, plans
from kubetrain_operator.planning import status as st
from operator_fakes import command_spec, job, observed, pod, service, trainer_spec, trainingjob

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, 1, 0, 0, tzinfo=UTC)
STARTED = {
    "startTime": "2026-01-01T00:30:00Z",
    "restartAttempt": 0,
    "restarts": 0,
    "phase": "Running",
    "conditions": [
        {"type": "Created", "status": "True", "reason": "WorkersCreated", "message": "m"},
        {"type": "Running", "status": "True", "reason": "AllWorkersRunning", "message": "m"},
    ],
}


def _plan(**kwargs: Any) -> plans.Plan:
    return planner.plan(observed(**kwargs), NOW)


def _created(p: plans.Plan) -> list[str]:
    return [m["metadata"]["name"] for m in p.create]


def _deleted(p: plans.Plan) -> list[tuple[str, str, str]]:
    return [(d.kind, d.name, d.propagation) for d in p.delete]


def _cond(p: plans.Plan, type_: str) -> dict[str, Any] | None:
    return st.get_condition(p.status, type_)


def test_new_job_creates_service_and_every_worker_then_waits() -> None:
    p = _plan(with_service=False)
    assert _created(p) == ["demo", "demo-r0-w0", "demo-r0-w1"]
    assert p.status["phase"] == "Pending"
    assert p.status["startTime"] == "2026-01-01T01:00:00Z"
    assert p.status["restartAttempt"] == 0
    assert p.status["workersReady"] == "0/2"
    assert _cond(p, "Created")["status"] == "True"
    assert "created" in p.transitions
    assert p.events == []  # the Created condition says it; no Event


def test_replanning_after_creation_creates_nothing_twice() -> None:
    first = _plan(with_service=False)
    again = _plan(status=first.status, jobs=[job(0), job(1)], pods=[pod(0), pod(1)])
    assert again.create == []
    assert again.status["startTime"] == first.status["startTime"]


def test_a_pass_after_the_creating_one_dates_created_and_start_from_the_jobs() -> None:
    jobs = [job(0), job(1)]
    for j in jobs:
        j["metadata"]["creationTimestamp"] = "2026-01-01T00:59:57Z"
    p = _plan(status={}, jobs=jobs, pods=[pod(0), pod(1)])  # the creating pass wrote no status
    created = _cond(p, "Created")
    assert created["message"] == "created 2 worker Jobs: demo-r0-w0 .. demo-r0-w1"
    assert created["lastTransitionTime"] == p.status["startTime"] == "2026-01-01T00:59:57Z"
    assert "created" in p.transitions


def test_a_job_that_ends_before_its_first_status_write_still_says_when_it_started() -> None:
    jobs = [job(0), job(1)]
    for j in jobs:
        j["metadata"]["creationTimestamp"] = "2026-01-01T00:59:57Z"
    p = _plan(status={}, jobs=jobs, pods=[pod(0, phase="Succeeded"), pod(1, phase="Succeeded")])
    assert p.status["phase"] == "Succeeded"
    assert p.status["startTime"] == "2026-01-01T00:59:57Z" <= p.status["completionTime"]
    assert _cond(p, "Created")["status"] == "True"
    assert p.transitions == ["created", "succeeded"]


def test_operator_killed_mid_creation_creates_only_the_rest() -> None:
    p = _plan(status={"phase": "Pending", "startTime": "2026-01-01T00:59:00Z"}, jobs=[job(0)], pods=[pod(0)])
    assert _created(p) == ["demo-r0-w1"]


@pytest.mark.parametrize(
    ("pods", "phase", "reason", "in_message"),
    [
        (
            [pod(0, unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu."), pod(1)],
            "Pending",
            "Unschedulable",
            "worker 0",
        ),
        (
            [pod(0, phase="Running", ready=True), pod(1, waiting="ImagePullBackOff")],
            "Pending",
            "ImagePullBackOff",
            "worker 1",
        ),
        ([pod(0, phase="Running"), pod(1, waiting="ErrImagePull")], "Pending", "ErrImagePull", "worker 1"),
        (
            [pod(0, waiting="CreateContainerConfigError"), pod(1)],
            "Pending",
            "CreateContainerConfigError",
            "worker 0",
        ),
        ([pod(0, waiting="ContainerCreating"), pod(1)], "Pending", None, None),
        ([pod(0)], "Pending", "PodNotCreated", "worker 1"),
    ],
)
def test_pending_workers_say_why(
    pods: list[Any], phase: str, reason: str | None, in_message: str | None
) -> None:
    p = _plan(status=dict(STARTED, phase="Pending"), jobs=[job(0), job(1)], pods=pods)
    assert p.status["phase"] == phase
    assert p.status.get("pendingReason") == reason
    if in_message:
        assert in_message in p.status["pendingMessage"]
        loud = reason not in st.QUIET_PENDING_REASONS
        assert any(e.type == "Warning" and e.reason == reason for e in p.events) == loud
    assert p.create == []


def test_all_workers_running_is_running() -> None:
    p = _plan(
        status=dict(STARTED, phase="Pending"),
        jobs=[job(0), job(1)],
        pods=[pod(0, phase="Running", ready=True), pod(1, phase="Running", ready=True)],
    )
    assert p.status["phase"] == "Running"
    assert _cond(p, "Running")["status"] == "True"
    assert p.status["workers"] == {"active": 2, "ready": 2, "pending": 0, "succeeded": 0, "failed": 0}
    assert p.status["workersReady"] == "2/2"
    assert p.status["pendingReason"] is None
    assert p.events == []  # the Running condition says it; no Event


def test_running_with_nothing_new_is_quiet() -> None:
    jobs, pods = [job(0), job(1)], [pod(0, phase="Running"), pod(1, phase="Running")]
    first = _plan(status=dict(STARTED, phase="Pending"), jobs=jobs, pods=pods)
    second = _plan(status=first.status, jobs=jobs, pods=pods)
    assert second.events == []
    assert not second.status_changed(first.status)
    assert second.requeue_after == plans.RESYNC_SECONDS


def test_retryable_failure_restarts_the_whole_group() -> None:
    p = _plan(
        status=STARTED,
        jobs=[job(0), job(1)],
        pods=[pod(0, phase="Running"), pod(1, phase="Failed", exit_code=11)],
    )
    assert p.status["phase"] == "Restarting"
    assert p.status["restartAttempt"] == 1
    assert p.status["restarts"] == 1
    assert _cond(p, "Restarting")["status"] == "True"
    assert _cond(p, "Restarting")["reason"] == "WorkerFailed"
    assert "worker 1" in p.status["message"] and "code 11" in p.status["message"]
    assert p.status["lastFailure"]["exitCode"] == 11
    assert sorted(_deleted(p)) == [("Job", "demo-r0-w0", "Foreground"), ("Job", "demo-r0-w1", "Foreground")]
    assert p.create == []
    assert p.transitions == ["restarted"]
    assert [e.type for e in p.events] == ["Warning"]


def test_next_attempt_waits_for_the_old_jobs_to_go() -> None:
    restarting = _plan(
        status=STARTED,
        jobs=[job(0), job(1)],
        pods=[pod(0, phase="Running"), pod(1, phase="Failed", exit_code=1)],
    ).status
    deleting = "2026-01-01T00:59:50Z"
    p = _plan(status=restarting, jobs=[job(0, deleting=deleting), job(1, deleting=deleting)])
    assert p.create == []
    assert p.delete == []
    assert p.status["phase"] == "Restarting"
    assert p.status["pendingReason"] == "WaitingForOldWorkers"
    assert p.requeue_after == plans.WAIT_SECONDS


def test_next_attempt_starts_when_old_jobs_are_gone() -> None:
    restarting = dict(STARTED, phase="Restarting", restartAttempt=1, restarts=1)
    restarting["conditions"] = [
        {"type": "Restarting", "status": "True", "reason": "WorkerFailed", "message": "m"}
    ]
    p = _plan(status=restarting)
    assert _created(p) == ["demo-r1-w0", "demo-r1-w1"]
    assert p.status["phase"] == "Restarting"
    then = _plan(
        status=p.status,
        jobs=[job(0, 1), job(1, 1)],
        pods=[pod(0, 1, phase="Running"), pod(1, 1, phase="Running")],
    )
    assert then.status["phase"] == "Running"
    assert _cond(then, "Restarting")["status"] == "False"


def _stuck_on_a_lost_node(index: int, attempt: int) -> dict[str, Any]:
    """An old attempt's pod whose kubelet never confirmed it stopped: still Running, its grace period
    (the deletionTimestamp the API server set) long over, as on a node cut off from the API server."""
    stuck = pod(index, attempt, phase="Running", node="node-3")
    stuck["metadata"]["deletionTimestamp"] = (NOW - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return stuck


def test_old_jobs_stuck_terminating_are_waited_for_however_long_naming_the_pod_and_its_way_out() -> None:
    status = dict(STARTED, phase="Restarting", restartAttempt=1, restarts=1)
    hours_ago = (NOW - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    p = _plan(status=status, jobs=[job(0, 0, deleting=hours_ago)], pods=[_stuck_on_a_lost_node(0, 0)])
    assert p.create == [], "a pod that may still train keeps the next attempt from starting"
    assert p.status["pendingReason"] == "WaitingForOldWorkers"
    message = p.status["pendingMessage"]
    assert "pods demo-r0-w0-abcde on node-3 still there" in message
    assert "past its grace period" in message
    assert "kubectl delete pod demo-r0-w0-abcde --force --grace-period=0" in message


def test_a_deleted_namesakes_pod_still_running_keeps_a_new_job_from_creating_workers() -> None:
    namesake = _stuck_on_a_lost_node(1, 0)
    namesake["metadata"]["ownerReferences"][0]["uid"] = "a-deleted-namesakes-job"
    p = _plan(with_service=False, pods=[namesake])
    assert p.create == []
    assert p.status["pendingReason"] == "WaitingForOldWorkers"
    assert "pods of an earlier TrainingJob of this name" in p.status["pendingMessage"]
    assert "demo-r0-w1-abcde on node-3" in p.status["pendingMessage"]


def test_a_deleted_namesakes_pod_that_ended_does_not_hold_a_new_job() -> None:
    ended = pod(1, 0, phase="Failed", exit_code=1)
    ended["metadata"]["ownerReferences"][0]["uid"] = "a-deleted-namesakes-job"
    p = _plan(with_service=False, pods=[ended])
    assert _created(p) == ["demo", "demo-r0-w0", "demo-r0-w1"]


def test_stale_jobs_from_an_earlier_attempt_are_deleted() -> None:
    status = dict(STARTED, restartAttempt=2, restarts=2)
    p = _plan(status=status, jobs=[job(0, 1), job(0, 2), job(1, 2)])
    assert ("Job", "demo-r1-w0", "Foreground") in _deleted(p)
    assert p.create == []


@pytest.mark.parametrize(
    ("pods", "reason", "words"),
    [
        (
            [pod(0, phase="Running"), pod(1, phase="Failed", exit_code=2)],
            "NonRetryableExitCode",
            ["worker 1", "2"],
        ),
        (
            [pod(0, phase="Failed", exit_code=3), pod(1, phase="Failed", exit_code=11)],
            "NonRetryableExitCode",
            ["worker 0", "code 3"],
        ),
    ],
)
def test_non_retryable_exit_code_fails_at_once(pods: list[Any], reason: str, words: list[str]) -> None:
    p = _plan(status=STARTED, jobs=[job(0), job(1)], pods=pods)
    assert p.status["phase"] == "Failed"
    assert _cond(p, "Failed")["reason"] == reason
    for word in words:
        assert word in _cond(p, "Failed")["message"]
    assert p.status["restarts"] == 0
    assert p.status["completionTime"] == "2026-01-01T01:00:00Z"
    assert p.transitions == ["failed"]


def test_failing_workers_still_running_are_deleted_on_failure() -> None:
    p = _plan(
        status=STARTED,
        jobs=[job(0), job(1)],
        pods=[pod(0, phase="Running"), pod(1, phase="Failed", exit_code=2)],
    )
    assert _deleted(p) == [("Job", "demo-r0-w0", "Background")]


def test_clean_pod_policy_none_keeps_running_workers() -> None:
    spec = trainer_spec(runPolicy={"cleanPodPolicy": "None"})
    p = _plan(
        spec=spec,
        status=STARTED,
        jobs=[job(0), job(1)],
        pods=[pod(0, phase="Running"), pod(1, phase="Failed", exit_code=2)],
    )
    assert p.delete == []


def test_restart_budget_exhausted_fails_naming_worker_and_code() -> None:
    status = dict(STARTED, restartAttempt=3, restarts=3)
    p = _plan(
        status=status,
        jobs=[job(0, 3), job(1, 3)],
        pods=[pod(0, 3, phase="Failed", exit_code=12), pod(1, 3, phase="Running")],
    )
    assert p.status["phase"] == "Failed"
    assert _cond(p, "Failed")["reason"] == "RestartLimitExceeded"
    assert "worker 0" in p.status["message"] and "code 12" in p.status["message"]


def test_explicit_retryable_codes_make_others_permanent() -> None:
    spec = trainer_spec(failurePolicy={"retryableExitCodes": [10, 11]})
    p = _plan(
        spec=spec, status=STARTED, jobs=[job(0), job(1)], pods=[pod(0, phase="Failed", exit_code=1), pod(1)]
    )
    assert p.status["phase"] == "Failed"


@pytest.mark.parametrize(
    ("failed_pod", "failed_job"),
    [
        (pod(1, phase="Failed", pod_reason="Evicted"), job(1)),
        (None, job(1, condition="Failed", reason="BackoffLimitExceeded")),
        (None, job(1, deleting="2026-01-01T00:59:00Z")),
    ],
)
def test_failures_without_exit_code_are_retryable(failed_pod: Any, failed_job: Any) -> None:
    pods = [pod(0, phase="Running")] + ([failed_pod] if failed_pod else [])
    p = _plan(status=STARTED, jobs=[job(0), failed_job], pods=pods)
    assert p.status["phase"] == "Restarting"
    assert "worker 1" in p.status["message"]


def test_the_earliest_failure_is_blamed() -> None:
    pods = [
        pod(0, phase="Failed", exit_code=11, finished_at="2026-01-01T00:50:05Z"),
        pod(1, phase="Failed", exit_code=12, finished_at="2026-01-01T00:50:00Z"),
    ]
    p = _plan(status=STARTED, jobs=[job(0), job(1)], pods=pods)
    assert p.status["lastFailure"]["worker"] == 1


def test_success_needs_every_worker() -> None:
    jobs = [job(0), job(1)]
    half = _plan(status=STARTED, jobs=jobs, pods=[pod(0, phase="Succeeded"), pod(1, phase="Running")])
    assert half.status["phase"] == "Running"
    done = _plan(status=STARTED, jobs=jobs, pods=[pod(0, phase="Succeeded"), pod(1, phase="Succeeded")])
    assert done.status["phase"] == "Succeeded"
    assert _cond(done, "Succeeded")["status"] == "True"
    assert _cond(done, "Succeeded")["reason"] == "AllWorkersSucceeded"
    assert done.status["completionTime"] == "2026-01-01T01:00:00Z"
    assert done.status["workers"]["succeeded"] == 2
    assert done.transitions == ["succeeded"]
    assert done.delete == []  # cleanPodPolicy Running: finished pods stay for their logs


def test_job_level_complete_counts_as_success() -> None:
    p = _plan(status=STARTED, jobs=[job(0, condition="Complete"), job(1, condition="Complete")])
    assert p.status["phase"] == "Succeeded"


def test_worker0_success_policy_ends_the_job_and_stops_the_rest() -> None:
    spec = trainer_spec(successPolicy="Worker0")
    p = _plan(
        spec=spec,
        status=STARTED,
        jobs=[job(0), job(1)],
        pods=[pod(0, phase="Succeeded"), pod(1, phase="Running")],
    )
    assert p.status["phase"] == "Succeeded"
    assert _deleted(p) == [("Job", "demo-r0-w1", "Background")]


def test_clean_pod_policy_all_removes_every_child_after_finishing() -> None:
    spec = trainer_spec(runPolicy={"cleanPodPolicy": "All"})
    done = dict(STARTED, phase="Succeeded", completionTime="2026-01-01T00:59:00Z")
    p = _plan(spec=spec, status=done, jobs=[job(0), job(1)], pods=[pod(0, phase="Succeeded")])
    assert sorted(_deleted(p)) == [
        ("Job", "demo-r0-w0", "Background"),
        ("Job", "demo-r0-w1", "Background"),
        ("Service", "demo", "Background"),
    ]


@pytest.mark.parametrize(
    ("ttl", "delete_self", "requeue"), [(30, True, None), (3600, False, 3540.0), (None, False, None)]
)
def test_ttl_after_finished(ttl: int | None, delete_self: bool, requeue: float | None) -> None:
    spec = trainer_spec(runPolicy={"ttlSecondsAfterFinished": ttl} if ttl is not None else {})
    done = dict(STARTED, phase="Succeeded", completionTime="2026-01-01T00:59:00Z")
    p = _plan(spec=spec, status=done)
    assert p.delete_self is delete_self
    assert p.requeue_after == requeue


def test_finished_jobs_are_left_alone() -> None:
    done = dict(STARTED, phase="Failed", completionTime="2026-01-01T00:59:00Z")
    p = _plan(status=done, jobs=[job(0, condition="Complete"), job(1, condition="Failed")])
    assert p.create == [] and p.delete == [] and p.events == []
    assert p.status["phase"] == "Failed"


def test_active_deadline_fails_the_job() -> None:
    spec = trainer_spec(runPolicy={"activeDeadlineSeconds": 600})
    p = _plan(
        spec=spec,
        status=STARTED,
        jobs=[job(0), job(1)],
        pods=[pod(0, phase="Running"), pod(1, phase="Running")],
    )
    assert p.status["phase"] == "Failed"
    assert _cond(p, "Failed")["reason"] == "DeadlineExceeded"
    assert sorted(_deleted(p)) == [("Job", "demo-r0-w0", "Background"), ("Job", "demo-r0-w1", "Background")]


def test_deadline_not_reached_requeues_for_it() -> None:
    spec = trainer_spec(runPolicy={"activeDeadlineSeconds": 1900})
    p = _plan(
        spec=spec,
        status=STARTED,
        jobs=[job(0), job(1)],
        pods=[pod(0, phase="Running"), pod(1, phase="Running")],
    )
    assert p.status["phase"] == "Running"
    assert p.requeue_after == 60.0
    spec = trainer_spec(runPolicy={"activeDeadlineSeconds": 1810})
    p = _plan(
        spec=spec,
        status=STARTED,
        jobs=[job(0), job(1)],
        pods=[pod(0, phase="Running"), pod(1, phase="Running")],
    )
    assert p.requeue_after == 10.0


def test_suspend_deletes_workers_and_resume_starts_a_new_attempt() -> None:
    spec = trainer_spec(runPolicy={"suspend": True})
    p = _plan(
        spec=spec,
        status=STARTED,
        jobs=[job(0), job(1)],
        pods=[pod(0, phase="Running"), pod(1, phase="Running")],
    )
    assert p.status["phase"] == "Suspended"
    assert _cond(p, "Suspended")["status"] == "True"
    assert _cond(p, "Running")["status"] == "False"
    assert p.status["restartAttempt"] == 1
    assert p.status["restarts"] == 0  # suspension is not a failure
    assert p.status["startTime"] is None
    assert sorted(_deleted(p)) == [("Job", "demo-r0-w0", "Foreground"), ("Job", "demo-r0-w1", "Foreground")]
    assert [e.reason for e in p.events] == ["Suspended"]

    deleting = "2026-01-01T00:59:59Z"
    still = _plan(spec=spec, status=p.status, jobs=[job(0, deleting=deleting)])
    assert still.status["restartAttempt"] == 1  # no second bump
    assert still.events == [] and still.delete == []

    resumed = _plan(spec=trainer_spec(), status=still.status)
    assert _created(resumed) == ["demo-r1-w0", "demo-r1-w1"]
    assert _cond(resumed, "Suspended")["status"] == "False"
    assert _cond(resumed, "Suspended")["reason"] == "Resumed"
    assert resumed.status["startTime"] == "2026-01-01T01:00:00Z"
    assert "Resumed" in [e.reason for e in resumed.events]


def test_created_suspended_never_creates_workers_and_its_first_admission_is_attempt_0() -> None:
    """Kueue admits a job created suspended by clearing suspend: its first group is its first run, not a
    replacement of one, so it is attempt 0 (worker Jobs -r0-, KUBETRAIN_RESTART_ATTEMPT=0); only a resume
    after a suspend that deleted workers starts a new attempt."""
    p = _plan(spec=trainer_spec(runPolicy={"suspend": True}), status={}, with_service=False)
    assert p.create == []
    assert p.status["phase"] == "Suspended"
    assert p.status["restartAttempt"] == 0
    admitted = _plan(spec=trainer_spec(runPolicy={"suspend": False}), status=p.status, with_service=False)
    assert _created(admitted) == ["demo", "demo-r0-w0", "demo-r0-w1"]
    assert admitted.status["restartAttempt"] == 0 and admitted.status["restarts"] == 0
    assert _cond(admitted, "Suspended")["reason"] == "Resumed"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"workers": 2}, "spec"),
        ({"workers": 0, "trainer": {}}, "spec.workers"),
        ({"trainer": {"model": "simple_cnn", "data": {"image_size": 64}}}, "spec.trainer"),
        ({"command": ["x"], "failurePolicy": {"retryableExitCodes": [2]}}, "spec.failurePolicy"),
    ],
)
def test_invalid_spec_fails_naming_the_field(spec: dict[str, Any], field: str) -> None:
    p = _plan(spec=spec, status={}, with_service=False)
    assert p.status["phase"] == "Failed"
    assert _cond(p, "Failed")["reason"] == "InvalidSpec"
    assert field in p.status["message"]
    assert p.create == [] and p.delete == []


HOST_PATH = [{"name": "data", "mountPath": "/data", "hostPath": {"path": "/srv/data"}}]
NARROW = admission.Policy(
    volume_types=frozenset({"persistentVolumeClaim", "emptyDir"}),
    service_accounts=frozenset({"kubetrain-worker"}),
)
REFUSALS = {
    "a hostPath volume": (
        trainer_spec(storage=HOST_PATH),
        "spec.storage[0].hostPath",
        "--allowed-volume-types",
    ),
    "another ServiceAccount": (
        trainer_spec(serviceAccountName="cluster-admin-sa"),
        "spec.serviceAccountName",
        "--allowed-service-accounts",
    ),
}


@pytest.mark.parametrize(("spec", "field", "flag"), REFUSALS.values(), ids=REFUSALS.keys())
def test_a_new_job_asking_for_what_the_operator_does_not_allow_fails_naming_the_field_and_the_flag(
    spec: dict[str, Any], field: str, flag: str
) -> None:
    p = planner.plan(observed(spec, status={}, with_service=False), NOW, plans.Defaults(policy=NARROW))
    assert p.status["phase"] == "Failed"
    assert _cond(p, "Failed")["reason"] == "NotAllowed"
    assert field in p.status["message"] and flag in p.status["message"]
    assert [e.reason for e in p.events] == ["NotAllowed"] and p.create == []


def test_what_the_operator_allows_runs_and_an_unset_service_account_is_always_allowed() -> None:
    pvc = [{"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "data"}}]
    for spec in (trainer_spec(storage=pvc, serviceAccountName="kubetrain-worker"), trainer_spec()):
        p = planner.plan(observed(spec, status={}), NOW, plans.Defaults(policy=NARROW))
        assert _created(p) == ["demo-r0-w0", "demo-r0-w1"]


HELD = {
    "invalid after an operator upgrade": (
        {"workers": 2, "trainer": {"epochs": "many"}},
        plans.Defaults(),
        "InvalidSpec",
    ),
    "no longer allowed after a flag change": (
        trainer_spec(storage=HOST_PATH),
        plans.Defaults(policy=NARROW),
        "NotAllowed",
    ),
}


@pytest.mark.parametrize(("spec", "defaults", "reason"), HELD.values(), ids=HELD.keys())
def test_a_running_job_whose_spec_stops_passing_is_held_with_its_workers_left_running(
    spec: dict[str, Any], defaults: plans.Defaults, reason: str
) -> None:
    running = {"jobs": [job(0), job(1)], "pods": [pod(0, phase="Running"), pod(1, phase="Running")]}
    p = planner.plan(observed(spec, status=STARTED, **running), NOW, defaults)
    assert p.status["phase"] == "Running" and p.delete == [] and p.create == []
    held = _cond(p, "SpecRefused")
    assert held["status"] == "True" and held["reason"] == reason
    assert "running ones keep running" in held["message"]
    assert [(e.type, e.reason) for e in p.events] == [("Warning", reason)]
    again = planner.plan(observed(spec, status=p.status, **running), NOW, defaults)
    assert again.events == [] and again.status == p.status  # said once; nothing else happens

    fixed = planner.plan(observed(trainer_spec(), status=p.status, **running), NOW, defaults)
    assert _cond(fixed, "SpecRefused")["status"] == "False"
    assert fixed.status["phase"] == "Running" and fixed.requeue_after == plans.RESYNC_SECONDS


def _held(spec: dict[str, Any], **more: Any) -> dict[str, Any]:
    """A held spec (as HELD's) with more fields of its own."""
    return {**spec, **more}


@pytest.mark.parametrize(("spec", "defaults", "reason"), HELD.values(), ids=HELD.keys())
def test_a_held_job_still_succeeds_when_its_workers_do(
    spec: dict[str, Any], defaults: plans.Defaults, reason: str
) -> None:
    done = {"jobs": [job(0, condition="Complete"), job(1, condition="Complete")]}
    p = planner.plan(observed(spec, status=STARTED, **done), NOW, defaults)
    assert p.status["phase"] == "Succeeded" and p.create == []
    assert _cond(p, "SpecRefused")["reason"] == reason


@pytest.mark.parametrize(("spec", "defaults", "reason"), HELD.values(), ids=HELD.keys())
def test_a_held_job_restarts_a_failed_group_but_starts_no_worker_from_the_refused_spec(
    spec: dict[str, Any], defaults: plans.Defaults, reason: str
) -> None:
    failed = {
        "jobs": [job(0), job(1)],
        "pods": [pod(0, phase="Running"), pod(1, phase="Failed", exit_code=11)],
    }
    p = planner.plan(observed(spec, status=STARTED, **failed), NOW, defaults)
    assert p.status["phase"] == "Restarting" and p.status["restarts"] == 1
    assert sorted(d.name for d in p.delete) == ["demo-r0-w0", "demo-r0-w1"] and p.create == []
    gone = planner.plan(observed(spec, status=p.status), NOW, defaults)
    assert gone.create == [] and _cond(gone, "SpecRefused")["reason"] == reason


@pytest.mark.parametrize(("spec", "defaults", "reason"), HELD.values(), ids=HELD.keys())
def test_a_held_job_fails_at_its_deadline_and_is_deleted_after_its_ttl(
    spec: dict[str, Any], defaults: plans.Defaults, reason: str
) -> None:
    spec = _held(spec, runPolicy={"activeDeadlineSeconds": 600, "ttlSecondsAfterFinished": 60})
    running = {"jobs": [job(0), job(1)], "pods": [pod(0, phase="Running"), pod(1, phase="Running")]}
    p = planner.plan(observed(spec, status=STARTED, **running), NOW, defaults)
    assert p.status["phase"] == "Failed" and _cond(p, "Failed")["reason"] == "DeadlineExceeded"
    later = NOW + timedelta(seconds=61)
    ended = planner.plan(observed(spec, status=p.status), later, defaults)
    assert ended.delete_self


def test_a_job_refused_before_it_started_is_deleted_after_its_ttl() -> None:
    spec = {"workers": 2, "trainer": {"epochs": "many"}, "runPolicy": {"ttlSecondsAfterFinished": 60}}
    refused = planner.plan(observed(spec, status={}, with_service=False), NOW)
    assert refused.status["phase"] == "Failed" and not refused.delete_self
    later = planner.plan(observed(spec, status=refused.status), NOW + timedelta(seconds=61))
    assert later.delete_self


def test_a_refusal_that_names_no_field_to_set_aside_holds_the_job_as_it_stands() -> None:
    """Both trainer and command is a rule over two fields: neither is set aside, nothing is read, and the
    job is held as it stands (its failed worker is not acted on)."""
    spec = {"workers": 2, "trainer": {}, "command": ["python", "train.py"]}
    running = {
        "jobs": [job(0), job(1)],
        "pods": [pod(0, phase="Running"), pod(1, phase="Failed", exit_code=11)],
    }
    p = planner.plan(observed(spec, status=STARTED, **running), NOW)
    assert p.status["phase"] == "Running" and p.delete == [] and p.create == []
    assert _cond(p, "SpecRefused")["reason"] == "InvalidSpec"


def test_a_finished_job_whose_spec_stops_passing_stays_finished() -> None:
    done = dict(STARTED, phase="Succeeded", completionTime="2026-01-01T00:50:00Z")
    p = _plan(
        spec={"workers": 2, "trainer": {"epochs": "many"}}, status=done, jobs=[job(0, condition="Complete")]
    )
    assert p.status["phase"] == "Succeeded" and p.delete == []
    assert _cond(p, "SpecRefused")["status"] == "True"


def test_progress_of_rank0_is_copied_to_status_and_kept() -> None:
    report = {
        "epoch": 3,
        "epochs": 10,
        "step": 120,
        "loss": 0.75,
        "validationLoss": 0.9,
        "accuracy": 0.6,
        "imagesPerSecond": 2400.5,
        "updatedAt": "2026-01-01T00:59:00Z",
        "resumedFrom": {"attempt": 2, "epoch": 3, "step": 100},
    }
    pods = [
        pod(0, phase="Running", progress=report),
        pod(1, phase="Running", progress={"epoch": 1, "loss": "bad"}),
    ]
    p = _plan(status=STARTED, jobs=[job(0), job(1)], pods=pods)
    assert p.status["progress"] == report
    gone = _plan(
        status=p.status, jobs=[job(0), job(1)], pods=[pod(0, phase="Running"), pod(1, phase="Running")]
    )
    assert gone.status["progress"] == report


def test_a_malformed_resumed_from_is_left_out_of_the_status_progress() -> None:
    report = {"epoch": 3, "step": 120, "resumedFrom": {"attempt": "2", "epoch": 3, "step": 100}}
    pods = [pod(0, phase="Running", progress=report), pod(1, phase="Running")]
    p = _plan(status=STARTED, jobs=[job(0), job(1)], pods=pods)
    assert p.status["progress"] == {"epoch": 3, "step": 120}


def test_observed_generation_is_recorded() -> None:
    assert _plan(status=STARTED).status["observedGeneration"] == 1


def test_children_of_another_trainingjob_with_the_same_name_are_ignored() -> None:
    foreign = job(0, attempt=3)
    foreign["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    p = _plan(status={}, jobs=[foreign])
    assert _created(p) == ["demo-r0-w0", "demo-r0-w1"]
    assert p.delete == []


def test_custom_command_jobs_are_planned_too() -> None:
    p = _plan(spec=command_spec(workers=3), status={})
    assert _created(p) == ["demo-r0-w0", "demo-r0-w1", "demo-r0-w2"]


def test_pods_of_a_deleted_namesakes_jobs_are_ignored() -> None:
    stray = pod(0, phase="Failed", exit_code=2)
    stray["metadata"]["ownerReferences"][0]["uid"] = "job-of-an-earlier-trainingjob"
    p = _plan(status=STARTED, jobs=[job(0), job(1)], pods=[stray, pod(1, phase="Running")])
    assert p.status["phase"] != "Failed"


def test_a_failed_creation_stays_reported_until_the_workers_exist() -> None:
    failed = dict(STARTED, phase="Pending", pendingReason="FailedCreate", pendingMessage="403 exceeded quota")
    p = _plan(status=failed, jobs=[job(0)], pods=[pod(0, phase="Running")])
    assert (p.status["pendingReason"], p.status["pendingMessage"]) == ("FailedCreate", "403 exceeded quota")
    assert not [e for e in p.events if e.reason == "FailedCreate"]  # the controller posted it already
    done = _plan(
        status=failed, jobs=[job(0), job(1)], pods=[pod(0, phase="Running"), pod(1, phase="Running")]
    )
    assert done.status["pendingReason"] is None


@pytest.mark.parametrize(
    ("provider", "with_service", "status", "jobs", "expected"),
    [
        (
            "volcano",
            False,
            {},
            [],
            [("Service", "demo"), ("PodGroup", "demo"), ("Job", "demo-r0-w0"), ("Job", "demo-r0-w1")],
        ),
        (
            "volcano",
            True,
            {**STARTED, "restartAttempt": 1},
            [],
            [("Job", "demo-r1-w0"), ("Job", "demo-r1-w1")],
        ),
        (
            "kubernetes",
            False,
            {},
            [],
            [
                ("Workload", "demo"),
                ("Service", "demo"),
                ("PodGroup", "demo-r0"),
                ("Job", "demo-r0-w0"),
                ("Job", "demo-r0-w1"),
            ],
        ),
        (
            "kubernetes",
            True,
            {**STARTED, "restartAttempt": 1},
            [],
            [("PodGroup", "demo-r1"), ("Job", "demo-r1-w0"), ("Job", "demo-r1-w1")],
        ),
        ("kubernetes", True, STARTED, [job(0)], [("Job", "demo-r0-w1")]),
    ],
)
def test_gang_objects_are_created_with_what_they_belong_to(
    provider: str,
    with_service: bool,
    status: dict[str, Any],
    jobs: list[dict[str, Any]],
    expected: list[tuple[str, str]],
) -> None:
    """The TrainingJob's (Workload; a volcano PodGroup) with the Service, a kubernetes attempt's PodGroup
    with the attempt's first Jobs: never again, so the operator never has to read them back."""
    spec = trainer_spec(gangScheduling={"provider": provider})
    p = _plan(spec=spec, status=status, jobs=jobs, with_service=with_service)
    assert [(m["kind"], m["metadata"]["name"]) for m in p.create] == expected


@pytest.mark.parametrize(
    ("provider", "deleted_groups"),
    [("kubernetes", [("PodGroup", "demo-r0", "scheduling.k8s.io/v1beta1")]), ("volcano", [])],
)
@pytest.mark.parametrize("why", ["restart", "suspend"])
def test_the_pod_group_of_an_attempt_goes_with_its_jobs(
    provider: str, deleted_groups: list[tuple[str, str, str]], why: str
) -> None:
    gang = {"gangScheduling": {"provider": provider}}
    spec = trainer_spec(**gang, runPolicy={"suspend": True}) if why == "suspend" else trainer_spec(**gang)
    p = _plan(
        spec=spec,
        status=STARTED,
        jobs=[job(0), job(1)],
        pods=[pod(0, phase="Failed", exit_code=1), pod(1, phase="Running")],
    )
    assert [(d.kind, d.name) for d in p.delete if d.kind == "Job"] == [
        ("Job", "demo-r0-w0"),
        ("Job", "demo-r0-w1"),
    ]
    assert [(d.kind, d.name, d.api_version) for d in p.delete if d.kind != "Job"] == deleted_groups


@pytest.mark.parametrize("gang", [{"provider": "kubernetes"}, None])
def test_an_unplaced_gang_says_it_waits_for_room_for_every_worker(gang: dict[str, str] | None) -> None:
    refused = "0/6 nodes are available: 6 Insufficient nvidia.com/gpu."
    p = _plan(
        spec=trainer_spec(workers=2, gangScheduling=gang),
        status={**STARTED, "phase": "Pending"},
        jobs=[job(0), job(1)],
        pods=[pod(0, unschedulable=refused), pod(1, unschedulable=refused)],
    )
    assert p.status["pendingReason"] == "Unschedulable"
    message = p.status["pendingMessage"]
    assert message.endswith(refused)
    gang_words = "gang-scheduled (kubernetes, PodGroup demo-r0): no worker starts until all 2 fit at once"
    assert (gang_words in message) == (gang is not None)
    assert [e.message for e in p.events if e.reason == "Unschedulable"] == [message]


def test_gang_scheduling_without_a_provider_takes_the_clusters_and_is_refused_when_there_is_none() -> None:
    obs = observed(trainer_spec(gangScheduling={}), status={}, with_service=False)
    served = planner.plan(obs, NOW, plans.Defaults(gang_provider="kubernetes"))
    assert [m["kind"] for m in served.create][:3] == ["Workload", "Service", "PodGroup"]
    none = planner.plan(obs, NOW, plans.Defaults(gang_provider=None))
    assert none.create == [] and none.status["phase"] == "Failed"
    assert "spec.gangScheduling names no provider" in none.status["message"]


def _from_namesake(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as left by a deleted TrainingJob of the same name (another uid), not yet garbage-collected."""
    obj["metadata"]["ownerReferences"][0]["uid"] = "uid-of-the-deleted-namesake"
    return obj


def test_a_namesakes_leftover_children_are_waited_for_and_never_counted_as_created() -> None:
    p = planner.plan(
        plans.Observed.from_objects(
            trainingjob(status={}),
            services=[_from_namesake(service())],
            jobs=[_from_namesake(job(0)), _from_namesake(job(1))],
            pods=[],
        ),
        NOW,
    )
    assert p.create == []
    assert p.status["pendingReason"] == "WaitingForOldWorkers"
    assert "Service demo" in p.status["pendingMessage"] and "Job demo-r0-w0" in p.status["pendingMessage"]
    assert _cond(p, "Created") is None and "CreatedWorkers" not in [e.reason for e in p.events]
    assert p.requeue_after == plans.WAIT_SECONDS


def test_a_job_that_names_the_trainingjob_as_owner_but_not_as_controller_is_not_a_worker() -> None:
    borrowed = job(0)
    borrowed["metadata"]["ownerReferences"][0]["controller"] = False
    p = _plan(status=STARTED, jobs=[borrowed, job(1)], pods=[pod(1, phase="Running")])
    assert p.status["workers"]["active"] == 1
    assert "demo-r0-w0" in p.status["pendingMessage"]


def test_every_deletion_names_the_uid_of_the_object_it_was_planned_from() -> None:
    suspended = _plan(spec=trainer_spec(runPolicy={"suspend": True}), status=STARTED, jobs=[job(0), job(1)])
    restart = _plan(
        status=STARTED,
        jobs=[job(0), job(1)],
        pods=[pod(0, phase="Running"), pod(1, phase="Failed", exit_code=11)],
    )
    finished = dict(STARTED, phase="Succeeded", completionTime="2026-01-01T00:50:00Z")
    cleanup = _plan(spec=trainer_spec(runPolicy={"cleanPodPolicy": "All"}), status=finished, jobs=[job(0)])
    for p in (suspended, restart, cleanup):
        assert p.delete
        assert {(d.name, d.uid) for d in p.delete} <= {
            ("demo-r0-w0", "job-0-0"),
            ("demo-r0-w1", "job-0-1"),
            ("demo", "svc-uid"),
        }


CREATED = dict(
    STARTED,
    conditions=[
        *STARTED["conditions"],
        {"type": "Created", "status": "True", "reason": "WorkersCreated", "message": "m"},
    ],
)


@pytest.mark.parametrize(
    ("status", "with_service", "workers", "creates", "confirm"),
    [
        pytest.param({}, False, [], 3, False, id="a new job's first children"),
        pytest.param({"phase": "Pending"}, True, [0], 1, False, id="the rest of a first creation"),
        pytest.param(CREATED, True, [0, 1], 0, False, id="nothing to create"),
        pytest.param(CREATED, True, [0], 1, True, id="a worker Job that disappeared"),
        pytest.param(CREATED, False, [], 3, True, id="every child gone (a deleted job's, collected)"),
        pytest.param(
            dict(CREATED, phase="Restarting", restartAttempt=1, restarts=1), True, [], 2, True, id="a restart"
        ),
    ],
)
def test_creations_that_are_not_a_jobs_first_ask_to_confirm_it_still_exists(
    status: dict[str, Any], with_service: bool, workers: list[int], creates: int, confirm: bool
) -> None:
    attempt = int(status.get("restartAttempt") or 0)
    p = _plan(
        status=status,
        with_service=with_service,
        jobs=[job(i, attempt) for i in workers],
        pods=[pod(i, attempt, phase="Running", ready=True) for i in workers],
    )
    assert len(p.create) == creates
    assert p.confirm_owner is confirm


def test_the_gang_provider_a_job_was_given_is_recorded_and_kept_across_operator_restarts() -> None:
    """Planned once under an operator whose default was volcano, the job keeps volcano when a restarted
    operator finds only the kubernetes gang API served; a new job takes the new default."""
    spec = trainer_spec(gangScheduling={})
    first = planner.plan(observed(spec, with_service=False), NOW, plans.Defaults(gang_provider="volcano"))
    assert first.status["gangProvider"] == "volcano"
    assert ("PodGroup", "demo") in [(m["kind"], m["metadata"]["name"]) for m in first.create]

    restarted = plans.Defaults(gang_provider="kubernetes")
    later = planner.plan(observed(spec, status=first.status, with_service=False), NOW, restarted)
    assert later.status["gangProvider"] == "volcano"
    kinds = {(m["apiVersion"], m["kind"]) for m in later.create}
    assert ("scheduling.volcano.sh/v1beta1", "PodGroup") in kinds
    assert not any(api_version.startswith("scheduling.k8s.io") for api_version, _ in kinds)

    new = planner.plan(observed(spec, with_service=False), NOW, restarted)
    assert new.status["gangProvider"] == "kubernetes"


def test_a_job_without_gang_scheduling_records_no_provider() -> None:
    p = planner.plan(observed(with_service=False), NOW, plans.Defaults(gang_provider="volcano"))
    assert "gangProvider" not in p.status
