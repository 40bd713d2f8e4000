"""Reading one worker from its Job and pod, for every combination of Job state and pod state."""

from __future__ import annotations

from typing import Any

import pytest
from kubetrain_operator.planning import observe
from kubetrain_operator.planning import status as st
from operator_fakes import job, pod

pytestmark = pytest.mark.unit

DELETING = "2026-01-01T00:59:00Z"

JOBS: dict[str, Any] = {
    "missing": None,
    "active": job(0),
    "complete": job(0, condition="Complete"),
    "failed": job(0, condition="Failed", reason="BackoffLimitExceeded"),
    "deleting": job(0, deleting=DELETING),
}
PODS: dict[str, Any] = {
    "none": None,
    "pending": pod(0, waiting="ContainerCreating"),
    "unschedulable": pod(0, unschedulable="0/3 nodes are available"),
    "image-pull": pod(0, waiting="ImagePullBackOff"),
    "unscheduled": pod(0, unscheduled=True),
    "running": pod(0, phase="Running"),
    "ready": pod(0, phase="Running", ready=True),
    "succeeded": pod(0, phase="Succeeded"),
    "exit-11": pod(0, phase="Failed", exit_code=11),
    "oom": pod(0, phase="Failed", exit_code=137, reason="OOMKilled"),
    "evicted": pod(0, phase="Failed", pod_reason="Evicted"),
}

# (job state, pod state) -> (worker phase, reason, ready). The pod wins when it has finished; otherwise a
# finished Job wins; a Job being deleted by someone else loses its worker; else the pod says how it goes.
EXPECTED: dict[tuple[str, str], tuple[str, str | None, bool]] = {}
for _pod, _expect in {
    "none": ("pending", "PodNotCreated", False),
    "pending": ("pending", "ContainerCreating", False),
    "unschedulable": ("pending", "Unschedulable", False),
    "image-pull": ("pending", "ImagePullBackOff", False),
    "unscheduled": ("pending", "WaitingForScheduler", False),
    "running": ("running", None, False),
    "ready": ("running", None, True),
    "succeeded": ("succeeded", None, False),
    "exit-11": ("failed", "Error", False),
    "oom": ("failed", "OOMKilled", False),
    "evicted": ("failed", "Evicted", False),
}.items():
    EXPECTED["active", _pod] = _expect
    finished = _expect[0] in ("succeeded", "failed")
    EXPECTED["complete", _pod] = _expect if finished else ("succeeded", None, False)
    EXPECTED["failed", _pod] = _expect if finished else ("failed", "BackoffLimitExceeded", False)
    EXPECTED["deleting", _pod] = _expect if finished else ("failed", "JobDeleted", False)
    EXPECTED["missing", _pod] = ("missing", None, False)


@pytest.mark.parametrize(("job_state", "pod_state"), sorted(EXPECTED), ids=str)
def test_worker_state_for_every_job_and_pod_state(job_state: str, pod_state: str) -> None:
    pods = [PODS[pod_state]] if PODS[pod_state] is not None else []
    worker = observe.read_worker(0, 0, JOBS[job_state], pods)
    assert (worker.phase, worker.reason, worker.ready) == EXPECTED[job_state, pod_state]


@pytest.mark.parametrize(
    ("pod_state", "exit_code"), [("exit-11", 11), ("oom", 137), ("evicted", None), ("succeeded", 0)]
)
def test_exit_codes_are_read_from_the_worker_container(pod_state: str, exit_code: int | None) -> None:
    assert observe.read_worker(0, 0, JOBS["active"], [PODS[pod_state]]).exit_code == exit_code


def test_the_newest_pod_of_a_worker_is_the_one_read() -> None:
    old, new = pod(0, phase="Failed", exit_code=1), pod(0, phase="Running")
    new["metadata"]["creationTimestamp"] = "2026-01-01T00:05:00Z"
    assert observe.read_worker(0, 0, JOBS["active"], [new, old]).phase == "running"


@pytest.mark.parametrize(
    ("phases", "counts"),
    [
        (["missing", "missing"], {"active": 0, "ready": 0, "pending": 2, "succeeded": 0, "failed": 0}),
        (["pending", "running"], {"active": 2, "ready": 0, "pending": 1, "succeeded": 0, "failed": 0}),
        (["succeeded", "failed"], {"active": 0, "ready": 0, "pending": 0, "succeeded": 1, "failed": 1}),
    ],
)
def test_worker_counts(phases: list[str], counts: dict[str, int]) -> None:
    workers = [observe.Worker(index=i, attempt=0, phase=p) for i, p in enumerate(phases)]  # type: ignore[arg-type]
    assert st.worker_counts(workers) == counts


@pytest.mark.parametrize(
    ("phases", "running"),
    [
        (["running", "running"], True),
        (["running", "succeeded"], True),
        (["succeeded", "succeeded"], False),
        (["running", "pending"], False),
        ([], False),
    ],
)
def test_group_running_means_every_worker_is_up(phases: list[str], running: bool) -> None:
    workers = [observe.Worker(index=i, attempt=0, phase=p) for i, p in enumerate(phases)]  # type: ignore[arg-type]
    assert st.group_running(workers) is running


def test_conditions_keep_their_transition_time_until_they_flip() -> None:
    from datetime import UTC, datetime

    status: dict[str, Any] = {}
    t1, t2 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    assert st.set_condition(status, "Running", True, "A", "a", t1)
    assert not st.set_condition(status, "Running", True, "B", "b", t2)
    assert st.get_condition(status, "Running")["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert st.set_condition(status, "Running", False, "C", "c", t2)
    assert st.get_condition(status, "Running")["lastTransitionTime"] == "2026-01-02T00:00:00Z"


@pytest.mark.parametrize(
    ("message", "exit_code"),
    [
        ('{"exitCode": 3, "reason": "DATA_ERROR", "message": "no images under /data"}\n', 3),
        ("Root Cause (first observed failure):\n[0]:\n  exitcode  : 2 (pid: 7)\n====\n", 2),
        ("Traceback (most recent call last):\nRuntimeError: boom\n", 1),
    ],
    ids=["trainer-record", "torchrun-report", "plain-log"],
)
def test_a_worker_under_torchrun_fails_with_the_code_its_child_recorded(message: str, exit_code: int) -> None:
    failed = pod(0, phase="Failed", exit_code=1)
    failed["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = message
    assert observe.read_worker(0, 0, JOBS["active"], [failed]).exit_code == exit_code


@pytest.mark.parametrize(
    ("said", "shown"),
    [
        (
            '0/3 nodes are available: persistentvolumeclaim "cifar10-data" not found. not found',
            '0/3 nodes are available: persistentvolumeclaim "cifar10-data" not found',
        ),
        (
            "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: 3 No "
            "preemption victims found for incoming pod.",
            "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: 3 No "
            "preemption victims found for incoming pod.",
        ),
    ],
)
def test_a_scheduler_message_loses_its_echo_and_nothing_else(said: str, shown: str) -> None:
    assert observe.scheduler_message(said) == shown
