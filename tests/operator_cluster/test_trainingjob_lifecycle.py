"""TrainingJobs on a real control plane, reconciled by the operator running as a real process.

kwok plays the kubelet; pod annotations (see tests/testcluster/kwok.yaml) choose each worker's fate.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubetrain_operator.api import constants
from testcluster.cluster import Cluster
from testcluster.manifests import trainingjob
from testcluster.operator_process import CreationCounter, OperatorProcess
from testcluster.waiting import wait_for

pytestmark = pytest.mark.cluster


def _wait_for(predicate: Callable[[], Any], timeout: float, what: str, operator: OperatorProcess) -> Any:
    return wait_for(predicate, what, timeout, explain=lambda: f"operator log:\n{operator.log_tail()}")


def _apply(cluster: Cluster, namespace: str, manifest: dict) -> None:
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(manifest))


def _get(cluster: Cluster, namespace: str, *args: str) -> dict:
    return json.loads(cluster.kubectl("-n", namespace, "get", *args, "-o", "json"))


def _status(cluster: Cluster, namespace: str, name: str) -> dict:
    return _get(cluster, namespace, "trainingjob", name).get("status") or {}


def _phase_is(cluster: Cluster, namespace: str, name: str, phase: str) -> Callable[[], bool]:
    return lambda: _status(cluster, namespace, name).get("phase") == phase


def _children(cluster: Cluster, namespace: str, kind: str, name: str) -> list[dict]:
    return _get(cluster, namespace, kind, "-l", f"kubetrain.io/job-name={name}")["items"]


def _env(job: dict) -> dict[str, str]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value", "<from>") for item in container.get("env", [])}


def test_the_operator_logs_one_json_object_per_line_naming_the_trainingjob(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    """The session's operator runs with --log-format json: log pipelines get one object per line, and
    the operator's lines about a TrainingJob carry its reference like kopf's own per-object lines."""
    _apply(
        cluster, namespace, trainingjob("logged", workers=1, annotations={"sim.kubetrain.io/run-for": "1s"})
    )
    cluster.kubectl("-n", namespace, "wait", "--for=condition=Succeeded", "tj/logged", "--timeout=90s")

    def records() -> list[dict[str, Any]]:
        lines = [line for line in operator.log_tail(1_000_000).splitlines() if line.strip()]
        return [json.loads(line) for line in lines]

    def about_logged() -> list[str]:
        return [
            r["message"]
            for r in records()
            if r.get("object", {}).get("name") == "logged" and r["object"].get("namespace") == namespace
        ]

    # The line is written after the status that `kubectl wait` saw: wait for it, do not race it.
    about = _wait_for(
        lambda: [m for m in about_logged() if "Succeeded" in m],
        30,
        "the Succeeded line about logged",
        operator,
    )
    assert all({"message", "severity", "timestamp"} <= set(record) for record in records())
    assert about[0].startswith(f"{namespace}/logged: Succeeded"), about


def test_trainingjob_runs_to_success_with_service_jobs_env_and_times(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    _apply(
        cluster, namespace, trainingjob("mnist", workers=3, annotations={"sim.kubetrain.io/run-for": "3s"})
    )
    _wait_for(lambda: len(_children(cluster, namespace, "jobs", "mnist")) == 3, 60, "three Jobs", operator)

    services = _children(cluster, namespace, "services", "mnist")
    assert len(services) == 1
    assert services[0]["spec"]["clusterIP"] == "None"
    assert services[0]["spec"]["publishNotReadyAddresses"] is True
    service = services[0]["metadata"]["name"]

    jobs = sorted(_children(cluster, namespace, "jobs", "mnist"), key=lambda j: j["metadata"]["name"])
    ranks = set()
    for job in jobs:
        assert job["spec"]["backoffLimit"] == 0
        assert job["metadata"]["ownerReferences"][0]["kind"] == "TrainingJob"
        pod_spec = job["spec"]["template"]["spec"]
        assert pod_spec["subdomain"] == service
        env = _env(job)
        assert env["WORLD_SIZE"] == "3"
        assert env["PET_NNODES"] == "3"
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"]
        assert env["MASTER_ADDR"].startswith(f"{jobs[0]['spec']['template']['spec']['hostname']}.{service}.")
        assert env["KUBETRAIN_JOB_NAME"] == "mnist"
        ranks.add(env["RANK"])
    assert ranks == {"0", "1", "2"}

    cluster.kubectl("-n", namespace, "wait", "--for=condition=Succeeded", "tj/mnist", "--timeout=90s")
    status = _status(cluster, namespace, "mnist")
    assert status["phase"] == "Succeeded"
    assert status["startTime"] <= status["completionTime"]
    assert status["workers"]["succeeded"] == 3
    assert status.get("restarts", 0) == 0
    assert status["observedGeneration"] == 1

    table = cluster.kubectl("-n", namespace, "get", "trainingjobs")
    header = table.splitlines()[0].split()
    for column in ("NAME", "PHASE", "READY", "RESTARTS", "AGE"):
        assert column in header, table
    assert "Succeeded" in table.splitlines()[1]


def test_a_new_trainingjob_shows_pending_from_the_api_server_before_any_status_is_written(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    """The CRD's default status: the response to the create, a watch's event and `kubectl get` all say
    Pending while nothing has written a status. The job is one another controller manages
    (spec.managedBy), so the operator running beside it writes none."""
    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    objects = client.CustomObjectsApi(api_client)
    where = (constants.GROUP, constants.VERSION, namespace, constants.PLURAL)
    try:
        manifest = trainingjob("fresh", workers=2, managedBy="example.com/elsewhere")
        created = objects.create_namespaced_custom_object(*where, manifest)
        assert created["status"] == {"phase": "Pending"}
        events = watch.Watch().stream(objects.list_namespaced_custom_object, *where, timeout_seconds=10)
        event = next(events)
        assert event["type"] == "ADDED" and event["object"]["status"] == {"phase": "Pending"}
    finally:
        api_client.close()
    table = cluster.kubectl("-n", namespace, "get", "trainingjob", "fresh").splitlines()
    assert table[1].split()[:2] == ["fresh", "Pending"], table
    time.sleep(2)  # a pass of the operator's 2 s resync: it still writes nothing for another's job
    assert _status(cluster, namespace, "fresh") == {"phase": "Pending"}


def test_one_failed_worker_restarts_the_whole_group_exactly_once(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    counter = CreationCounter(cluster)
    counter.start()
    try:
        controls = {"sim.kubetrain.io/exit-code": "11", "sim.kubetrain.io/fail-attempt": "0"}
        manifest = trainingjob("flaky", workers=3, annotations=controls)
        manifest["spec"]["runPolicy"] = {"maxRestarts": 2}
        _apply(cluster, namespace, manifest)
        _wait_for(
            _phase_is(cluster, namespace, "flaky", "Succeeded"), 120, "Succeeded after a restart", operator
        )
    finally:
        counter.stop()
    status = _status(cluster, namespace, "flaky")
    assert status["restarts"] == 1
    jobs = [key for key in counter.created if key[0] == "Job" and key[1] == namespace]
    assert len(jobs) == 6, f"3 workers x 2 attempts, got {sorted(jobs)}"
    assert not counter.duplicates()
    remaining = _children(cluster, namespace, "jobs", "flaky")
    assert {job["metadata"]["labels"]["kubetrain.io/restart-attempt"] for job in remaining} == {"1"}
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Succeeded"]["status"] == "True"
    events = cluster.kubectl(
        "-n", namespace, "get", "events", "--field-selector", "involvedObject.name=flaky"
    )
    assert "Restart" in events, events


def test_a_worker_evicted_through_the_eviction_api_restarts_the_group_without_spending_a_restart(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    """`kubectl drain` evicts through the Eviction API: the API server marks the pod DisruptionTarget and
    deletes it, kwok stops it as a kubelet would (exit 143, Failed). With maxRestarts 0 a counted restart
    would fail the job; a disruption restarts the group from attempt 1 and the job still succeeds."""
    manifest = trainingjob("evicted", workers=2, annotations={"sim.kubetrain.io/run-for": "25s"})
    manifest["spec"]["runPolicy"] = {"maxRestarts": 0}
    _apply(cluster, namespace, manifest)

    def running_worker() -> str | None:
        pods = _get(
            cluster, namespace, "pods", "-l", "kubetrain.io/job-name=evicted,kubetrain.io/restart-attempt=0"
        )
        names = [p["metadata"]["name"] for p in pods["items"] if p["status"].get("phase") == "Running"]
        return names[0] if len(names) == 2 else None

    victim = _wait_for(running_worker, 60, "both first-attempt workers Running", operator)
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": victim, "namespace": namespace},
    }
    cluster.kubectl(
        "create",
        "--raw",
        f"/api/v1/namespaces/{namespace}/pods/{victim}/eviction",
        "-f",
        "-",
        input_text=json.dumps(eviction),
    )
    _wait_for(
        _phase_is(cluster, namespace, "evicted", "Succeeded"), 150, "Succeeded after the eviction", operator
    )
    status = _status(cluster, namespace, "evicted")
    assert (status["restarts"], status["restartAttempt"], status["disruptionRestarts"]) == (0, 1, 1), status
    events = cluster.kubectl(
        "-n", namespace, "get", "events", "--field-selector", "involvedObject.name=evicted"
    )
    assert f"{victim}) on node" in events and "was evicted through the Eviction API" in events, events
    assert "not counted against maxRestarts" in events, events


def test_failures_beyond_max_restarts_fail_naming_worker_and_exit_code(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    manifest = trainingjob("doomed", workers=2, annotations={"sim.kubetrain.io/exit-code": "11"})
    manifest["spec"]["runPolicy"] = {"maxRestarts": 1}
    _apply(cluster, namespace, manifest)
    _wait_for(_phase_is(cluster, namespace, "doomed", "Failed"), 120, "Failed", operator)
    status = _status(cluster, namespace, "doomed")
    assert status["restarts"] == 1
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True"
    assert "11" in failed["message"] and "worker" in failed["message"], failed
    assert status["completionTime"]


def test_non_retryable_exit_code_fails_at_once(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    manifest = trainingjob("badconfig", workers=2, annotations={"sim.kubetrain.io/exit-code": "2"})
    manifest["spec"]["runPolicy"] = {"maxRestarts": 3}
    _apply(cluster, namespace, manifest)
    _wait_for(_phase_is(cluster, namespace, "badconfig", "Failed"), 90, "Failed", operator)
    status = _status(cluster, namespace, "badconfig")
    assert status.get("restarts", 0) == 0
    assert "2" in status["lastFailure"]["message"] or status["lastFailure"]["exitCode"] == 2


def test_suspend_removes_workers_and_resume_recreates_them(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    _apply(
        cluster, namespace, trainingjob("queued", workers=2, annotations={"sim.kubetrain.io/hold": "true"})
    )
    _wait_for(_phase_is(cluster, namespace, "queued", "Running"), 60, "Running", operator)
    cluster.kubectl(
        "-n",
        namespace,
        "patch",
        "tj",
        "queued",
        "--type=merge",
        "-p",
        '{"spec":{"runPolicy":{"suspend":true}}}',
    )
    _wait_for(_phase_is(cluster, namespace, "queued", "Suspended"), 60, "Suspended", operator)
    _wait_for(
        lambda: not _children(cluster, namespace, "pods", "queued"), 60, "worker pods removed", operator
    )
    assert not _children(cluster, namespace, "jobs", "queued")
    cluster.kubectl(
        "-n",
        namespace,
        "patch",
        "tj",
        "queued",
        "--type=merge",
        "-p",
        '{"spec":{"runPolicy":{"suspend":false}}}',
    )
    _wait_for(_phase_is(cluster, namespace, "queued", "Running"), 60, "Running again", operator)
    assert len(_children(cluster, namespace, "jobs", "queued")) == 2


def test_deleting_a_trainingjob_cascades_to_every_child(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    _apply(cluster, namespace, trainingjob("doomed-owner", annotations={"sim.kubetrain.io/hold": "true"}))
    _wait_for(_phase_is(cluster, namespace, "doomed-owner", "Running"), 60, "Running", operator)
    cluster.kubectl("-n", namespace, "delete", "tj", "doomed-owner", "--timeout=60s")
    _wait_for(
        lambda: (
            not any(
                _children(cluster, namespace, kind, "doomed-owner") for kind in ("jobs", "services", "pods")
            )
        ),
        60,
        "the garbage collector to remove Jobs, Service and pods",
        operator,
    )


def test_a_trainingjob_deleted_and_applied_again_runs_on_its_own_children_only(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    """`kubectl delete` (background) then `kubectl apply`: the old job's children wait for the garbage
    collector under the same names. The new job claims none of them (its Created condition counts only the
    children it controls) and runs on children it controls; every deletion along the way is uid-guarded."""
    manifest = trainingjob("again", annotations={"sim.kubetrain.io/hold": "true"})
    _apply(cluster, namespace, manifest)
    _wait_for(_phase_is(cluster, namespace, "again", "Running"), 60, "Running", operator)
    cluster.kubectl("-n", namespace, "delete", "tj", "again", "--cascade=background", "--wait=false")
    _apply(cluster, namespace, manifest)
    uid = _get(cluster, namespace, "trainingjob", "again")["metadata"]["uid"]

    def runs_on_its_own_children() -> bool:
        children = [c for kind in ("jobs", "services") for c in _children(cluster, namespace, kind, "again")]
        controllers = {
            ref["uid"]
            for c in children
            for ref in c["metadata"].get("ownerReferences", [])
            if ref.get("controller")
        }
        running = _status(cluster, namespace, "again").get("phase") == "Running"
        return running and len(children) == 3 and controllers == {uid}

    _wait_for(runs_on_its_own_children, 90, "the new job Running on its own children", operator)
    created = next(c for c in _status(cluster, namespace, "again")["conditions"] if c["type"] == "Created")
    assert created["message"].startswith("created 2 worker Jobs"), created
    cluster.kubectl("-n", namespace, "delete", "tj", "again", "--wait=false")


def test_operator_killed_mid_reconcile_creates_no_duplicates_and_every_job_finishes(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    counter = CreationCounter(cluster)
    counter.start()
    names = [f"burst-{index}" for index in range(8)]
    try:
        # One request for all eight, so the first SIGKILL lands while the operator is still creating children.
        burst = [
            trainingjob(name, workers=3, annotations={"sim.kubetrain.io/run-for": "2s"}) for name in names
        ]
        _apply(cluster, namespace, {"apiVersion": "v1", "kind": "List", "items": burst})
        for kill_after in (0.3, 1.0, 0.6):
            time.sleep(kill_after)
            operator.kill()
            operator.start()
        for name in names:
            _wait_for(_phase_is(cluster, namespace, name, "Succeeded"), 180, f"{name} Succeeded", operator)
    finally:
        counter.stop()
        if not operator.running:
            operator.start()
    assert not counter.duplicates()
    jobs = [key for key in counter.created if key[0] == "Job" and key[1] == namespace]
    services = [key for key in counter.created if key[0] == "Service" and key[1] == namespace]
    assert len(jobs) == 3 * len(names)
    assert len(services) == len(names)
