"""The controller: worker threads that take TrainingJobs off the work queue and execute their plans.

The informers only note that a TrainingJob needs a look (`trainingjob_changed`, `schedule`); a fixed set
of worker threads takes keys off the `workqueue` (one key at a time per job, urgent before routine,
delayed wake-ups: its docstring) and reconciles them, reading everything from the `cache` and calling the
API server only to change something. A reconcile that fails is retried with capped exponential backoff.

Executing a plan. A plan that only creates the current attempt's children (a new job, or a missing
worker) creates them first, concurrently, then records status: nothing in that status is a decision the
creations depend on, and a kill in between leaves children a later reconcile recognises (names are
deterministic). Any other plan writes status first, guarded by the resourceVersion it was planned from
(a stale read fails with 409 and is planned again instead of overwriting), because its status records a
decision (a new restart attempt, a terminal phase) that must be durable before its effects: deletions,
then creations. 409 AlreadyExists on a creation is success when the existing object is controlled by
this TrainingJob's uid (a retry or a restarted operator never creates a duplicate), and a FailedCreate
when anything else holds the name; deletions name the uid they were planned from, so they never remove a
namesake created since. Creations that are not the TrainingJob's first (a new attempt, or children that
disappeared) are preceded by one GET of the TrainingJob, and made only if it is still the version the
plan was made from: a deleted job's children, removed by the garbage collector, must not be re-created
from a cache that has not heard of the deletion yet (`_owner_confirmed`). Events go to a background
poster (`events`).

When status is written: a change that records a decision or a finding goes out at once; any other waits
as `status.write_wait` says (a new job's first status and its start a few seconds, progress longer,
worker counts until another change), accumulating with what later passes plan, and the pass due then
writes it all (`_status_due`). A state a job leaves within its wait is never written on its own, and a
burst of submissions gets its workers before the status writes of its start. A held status decides
nothing, so the plan's deletions and creations go ahead without it; its events and transitions are
planned again by the pass that writes it.

Nothing is kept per TrainingJob beyond its life: `forget` (its deletion) drops every per-job structure,
here and in the queue, so a process that runs for months holds state in proportion to the jobs alive, not
to the jobs it has seen (`state_sizes` reports them).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubetrain_operator.api import constants, fieldpaths
from kubetrain_operator.planning import observe, planner, plans
from kubetrain_operator.planning import status as st
from kubetrain_operator.runtime import events, kube, workeridentity, workqueue
from kubetrain_operator.runtime.cache import ClusterCache, Key
from kubetrain_operator.runtime.metrics import Metrics

logger = logging.getLogger("kubetrain.operator")

ERROR_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
"""Delays before re-running a reconcile that failed: the k-th consecutive error waits ERROR_BACKOFF[k]."""
ERROR_EVENT_AFTER = 5
"""Consecutive failed reconciles after which a Warning event tells the user the operator is stuck."""
CONFLICT_RETRY = 0.2
"""Seconds before re-planning a job whose status patch met a newer version (the watch brings it)."""
CREATE_CONCURRENCY = 16
"""Creations in flight at once across all reconciles: a job's Service and Jobs go out together."""


@dataclasses.dataclass
class Outcome:
    """What one reconcile did, for tests and logs."""

    plan: plans.Plan | None = None
    invalid: str | None = None
    """A message when the TrainingJob cannot be run as specified (nothing is retried until it changes)."""
    gone: bool = False


class InvalidChildError(Exception):
    """The API server refused a child built from the spec (422): the spec cannot work."""

    def __init__(self, child: dict[str, Any], message: str) -> None:
        super().__init__(message)
        self.child = child
        self.message = message


def about(key: Key, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """Logging `extra` naming the TrainingJob a line is about: kopf's JSON log format (`--log-format json`)
    puts it in the line's `object` field, as for kopf's own per-object lines."""
    ref = {"apiVersion": constants.API_VERSION, "kind": constants.KIND, "namespace": key[0], "name": key[1]}
    uid = (body or {}).get("metadata", {}).get("uid")
    return {"k8s_ref": {**ref, "uid": uid} if uid else ref}


def needs_workers(body: dict[str, Any]) -> bool:
    """A TrainingJob someone is waiting on: never reconciled, or its spec changed since."""
    status = body.get("status") or {}
    generation = (body.get("metadata") or {}).get("generation")
    return not status.get("phase") or status.get("observedGeneration") != generation


def utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@dataclasses.dataclass
class _HeldStatus:
    """A TrainingJob's planned status that waits to be written (`status.write_wait`)."""

    uid: str
    due: float
    """When it must be written (monotonic): the earliest deadline of the changes it holds; infinite while
    they wait for another change."""
    omits_children: bool = False
    """It records children this process created (Created) that the stored status does not: until it is
    written, only this says they existed, so a creation for the job is confirmed like any re-creation
    (`_owner_confirmed`)."""


class Controller:
    def __init__(
        self,
        client: kube.Kube,
        cache: ClusterCache,
        *,
        defaults: plans.Defaults | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], datetime] = utcnow,
        workers: int = 8,
        namespaces: list[str] | None = None,
        worker_identities: workeridentity.WorkerIdentities | None = None,
        status_waits: st.WriteWaits | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = client
        self.cache = cache
        self.defaults = defaults or plans.Defaults()
        self.metrics = metrics or Metrics.create()
        self.metrics.jobs.source = cache.trainingjobs  # per-job series: the jobs alive in the cache
        self.clock = clock
        self.workers = workers
        self.namespaces = namespaces
        """The watched namespaces (kopf patterns allowed); None for all."""
        self.worker_identities = worker_identities
        """Creates the workers' ServiceAccount where workers need it (--worker-cluster-role); None: the
        account is the admin's to create."""
        self.status_waits = status_waits or st.WriteWaits()
        self.monotonic = monotonic
        """The clock of held status writes (tests move it; the queue and its delays use real time)."""
        self._stopped = threading.Event()
        self.ready = threading.Event()
        """Set when the cache is complete (every informer listed once): workers plan nothing before."""
        self.ready.set()
        self.post_event: Callable[[dict[str, Any]], None] = self._post_event_now
        """Where events go: the API at once by default; the operator sets a background `EventPoster`."""
        self.queue = workqueue.WorkQueue(on_depth=self.metrics.queue_depth.set)
        self._lock = threading.Lock()
        """Guards the per-job structures below (worker threads share them)."""
        self._active: dict[Key, bool] = {}
        self._threads: list[threading.Thread] = []
        self._creators = ThreadPoolExecutor(CREATE_CONCURRENCY, thread_name_prefix="kubetrain-create")
        self._refused: dict[Key, tuple[str | None, str]] = {}
        """TrainingJobs whose status the API server refuses -> (the resourceVersion refused, the message):
        nothing is tried again, and nothing said again, until the object changes."""
        self._held: dict[Key, _HeldStatus] = {}
        """TrainingJobs whose planned status waits to be written (`_status_due`)."""

    # ------------------------------------------------------------ the queue

    def enqueue(self, key: Key, urgent: bool = False) -> None:
        """Ask for a reconcile of `key` by a worker thread. Never blocks, never calls the API."""
        self.queue.add(key, urgent)

    def trainingjob_changed(self, key: Key) -> None:
        """The TrainingJobs' informer saw `key` added, changed or gone: forget a job the cache no longer
        holds; reconcile any other, urgently when someone waits for its workers (`needs_workers`)."""
        body = self.cache.trainingjob(*key)
        if body is None:
            self.forget(*key)
        else:
            self.enqueue(key, urgent=needs_workers(body))

    def schedule(self, key: Key, delay: float) -> None:
        """Enqueue `key` again after `delay` seconds (the earliest pending wake-up of a job wins)."""
        self.queue.add_after(key, delay)

    def busy(self) -> bool:
        """Whether new or changed TrainingJobs are waiting for a reconcile thread or being reconciled."""
        return self.queue.busy()

    def _run_worker(self) -> None:
        while not self.ready.wait(1.0):
            if self._stopped.is_set():
                return
        while (taken := self.queue.get()) is not None:
            key, urgent = taken
            try:
                self.trigger(*key)
            finally:
                if urgent:
                    self.queue.urgent_done()

    def trigger(self, namespace: str, name: str) -> Outcome | None:
        """Reconcile now in this thread, or mark dirty if another thread is at it. Never raises."""
        key = (namespace, name)
        if not self.queue.claim(key):
            return None
        outcome: Outcome | None = None
        try:
            while True:
                outcome = self._reconcile_guarded(key)
                if self.queue.release(key):
                    break
        except BaseException:
            self.queue.abandon(key)
            raise
        return outcome

    def _reconcile_guarded(self, key: Key) -> Outcome | None:
        started = time.monotonic()
        try:
            outcome = self.reconcile(*key)
        except Exception as exc:
            self.metrics.reconcile_errors.inc()
            failed_before = self.queue.failed(key)
            delay = ERROR_BACKOFF[min(failed_before, len(ERROR_BACKOFF) - 1)]
            logger.warning(
                "reconcile of %s/%s failed (%s); retrying in %.0fs", *key, exc, delay, extra=about(key)
            )
            if failed_before + 1 == ERROR_EVENT_AFTER:
                self._event(key, None, "Warning", "ReconcileError", f"the operator keeps failing: {exc}")
            self.schedule(key, delay)
            return None
        finally:
            self.metrics.reconcile_seconds.observe(time.monotonic() - started)
        self.queue.succeeded(key)
        if outcome.plan is not None and outcome.plan.requeue_after is not None:
            self.schedule(key, outcome.plan.requeue_after)
        return outcome

    def forget(self, namespace: str, name: str) -> None:
        """Drop everything kept about a deleted TrainingJob: nothing of a job that is gone may outlive it
        in a process that runs for months. A reconcile of it in progress goes round once more, to end
        with the cache's news (gone)."""
        key = (namespace, name)
        self._drop(key)
        self.queue.forget(key)

    def _gone(self, key: Key) -> Outcome:
        """The outcome for a TrainingJob that no longer exists, its per-job state dropped."""
        self._drop(key)
        self.queue.drop(key)
        return Outcome(gone=True)

    def _drop(self, key: Key) -> None:
        """Forget `key`'s per-job state in the controller (the queue's is the queue's)."""
        with self._lock:
            self._active.pop(key, None)
            self._refused.pop(key, None)
            self._held.pop(key, None)
            self.metrics.active.set(sum(self._active.values()))

    def state_sizes(self) -> dict[str, int]:
        """How many entries each per-job structure holds, the queue's included: what the soak watches."""
        with self._lock:
            own = {"active": len(self._active), "refused": len(self._refused), "held": len(self._held)}
        return own | self.queue.sizes()

    def start(self) -> None:
        scheduler = threading.Thread(target=self.queue.run_delays, name="kubetrain-scheduler", daemon=True)
        self._threads = [scheduler]
        self._threads += [
            threading.Thread(target=self._run_worker, name=f"kubetrain-worker-{i}", daemon=True)
            for i in range(self.workers)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self.queue.shut_down()
        for thread in self._threads:
            thread.join(timeout=5)
        self._creators.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ one reconcile

    def reconcile(self, namespace: str, name: str) -> Outcome:
        """Read the TrainingJob and its children from the cache, plan, execute. Raises on API errors."""
        key = (namespace, name)
        body = self.cache.trainingjob(namespace, name)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            return self._gone(key)
        uid = body["metadata"].get("uid", "")
        refused = self._refused.get((namespace, name))
        if refused is not None:
            if refused[0] == body["metadata"].get("resourceVersion"):
                return Outcome(invalid=refused[1])  # any write would be refused again: said once already
            del self._refused[(namespace, name)]
        if not planner.managed_here(body):
            self.forget(namespace, name)  # another controller runs it: no status, no children, no metrics
            return Outcome()
        observed = plans.Observed.from_objects(
            body,
            services=self.cache.children(namespace, name, "Service"),
            jobs=self.cache.children(namespace, name, "Job"),
            pods=self.cache.children(namespace, name, "Pod"),
            workloads=self.cache.children(namespace, name, "Workload"),
            flavors=self.cache.cluster_objects("ResourceFlavor"),
            departed=self.cache.departed_pods(namespace, name),
        )
        plan = planner.plan(observed, self.clock(), self.defaults)
        with self._lock:
            held = self._held.get(key)
            unrecorded = held is not None and held.uid == uid and held.omits_children
        if plan.create and (plan.confirm_owner or unrecorded) and not self._owner_confirmed(body):
            if self.cache.trainingjob(namespace, name) is None:
                return self._gone(key)
            self.schedule(key, 0.0)  # changed since the cache saw it: plan again from the news
            return Outcome()
        outcome = Outcome(plan=plan)
        stored = body.get("status") or {}
        creations_only = (
            bool(plan.create)
            and not plan.delete
            and not plan.delete_self
            and plan.status.get("restartAttempt") == stored.get("restartAttempt", 0)
        )
        if creations_only and not self._create_all(body, plan, outcome):
            return outcome
        waiting = self._status_due(key, uid, stored, plan, created=creations_only)
        if waiting > 0:
            if math.isfinite(waiting):  # else it waits for another change
                self.schedule(key, waiting)
        elif plan.status_changed(stored):
            written = self._write_status(body, plan, outcome)
            if written is None:
                return outcome
            body = written  # later writes are guarded by the version this one made
            with self._lock:
                self._held.pop(key, None)
        if not creations_only:
            for deletion in plan.delete:
                self.kube.delete(
                    deletion.kind,
                    namespace,
                    deletion.name,
                    deletion.propagation,
                    deletion.uid,
                    api_version=deletion.api_version,
                )
            if not self._create_all(body, plan, outcome):
                return outcome
        if not self._write_workload(observed, plan):
            return outcome
        if waiting > 0:
            return outcome  # its events and transitions are planned again by the pass that writes it
        self._post_plan_events(body, plan)
        if plan.delete_self:
            self.kube.delete(constants.KIND, namespace, name, "Background", uid)
        verdict = planner.refusal_verdict(plan.status)
        if outcome.invalid is None and verdict is not None:
            outcome.invalid = verdict.get("message")
        self.metrics.record(namespace, plan.transitions)
        phase = plan.status.get("phase")
        with self._lock:
            self._active[(namespace, name)] = phase not in ("Succeeded", "Failed", "Suspended")
            self.metrics.active.set(sum(self._active.values()))
        return outcome

    def _write_workload(self, observed: plans.Observed, plan: plans.Plan) -> bool:
        """Apply the plan's changes to the Kueue Workload: spec.active, then its status, guarded by the
        resourceVersion observed (Kueue writes it too: a stale read is planned again from the news), or
        the conditions the operator owns, applied server-side. False when the Workload changed meanwhile."""
        workload = observed.workload
        if workload is None or (
            plan.workload_spec is None and plan.workload_status is None and not plan.workload_conditions
        ):
            return True
        meta = workload["metadata"]
        try:
            if plan.workload_spec is not None:
                workload = self.kube.patch(
                    "Workload",
                    meta["namespace"],
                    meta["name"],
                    {"spec": plan.workload_spec},
                    resource_version=meta.get("resourceVersion"),
                )
                self.cache.observe(workload)
            if plan.workload_status is not None:
                written = self.kube.patch(
                    "Workload",
                    meta["namespace"],
                    meta["name"],
                    {"status": plan.workload_status},
                    subresource="status",
                    resource_version=workload["metadata"].get("resourceVersion"),
                )
                self.cache.observe(written)
            if plan.workload_conditions:
                applied = self.kube.apply_status(
                    "Workload",
                    meta["namespace"],
                    meta["name"],
                    constants.KUEUE_API,
                    {"conditions": plan.workload_conditions},
                )
                self.cache.observe(applied)
        except kube.ApiError as exc:
            if not (exc.conflict or exc.not_found):
                raise
            plan.requeue_after = CONFLICT_RETRY
            return False
        return True

    def _owner_confirmed(self, body: dict[str, Any]) -> bool:
        """Whether the TrainingJob is still, on the API server, the very version the plan was made from.

        Asked (one GET) only before creations that are not a TrainingJob's first (`Plan.confirm_owner`).
        The case it exists for: a TrainingJob deleted while running. The garbage collector removes its
        Service and Jobs; their informers report that first, while the TrainingJobs' informer has not yet
        reported the TrainingJob's deletion, so the cache still holds it, running, with every child
        missing, and the plan re-creates them all (for an owner that is gone: the collector removes them
        again). The GET is a quorum read made after the children were seen missing, so a deletion that
        made them go is visible in it. When the answer differs, the cache takes it (gone, being deleted, a
        namesake, or a newer version) and nothing is created from the old view."""
        meta = body["metadata"]
        live = self.kube.get(constants.KIND, meta["namespace"], meta["name"])
        if live is not None and live["metadata"].get("resourceVersion") == meta.get("resourceVersion"):
            return True
        if live is None:
            self.cache.forget(body)
        else:
            self.cache.observe(live)
        logger.info(
            "%s/%s: not creating children from a stale view: the TrainingJob %s",
            meta["namespace"],
            meta["name"],
            "is gone" if live is None else "changed since the cache saw it",
            extra=about((meta["namespace"], meta["name"]), body),
        )
        return False

    def _status_due(
        self, key: Key, uid: str, stored: dict[str, Any], plan: plans.Plan, *, created: bool
    ) -> float:
        """Seconds the planned status must still wait (`status.write_wait`): 0 to write it now (or
        when nothing changed), infinite when only another change writes it. A held change keeps its
        deadline while later passes plan more beside it; a more urgent one brings the write forward.
        `created`: this pass created the plan's children."""
        if not plan.status_changed(stored):
            with self._lock:
                self._held.pop(key, None)
            return 0.0
        if plan.delete_self:  # the TrainingJob goes: nothing is left to write later
            return 0.0
        now = self.monotonic()
        wait = st.write_wait(stored, plan.status, self.status_waits)
        due = math.inf if wait is None else now + wait
        with self._lock:
            held = self._held.get(key)
            if held is None or held.uid != uid:
                held = self._held[key] = _HeldStatus(uid, due)
            held.due = min(held.due, due)
            held.omits_children |= (
                created and st.is_true(plan.status, "Created") and not st.is_true(stored, "Created")
            )
            return max(0.0, held.due - now)

    def _post_plan_events(self, body: dict[str, Any], plan: plans.Plan) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        for event in plan.events:
            logger.info("%s/%s: %s: %s", *key, event.reason, event.message, extra=about(key, body))
            self._event(key, body, event.type, event.reason, event.message)

    def _write_status(
        self, body: dict[str, Any], plan: plans.Plan, outcome: Outcome
    ) -> dict[str, Any] | None:
        """Patch the planned status, guarded by the resourceVersion it was planned from; the object as
        written, or None when the reconcile must stop here (stale read, object gone, or refused: `outcome`
        says which)."""
        meta = body["metadata"]
        try:
            written = self.kube.patch_status(
                meta["namespace"], meta["name"], plan.status, meta.get("resourceVersion")
            )
        except kube.ApiError as exc:
            if exc.conflict:  # changed since we read it: the watch brings the news, decide again then
                plan.requeue_after = CONFLICT_RETRY
                return None
            if exc.not_found:  # deleted while a watch was broken: the cache held a ghost
                self.cache.forget(body)
                self._gone((meta["namespace"], meta["name"]))
                outcome.gone = True
                return None
            if exc.invalid:  # the API server refuses any write to this object: retrying cannot help
                outcome.invalid = self._status_refused(body, plan, exc)
                self._refused[(meta["namespace"], meta["name"])] = (
                    meta.get("resourceVersion"),
                    outcome.invalid,
                )
                plan.requeue_after = None
                return None
            raise
        self.cache.observe(written)
        return written

    def _create_all(self, body: dict[str, Any], plan: plans.Plan, outcome: Outcome) -> bool:
        """Create the plan's objects: the gang-scheduling objects or a Kueue Workload first (no worker pod
        may wait for a missing group), then the Service and Jobs concurrently. False when the spec cannot
        work."""
        first = [m for m in plan.create if m["kind"] not in ("Service", "Job")]
        rest = [m for m in plan.create if m["kind"] in ("Service", "Job")]
        try:
            self._ensure_worker_identity(plan.create)
            for batch in (first, rest):
                for created in self._creators.map(self._create, batch):
                    self.cache.observe(created)
        except InvalidChildError as exc:
            kind, child_name = exc.child["kind"], exc.child["metadata"]["name"]
            message = fieldpaths.to_trainingjob_fields(exc.message, body.get("spec") or {}, exc.child)
            outcome.invalid = self._fail_invalid(
                body, plan, f"the API server refused {kind} {child_name}: {message}"
            )
            return False
        except kube.ApiError as exc:
            # Quota exceeded, forbidden, server trouble: say so in status (a job must never look fine
            # while nothing can be created), then let the error schedule a retry with backoff.
            self._report_failed_create(body, plan, exc)
            raise
        return True

    def _ensure_worker_identity(self, manifests: list[dict[str, Any]]) -> None:
        """Before worker Jobs that run as the provisioned account: the account, or their pods would be
        refused (the Job controller cannot create a pod whose ServiceAccount does not exist)."""
        if self.worker_identities is None:
            return
        account = self.worker_identities.service_account
        for manifest in manifests:
            if manifest["kind"] == "Job" and (
                manifest["spec"]["template"]["spec"].get("serviceAccountName") == account
            ):
                self.worker_identities.ensure(manifest["metadata"]["namespace"])
                return

    def _create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """The created object, or the existing one when this TrainingJob already created it (an earlier,
        maybe killed, reconcile). An object of that name that this TrainingJob does not control (a deleted
        namesake's, not yet collected, or anyone else's) is never claimed: ApiError 409."""
        try:
            if manifest["kind"] == "Workload":
                manifest = self._with_priority(manifest)
            return self.kube.create(manifest)
        except kube.ApiError as exc:
            if exc.conflict:
                return self._existing(manifest, exc)
            if exc.not_found and manifest["kind"] == "PodGroup":
                raise kube.ApiError(
                    404,
                    "NotFound",
                    f"{manifest['apiVersion']} {manifest['kind']} is not served by this cluster: install or "
                    "enable that gang scheduler's API, or change spec.gangScheduling",
                ) from exc
            if exc.invalid:
                raise InvalidChildError(manifest, exc.message) from exc
            raise

    def _with_priority(self, workload: dict[str, Any]) -> dict[str, Any]:
        """The Workload with spec.priority, the value of the class its priorityClassRef names (a read
        only for jobs that name one, once per TrainingJob), as Kueue's integrations set it."""
        ref = workload["spec"].get("priorityClassRef")
        if ref is None:
            return workload
        url = (
            f"/apis/{constants.KUEUE_API}/workloadpriorityclasses/{ref['name']}"
            if ref["kind"] == "WorkloadPriorityClass"
            else f"/apis/scheduling.k8s.io/v1/priorityclasses/{ref['name']}"
        )
        try:
            value = self.kube.request("GET", url).get("value", 0)
        except kube.ApiError as exc:
            if exc.not_found:
                raise kube.ApiError(404, "NotFound", f"{ref['kind']} {ref['name']} does not exist") from exc
            raise
        return {**workload, "spec": {**workload["spec"], "priority": value}}

    def _existing(self, manifest: dict[str, Any], exc: kube.ApiError) -> dict[str, Any]:
        meta = manifest["metadata"]
        existing = self.kube.get(
            manifest["kind"], meta["namespace"], meta["name"], manifest.get("apiVersion")
        )
        owner = observe.controller_uid(manifest)
        if existing is not None and owner and observe.controlled_by(existing, owner):
            return existing
        holder = "is being deleted"
        if existing is not None:
            controller = observe.controller_uid(existing) or "nothing"
            holder = f"is controlled by {controller}, not by this TrainingJob ({owner})"
        raise kube.ApiError(
            409, "AlreadyExists", f"{manifest['kind']} {meta['name']} already exists and {holder}", exc.body
        ) from exc

    def _report_failed_create(self, body: dict[str, Any], plan: plans.Plan, exc: kube.ApiError) -> None:
        """Record why creating children failed, guarded like every status write by the version the plan
        was made from (a refused write is dropped: the retry plans again from the newer version)."""
        meta = body["metadata"]
        message = f"cannot create worker objects: {exc.status} {exc.reason}: {exc.message}"
        if plan.status.get("pendingMessage") == message:
            return
        status = {
            **st.children_not_created(plan.status, body.get("status") or {}),
            "pendingReason": "FailedCreate",
            "pendingMessage": message,
        }
        try:
            written = self.kube.patch_status(
                meta["namespace"], meta["name"], status, meta.get("resourceVersion")
            )
            self.cache.observe(written)
        except kube.ApiError as patch_error:
            logger.warning(
                "could not record FailedCreate on %s/%s: %s", meta["namespace"], meta["name"], patch_error
            )
            return
        self._event((meta["namespace"], meta["name"]), body, "Warning", "FailedCreate", message)

    def _status_refused(self, body: dict[str, Any], plan: plans.Plan, exc: kube.ApiError) -> str:
        """The API server refuses to store any status for this TrainingJob (422): its stored spec no longer
        passes the CRD's rules (written before a schema change, e.g. a value of the wrong type in a field
        with a transition rule, which cannot even be evaluated). Retrying cannot help until someone edits
        the object, which arrives as an update event: say what is wrong in a Warning event, once, and stop
        (nothing is rescheduled, and until the object's resourceVersion changes no reconcile of it writes
        or says anything again)."""
        meta = body["metadata"]
        verdict = planner.refusal_verdict(plan.status)
        if verdict is not None:  # the operator refuses the spec too: say why, naming the field
            reason = verdict["reason"]
            message = f"{verdict.get('message')} (the API server refuses to store status: {exc.message})"
        else:
            reason = "StatusRefused"
            message = f"the API server refuses to store this TrainingJob's status: {exc.message}"
        key = (meta["namespace"], meta["name"])
        logger.warning("%s/%s: %s: %s", *key, reason, message, extra=about(key, body))
        self._event((meta["namespace"], meta["name"]), body, "Warning", reason, message)
        return message

    def _fail_invalid(self, body: dict[str, Any], plan: plans.Plan, message: str) -> str | None:
        """Fail the job whose child the API server refused (422): the message, or None when the
        TrainingJob changed since the plan was made (the verdict is then planned again from the news)."""
        meta = body["metadata"]
        status = st.children_not_created(plan.status, body.get("status") or {})
        now = self.clock()
        st.enter_phase(status, "Failed", "InvalidSpec", message, now)
        status["completionTime"] = st.timestamp(now)
        try:
            written = self.kube.patch_status(
                meta["namespace"], meta["name"], status, meta.get("resourceVersion")
            )
        except kube.ApiError as exc:
            if not exc.conflict:
                raise
            plan.requeue_after = CONFLICT_RETRY
            return None
        self.cache.observe(written)
        self._event((meta["namespace"], meta["name"]), body, "Warning", "InvalidSpec", message)
        self.metrics.record(meta["namespace"], ["failed"])
        return message

    def _event(self, key: Key, body: dict[str, Any] | None, type_: str, reason: str, message: str) -> None:
        uid = (body or {}).get("metadata", {}).get("uid")
        now = st.timestamp(self.clock())
        event = events.build_event(*key, uid=uid, type_=type_, reason=reason, message=message, timestamp=now)
        self.post_event(event)

    def _post_event_now(self, event: dict[str, Any]) -> None:
        try:
            self.kube.create(event)
        except Exception as exc:  # events are best effort: never fail a reconcile for one
            about = event["involvedObject"]["name"]
            logger.info("could not post event %s on %s: %s", event["reason"], about, exc)
