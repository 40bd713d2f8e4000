"""The elastic membership policy (spec.elastic): replace one worker, scale, wait below minWorkers."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from kubetrain_operator.api import constants
from kubetrain_operator.planning import builders, planner, plans
from kubetrain_operator.planning import status as st
from operator_fakes import NS, T0, UID, context, job, pod, service, trainer_spec, trainingjob
from testcluster.manifests import merge_patch

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, 1, 0, 0, tzinfo=UTC)


def elastic_spec(workers: int = 3, **overrides: Any) -> dict[str, Any]:
    return trainer_spec(workers=workers, elastic={"minWorkers": 2, "maxWorkers": 3}, **overrides)


RUNNING = {
    "startTime": "2026-01-01T00:30:00Z",
    "restartAttempt": 0,
    "restarts": 0,
    "phase": "Running",
    "conditions": [{"type": "Running", "status": "True", "reason": "MinWorkersRunning", "message": "m"}],
    "elastic": {"members": [0, 1, 2], "worldSize": 3},
}


def store_job(*, condition: str | None = None, deleting: str | None = None) -> dict[str, Any]:
    out = builders.build_rendezvous_job(context(spec=elastic_spec()))
    assert out is not None
    out["metadata"].update(uid="store-uid", creationTimestamp=T0)
    if deleting:
        out["metadata"]["deletionTimestamp"] = deleting
    out["status"] = {}
    if condition:
        out["status"]["conditions"] = [
            {"type": condition, "status": "True", "reason": "BackoffLimitExceeded"}
        ]
    return out


def store_pod(phase: str = "Running") -> dict[str, Any]:
    template = store_job()["spec"]["template"]
    return {
        "metadata": {
            **copy.deepcopy(template["metadata"]),
            "name": "demo-rdzv-xyz",
            "namespace": NS,
            "creationTimestamp": T0,
            "ownerReferences": [{"kind": "Job", "name": "demo-rdzv", "uid": "store-uid", "controller": True}],
        },
        "spec": template["spec"],
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def running(*indices: int, attempt: int = 0) -> list[dict[str, Any]]:
    return [pod(i, attempt, phase="Running", ready=True) for i in indices]


def plan(
    spec: dict[str, Any] | None = None,
    *,
    status: dict[str, Any] | None = None,
    jobs: list[dict[str, Any]] | None = None,
    pods: list[dict[str, Any]] | None = None,
    store: bool = True,
) -> plans.Plan:
    all_jobs = [*(jobs or []), *([store_job()] if store else [])]
    all_pods = [*(pods or []), *([store_pod()] if store else [])]
    obs = plans.Observed.from_objects(
        trainingjob("demo", spec or elastic_spec(), status),
        services=[service()],
        jobs=all_jobs,
        pods=all_pods,
    )
    return planner.plan(obs, NOW)


def created(p: plans.Plan) -> list[str]:
    return [m["metadata"]["name"] for m in p.create]


def deleted(p: plans.Plan) -> list[str]:
    return [d.name for d in p.delete]


def reasons(p: plans.Plan) -> list[str]:
    return [e.reason for e in p.events]


def test_a_new_elastic_job_creates_the_rendezvous_store_and_every_wanted_worker() -> None:
    p = plan(store=False)
    assert created(p) == ["demo-rdzv", "demo-r0-w0", "demo-r0-w1", "demo-r0-w2"]
    assert p.status["phase"] == "Pending"
    assert "waiting for minWorkers: 0 of 2 running" in p.status["message"]


def test_a_pass_after_the_creating_one_records_created_dated_from_the_members_jobs() -> None:
    p = plan(status={}, jobs=[job(0), job(1), job(2)])  # the creating pass wrote no status
    created = st.get_condition(p.status, "Created")
    assert created is not None and created["message"] == "created 3 worker Jobs: demo-r0-w0 .. demo-r0-w2"
    assert created["lastTransitionTime"] == p.status["startTime"] == T0
    assert p.create == [] and "created" in p.transitions


def test_min_workers_running_is_running_with_the_world_size_and_a_membership_event() -> None:
    p = plan(
        status=dict(RUNNING, elastic=None, phase="Pending"), jobs=[job(0), job(1), job(2)], pods=running(0, 1)
    )
    assert p.status["phase"] == "Running"
    assert p.status["elastic"]["members"] == [0, 1]
    assert p.status["elastic"]["worldSize"] == 2
    assert "MembershipChanged" in reasons(p)
    assert p.create == [] and p.delete == []


@pytest.mark.parametrize("lost", [0, 1, 2])
def test_a_retryable_failure_replaces_that_worker_alone(lost: int) -> None:
    pods = [
        pod(i, phase="Failed", exit_code=11) if i == lost else pod(i, phase="Running", ready=True)
        for i in range(3)
    ]
    p = plan(status=RUNNING, jobs=[job(0), job(1), job(2)], pods=pods)
    assert created(p) == [f"demo-r1-w{lost}"]
    assert deleted(p) == [f"demo-r0-w{lost}"]
    assert (p.status["restarts"], p.status["restartAttempt"]) == (1, 1)
    assert p.status["elastic"]["workerAttempts"] == [1 if i == lost else 0 for i in range(3)]
    assert p.status["lastFailure"]["worker"] == lost and p.status["lastFailure"]["exitCode"] == 11
    assert p.status["phase"] == "Running", "two of minWorkers 2 still run"
    assert "WorkerReplaced" in reasons(p) and "restarted" in p.transitions
    replacement = p.create[0]
    assert replacement["metadata"]["labels"][constants.LABEL_RESTART_ATTEMPT] == "1"


def test_after_a_replacement_nothing_is_created_or_deleted_twice() -> None:
    pods = [
        pod(0, phase="Running", ready=True),
        pod(1, phase="Failed", exit_code=11),
        pod(2, phase="Running"),
    ]
    first = plan(status=RUNNING, jobs=[job(0), job(1), job(2)], pods=pods)
    again = plan(
        status=first.status,
        jobs=[job(0), job(1, deleting=T0), job(2), job(1, 1)],
        pods=[pods[0], pods[2], pod(1, 1)],
    )
    assert again.create == [] and again.delete == []
    assert again.status["restarts"] == 1


@pytest.mark.parametrize("lost", [0, 2])
def test_a_replacement_survives_the_status_merge_patch_and_is_not_undone(lost: int) -> None:
    pods = [pod(i, phase="Failed", exit_code=11) if i == lost else pod(i, phase="Running") for i in range(3)]
    before = dict(RUNNING, elastic={"members": [0, 1, 2], "workerAttempts": [0, 0, 0]})
    first = plan(status=before, jobs=[job(0), job(1), job(2)], pods=pods)
    stored = merge_patch(before, first.status)
    survivors = [job(i) for i in range(3) if i != lost]
    again = plan(
        status=stored, jobs=[*survivors, job(lost, 1)], pods=[p for i, p in enumerate(pods) if i != lost]
    )
    assert again.create == [] and again.delete == []


def test_a_non_retryable_code_fails_the_job_at_once() -> None:
    pods = [pod(0, phase="Running"), pod(1, phase="Failed", exit_code=2), pod(2, phase="Running")]
    p = plan(status=RUNNING, jobs=[job(0), job(1), job(2)], pods=pods)
    assert p.status["phase"] == "Failed"
    assert st.get_condition(p.status, "Failed")["reason"] == "NonRetryableExitCode"
    assert "worker 1" in p.status["message"] and "code 2" in p.status["message"]
    assert p.create == []


def test_a_crash_loop_ends_failed_naming_the_worker_and_code_when_the_budget_is_spent() -> None:
    pods = [pod(0, phase="Running"), pod(1, 3, phase="Failed", exit_code=11), pod(2, phase="Running")]
    status = dict(RUNNING, restarts=3, restartAttempt=3, elastic={"workerAttempts": [0, 3, 0]})
    p = plan(status=status, jobs=[job(0), job(1, 3), job(2)], pods=pods)
    assert p.status["phase"] == "Failed"
    assert st.get_condition(p.status, "Failed")["reason"] == "RestartLimitExceeded"
    assert "worker 1" in p.status["message"] and "code 11" in p.status["message"]
    assert "3 of maxRestarts 3" in p.status["message"]


def test_scaling_up_adds_only_the_new_worker() -> None:
    status = dict(RUNNING, elastic={"members": [0, 1], "worldSize": 2})
    p = plan(elastic_spec(3), status=status, jobs=[job(0), job(1)], pods=running(0, 1))
    assert created(p) == ["demo-r0-w2"]
    assert p.delete == []


def test_scaling_down_removes_only_the_highest_workers_and_moves_the_counter_on() -> None:
    p = plan(elastic_spec(2), status=RUNNING, jobs=[job(0), job(1), job(2)], pods=running(0, 1, 2))
    assert deleted(p) == ["demo-r0-w2"] and p.create == []
    assert "ScaledDown" in reasons(p)
    assert p.status["restartAttempt"] == 1 and p.status["restarts"] == 0
    assert p.status["elastic"]["workerAttempts"] == [0, 0]


def test_scaling_back_up_while_the_removed_worker_terminates_uses_a_new_name() -> None:
    status = dict(RUNNING, restartAttempt=1, elastic={"workerAttempts": [0, 0], "members": [0, 1]})
    p = plan(
        elastic_spec(3), status=status, jobs=[job(0), job(1), job(2, deleting=T0)], pods=running(0, 1, 2)
    )
    assert created(p) == ["demo-r1-w2"]
    assert p.delete == []


def test_below_min_workers_the_job_waits_and_says_why() -> None:
    pods = [
        pod(0, phase="Running"),
        pod(1, unschedulable="0/3 nodes are available"),
        pod(2, unschedulable="x"),
    ]
    p = plan(status=dict(RUNNING, elastic={"members": [0, 1, 2]}), jobs=[job(0), job(1), job(2)], pods=pods)
    assert p.status["phase"] == "Pending"
    assert p.status["pendingReason"] == "Unschedulable"
    assert "waiting for minWorkers: 1 of 2 running" in p.status["message"]
    assert "worker 1" in p.status["message"]
    assert {"Unschedulable", "MembershipChanged"} <= set(reasons(p))
    assert p.create == [] and p.delete == []


def test_the_deadline_applies_while_waiting_for_min_workers() -> None:
    spec = elastic_spec(runPolicy={"activeDeadlineSeconds": 60})
    p = plan(spec, status=RUNNING, jobs=[job(0), job(1), job(2)], pods=[pod(0, unschedulable="x")])
    assert p.status["phase"] == "Failed"
    assert st.get_condition(p.status, "Failed")["reason"] == "DeadlineExceeded"


def test_losing_the_rendezvous_store_restarts_the_whole_group() -> None:
    jobs = [job(0), job(1), job(2), store_job(condition="Failed")]
    obs = plans.Observed.from_objects(
        trainingjob("demo", elastic_spec(), RUNNING), services=[service()], jobs=jobs, pods=running(0, 1, 2)
    )
    p = planner.plan(obs, NOW)
    assert p.status["phase"] == "Restarting"
    assert sorted(deleted(p)) == ["demo-r0-w0", "demo-r0-w1", "demo-r0-w2", "demo-rdzv"]
    assert (p.status["restarts"], p.status["restartAttempt"]) == (1, 1)
    assert p.create == []


def test_losing_the_store_and_every_worker_together_restarts_the_group_once_with_a_new_store() -> None:
    jobs = [job(i) for i in range(3)]
    pods = [pod(i, phase="Failed", pod_reason="NodeLost") for i in range(3)]
    p = plan(status=RUNNING, jobs=jobs, pods=pods, store=False)
    assert p.status["phase"] == "Restarting"
    assert (p.status["restarts"], p.status["disruptionRestarts"]) == (0, 1), "a store Job gone is no crash"
    assert merge_patch(RUNNING, p.status)["elastic"] == {"storeGeneration": 1}, "the old record goes"
    assert "the rendezvous store was deleted (its Job is gone)" in p.status["message"]
    assert p.create == []


def test_a_restarted_group_waits_for_the_old_jobs_then_starts_whole_at_the_new_attempt() -> None:
    status = dict(RUNNING, restarts=1, restartAttempt=1, elastic=None, phase="Restarting")
    waiting = plan(status=status, jobs=[job(0, deleting="2026-01-01T00:59:30Z")], store=False)
    assert waiting.create == [] and waiting.status["pendingReason"] == "WaitingForOldWorkers"
    p = plan(status=status, store=False)
    assert created(p) == ["demo-rdzv", "demo-r1-w0", "demo-r1-w1", "demo-r1-w2"]


@pytest.mark.parametrize("elastic", [False, True], ids=["whole group", "elastic group"])
def test_both_policies_retire_an_old_attempt_the_same_way_guarded_by_each_jobs_uid(elastic: bool) -> None:
    """One step (`steps.retire_old_attempts`) retires the old attempt for both policies: each old Job is
    deleted Foreground with its uid as the precondition, so a namesake created since is never deleted, and
    the wait names the old pods still there and their nodes."""
    spec = elastic_spec() if elastic else trainer_spec(workers=3)
    status = dict(RUNNING, restarts=1, restartAttempt=1, elastic=None, phase="Restarting")
    old_pod = pod(1, phase="Running")
    old_pod["spec"]["nodeName"] = "node-3"
    obs = plans.Observed.from_objects(
        trainingjob("demo", spec, status), services=[service()], jobs=[job(0), job(1)], pods=[old_pod]
    )
    p = planner.plan(obs, NOW)
    assert [(d.name, d.propagation, d.uid) for d in p.delete] == [
        ("demo-r0-w0", "Foreground", "job-0-0"),
        ("demo-r0-w1", "Foreground", "job-0-1"),
    ]
    assert p.create == [] and p.status["pendingReason"] == "WaitingForOldWorkers"
    assert p.status["pendingMessage"] == (
        "waiting for 2 Jobs of earlier attempts to be deleted: pods demo-r0-w1-abcde on node-3 still there"
    )


@pytest.mark.parametrize(
    ("pods", "phase"),
    [
        ([pod(i, phase="Succeeded") for i in range(3)], "Succeeded"),
        (
            [pod(0, phase="Succeeded"), pod(1, phase="Failed", exit_code=11), pod(2, phase="Succeeded")],
            "Succeeded",
        ),
        ([pod(0, phase="Succeeded"), pod(1, phase="Running"), pod(2, phase="Succeeded")], "Running"),
    ],
)
def test_training_is_over_when_a_worker_succeeded_and_none_still_runs(pods: list[Any], phase: str) -> None:
    p = plan(status=RUNNING, jobs=[job(0), job(1), job(2)], pods=pods)
    assert p.status["phase"] == phase
    assert p.create == [], "nothing is replaced or created once training finished"
    if phase == "Succeeded":
        assert "demo-rdzv" in deleted(p)


def test_elastic_workers_get_the_torchrun_rendezvous_contract_and_no_fixed_ranks() -> None:
    ctx = context(spec=elastic_spec(nprocPerWorker=2), attempt=4)
    env = {e["name"]: e.get("value") for e in builders.worker_env(ctx, 1)}
    assert env["PET_NNODES"] == "2:3"
    assert env["PET_NPROC_PER_NODE"] == "2"
    assert env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == f"demo-rdzv.demo.{NS}.svc:29500"
    assert env["PET_RDZV_ID"] == UID
    assert "is_host=false" in env["PET_RDZV_CONF"] and "last_call_timeout=30" in env["PET_RDZV_CONF"]
    assert env["PET_LOCAL_ADDR"] == f"demo-r4-w1.demo.{NS}.svc"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    for fixed in ("WORLD_SIZE", "RANK", "NODE_RANK", "MASTER_ADDR", "PET_NODE_RANK", "PET_MASTER_ADDR"):
        assert fixed not in env
    command, _ = builders.worker_command(ctx.spec)
    assert command[0] == "torchrun"
    assert builders.worker_command(context(spec=elastic_spec()).spec)[0][0] == "torchrun"


def test_the_rendezvous_store_is_its_own_pod_on_the_service_at_the_master_port() -> None:
    store = builders.build_rendezvous_job(context(spec=elastic_spec(masterPort=29600)))
    assert store is not None
    pod_spec = store["spec"]["template"]["spec"]
    assert (pod_spec["hostname"], pod_spec["subdomain"]) == ("demo-rdzv", "demo")
    container = pod_spec["containers"][0]
    assert container["command"][-3:] == ["kubetrain_trainer.rendezvous_store", "--port", "29600"]
    assert store["metadata"]["labels"][constants.LABEL_ROLE] == constants.ROLE_RENDEZVOUS
    assert builders.build_rendezvous_job(context()) is None


def test_an_evicted_member_is_replaced_alone_without_spending_a_restart() -> None:
    pods = [
        pod(0, phase="Running", ready=True),
        pod(1, phase="Failed", exit_code=130, node="node-2", disruption="EvictionByEvictionAPI"),
        pod(2, phase="Running", ready=True),
    ]
    p = plan(status=RUNNING, jobs=[job(0), job(1), job(2)], pods=pods)
    assert created(p) == ["demo-r1-w1"]
    assert (p.status["restarts"], p.status["disruptionRestarts"], p.status["restartAttempt"]) == (0, 1, 1)
    assert "WorkerDisrupted" in reasons(p)
    assert "on node node-2 was evicted" in p.status["lastFailure"]["message"]
    assert "replacing worker 1 alone" in p.status["lastFailure"]["message"]


def _evicted_store() -> dict[str, Any]:
    """The store's pod after its node was lost and deleted: the pod GC failed it, DisruptionTarget."""
    out = store_pod("Failed")
    out["spec"] = dict(out["spec"], nodeName="node-9")
    out["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC", "message": "m"}
    )
    return out


def test_a_store_lost_with_its_node_restarts_the_group_once_with_a_new_store_and_no_restart_spent() -> None:
    jobs = [job(0), job(1), job(2), store_job()]
    pods = [*running(0, 1, 2), _evicted_store()]
    obs = plans.Observed.from_objects(
        trainingjob("demo", elastic_spec(), RUNNING), services=[service()], jobs=jobs, pods=pods
    )
    p = planner.plan(obs, NOW)
    assert p.status["phase"] == "Restarting"
    assert (p.status["restarts"], p.status["disruptionRestarts"]) == (0, 1)
    assert merge_patch(RUNNING, p.status)["elastic"] == {"storeGeneration": 1}, "the old record goes"
    assert (
        "the rendezvous store (pod demo-rdzv-xyz) on node node-9 was deleted by the pod garbage"
        in (p.status["message"])
    )


def test_the_new_group_starts_at_once_beside_an_old_store_stuck_on_a_lost_node_and_joins_the_new_one() -> (
    None
):
    status = dict(RUNNING, restarts=0, restartAttempt=1, disruptionRestarts=1, elastic={"storeGeneration": 1})
    stuck = store_job(deleting="2026-01-01T00:10:00Z")
    obs = plans.Observed.from_objects(
        trainingjob("demo", elastic_spec(), status), services=[service()], jobs=[stuck], pods=[store_pod()]
    )
    p = planner.plan(obs, NOW)
    assert created(p) == ["demo-rdzv-g1", "demo-r1-w0", "demo-r1-w1", "demo-r1-w2"]
    env = {e["name"]: e.get("value") for e in p.create[1]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PET_RDZV_ENDPOINT"].startswith("demo-rdzv-g1.demo.")


def test_an_earlier_generations_store_is_deleted_and_never_waited_for() -> None:
    status = dict(RUNNING, restartAttempt=1, elastic={"storeGeneration": 1})
    obs = plans.Observed.from_objects(
        trainingjob("demo", elastic_spec(), status), services=[service()], jobs=[store_job()], pods=[]
    )
    p = planner.plan(obs, NOW)
    assert "demo-rdzv" in deleted(p)
    assert created(p)[0] == "demo-rdzv-g1"


def test_a_store_that_fails_by_itself_is_a_counted_restart() -> None:
    failed_store = store_job(condition="Failed")
    p = plan(status=RUNNING, jobs=[job(0), job(1), job(2)], pods=running(0, 1, 2), store=False)
    assert p.status["disruptionRestarts"] == 1  # its Job gone: taken away
    obs = plans.Observed.from_objects(
        trainingjob("demo", elastic_spec(), RUNNING),
        services=[service()],
        jobs=[job(0), job(1), job(2), failed_store],
        pods=running(0, 1, 2),
    )
    counted = planner.plan(obs, NOW)
    assert (counted.status["restarts"], counted.status.get("disruptionRestarts")) == (1, None)
    assert "the rendezvous store ended: BackoffLimitExceeded" in counted.status["message"]
