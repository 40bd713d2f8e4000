"""A hung group is detected: with failurePolicy.progressDeadlineSeconds, a running group in which a worker
made no progress for longer (its heartbeat's stepAt) restarts, counted, naming the worker. Pure planner."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubetrain_operator import api
from kubetrain_operator.planning import builders, planner, plans
from kubetrain_operator.planning import status as st
from operator_fakes import context, job, observed, pod, running_status, trainer_spec
from pydantic import ValidationError

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, 1, 0, 0, tzinfo=UTC)
DEADLINE = 300


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def worker(index: int, *, step: int | None, idle: float | None, attempt: int = 0) -> dict[str, Any]:
    """A running worker whose container started an hour ago and whose heartbeat says it last made
    progress `idle` seconds ago at `step` (no heartbeat when idle is None)."""
    out = pod(index, attempt, phase="Running", ready=True)
    if idle is not None:
        beat = {"step": step, "stepAt": ago(idle), "updatedAt": ago(1)}
        out["metadata"].setdefault("annotations", {})["kubetrain.io/heartbeat"] = json.dumps(beat)
    return out


def deadline_spec(seconds: int | None = DEADLINE, **more: Any) -> dict[str, Any]:
    policy = {} if seconds is None else {"progressDeadlineSeconds": seconds}
    return trainer_spec(failurePolicy=policy, **more)


def _plan(spec: dict[str, Any], pods: list[dict[str, Any]], **kwargs: Any) -> plans.Plan:
    kwargs.setdefault("status", running_status())
    return planner.plan(observed(spec, jobs=[job(0), job(1)], pods=pods, **kwargs), NOW)


def test_a_worker_stalled_past_the_deadline_restarts_the_group_naming_it_and_its_last_step() -> None:
    pods = [worker(0, step=121, idle=5), worker(1, step=120, idle=DEADLINE + 12)]
    p = _plan(deadline_spec(), pods)
    assert p.status["phase"] == "Restarting"
    assert (p.status["restarts"], p.status["restartAttempt"]) == (1, 1)
    cond = st.get_condition(p.status, "Restarting")
    assert cond is not None and cond["reason"] == "ProgressStalled"
    message = p.status["message"]
    assert "1 of 2 workers made no progress for over 300 s (failurePolicy.progressDeadlineSeconds)" in message
    assert "worker 1 (pod demo-r0-w1-abcde) at step 120, 312 s ago" in message
    assert "worker 0" not in message
    assert p.status["lastFailure"]["reason"] == "ProgressStalled"
    assert p.status["lastFailure"]["worker"] == 1
    assert ("Warning", "Restarting") in [(e.type, e.reason) for e in p.events]


def test_every_stalled_worker_is_named_when_a_collective_holds_them_all() -> None:
    pods = [worker(0, step=120, idle=DEADLINE + 40), worker(1, step=120, idle=DEADLINE + 40)]
    p = _plan(deadline_spec(), pods)
    assert "2 of 2 workers" in p.status["message"]
    assert "worker 0 (pod demo-r0-w0-abcde) at step 120" in p.status["message"]
    assert "worker 1 (pod demo-r0-w1-abcde) at step 120" in p.status["message"]


def test_without_a_deadline_a_silent_group_runs_on() -> None:
    pods = [worker(0, step=120, idle=3000), worker(1, step=120, idle=3000)]
    p = _plan(deadline_spec(None), pods)
    assert p.status["phase"] == "Running"
    assert p.delete == []


def test_a_progressing_group_runs_on_and_is_looked_at_again_before_it_could_stall() -> None:
    pods = [worker(0, step=500, idle=10), worker(1, step=500, idle=100)]
    p = _plan(deadline_spec(), pods)
    assert p.status["phase"] == "Running"
    assert p.requeue_after is not None and p.requeue_after <= DEADLINE - 100 + 1


def test_a_group_not_yet_all_running_is_not_judged() -> None:
    pods = [worker(0, step=0, idle=3000), pod(1, phase="Pending", unschedulable="0/3 nodes are available")]
    p = _plan(deadline_spec(), pods, status=running_status(phase="Pending"))
    assert p.status["restarts"] == 0
    assert st.get_condition(p.status, "Restarting") is None


def test_progress_is_counted_from_when_the_last_worker_started_not_before() -> None:
    early = worker(0, step=0, idle=3000)
    late = worker(1, step=None, idle=None)
    late["status"]["containerStatuses"][0]["state"]["running"]["startedAt"] = ago(60)
    p = _plan(deadline_spec(), [early, late])
    assert p.status["phase"] == "Running", "the group has run together for 60 s only"


def test_a_worker_without_a_heartbeat_stalls_from_the_group_start() -> None:
    pods = [worker(0, step=None, idle=None), worker(1, step=None, idle=None)]
    p = _plan(deadline_spec(), pods)
    assert "before its first step" in p.status["message"]


def test_a_malformed_heartbeat_is_no_heartbeat() -> None:
    bad = worker(1, step=None, idle=None)
    bad["metadata"].setdefault("annotations", {})["kubetrain.io/heartbeat"] = "{not json"
    p = _plan(deadline_spec(), [worker(0, step=5, idle=1), bad])
    assert "worker 1 (pod demo-r0-w1-abcde) before its first step" in p.status["message"]


def test_a_stall_with_the_budget_spent_fails_the_job() -> None:
    pods = [worker(0, step=9, idle=1, attempt=3), worker(1, step=9, idle=DEADLINE + 1, attempt=3)]
    status = running_status(restartAttempt=3, restarts=3)
    p = planner.plan(observed(deadline_spec(), status=status, jobs=[job(0, 3), job(1, 3)], pods=pods), NOW)
    assert p.status["phase"] == "Failed"
    assert st.get_condition(p.status, "Failed")["reason"] == "RestartLimitExceeded"
    assert "made no progress" in p.status["message"]


@pytest.mark.parametrize(
    ("deadline", "period"), [(None, None), (20, "5"), (40, "10"), (300, "30"), (3600, "30")]
)
def test_workers_are_asked_for_a_heartbeat_only_with_a_deadline(
    deadline: int | None, period: str | None
) -> None:
    template = builders.build_worker_job(context("demo", spec=deadline_spec(deadline)), 0)["spec"]["template"]
    values = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
    assert values.get("KUBETRAIN_HEARTBEAT_SECONDS") == period


def test_a_deadline_shorter_than_four_heartbeats_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"progressDeadlineSeconds|progress_deadline_seconds"):
        api.TrainingJobSpec.model_validate(deadline_spec(10))


# ---- elastic groups: judged once every wanted member runs, restarted whole with a new store


def _elastic_plan(pods: list[dict[str, Any]], **status: Any) -> plans.Plan:
    spec = deadline_spec(workers=2, elastic={"minWorkers": 1, "maxWorkers": 2})
    record = running_status(elastic={"members": [0, 1], "worldSize": 2}, **status)
    store = elastic_store(spec)
    return planner.plan(
        observed(spec, status=record, jobs=[job(0), job(1), store[0]], pods=[*pods, store[1]]), NOW
    )


def elastic_store(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The elastic group's running rendezvous store: its Job and its pod."""
    store = builders.build_rendezvous_job(context("demo", spec=spec))
    assert store is not None
    store["metadata"].update(uid="store-uid", creationTimestamp=ago(3600))
    store["status"] = {}
    template = store["spec"]["template"]
    store_pod = {
        "metadata": {
            **template["metadata"],
            "name": f"{store['metadata']['name']}-xyz",
            "namespace": store["metadata"]["namespace"],
            "ownerReferences": [
                {"kind": "Job", "name": store["metadata"]["name"], "uid": "store-uid", "controller": True}
            ],
        },
        "spec": template["spec"],
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    return store, store_pod


def test_a_hung_elastic_group_restarts_whole_with_a_new_store_naming_the_stalled_workers() -> None:
    pods = [worker(0, step=80, idle=DEADLINE + 30), worker(1, step=80, idle=DEADLINE + 30)]
    p = _elastic_plan(pods)
    assert p.status["phase"] == "Restarting"
    assert (p.status["restarts"], p.status["restartAttempt"]) == (1, 1)
    assert p.status["elastic"]["storeGeneration"] == 1
    assert "2 of 2 workers made no progress for over 300 s" in p.status["message"]
    assert "with a new rendezvous store" in p.status["message"]
    assert p.status["lastFailure"]["reason"] == "ProgressStalled"
    deleted = sorted(d.name for d in p.delete)
    assert len(deleted) == 3 and any("rdzv" in name for name in deleted), deleted


def test_a_progressing_elastic_group_runs_on_and_is_looked_at_again_before_it_could_stall() -> None:
    p = _elastic_plan([worker(0, step=500, idle=10), worker(1, step=500, idle=100)])
    assert p.status["phase"] == "Running"
    assert p.delete == []
    assert p.requeue_after is not None and p.requeue_after <= DEADLINE - 100 + 1


def test_an_elastic_group_waiting_for_a_member_is_not_judged() -> None:
    """The survivors of a replaced worker wait in the rendezvous, making no steps, until it runs."""
    waiting = pod(1, phase="Pending", unschedulable="0/3 nodes are available")
    p = _elastic_plan([worker(0, step=80, idle=3000), waiting])
    assert p.status["restarts"] == 0
    assert st.get_condition(p.status, "Restarting") is None


def test_elastic_workers_are_asked_for_a_heartbeat_with_a_deadline() -> None:
    spec = deadline_spec(300, workers=2, elastic={"minWorkers": 1, "maxWorkers": 2})
    template = builders.build_worker_job(context("demo", spec=spec), 0)["spec"]["template"]
    values = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
    assert values.get("KUBETRAIN_HEARTBEAT_SECONDS") == "30"
