"""A disruption (eviction, drain, preemption, lost node) is not the user's failure: the group restarts from
its checkpoint without spending maxRestarts, bounded apart by maxDisruptionRestarts. Pure planner."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from kubetrain_operator.planning import builders, planner, plans
from kubetrain_operator.planning import status as st
from operator_fakes import context, job, observed, pod, running_status, trainer_spec
from testcluster.manifests import merge_patch

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, 1, 0, 0, tzinfo=UTC)
SAME_SECOND = "2026-01-01T00:50:05Z"


def evicted(index: int, attempt: int = 0, **more: Any) -> dict[str, Any]:
    """What a drained worker's pod looks like at the end: the trainer's SIGTERM exit, DisruptionTarget."""
    return pod(
        index,
        attempt,
        phase="Failed",
        exit_code=130,
        finished_at=SAME_SECOND,
        node="node-2",
        disruption="EvictionByEvictionAPI",
        **more,
    )


def peer_lost(index: int, attempt: int = 0) -> dict[str, Any]:
    """A rank that died because its peer did, in the same second (finishedAt has 1 s resolution)."""
    return pod(index, attempt, phase="Failed", exit_code=11, finished_at=SAME_SECOND, node="node-1")


def _plan(spec: dict[str, Any] | None = None, **kwargs: Any) -> plans.Plan:
    return planner.plan(observed(spec, **kwargs), NOW)


def _reason(p: plans.Plan, type_: str) -> str | None:
    cond = st.get_condition(p.status, type_)
    return cond["reason"] if cond else None


def test_an_evicted_worker_restarts_the_group_without_spending_a_restart_and_says_where() -> None:
    p = _plan(status=running_status(), jobs=[job(0), job(1)], pods=[peer_lost(0), evicted(1)])
    assert p.status["phase"] == "Restarting"
    assert (p.status["restartAttempt"], p.status["restarts"], p.status["disruptionRestarts"]) == (1, 0, 1)
    assert _reason(p, "Restarting") == "WorkerDisrupted"
    message = p.status["message"]
    assert "worker 1 (pod demo-r0-w1-abcde) on node node-2 was evicted" in message
    assert "disruption 1, not counted against maxRestarts" in message
    assert p.status["lastFailure"]["disruption"] == "EvictionByEvictionAPI"
    assert p.status["lastFailure"]["node"] == "node-2"
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "Restarting")]
    assert "evicted" in p.events[0].message


def test_disruptions_restart_the_group_even_with_the_restart_budget_spent() -> None:
    status = running_status(restartAttempt=3, restarts=3, disruptionRestarts=7)
    p = _plan(status=status, jobs=[job(0, 3), job(1, 3)], pods=[peer_lost(0, 3), evicted(1, 3)])
    assert p.status["phase"] == "Restarting"
    assert (p.status["restarts"], p.status["disruptionRestarts"], p.status["restartAttempt"]) == (3, 8, 4)


def test_a_crash_after_disruptions_still_counts_against_max_restarts() -> None:
    status = running_status(restartAttempt=2, disruptionRestarts=2)
    p = _plan(status=status, jobs=[job(0, 2), job(1, 2)], pods=[pod(0, 2, phase="Running"), peer_lost(1, 2)])
    assert _reason(p, "Restarting") == "WorkerFailed"
    assert (p.status["restarts"], p.status["disruptionRestarts"]) == (1, 2)


def test_the_disruption_budget_when_set_ends_a_flapping_job() -> None:
    spec = trainer_spec(runPolicy={"maxDisruptionRestarts": 2})
    status = running_status(restartAttempt=2, disruptionRestarts=2)
    p = _plan(spec, status=status, jobs=[job(0, 2), job(1, 2)], pods=[peer_lost(0, 2), evicted(1, 2)])
    assert p.status["phase"] == "Failed"
    assert _reason(p, "Failed") == "DisruptionLimitExceeded"
    assert "2 of maxDisruptionRestarts 2" in p.status["message"]


def test_a_disruption_within_the_budget_says_how_many_are_left() -> None:
    spec = trainer_spec(runPolicy={"maxDisruptionRestarts": 2})
    p = _plan(spec, status=running_status(), jobs=[job(0), job(1)], pods=[peer_lost(0), evicted(1)])
    assert "disruption 1 of 2" in p.status["message"]


def test_an_allow_list_without_the_sigterm_code_does_not_fail_a_drained_job() -> None:
    spec = trainer_spec(failurePolicy={"retryableExitCodes": [10, 11]})
    p = _plan(spec, status=running_status(), jobs=[job(0), job(1)], pods=[peer_lost(0), evicted(1)])
    assert p.status["phase"] == "Restarting"
    assert p.status["restarts"] == 0


def test_the_trainers_sigterm_exit_is_retryable_whatever_the_allow_list() -> None:
    spec = trainer_spec(failurePolicy={"retryableExitCodes": [10, 11]})
    pods = [pod(0, phase="Running"), pod(1, phase="Failed", exit_code=130)]
    p = _plan(spec, status=running_status(), jobs=[job(0), job(1)], pods=pods)
    assert _reason(p, "Restarting") == "WorkerFailed"
    assert p.status["restarts"] == 1


def test_a_peer_failing_while_the_evicted_pod_is_still_terminating_is_a_disruption() -> None:
    terminating = pod(1, phase="Running", node="node-2", disruption="EvictionByEvictionAPI")
    p = _plan(status=running_status(), jobs=[job(0), job(1)], pods=[peer_lost(0), terminating])
    assert _reason(p, "Restarting") == "WorkerDisrupted"
    assert (p.status["restarts"], p.status["disruptionRestarts"]) == (0, 1)


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("PreemptionByScheduler", "preempted by the scheduler"),
        ("DeletionByTaintManager", "its node was NotReady or unreachable"),
        ("DeletionByPodGC", "its node is gone"),
        ("TerminationByKubelet", "terminated by the kubelet"),
        ("SomethingNew", "was disrupted (SomethingNew)"),
    ],
)
def test_each_disruption_is_named_by_who_caused_it(reason: str, words: str) -> None:
    pods = [peer_lost(0), pod(1, phase="Failed", exit_code=137, node="node-2", disruption=reason)]
    p = _plan(status=running_status(), jobs=[job(0), job(1)], pods=pods)
    assert _reason(p, "Restarting") == "WorkerDisrupted"
    assert words in p.status["message"]


POLICY_VERDICT = (
    "Pod default/demo-r0-w1-abcde has condition DisruptionTarget matching FailJob rule at index 0"
)


def _plan_after_pod_gone(departed: dict[str, dict[str, Any]]) -> plans.Plan:
    """Worker 1's Job failed by its podFailurePolicy, its pod deleted; `departed` as the cache kept it."""
    failed = job(1, condition="Failed", reason="PodFailurePolicy", message=POLICY_VERDICT)
    return _plan(status=running_status(), jobs=[job(0), failed], pods=[peer_lost(0)], departed=departed)


def test_a_disruption_whose_pod_is_gone_is_read_from_the_jobs_pod_failure_policy_verdict() -> None:
    p = _plan_after_pod_gone({})
    assert _reason(p, "Restarting") == "WorkerDisrupted"
    assert (p.status["restarts"], p.status["disruptionRestarts"]) == (0, 1)


def test_a_disruption_whose_pod_is_gone_is_named_by_the_pods_last_state_the_watch_reported() -> None:
    """The Job controller deletes an evicted pod as soon as it has failed the Job: the verdict alone says
    only "DisruptionTarget"; the pod's last state (runtime.cache keeps it) says who took it and where."""
    p = _plan_after_pod_gone({"job-0-1": evicted(1)})
    said = "worker 1 (pod demo-r0-w1-abcde) on node node-2 was evicted through the Eviction API"
    assert said in p.status["message"]
    failure = p.status["lastFailure"]
    assert (failure["disruption"], failure["exitCode"]) == ("EvictionByEvictionAPI", 130)
    assert (p.status["restarts"], p.status["disruptionRestarts"]) == (0, 1)


def test_the_last_state_of_a_pod_of_another_job_names_no_disruption() -> None:
    """A departed pod is matched to its Job by uid: a namesake's (a deleted TrainingJob's) is not ours."""
    p = _plan_after_pod_gone({"job-of-a-namesake": evicted(1)})
    assert p.status["lastFailure"]["disruption"] == "DisruptionTarget"


def test_a_new_failure_leaves_nothing_of_the_previous_one_in_the_stored_status() -> None:
    """Status is merge-patched: a field the new lastFailure lacks must be nulled, or the stored record
    mixes the new message with the previous attempt's pod and exit code."""
    first = _plan(status=running_status(), jobs=[job(0), job(1)], pods=[peer_lost(0), evicted(1)])
    stored = merge_patch(running_status(), first.status)
    assert stored["lastFailure"]["pod"] == "demo-r0-w1-abcde"
    failed = job(1, 1, condition="Failed", reason="PodFailurePolicy", message=POLICY_VERDICT)
    running = dict(stored, phase="Running")
    second = _plan(status=running, jobs=[job(0, 1), failed], pods=[pod(0, 1, phase="Running")])
    again = merge_patch(stored, second.status)["lastFailure"]
    assert again["restartAttempt"] == 1
    assert "pod" not in again and "exitCode" not in again and "node" not in again, again


def test_a_job_failed_for_another_reason_is_still_a_failure() -> None:
    failed = job(1, condition="Failed", reason="BackoffLimitExceeded", message="Job has reached the limit")
    p = _plan(status=running_status(), jobs=[job(0), failed], pods=[pod(0, phase="Running")])
    assert _reason(p, "Restarting") == "WorkerFailed"
    assert p.status["restarts"] == 1


def test_a_non_retryable_code_beside_a_disruption_still_fails_the_job() -> None:
    pods = [pod(0, phase="Failed", exit_code=2), evicted(1)]
    p = _plan(status=running_status(), jobs=[job(0), job(1)], pods=pods)
    assert _reason(p, "Failed") == "NonRetryableExitCode"
    assert "worker 0" in p.status["message"]


def test_worker_jobs_fail_with_the_pod_failure_policy_reason_when_disrupted() -> None:
    spec = builders.build_worker_job(context("demo"), 0)["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["podFailurePolicy"] == {
        "rules": [{"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    }
    assert spec["template"]["spec"]["restartPolicy"] == "Never", "a podFailurePolicy requires Never"
