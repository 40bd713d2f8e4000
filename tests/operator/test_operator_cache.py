"""The operator's cache: what it keeps of each object, which copy wins, where children are filed."""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

import pytest
from kubetrain_operator.api import constants
from kubetrain_operator.runtime import events
from kubetrain_operator.runtime.cache import ClusterCache, slim
from kubetrain_operator.runtime.controller import needs_workers
from operator_fakes import NS, job, pod, service, trainingjob

pytestmark = pytest.mark.unit


def _versioned(obj: dict[str, Any], version: int, uid: str | None = None) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = str(version)
    if uid:
        out["metadata"]["uid"] = uid
    return out


def test_a_pod_is_kept_without_managed_fields_or_its_spec_but_with_what_the_planner_reads() -> None:
    full = pod(0, phase="Running", ready=True, progress={"epoch": 1})
    full["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    full["spec"]["nodeName"] = "node-1"
    kept = slim(full)
    assert "managedFields" not in kept["metadata"]
    assert kept["spec"] == {"nodeName": "node-1"}
    assert kept["status"] == full["status"]
    assert kept["metadata"]["annotations"]["kubetrain.io/progress"]
    assert "managedFields" in full["metadata"]  # the original is untouched


def test_a_trainingjob_is_kept_without_kubectls_copy_of_itself() -> None:
    body = trainingjob()
    body["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{...}", "a": "b"}
    kept = slim(body)
    assert kept["metadata"]["annotations"] == {"a": "b"}
    assert kept["spec"] == body["spec"]


def test_a_trainingjob_status_that_is_only_the_schemas_default_is_kept_as_never_written() -> None:
    """The API server shows a new job's status as Pending (the CRD's default) before the operator writes
    one: the planner must still see a job whose first status is to be written, and so must needs_workers."""
    fresh, ours = trainingjob(status={"phase": "Pending"}), trainingjob(status={"phase": "Pending", "x": 1})
    assert "status" not in slim(fresh)
    assert slim(ours)["status"] == {"phase": "Pending", "x": 1}
    cache = ClusterCache()
    key = cache.observe(fresh)
    assert key is not None and needs_workers(cache.trainingjob(*key) or {})


def test_children_are_filed_under_their_trainingjob_by_owner() -> None:
    cache = ClusterCache()
    long_name = "x" * 100  # pods name their TrainingJob in an annotation: labels stop at 63 characters
    worker = pod(0, name=long_name)
    worker["metadata"]["uid"] = "pod-uid"
    assert cache.observe(worker) == (NS, long_name)
    assert cache.observe(_versioned(job(0), 1)) == (NS, "demo")
    assert cache.observe(service()) == (NS, "demo")
    assert [p["metadata"]["uid"] for p in cache.children(NS, long_name, "Pod")] == ["pod-uid"]
    assert len(cache.children(NS, "demo", "Job")) == 1
    assert len(cache.children(NS, "demo", "Service")) == 1
    assert cache.children(NS, "other", "Job") == []


def test_an_older_copy_never_replaces_a_newer_one() -> None:
    """Our own write's answer may be newer than a watch event still on its way."""
    cache = ClusterCache()
    cache.observe(_versioned(trainingjob(status={"phase": "Running"}), 20))
    cache.observe(_versioned(trainingjob(status={"phase": "Pending"}), 10))
    assert cache.trainingjob(NS, "demo")["status"]["phase"] == "Running"
    cache.observe(_versioned(job(0, condition="Complete"), 30))
    cache.observe(_versioned(job(0), 25))
    assert cache.children(NS, "demo", "Job")[0]["status"]["conditions"][0]["type"] == "Complete"


def test_a_new_trainingjob_with_an_old_name_replaces_the_deleted_one() -> None:
    cache = ClusterCache()
    cache.observe(_versioned(trainingjob(), 50, uid="old"))
    cache.observe(_versioned(trainingjob(), 40, uid="new"))  # versions of different objects: no contest
    assert cache.trainingjob(NS, "demo")["metadata"]["uid"] == "new"
    cache.forget(_versioned(trainingjob(), 51, uid="old"))  # a late deletion of the old one
    assert cache.trainingjob(NS, "demo")["metadata"]["uid"] == "new"
    cache.forget(_versioned(trainingjob(), 60, uid="new"))
    assert cache.trainingjob(NS, "demo") is None


def test_deleted_children_are_dropped() -> None:
    cache = ClusterCache()
    cache.observe(_versioned(job(0), 1))
    cache.observe(_versioned(job(1), 2))
    assert cache.forget(_versioned(job(0), 3)) == (NS, "demo")
    assert [j["metadata"]["name"] for j in cache.children(NS, "demo", "Job")] == ["demo-r0-w1"]
    assert cache.forget(_versioned(job(0), 3)) is None  # already gone


def test_a_disrupted_pod_deleted_while_its_job_stays_is_kept_until_the_job_goes() -> None:
    """The Job controller deletes an evicted pod once it has failed the Job; the DELETED event's copy is
    the only record of who took it."""
    cache = ClusterCache()
    cache.observe(_versioned(job(1), 1))
    evicted = _versioned(pod(1, phase="Failed", exit_code=130, disruption="EvictionByEvictionAPI"), 2, "p1")
    cache.observe(evicted)
    assert cache.forget(_versioned(evicted, 3)) == (NS, "demo")
    assert cache.children(NS, "demo", "Pod") == []
    departed = cache.departed_pods(NS, "demo")
    assert list(departed) == ["job-0-1"]
    assert departed["job-0-1"]["status"]["conditions"][-1]["reason"] == "EvictionByEvictionAPI"
    cache.forget(_versioned(job(1), 4))
    assert cache.departed_pods(NS, "demo") == {}


@pytest.mark.parametrize(
    "deleted",
    [
        pytest.param(pod(1, phase="Failed", exit_code=1), id="a-pod-nobody-took-away"),
        pytest.param(
            pod(1, phase="Failed", disruption="DeletionByPodGC", attempt=1), id="a-pod-whose-job-went-first"
        ),
    ],
)
def test_no_last_state_is_kept_that_nothing_would_ask_for_or_drop(deleted: dict[str, Any]) -> None:
    cache = ClusterCache()
    cache.observe(_versioned(job(1), 1))  # attempt 0's Job: the attempt-1 pod's Job is not cached
    cache.observe(_versioned(deleted, 2, "p1"))
    cache.forget(_versioned(deleted, 3, "p1"))
    assert cache.departed_pods(NS, "demo") == {}


def test_objects_of_no_trainingjob_are_ignored() -> None:
    cache = ClusterCache()
    stray = {"kind": "Pod", "metadata": {"name": "p", "namespace": NS, "uid": "u"}}
    assert cache.observe(stray) is None
    assert cache.children(NS, "p", "Pod") == []


@pytest.mark.parametrize(
    ("status", "generation", "urgent"),
    [
        ({}, 1, True),
        ({"phase": "Running", "observedGeneration": 1}, 1, False),
        ({"phase": "Running", "observedGeneration": 1}, 2, True),
    ],
)
def test_new_and_changed_trainingjobs_are_urgent(
    status: dict[str, Any], generation: int, urgent: bool
) -> None:
    body = trainingjob(status=status)
    body["metadata"]["generation"] = generation
    assert needs_workers(body) is urgent


def test_events_are_posted_in_order_in_the_background_and_a_refused_one_does_not_stop_the_rest() -> None:
    posted: list[str] = []
    slow = threading.Event()

    def create(event: dict[str, Any]) -> None:
        slow.wait(5)
        if event["reason"] == "Refused":
            raise RuntimeError("403")
        posted.append(event["reason"])

    poster = events.EventPoster(create)
    for reason in ("CreatedWorkers", "Refused", "Running"):
        poster.post(
            events.build_event(
                NS,
                "demo",
                uid="u",
                type_="Normal",
                reason=reason,
                message="m",
                timestamp="2026-01-01T00:00:00Z",
            )
        )
    assert posted == []  # post() returned before any request
    slow.set()
    assert poster.flush()
    assert posted == ["CreatedWorkers", "Running"]
    poster.stop()


def test_an_event_names_its_trainingjob() -> None:
    event = events.build_event(
        NS, "demo", uid="u-1", type_="Warning", reason="R", message="x" * 2000, timestamp="t"
    )
    assert event["involvedObject"] == {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "name": "demo",
        "namespace": NS,
        "uid": "u-1",
    }
    assert len(event["message"]) == 1024


def _pages(*objects: dict[str, Any], snapshot: int) -> list[tuple[list[dict[str, Any]], str]]:
    """A listing in pages of two, as the API server would send it."""
    items = [copy.deepcopy(o) for o in objects]
    return [(items[i : i + 2], str(snapshot)) for i in range(0, max(len(items), 1), 2)]


def test_a_sweep_drops_what_was_deleted_while_the_watch_was_broken() -> None:
    cache = ClusterCache()
    for index, version in ((0, 10), (1, 11), (2, 12)):
        cache.observe(_versioned(job(index), version))
    touched = cache.sweep(
        "Job", _pages(_versioned(job(0), 10), _versioned(job(2), 12), snapshot=20), lambda ns: True
    )
    assert touched == {(NS, "demo")}
    assert sorted(j["metadata"]["name"] for j in cache.children(NS, "demo", "Job")) == [
        "demo-r0-w0",
        "demo-r0-w2",
    ]


def test_a_sweep_keeps_what_is_newer_than_its_listing_and_adds_what_the_watch_missed() -> None:
    cache = ClusterCache()
    cache.observe(_versioned(job(0), 30))  # created after the snapshot was taken
    missed = _versioned(job(1), 15)
    touched = cache.sweep("Job", _pages(missed, snapshot=20), lambda ns: True)
    assert touched == {(NS, "demo")}
    assert len(cache.children(NS, "demo", "Job")) == 2


def test_a_sweep_takes_in_what_changed_while_the_watch_was_broken_and_ignores_what_did_not() -> None:
    cache = ClusterCache()
    cache.observe(_versioned(job(0), 10))
    cache.observe(_versioned(job(1), 11))
    finished = _versioned(job(0), 18)
    finished["status"] = {"succeeded": 1}
    touched = cache.sweep("Job", _pages(finished, _versioned(job(1), 11), snapshot=20), lambda ns: True)
    assert touched == {(NS, "demo")}
    held = {j["metadata"]["name"]: j for j in cache.children(NS, "demo", "Job")}
    assert held["demo-r0-w0"]["status"] == {"succeeded": 1}
    assert cache.sweep("Job", _pages(finished, _versioned(job(1), 11), snapshot=21), lambda ns: True) == set()


def test_a_sweep_of_one_namespace_leaves_the_others_alone() -> None:
    cache = ClusterCache()
    elsewhere = _versioned(job(0), 5)
    elsewhere["metadata"]["namespace"] = "team-b"
    cache.observe(elsewhere)
    assert cache.sweep("Job", _pages(snapshot=20), lambda ns: ns == NS) == set()
    assert len(cache.children("team-b", "demo", "Job")) == 1


def test_a_sweep_forgets_a_deleted_trainingjob() -> None:
    cache = ClusterCache()
    cache.observe(_versioned(trainingjob(), 5))
    assert cache.sweep(constants.KIND, _pages(snapshot=20), lambda ns: True) == {(NS, "demo")}
    assert cache.trainingjob(NS, "demo") is None


def test_events_wait_while_the_controller_is_busy_with_new_jobs() -> None:
    posted: list[str] = []
    busy = threading.Event()
    busy.set()
    poster = events.EventPoster(lambda event: posted.append(event["reason"]), busy=busy.is_set)
    poster.post(
        events.build_event(NS, "demo", uid=None, type_="Normal", reason="R", message="m", timestamp="t")
    )
    assert not poster.flush(timeout=0.5)  # held back
    assert posted == []
    busy.clear()
    assert poster.flush()
    assert posted == ["R"]
    poster.stop()


def _flavor(name: str, version: int, uid: str = "f-uid") -> dict[str, Any]:
    return {
        "apiVersion": constants.KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": {"name": name, "uid": uid, "resourceVersion": str(version)},
        "spec": {"nodeLabels": {"pool": name}},
    }


def test_resource_flavors_are_kept_by_name_for_every_trainingjob_and_wake_none() -> None:
    cache = ClusterCache()
    assert cache.observe(_flavor("a", 5)) is None
    assert cache.observe(_flavor("a", 4)) is None  # older: ignored
    assert cache.cluster_objects("ResourceFlavor")["a"]["metadata"]["resourceVersion"] == "5"
    cache.forget(_flavor("a", 6))
    assert cache.cluster_objects("ResourceFlavor") == {}


def test_a_flavor_deleted_while_the_watch_was_broken_is_dropped_by_the_next_listing() -> None:
    cache = ClusterCache()
    cache.observe(_flavor("gone", 5, uid="g"))
    cache.sweep("ResourceFlavor", [([_flavor("kept", 7, uid="k")], "9")], lambda namespace: True)
    assert sorted(cache.cluster_objects("ResourceFlavor")) == ["kept"]


def test_a_workload_is_filed_under_its_trainingjob_with_only_what_the_planner_reads() -> None:
    workload = {
        "apiVersion": constants.KUEUE_API,
        "kind": "Workload",
        "metadata": {
            "name": "demo",
            "namespace": NS,
            "uid": "wl",
            "resourceVersion": "3",
            "ownerReferences": [
                {"apiVersion": constants.API_VERSION, "kind": constants.KIND, "name": "demo"}
            ],
        },
        "spec": {
            "queueName": "team",
            "active": True,
            "podSets": [{"name": "workers", "count": 4, "template": {"spec": {"containers": []}}}],
        },
        "status": {"conditions": []},
    }
    cache = ClusterCache()
    assert cache.observe(workload) == (NS, "demo")
    [kept] = cache.children(NS, "demo", "Workload")
    assert kept["spec"] == {"queueName": "team", "active": True, "podSets": [{"name": "workers", "count": 4}]}
    assert kept["status"] == {"conditions": []}


def test_events_held_while_the_controller_stays_busy_go_out_together_once_they_are_old() -> None:
    """Under steady churn the controller is nearly always busy: a held event must not hold back the ones
    behind it for a hold of their own, or the queue grows without end."""
    posted: list[str] = []
    now = [0.0]
    poster = events.EventPoster(
        lambda event: posted.append(event["reason"]), busy=lambda: True, clock=lambda: now[0]
    )
    for reason in ("A", "B", "C"):
        poster.post(
            events.build_event(
                NS, "demo", uid=None, type_="Normal", reason=reason, message="m", timestamp="t"
            )
        )
    assert not poster.flush(timeout=0.5)  # held back: young, and the controller busy
    now[0] = events.HOLD_LIMIT
    assert poster.flush()
    assert posted == ["A", "B", "C"]
    poster.stop()


def test_a_full_event_queue_drops_new_events_counts_them_and_warns_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Memory stays bounded when the API server is slower than events arrive."""
    release, taken = threading.Event(), threading.Event()
    posted: list[str] = []
    now = [0.0]

    def create(event: dict[str, Any]) -> None:
        taken.set()
        release.wait(5)
        posted.append(event["reason"])

    poster = events.EventPoster(create, clock=lambda: now[0], limit=2)

    def post(reason: str) -> None:
        poster.post(
            events.build_event(
                NS, "demo", uid=None, type_="Normal", reason=reason, message="m", timestamp="t"
            )
        )

    post("taken")
    assert taken.wait(5)  # the poster holds it in create: the queue is empty again
    with caplog.at_level(logging.WARNING, logger="kubetrain.operator"):
        for reason in ("q1", "q2", "d1", "d2"):
            post(reason)
        now[0] = events.DROP_REPORT_INTERVAL
        post("d3")
    assert poster.dropped == 3
    warnings = [r.getMessage() for r in caplog.records if "event queue full" in r.getMessage()]
    assert len(warnings) == 2 and "3 dropped so far" in warnings[1], warnings
    release.set()
    assert poster.flush()
    assert posted == ["taken", "q1", "q2"]
    poster.stop()


def test_a_workload_of_another_api_group_is_not_taken_for_kueues() -> None:
    """scheduling.k8s.io has a Workload too (the gang of provider kubernetes): not one the cache files."""
    gang = {
        "apiVersion": "scheduling.k8s.io/v1alpha1",
        "kind": "Workload",
        "metadata": {
            "name": "demo",
            "namespace": NS,
            "uid": "gang",
            "ownerReferences": [
                {"apiVersion": constants.API_VERSION, "kind": constants.KIND, "name": "demo"}
            ],
        },
    }
    cache = ClusterCache()
    assert cache.observe(gang) is None
    assert cache.children(NS, "demo", "Workload") == []
    assert cache.forget(gang) is None
