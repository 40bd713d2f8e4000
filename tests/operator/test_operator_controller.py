"""The controller against an in-memory API whose watch feeds a real ClusterCache: plan execution order,
idempotency, stale reads, conflicts, coalescing and the work queue."""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from kubetrain_operator import api
from kubetrain_operator.api import constants
from kubetrain_operator.planning import admission, builders, plans
from kubetrain_operator.planning import status as st
from kubetrain_operator.runtime import informer, kube, workeridentity, workqueue
from kubetrain_operator.runtime.cache import ClusterCache, owner_name
from kubetrain_operator.runtime.controller import Controller
from kubetrain_operator.runtime.metrics import Metrics
from kubetrain_trainer import contract
from operator_fakes import NS, job, pod, trainer_spec, trainingjob

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, 1, 0, 0, tzinfo=UTC)


class FakeKube:
    """Stores objects by (kind, namespace, name); counts creations; can inject errors. Its "watch" hands
    every change to `cache` at once, unless `watch_paused` (then the cache only learns what the
    controller's own writes return, as when watch events are late)."""

    def __init__(self) -> None:
        self.cache = ClusterCache()
        self.watch_paused = False
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.creations: list[tuple[str, str]] = []
        self.events: list[dict[str, Any]] = []
        self.calls: list[str] = []
        self.fail_create: dict[str, kube.ApiError] = {}
        self.fail_patch: list[kube.ApiError] = []
        self.rv = 100
        self.gc_paused = False
        """When set, pods outlive their Job's deletion until `collect_garbage` (their grace period)."""

    def put(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.objects[(obj["kind"], meta.get("namespace", NS), meta["name"])] = obj
        self._watch(obj)

    def _watch(self, obj: dict[str, Any], deleted: bool = False) -> None:
        if not self.watch_paused:
            snapshot = copy.deepcopy(obj)
            self.cache.forget(snapshot) if deleted else self.cache.observe(snapshot)

    def get(
        self, kind: str, namespace: str, name: str, api_version: str | None = None
    ) -> dict[str, Any] | None:
        self.calls.append(f"get {kind} {name}")
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if manifest["kind"] == "Event":
            self.events.append(manifest)
            return manifest
        name = manifest["metadata"]["name"]
        self.calls.append(f"create {manifest['kind']} {name}")
        if name in self.fail_create:
            raise self.fail_create[name]
        key = (manifest["kind"], manifest["metadata"]["namespace"], name)
        if key in self.objects:
            raise kube.ApiError(409, "AlreadyExists", f"{name} exists")
        obj = copy.deepcopy(manifest)
        obj["metadata"]["uid"] = f"uid-{name}"
        obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
        obj.setdefault("status", {})
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.put(obj)
        self.creations.append((manifest["kind"], name))
        return copy.deepcopy(obj)

    def request(self, method: str, url: str, **_: Any) -> dict[str, Any]:
        """Reads by path: only the chart's worker ClusterRole exists here (cluster-scoped)."""
        self.calls.append(f"{method} {url}")
        if method == "GET" and url == "/apis/rbac.authorization.k8s.io/v1/clusterroles/kubetrain-worker":
            return {"metadata": {"name": "kubetrain-worker", "uid": "worker-role-uid"}}
        raise kube.ApiError(404, "NotFound", f"{url} not found")

    def list_pages(
        self, kind: str, namespace: str | None, label_selector: str | None = None, limit: int = 500
    ) -> list[tuple[list[dict[str, Any]], str]]:
        items = [
            copy.deepcopy(o)
            for (k, ns, _), o in self.objects.items()
            if k == kind
            and namespace in (None, ns)
            and (label_selector is None or label_selector in o["metadata"].get("labels", {}))
        ]
        return [(items, str(self.rv))]

    def delete(
        self,
        kind: str,
        namespace: str,
        name: str,
        propagation: str = "Background",
        uid: str | None = None,
        *,
        api_version: str | None = None,
    ) -> None:
        """Like `kube.Kube.delete`: gone or replaced by a namesake (uid precondition) is success. The
        garbage collector is modelled: Background removes the object now and its pods with it, or, while
        `gc_paused`, at `collect_garbage`; Foreground then keeps the Job (deletionTimestamp set) until
        its pods are gone."""
        self.calls.append(f"delete {kind} {name} {propagation}")
        obj = self.objects.get((kind, namespace, name))
        if obj is None or (uid is not None and obj["metadata"].get("uid") != uid):
            return
        if kind == "Job" and self.gc_paused and propagation == "Foreground" and self._pods_of(obj):
            obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:59:59Z"
            self._bump(obj)
            return
        del self.objects[(kind, namespace, name)]
        self._watch(obj, deleted=True)
        if kind == "Job" and not self.gc_paused:
            self.collect_garbage()

    def _pods_of(self, job: dict[str, Any]) -> list[tuple[str, str, str]]:
        uid = job["metadata"].get("uid")
        return [
            key
            for key, o in self.objects.items()
            if key[0] == "Pod"
            and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or ())
        ]

    def collect_garbage(self) -> None:
        """Remove the pods of deleted or deleting Jobs, then the Jobs deleted in the foreground."""
        live = {o["metadata"]["uid"] for k, o in self.objects.items() if k[0] == "Job"}
        deleting = {o["metadata"]["uid"] for k, o in self.objects.items() if k[0] == "Job" and _deleting(o)}
        for key, obj in list(self.objects.items()):
            owners = {r.get("uid") for r in obj["metadata"].get("ownerReferences") or ()}
            if key[0] == "Pod" and (not owners & live or owners & deleting):
                self._watch(self.objects.pop(key), deleted=True)
        for key, obj in list(self.objects.items()):
            if key[0] == "Job" and _deleting(obj):
                self._watch(self.objects.pop(key), deleted=True)

    def _bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._watch(obj)

    def edit_spec(self, name: str = "demo", **changes: Any) -> None:
        """A user's edit of the TrainingJob's spec: a new generation and resourceVersion."""
        obj = self.objects[(constants.KIND, NS, name)]
        obj["spec"] = {**obj["spec"], **changes}
        obj["metadata"]["generation"] += 1
        self._bump(obj)

    def patch_status(
        self, namespace: str, name: str, status: dict[str, Any], rv: str | None
    ) -> dict[str, Any]:
        self.calls.append("patch status")
        if self.fail_patch:
            raise self.fail_patch.pop(0)
        obj = self.objects.get((constants.KIND, namespace, name))
        if obj is None:
            raise kube.ApiError(404, "NotFound", f"{name} not found")
        if rv is not None and rv != obj["metadata"]["resourceVersion"]:
            raise kube.ApiError(409, "Conflict", "the object has been modified")
        merged = dict(obj.get("status") or {})
        for key, value in status.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        obj["status"] = merged
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._watch(obj)
        return copy.deepcopy(obj)

    def apply_status(
        self, kind: str, namespace: str, name: str, api_version: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        """Server-side apply of status conditions: entries merged by type, the others kept."""
        self.calls.append(f"apply {kind} status")
        obj = self.objects[(kind, namespace, name)]
        conditions = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or ()}
        conditions.update({c["type"]: c for c in status.get("conditions") or ()})
        obj["status"] = {**(obj.get("status") or {}), "conditions": list(conditions.values())}
        self._bump(obj)
        return copy.deepcopy(obj)

    def patch(
        self,
        kind: str,
        namespace: str,
        name: str,
        body: dict[str, Any],
        *,
        subresource: str | None = None,
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        """A merge patch one level deep (spec or status keys), as the operator writes Workloads."""
        self.calls.append(f"patch {kind} {subresource or 'spec'}")
        obj = self.objects[(kind, namespace, name)]
        if resource_version is not None and resource_version != obj["metadata"]["resourceVersion"]:
            raise kube.ApiError(409, "Conflict", "the object has been modified")
        for part, values in body.items():
            obj[part] = {**(obj.get(part) or {}), **values}
        self._bump(obj)
        return copy.deepcopy(obj)

    # --- a tiny Job controller + kubelet

    def run_pods(self, phase: str = "Running", exit_codes: dict[int, int] | None = None) -> None:
        """Give every existing worker Job a pod in `phase` (Failed pods get exit_codes[index])."""
        for (kind, _ns, name), obj in list(self.objects.items()):
            if kind != "Job":
                continue
            labels = obj["metadata"]["labels"]
            attempt, index = (
                int(labels[constants.LABEL_RESTART_ATTEMPT]),
                int(labels[constants.LABEL_WORKER_INDEX]),
            )
            code = (exit_codes or {}).get(index)
            this_phase = "Failed" if code else phase
            p = pod(index, attempt, phase=this_phase, exit_code=code, ready=this_phase == "Running")
            p["metadata"]["name"] = f"{name}-abcde"
            p["metadata"]["ownerReferences"][0]["uid"] = obj["metadata"]["uid"]
            p["metadata"]["uid"] = f"pod-{name}"
            self.rv += 1
            p["metadata"]["resourceVersion"] = str(self.rv)
            self.put(p)

    def status(self, name: str = "demo") -> dict[str, Any]:
        return self.objects[(constants.KIND, NS, name)]["status"]


def _deleting(obj: dict[str, Any]) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def _controller(fake: FakeKube, workers: int = 2, waits: st.WriteWaits = st.WRITE_AT_ONCE) -> Controller:
    """A controller that writes every status change when it is planned, unless `waits` say otherwise."""
    return Controller(
        fake,  # type: ignore[arg-type]
        fake.cache,
        defaults=plans.Defaults(image="img:test"),
        metrics=Metrics.create(),
        clock=lambda: NOW,
        workers=workers,
        status_waits=waits,
    )


class Ticks:
    """A monotonic clock that moves only when a test says so (the clock of held status writes)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


WAITS = st.WriteWaits(start=5.0, details=30.0)


def _holding_controller(fake: FakeKube) -> tuple[Controller, Ticks]:
    """A controller whose status writes wait as WAITS say, on a clock the test moves."""
    ctl = _controller(fake, waits=WAITS)
    ticks = Ticks()
    ctl.monotonic = ticks
    return ctl, ticks


def _fake_with_job(spec: dict[str, Any] | None = None) -> FakeKube:
    fake = FakeKube()
    fake.put(trainingjob(spec=spec))
    return fake


def test_a_new_job_gets_its_children_first_then_its_status() -> None:
    fake = _fake_with_job()
    outcome = _controller(fake).reconcile(NS, "demo")
    assert outcome.plan is not None
    assert fake.calls[-1] == "patch status" and fake.calls.count("patch status") == 1
    assert sorted(fake.creations) == [("Job", "demo-r0-w0"), ("Job", "demo-r0-w1"), ("Service", "demo")]
    assert fake.status()["phase"] == "Pending"
    assert fake.events == []  # the Created condition says it


def test_a_restart_decision_is_durable_before_the_old_workers_are_deleted() -> None:
    fake = _fake_with_job()
    ctl = _controller(fake)
    ctl.reconcile(NS, "demo")
    fake.run_pods("Running", exit_codes={1: 11})
    fake.calls.clear()
    ctl.reconcile(NS, "demo")
    assert fake.calls[0] == "patch status"
    assert fake.status()["restartAttempt"] == 1
    assert [c for c in fake.calls[1:] if not c.startswith("delete Job demo-r0-")] == []


def test_an_evicted_pod_deleted_before_the_reconcile_still_names_the_eviction() -> None:
    """The Job controller fails the Job by its podFailurePolicy and deletes the evicted pod at once; the
    reconcile after it reads the pod's last state from the watch's DELETED event, kept by the cache."""
    fake = _fake_with_job()
    ctl = _controller(fake)
    ctl.reconcile(NS, "demo")
    fake.run_pods("Running")
    ctl.reconcile(NS, "demo")
    evicted = fake.objects[("Pod", NS, "demo-r0-w1-abcde")]
    evicted["status"] = pod(1, phase="Failed", exit_code=130, disruption="EvictionByEvictionAPI")["status"]
    fake._bump(evicted)
    verdict = "Pod ns/demo-r0-w1-abcde has condition DisruptionTarget matching FailJob rule at index 0"
    worker_job = fake.objects[("Job", NS, "demo-r0-w1")]
    worker_job["status"] = job(1, condition="FailureTarget", reason="PodFailurePolicy", message=verdict)[
        "status"
    ]
    fake._bump(worker_job)
    fake._watch(fake.objects.pop(("Pod", NS, "demo-r0-w1-abcde")), deleted=True)
    ctl.reconcile(NS, "demo")
    failure = fake.status()["lastFailure"]
    assert (failure["disruption"], failure["pod"], failure["exitCode"]) == (
        "EvictionByEvictionAPI",
        "demo-r0-w1-abcde",
        130,
    )
    assert (fake.status()["restarts"], fake.status()["disruptionRestarts"]) == (0, 1)


def test_a_reconcile_on_a_late_cache_repeats_no_creation() -> None:
    """The watch events of the children just created have not arrived yet: the controller's own
    record of what it created keeps the next reconcile from asking again."""
    fake = _fake_with_job()
    fake.watch_paused = True
    ctl = _controller(fake)
    ctl.reconcile(NS, "demo")
    calls = len(fake.calls)
    ctl.reconcile(NS, "demo")
    assert [c for c in fake.calls[calls:] if c.startswith("create")] == []
    assert len(fake.creations) == 3


def test_a_decision_from_a_stale_trainingjob_is_refused_and_planned_again() -> None:
    fake = _fake_with_job()
    ctl = _controller(fake)
    ctl.reconcile(NS, "demo")
    fake.run_pods("Running", exit_codes={1: 11})
    fake.watch_paused = True  # someone else wrote the TrainingJob; our cache has not seen it
    fake.objects[(constants.KIND, NS, "demo")]["metadata"]["resourceVersion"] = "999"
    fake.calls.clear()
    outcome = ctl.reconcile(NS, "demo")
    assert fake.calls == ["patch status"]  # refused (409): no deletion on a decision from an old read
    assert outcome.plan is not None and outcome.plan.requeue_after == 0.2
    fake.watch_paused = False
    fake.put(fake.objects[(constants.KIND, NS, "demo")])  # the watch event arrives
    ctl.reconcile(NS, "demo")
    assert fake.status()["restarts"] == 1


def test_a_job_created_before_a_crash_still_gets_its_created_condition() -> None:
    fake = _fake_with_job()
    ctl = _controller(fake)
    fake.fail_patch.append(kube.ApiError(500, "InternalError", "the operator died here"))
    with pytest.raises(kube.ApiError):
        ctl.reconcile(NS, "demo")
    assert len(fake.creations) == 3 and fake.status() == {}
    ctl.reconcile(NS, "demo")  # the restarted operator
    created = next(c for c in fake.status()["conditions"] if c["type"] == "Created")
    assert created["status"] == "True" and fake.status()["startTime"]
    assert len(fake.creations) == 3


def test_a_whole_lifecycle_with_one_restart_never_duplicates_a_child() -> None:
    fake = _fake_with_job()
    ctl = _controller(fake)
    for _ in range(3):
        ctl.reconcile(NS, "demo")
    fake.run_pods("Running")
    ctl.reconcile(NS, "demo")
    assert fake.status()["phase"] == "Running"

    fake.run_pods("Running", exit_codes={1: 11})
    ctl.reconcile(NS, "demo")
    assert fake.status()["phase"] == "Restarting"
    assert fake.status()["restarts"] == 1
    for _ in range(3):
        ctl.reconcile(NS, "demo")
    fake.run_pods("Running")
    ctl.reconcile(NS, "demo")
    assert fake.status()["phase"] == "Running"
    fake.run_pods("Succeeded")
    ctl.reconcile(NS, "demo")
    ctl.reconcile(NS, "demo")
    status = fake.status()
    assert status["phase"] == "Succeeded"
    assert status["restartAttempt"] == 1
    assert status["completionTime"]
    assert len(fake.creations) == len(set(fake.creations)) == 5
    reasons = [e["reason"] for e in fake.events]
    assert reasons == ["Restarting", "Succeeded"]  # starts are told by conditions, not events
    assert ctl.metrics.restarted.labels(namespace=NS)._value.get() == 1
    assert ctl.metrics.succeeded.labels(namespace=NS)._value.get() == 1


def test_children_this_trainingjob_created_before_are_recognised_when_they_already_exist() -> None:
    """An earlier reconcile created them but the cache never saw them (killed before the watch caught
    up): a 409 on a child this TrainingJob controls is success."""
    fake = _fake_with_job()
    _controller(fake).reconcile(NS, "demo")
    fake.creations.clear()
    fake.cache = ClusterCache()  # a restarted operator whose cache has not seen the children yet
    fake.cache.observe(fake.objects[(constants.KIND, NS, "demo")])
    _controller(fake).reconcile(NS, "demo")
    assert fake.creations == []
    assert fake.status()["phase"] == "Pending" and fake.status().get("pendingReason") != "FailedCreate"


def _namesake_children(fake: FakeKube) -> None:
    """A TrainingJob `demo` deleted (background) and applied again: its children await collection."""
    old = FakeKube()
    old.objects[(constants.KIND, NS, "demo")] = trainingjob()
    old.objects[(constants.KIND, NS, "demo")]["metadata"]["uid"] = "uid-of-the-deleted-namesake"
    old.cache.observe(old.objects[(constants.KIND, NS, "demo")])
    _controller(old).reconcile(NS, "demo")
    for (kind, _ns, _name), obj in old.objects.items():
        if kind != constants.KIND:
            fake.put(obj)


def test_after_delete_and_apply_the_new_trainingjob_waits_for_its_namesakes_children() -> None:
    fake = _fake_with_job()
    _namesake_children(fake)
    ctl = _controller(fake)
    ctl.reconcile(NS, "demo")
    assert fake.creations == []
    assert fake.status()["pendingReason"] == "WaitingForOldWorkers"
    for key in [k for k in fake.objects if k[0] != constants.KIND]:  # the garbage collector
        fake._watch(fake.objects.pop(key), deleted=True)
    ctl.reconcile(NS, "demo")
    assert sorted(fake.creations) == [("Job", "demo-r0-w0"), ("Job", "demo-r0-w1"), ("Service", "demo")]


def test_a_child_name_held_by_an_object_this_trainingjob_does_not_control_is_reported_not_claimed() -> None:
    fake = _fake_with_job()
    fake.watch_paused = True  # an unrelated Job the operator does not watch
    fake.put({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "demo-r0-w1", "namespace": NS}})
    fake.watch_paused = False
    ctl = _controller(fake)
    assert ctl.trigger(NS, "demo") is None  # retried with backoff
    assert fake.status()["pendingReason"] == "FailedCreate"
    assert "Job demo-r0-w1 already exists" in fake.status()["pendingMessage"]
    assert not any(c["type"] == "Created" for c in fake.status().get("conditions") or ())


def test_a_ttl_deletion_planned_from_a_stale_read_never_deletes_a_namesake() -> None:
    fake = FakeKube()
    finished = {"phase": "Succeeded", "completionTime": "2026-01-01T00:00:00Z"}
    fake.put(trainingjob(spec={"trainer": {}, "runPolicy": {"ttlSecondsAfterFinished": 0}}, status=finished))
    fake.watch_paused = True  # deleted and applied again; the operator's cache still holds the old one
    namesake = trainingjob()
    namesake["metadata"]["uid"] = "uid-of-the-new-namesake"
    fake.put(namesake)
    _controller(fake).reconcile(NS, "demo")
    assert fake.objects[(constants.KIND, NS, "demo")]["metadata"]["uid"] == "uid-of-the-new-namesake"


def test_a_child_the_api_server_refuses_fails_the_job_naming_the_trainingjobs_field_not_the_jobs() -> None:
    fake = _fake_with_job(spec={"trainer": {}, "workers": 2, "env": [{"name": "A", "value": "1"}]})
    # The user's env follows the operator's own variables in the container: its index there is theirs.
    spec = api.TrainingJobSpec.model_validate(
        {"trainer": {}, "workers": 2, "env": [{"name": "A", "value": "1"}]}
    )
    context = builders.Context(owner=builders.Owner(name="demo", namespace=NS, uid="u"), spec=spec)
    operator_env = [item["name"] for item in builders.worker_env(context, 0)].index("A")
    fake.fail_create["demo-r0-w0"] = kube.ApiError(
        422,
        "Invalid",
        f'Job.batch "demo-r0-w0" is invalid: spec.template.spec.containers[0].env[{operator_env}].value: '
        "Invalid value",
    )
    outcome = _controller(fake).reconcile(NS, "demo")
    assert outcome.invalid and "spec.env[0].value: Invalid value" in outcome.invalid, outcome.invalid
    assert "containers" not in outcome.invalid
    assert fake.status()["phase"] == "Failed"
    assert next(c for c in fake.status()["conditions"] if c["type"] == "Failed")["reason"] == "InvalidSpec"


def test_a_refused_child_is_never_claimed_as_created() -> None:
    fake = _fake_with_job()
    fake.fail_create["demo-r0-w0"] = kube.ApiError(
        422, "Invalid", "spec.template.spec.containers[0].image: bad"
    )
    _controller(fake).reconcile(NS, "demo")
    assert [c["type"] for c in fake.status()["conditions"] if c["status"] == "True"] == ["Failed"]
    assert "startTime" not in fake.status()


def test_an_invalid_spec_fails_without_creating_anything() -> None:
    fake = _fake_with_job(spec={"workers": 2})
    outcome = _controller(fake).reconcile(NS, "demo")
    assert outcome.invalid and "spec" in outcome.invalid
    assert fake.creations == []


def test_a_deleted_trainingjob_is_forgotten() -> None:
    fake = FakeKube()
    assert _controller(fake).reconcile(NS, "gone").gone


def _delete_behind_the_caches_back(fake: FakeKube, name: str = "demo") -> None:
    """The TrainingJob is deleted and the garbage collector removes its children; the cache hears of the
    children's deletions but not yet of the TrainingJob's (kopf's watch is late)."""
    fake.watch_paused = True
    del fake.objects[(constants.KIND, NS, name)]
    fake.watch_paused = False
    for key in [k for k in fake.objects if k[0] in ("Service", "Job", "Pod") and owner_name(fake.objects[k])]:
        fake._watch(fake.objects.pop(key), deleted=True)


def test_children_of_a_deleted_trainingjob_are_not_created_again_from_a_cache_that_still_holds_it() -> None:
    fake = _fake_with_job()
    ctl = _controller(fake)
    ctl.reconcile(NS, "demo")
    fake.run_pods()
    ctl.reconcile(NS, "demo")
    assert fake.status()["phase"] == "Running"
    _delete_behind_the_caches_back(fake)
    outcome = ctl.reconcile(NS, "demo")
    assert sorted(fake.creations) == [("Job", "demo-r0-w0"), ("Job", "demo-r0-w1"), ("Service", "demo")]
    assert outcome.gone
    assert fake.cache.trainingjob(NS, "demo") is None


def test_children_created_while_their_status_waits_are_not_created_again_for_a_deleted_trainingjob() -> None:
    fake = _fake_with_job()
    ctl, _ = _holding_controller(fake)
    ctl.reconcile(NS, "demo")  # creates, holds its status (Created)
    assert "patch status" not in fake.calls
    _delete_behind_the_caches_back(fake)
    outcome = ctl.reconcile(NS, "demo")
    assert len(fake.creations) == 3
    assert outcome.gone


def test_a_creation_planned_from_a_trainingjob_changed_since_is_planned_again_from_the_news() -> None:
    fake = _fake_with_job()
    ctl = _controller(fake)
    ctl.reconcile(NS, "demo")
    fake.run_pods()
    ctl.reconcile(NS, "demo")
    fake.watch_paused = True
    fake.edit_spec(workers=3)  # the cache has not seen the edit
    fake.watch_paused = False
    fake.delete("Job", NS, "demo-r0-w1")
    before = len(fake.creations)
    assert ctl.reconcile(NS, "demo").plan is None  # nothing executed from the old view
    assert len(fake.creations) == before
    assert fake.cache.trainingjob(NS, "demo")["spec"]["workers"] == 3  # type: ignore[index]
    assert ctl.queue.wakes_up((NS, "demo"))
    ctl.reconcile(NS, "demo")
    assert sorted(fake.creations[before:]) == [("Job", "demo-r0-w1"), ("Job", "demo-r0-w2")]  # concurrent


def test_a_forgotten_trainingjob_leaves_nothing_in_the_controllers_per_job_state() -> None:
    fake = FakeKube()
    for name in ("first", "second"):
        fake.put(trainingjob(name))
    ctl, ticks = _holding_controller(fake)
    ctl.trigger(NS, "second")
    ticks.now += WAITS.start
    ctl.trigger(NS, "second")  # its status written: _active
    ctl.trigger(NS, "first")  # its status held and its write scheduled: held, due
    ctl.forget(NS, "first")
    ctl.forget(NS, "second")
    sizes = ctl.state_sizes()
    sizes.pop("heap")  # stale entries of the forgotten wake-ups: bounded (test_operator_workqueue.py)
    assert not any(sizes.values()), sizes


def test_wake_ups_of_forgotten_jobs_do_not_stay_in_the_delay_heap() -> None:
    ctl = _controller(FakeKube())
    for index in range(1_000):  # jobs finished with a TTL of a day, then deleted by hand
        ctl.schedule((NS, f"job-{index}"), 86_400)
        ctl.forget(NS, f"job-{index}")
    ctl.schedule((NS, "alive"), 60)
    assert ctl.queue.sizes()["heap"] <= workqueue.HEAP_SLACK + 1


def test_ttl_deletes_the_trainingjob() -> None:
    fake = FakeKube()
    finished = {"phase": "Succeeded", "completionTime": "2026-01-01T00:00:00Z"}
    fake.put(trainingjob(spec={"trainer": {}, "runPolicy": {"ttlSecondsAfterFinished": 0}}, status=finished))
    _controller(fake).reconcile(NS, "demo")
    assert (constants.KIND, NS, "demo") not in fake.objects


def test_a_refused_creation_shows_in_status_and_is_retried() -> None:
    fake = _fake_with_job()
    fake.fail_create["demo-r0-w1"] = kube.ApiError(403, "Forbidden", "exceeded quota: gpus, requested: 8")
    ctl = _controller(fake)
    assert ctl.trigger(NS, "demo") is None
    assert fake.status()["pendingReason"] == "FailedCreate"
    assert "exceeded quota" in fake.status()["pendingMessage"]
    assert all(c["type"] != "Created" for c in fake.status().get("conditions") or ())
    assert [e["reason"] for e in fake.events][-1] == "FailedCreate"
    assert ctl.queue.wakes_up((NS, "demo"))  # retried later
    del fake.fail_create["demo-r0-w1"]
    ctl.trigger(NS, "demo")
    assert ("Job", "demo-r0-w1") in fake.creations


def test_errors_are_retried_with_backoff_and_do_not_escape() -> None:
    fake = _fake_with_job()
    fake.fail_create["demo-r0-w0"] = kube.ApiError(500, "InternalError", "etcd is sad")
    ctl = _controller(fake)
    assert ctl.trigger(NS, "demo") is None
    assert ctl.queue.wakes_up((NS, "demo"))


def test_triggers_for_one_job_coalesce_while_it_reconciles() -> None:
    fake = _fake_with_job()
    ctl = _controller(fake)
    entered, release = threading.Event(), threading.Event()
    runs: list[int] = []
    original = ctl.reconcile

    def slow(namespace: str, name: str) -> Any:
        runs.append(1)
        if len(runs) == 1:
            entered.set()
            release.wait(5)
        return original(namespace, name)

    ctl.reconcile = slow  # type: ignore[method-assign]
    first = threading.Thread(target=ctl.trigger, args=(NS, "demo"))
    first.start()
    entered.wait(5)
    for _ in range(5):
        assert ctl.trigger(NS, "demo") is None  # marked dirty, returns at once
    release.set()
    first.join(5)
    assert len(runs) == 2  # the running thread went round once more, not five times


def test_one_pending_wake_up_per_job() -> None:
    ctl = _controller(FakeKube())
    for delay in (60, 60, 30, 90, 60):
        ctl.schedule((NS, "demo"), delay)
    ctl.schedule((NS, "other"), 5)
    sizes = ctl.queue.sizes()
    assert sizes["due"] == 2
    assert sizes["heap"] == 3  # 60, then the earlier 30, and "other"; the later requests were dropped


def test_the_scheduler_triggers_due_jobs() -> None:
    fake = _fake_with_job()
    ctl = _controller(fake)
    ctl.start()
    try:
        ctl.schedule((NS, "demo"), 0)
        for _ in range(50):
            if fake.creations:
                break
            threading.Event().wait(0.05)
    finally:
        ctl.stop()
    assert ("Job", "demo-r0-w0") in fake.creations


@pytest.mark.parametrize(
    ("body", "owner"),
    [
        (
            {
                "metadata": {
                    "ownerReferences": [
                        {"kind": "TrainingJob", "apiVersion": "kubetrain.io/v1alpha1", "name": "demo"}
                    ]
                }
            },
            "demo",
        ),
        (
            {
                "metadata": {
                    "ownerReferences": [{"kind": "Job", "apiVersion": "batch/v1", "name": "demo-r0-w0"}],
                    "annotations": {constants.ANNOTATION_JOB_NAME: "x" * 100},
                }
            },
            "x" * 100,
        ),
        ({"metadata": {"labels": {constants.LABEL_JOB_NAME: "short"}}}, "short"),
    ],
)
def test_child_events_find_their_trainingjob(body: dict[str, Any], owner: str) -> None:
    assert owner_name(body) == owner


@pytest.mark.parametrize(
    ("provider", "groups"),
    [
        ("scheduler-plugins", [("PodGroup", "demo")]),
        ("kubernetes", [("Workload", "demo"), ("PodGroup", "demo-r0")]),
    ],
)
def test_a_gang_scheduled_job_creates_its_group_objects_first_once_and_never_reads_them(
    provider: str, groups: list[tuple[str, str]]
) -> None:
    fake = _fake_with_job(spec={"workers": 2, "trainer": {}, "gangScheduling": {"provider": provider}})
    ctl = _controller(fake)
    ctl.reconcile(NS, "demo")
    ctl.reconcile(NS, "demo")
    created = [c for c in fake.calls if c.startswith("create")]
    assert created[: len(groups)] == [f"create {kind} {name}" for kind, name in groups]
    assert sorted(fake.creations) == sorted(
        [*groups, ("Service", "demo"), ("Job", "demo-r0-w0"), ("Job", "demo-r0-w1")]
    )
    assert not [c for c in fake.calls if c.startswith("get")]


def test_a_restart_deletes_the_failed_attempts_pod_group_and_makes_the_next_ones() -> None:
    fake = _fake_with_job(spec={"workers": 2, "trainer": {}, "gangScheduling": {"provider": "kubernetes"}})
    ctl = _controller(fake)
    _running(fake, ctl)
    fake.run_pods("Running", exit_codes={1: 11})
    ctl.reconcile(NS, "demo")  # restart: the attempt's Jobs go, and its group with them
    assert "delete PodGroup demo-r0 Background" in fake.calls
    assert ("PodGroup", NS, "demo-r0") not in fake.objects
    ctl.reconcile(NS, "demo")
    created = [c for c in fake.calls if c.startswith("create")]
    assert created[-3:] == ["create PodGroup demo-r1", "create Job demo-r1-w0", "create Job demo-r1-w1"]
    assert fake.creations.count(("Workload", "demo")) == 1


def test_a_finished_gang_job_of_provider_kubernetes_is_ttl_deleted_and_writes_nothing_to_kueue() -> None:
    """Its gang is a scheduling.k8s.io Workload, which is not Kueue's: taken for one, the finished job
    marked it Finished against Kueue's API (404 on a cluster: retried for ever, the TTL never reached)."""
    spec = {
        "workers": 2,
        "trainer": {},
        "gangScheduling": {"provider": "kubernetes"},
        "runPolicy": {"ttlSecondsAfterFinished": 0},
    }
    fake = _fake_with_job(spec=spec)
    ctl = _controller(fake)
    _running(fake, ctl)
    fake.run_pods("Succeeded")
    ctl.reconcile(NS, "demo")
    assert fake.status()["phase"] == "Succeeded"
    ctl.reconcile(NS, "demo")
    assert (constants.KIND, NS, "demo") not in fake.objects
    assert not [call for call in fake.calls if call.startswith("patch Workload")], fake.calls


def test_a_group_kind_the_cluster_does_not_serve_is_explained_and_no_worker_is_created() -> None:
    fake = _fake_with_job(spec={"workers": 2, "trainer": {}, "gangScheduling": {"provider": "kubernetes"}})
    fake.fail_create["demo-r0"] = kube.ApiError(404, "NotFound", "404 page not found")
    ctl = _controller(fake)
    ctl.trigger(NS, "demo")
    assert fake.status()["pendingReason"] == "FailedCreate"
    assert (
        "scheduling.k8s.io/v1beta1 PodGroup is not served by this cluster" in fake.status()["pendingMessage"]
    )
    assert not [c for c in fake.creations if c[0] == "Job"]  # no half-scheduled group


def test_worker_threads_reconcile_what_is_enqueued() -> None:
    fake = FakeKube()
    for name in ("a", "b", "c"):
        fake.put(trainingjob(name))
    ctl = _controller(fake, workers=2)
    ctl.start()
    try:
        for name in ("a", "b", "c"):
            ctl.enqueue((NS, name), urgent=True)
        for _ in range(100):
            if len(fake.creations) == 9:
                break
            threading.Event().wait(0.05)
    finally:
        ctl.stop()
    assert sorted(name for kind, name in fake.creations if kind == "Service") == ["a", "b", "c"]
    assert len(fake.creations) == len(set(fake.creations)) == 9


def test_a_job_whose_workers_run_soon_gets_one_status_write_its_start_wait_after_they_run() -> None:
    fake = _fake_with_job()
    ctl, ticks = _holding_controller(fake)
    ctl.reconcile(NS, "demo")
    assert len(fake.creations) == 3 and "patch status" not in fake.calls
    assert ctl.queue.wakes_up((NS, "demo"))  # the held status is written by a later pass at the latest
    ticks.now += 1
    ctl.reconcile(NS, "demo")  # the Jobs' events
    fake.run_pods("Running")
    ctl.reconcile(NS, "demo")
    ticks.now += WAITS.start - 1
    ctl.reconcile(NS, "demo")
    assert "patch status" not in fake.calls
    ticks.now += 1  # Running's wait is over (Pending's, from the first pass, is longer)
    ctl.reconcile(NS, "demo")
    assert fake.calls.count("patch status") == 1
    status = fake.status()
    assert status["phase"] == "Running"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Created": "True", "Running": "True"}
    created = next(c for c in status["conditions"] if c["type"] == "Created")
    assert status["startTime"] == created["lastTransitionTime"] == "2026-01-01T00:00:00Z"  # the Jobs'
    assert fake.events == []
    assert ctl.metrics.created.labels(namespace=NS)._value.get() == 1


def test_a_group_that_waits_for_its_pods_is_written_pending_after_its_details_wait_then_succeeded() -> None:
    fake = _fake_with_job()
    ctl, ticks = _holding_controller(fake)
    ctl.reconcile(NS, "demo")
    ticks.now += WAITS.details - 1
    ctl.reconcile(NS, "demo")
    assert "patch status" not in fake.calls  # kubectl shows Pending meanwhile: the schema's default
    ticks.now += 1
    ctl.reconcile(NS, "demo")
    assert fake.calls.count("patch status") == 1 and fake.status()["phase"] == "Pending"
    fake.run_pods("Running")
    ctl.reconcile(NS, "demo")
    ticks.now += WAITS.start - 1
    ctl.reconcile(NS, "demo")
    assert fake.calls.count("patch status") == 1  # Running waits
    fake.run_pods("Succeeded")
    ctl.reconcile(NS, "demo")  # a decision: at once
    assert fake.calls.count("patch status") == 2 and fake.status()["phase"] == "Succeeded"
    assert [e["reason"] for e in fake.events] == ["Succeeded"]
    assert (NS, "demo") not in ctl._held


def test_worker_counts_wait_for_another_change_and_a_restart_carries_them_at_once() -> None:
    fake = _fake_with_job(trainer_spec(workers=3))
    ctl, ticks = _holding_controller(fake)
    ctl.reconcile(NS, "demo")
    fake.run_pods("Running")
    ctl.reconcile(NS, "demo")
    ticks.now += WAITS.start
    ctl.reconcile(NS, "demo")
    assert fake.calls.count("patch status") == 1 and fake.status()["phase"] == "Running"
    finished = fake.objects[("Pod", NS, "demo-r0-w2-abcde")]
    finished["status"] = pod(2, 0, phase="Succeeded")["status"]
    fake._bump(finished)
    ctl.reconcile(NS, "demo")
    ticks.now += 3600
    ctl.reconcile(NS, "demo")
    assert fake.calls.count("patch status") == 1  # READY 2/3 is no news worth a write
    failed = fake.objects[("Pod", NS, "demo-r0-w0-abcde")]
    failed["status"] = pod(0, 0, phase="Failed", exit_code=11)["status"]
    fake._bump(failed)
    ctl.reconcile(NS, "demo")
    assert fake.calls.count("patch status") == 2
    status = fake.status()
    assert status["phase"] == "Restarting" and status["restarts"] == 1
    assert status["workers"]["succeeded"] == 1


def test_progress_waits_its_details_wait() -> None:
    fake = _fake_with_job()
    ctl, ticks = _holding_controller(fake)
    ctl.reconcile(NS, "demo")
    fake.run_pods("Running")
    ctl.reconcile(NS, "demo")
    ticks.now += WAITS.start
    ctl.reconcile(NS, "demo")
    rank0 = fake.objects[("Pod", NS, "demo-r0-w0-abcde")]
    rank0["metadata"].setdefault("annotations", {})[contract.PROGRESS_ANNOTATION] = (
        '{"epoch": 1, "epochs": 2, "loss": 0.5}'
    )
    fake._bump(rank0)
    ctl.reconcile(NS, "demo")
    ticks.now += WAITS.details - 1
    ctl.reconcile(NS, "demo")
    assert fake.calls.count("patch status") == 1
    ticks.now += 1
    ctl.reconcile(NS, "demo")
    assert fake.calls.count("patch status") == 2 and fake.status()["progress"]["epoch"] == 1


def test_a_queued_job_kueue_says_nothing_about_shows_suspended_after_its_start_wait() -> None:
    fake = FakeKube()
    body = trainingjob()
    body["metadata"]["labels"] = {constants.KUEUE_QUEUE_LABEL: "team"}
    fake.put(body)
    ctl, ticks = _holding_controller(fake)
    ctl.defaults = plans.Defaults(image="img:test", kueue=True)
    ctl.reconcile(NS, "demo")
    assert fake.calls == ["create Workload demo"]
    ticks.now += WAITS.start
    ctl.reconcile(NS, "demo")
    assert fake.status()["phase"] == "Suspended"
    assert [e["reason"] for e in fake.events] == ["Queued"]


def test_an_informer_listing_again_finds_a_job_deleted_while_its_watch_was_broken() -> None:
    fake = _fake_with_job()
    ctl = _controller(fake)
    ctl.reconcile(NS, "demo")
    fake.watch_paused = True
    fake.delete("Job", NS, "demo-r0-w1")  # the DELETED event is lost with the connection
    ctl.reconcile(NS, "demo")
    assert fake.creations.count(("Job", "demo-r0-w1")) == 1  # the ghost still counts as a worker
    changed: list[tuple[str, str]] = []
    scope = informer.scopes([NS])[0]
    informer.Informer(fake, fake.cache, "Job", scope, changed.append).relist()  # type: ignore[arg-type]
    assert changed == [(NS, "demo")]
    ctl.reconcile(NS, "demo")
    assert fake.creations.count(("Job", "demo-r0-w1")) == 2


def test_listing_trainingjobs_again_forgets_one_deleted_while_their_watch_was_broken() -> None:
    fake = _fake_with_job()
    ctl = _controller(fake)
    ctl.reconcile(NS, "demo")
    assert ctl.state_sizes()["active"] == 1
    fake.watch_paused = True
    del fake.objects[(constants.KIND, NS, "demo")]  # the DELETED event is lost with the connection
    scope = informer.scopes([NS])[0]
    informer.Informer(fake, fake.cache, constants.KIND, scope, ctl.trainingjob_changed).relist()  # type: ignore[arg-type]
    assert fake.cache.trainingjob(NS, "demo") is None
    assert ctl.state_sizes()["active"] == 0


def test_a_trainingjobs_first_event_asks_for_an_urgent_reconcile_and_its_status_echo_a_routine_one() -> None:
    fake = _fake_with_job()
    ctl = _controller(fake)
    asked: list[bool] = []
    ctl.enqueue = lambda key, urgent=False: asked.append(urgent)  # type: ignore[method-assign]
    ctl.trainingjob_changed((NS, "demo"))
    ctl.reconcile(NS, "demo")  # writes its first status, which the cache takes in
    ctl.trainingjob_changed((NS, "demo"))
    assert asked == [True, False]


def _running(fake: FakeKube, ctl: Controller) -> None:
    """Reconcile the fake's TrainingJob until its workers run."""
    ctl.reconcile(NS, "demo")
    fake.run_pods("Running")
    ctl.reconcile(NS, "demo")
    assert fake.status()["phase"] == "Running"


def test_a_quick_resume_waits_until_the_suspended_workers_pods_are_gone() -> None:
    """Suspension deletes the workers' Jobs in the foreground, as a restart does: a resume while their pods
    still terminate creates nothing, so the old rank 0 never writes beside the next attempt's."""
    fake = _fake_with_job()
    ctl = _controller(fake)
    _running(fake, ctl)
    fake.gc_paused = True  # the pods take their grace period to terminate
    fake.edit_spec(runPolicy={"suspend": True})
    ctl.reconcile(NS, "demo")
    ctl.reconcile(NS, "demo")
    assert fake.status()["phase"] == "Suspended"
    assert "deleting 2 worker Jobs and waiting for their pods" in fake.status()["message"]
    fake.edit_spec(runPolicy={"suspend": False})
    ctl.reconcile(NS, "demo")
    assert [name for _, name in fake.creations if name.startswith("demo-r1-")] == []
    assert fake.status()["pendingReason"] == "WaitingForOldWorkers"
    fake.collect_garbage()
    ctl.reconcile(NS, "demo")
    assert ("Job", "demo-r1-w0") in fake.creations and ("Job", "demo-r1-w1") in fake.creations


def _changed_behind_the_cache(fake: FakeKube) -> dict[str, Any]:
    """Another writer changes the TrainingJob's status while the operator's cache still holds the old
    version; returns the status the API server now holds."""
    fake.watch_paused = True
    stored = fake.objects[(constants.KIND, NS, "demo")]
    stored["status"] = {"phase": "Pending", "message": "written by someone who read a newer version"}
    stored["metadata"]["resourceVersion"] = "999"
    return copy.deepcopy(stored["status"])


def test_a_failed_creation_report_from_a_stale_read_is_refused() -> None:
    fake = _fake_with_job()
    newer = _changed_behind_the_cache(fake)
    fake.fail_create["demo-r0-w1"] = kube.ApiError(403, "Forbidden", "exceeded quota: gpus, requested: 8")
    ctl = _controller(fake)
    assert ctl.trigger(NS, "demo") is None  # the creation error is retried with backoff
    assert "patch status" in fake.calls
    assert fake.status() == newer


def test_an_invalid_child_verdict_from_a_stale_read_is_refused_and_planned_again() -> None:
    fake = _fake_with_job()
    newer = _changed_behind_the_cache(fake)
    fake.fail_create["demo-r0-w0"] = kube.ApiError(422, "Invalid", "spec.template: Invalid value")
    outcome = _controller(fake).reconcile(NS, "demo")
    assert "patch status" in fake.calls
    assert fake.status() == newer
    assert outcome.invalid is None and outcome.plan is not None and outcome.plan.requeue_after == 0.2


def test_a_refused_status_is_reported_once_and_not_retried_until_the_trainingjob_changes() -> None:
    fake = _fake_with_job()
    ctl = _controller(fake)
    refusal = kube.ApiError(422, "Invalid", "spec.workers: Invalid value: 'string': must be integer")
    fake.fail_patch += [refusal] * 5
    for _ in range(3):  # resyncs and child events
        ctl.trigger(NS, "demo")
    assert [e["reason"] for e in fake.events].count("StatusRefused") == 1
    assert not ctl.queue.wakes_up((NS, "demo"))
    assert fake.calls.count("patch status") == 1
    fake.edit_spec(runPolicy={"maxRestarts": 2})  # someone edits it: the operator looks again
    ctl.trigger(NS, "demo")
    assert fake.calls.count("patch status") == 2
    assert [e["reason"] for e in fake.events].count("StatusRefused") == 2


def test_a_job_the_operator_does_not_allow_gets_a_warning_naming_the_flag_and_no_children() -> None:
    fake = _fake_with_job(spec={"workers": 2, "trainer": {}, "serviceAccountName": "cluster-admin-sa"})
    ctl = _controller(fake)
    ctl.defaults = plans.Defaults(policy=admission.Policy(service_accounts=frozenset({"kubetrain-worker"})))
    outcome = ctl.reconcile(NS, "demo")
    assert fake.creations == []
    assert fake.status()["phase"] == "Failed"
    assert outcome.invalid is not None and "--allowed-service-accounts=kubetrain-worker" in outcome.invalid
    warning = fake.events[-1]
    assert (warning["type"], warning["reason"]) == ("Warning", "NotAllowed")
    assert "spec.serviceAccountName 'cluster-admin-sa'" in warning["message"]


def test_a_job_whose_spec_stops_validating_keeps_its_workers_even_when_its_status_is_refused() -> None:
    """After an upgrade the stored spec may fail both this operator's checks and the CRD's (so every
    write to it is refused): the workers stay, and the one Warning names the field."""
    fake = _fake_with_job()
    ctl = _controller(fake)
    _running(fake, ctl)
    fake.edit_spec(trainer={"epochs": "many"})
    fake.fail_patch.append(kube.ApiError(422, "Invalid", "spec.trainer.epochs: Invalid value"))
    outcome = ctl.reconcile(NS, "demo")
    assert [c for c in fake.calls if c.startswith("delete")] == []
    assert {("Job", "demo-r0-w0"), ("Job", "demo-r0-w1")} <= {(k, n) for k, _, n in fake.objects}
    warning = fake.events[-1]
    assert (warning["type"], warning["reason"]) == ("Warning", "InvalidSpec")
    assert "spec.trainer.epochs" in warning["message"] and outcome.invalid == warning["message"]


def _provisioning_controller(fake: FakeKube, cluster_role: str = "kubetrain-worker") -> Controller:
    """As the chart runs the operator when watching all namespaces (--worker-cluster-role)."""
    return Controller(
        fake,  # type: ignore[arg-type]
        fake.cache,
        defaults=plans.Defaults(image="img:test", service_account="kubetrain-worker"),
        metrics=Metrics.create(),
        clock=lambda: NOW,
        worker_identities=workeridentity.WorkerIdentities(fake, "kubetrain-worker", cluster_role),  # type: ignore[arg-type]
    )


def test_workers_without_an_account_get_the_provisioned_one_created_before_them_once_per_namespace() -> None:
    fake = _fake_with_job()
    fake.put(trainingjob("second"))
    controller = _provisioning_controller(fake)
    controller.reconcile(NS, "demo")
    controller.reconcile(NS, "second")
    assert fake.creations[:2] == [("ServiceAccount", "kubetrain-worker"), ("RoleBinding", "kubetrain-worker")]
    assert [kind for kind, _ in fake.creations].count("RoleBinding") == 1
    binding = fake.objects[("RoleBinding", NS, "kubetrain-worker")]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "kubetrain-worker"}  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kubetrain-worker", "namespace": NS}]
    for kind in ("ServiceAccount", "RoleBinding"):  # collected when the chart's ClusterRole is uninstalled
        owners = fake.objects[(kind, NS, "kubetrain-worker")]["metadata"]["ownerReferences"]
        assert owners == [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                           "name": "kubetrain-worker", "uid": "worker-role-uid"}]  # fmt: skip
    worker = fake.objects[("Job", NS, "demo-r0-w0")]
    assert worker["spec"]["template"]["spec"]["serviceAccountName"] == "kubetrain-worker"


def test_a_job_naming_its_own_account_provisions_nothing() -> None:
    fake = _fake_with_job({"workers": 2, "trainer": {"epochs": 2}, "serviceAccountName": "team-sa"})
    _provisioning_controller(fake).reconcile(NS, "demo")
    assert {kind for kind, _ in fake.creations} == {"Service", "Job"}
    assert (
        fake.objects[("Job", NS, "demo-r0-w0")]["spec"]["template"]["spec"]["serviceAccountName"] == "team-sa"
    )


def test_an_existing_worker_account_is_used_as_it_is() -> None:
    fake = _fake_with_job()
    fake.put({"apiVersion": "v1", "kind": "ServiceAccount",
              "metadata": {"name": "kubetrain-worker", "namespace": NS, "uid": "admins"}})  # fmt: skip
    _provisioning_controller(fake).reconcile(NS, "demo")
    assert fake.objects[("ServiceAccount", NS, "kubetrain-worker")]["metadata"]["uid"] == "admins"
    assert ("Job", "demo-r0-w0") in fake.creations


def test_a_missing_worker_cluster_role_is_reported_in_status_naming_the_flag() -> None:
    fake = _fake_with_job()
    with pytest.raises(kube.ApiError):
        _provisioning_controller(fake, cluster_role="absent").reconcile(NS, "demo")
    assert "ClusterRole absent (--worker-cluster-role) does not exist" in fake.status()["pendingMessage"]
    assert not [kind for kind, _ in fake.creations if kind == "Job"]


def test_a_trainingjob_managed_by_another_controller_is_left_alone() -> None:
    """spec.managedBy naming another controller (Kueue's MultiKueue, say): no child, no status, no event."""
    fake = _fake_with_job(trainer_spec(managedBy="kueue.x-k8s.io/multikueue"))
    outcome = _controller(fake).reconcile(NS, "demo")
    assert outcome.plan is None and not outcome.gone
    assert fake.calls == [] and fake.events == []
    assert fake.status() == {}


def _requests_for_a_whole_run(queued: bool) -> list[str]:
    """The operator's API writes (creations, patches, deletions, events) for one 2-worker TrainingJob
    from creation to success; a queued one is admitted by (this test playing) Kueue as soon as its
    Workload exists, the common case of a queue with room."""
    fake = FakeKube()
    body = trainingjob()
    if queued:
        body["metadata"]["labels"] = {constants.KUEUE_QUEUE_LABEL: "team"}
    fake.put(body)
    ctl = Controller(
        fake,  # type: ignore[arg-type]
        fake.cache,
        defaults=plans.Defaults(image="img:test", kueue=True),
        metrics=Metrics.create(),
        clock=lambda: NOW,
        status_waits=WAITS,
        monotonic=lambda: 1000.0,  # the whole run within the job's start wait
    )
    fake.put(
        {"apiVersion": constants.KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": "f", "uid": "f"}}
    )
    ctl.reconcile(NS, "demo")
    if queued:
        workload = fake.objects[("Workload", NS, "demo")]
        workload["status"] = {
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [{"name": "workers", "flavors": {"cpu": "f"}}],
            },
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": ""},
                {"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""},
            ],
        }
        fake._bump(workload)
        ctl.reconcile(NS, "demo")
    for phase in ("Running", "Succeeded"):
        fake.run_pods(phase)
        ctl.reconcile(NS, "demo")
    ctl.reconcile(NS, "demo")
    return fake.calls + [f"event {e['reason']}" for e in fake.events]


def test_kueue_costs_a_job_admitted_at_once_three_requests_its_workload_pods_ready_and_finishing_it() -> None:
    """The figure of issue 12 part 3: the Kueue integration's extra API requests per TrainingJob (issue 24
    added the PodsReady condition Kueue's waitForPodsReady reads: one status write when the group is ready)."""
    plain, queued = _requests_for_a_whole_run(False), _requests_for_a_whole_run(True)
    extra = list(queued)
    for call in plain:
        extra.remove(call)
    assert sorted(extra) == ["apply Workload status", "apply Workload status", "create Workload demo"]
