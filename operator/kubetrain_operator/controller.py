"""The controller: executes reconcile plans against the API, one TrainingJob at a time.

kopf delivers events (TrainingJob changes, child Job and Pod events); the controller turns each into a
`trigger(namespace, name)`. Triggers for one TrainingJob coalesce: while a reconcile of it runs, further
triggers only mark it dirty and the running thread reconciles once more, so one job never has two
reconciles in flight and bursts of pod events cost one pass. A small scheduler thread re-triggers jobs
when a plan asks (deadline, TTL, waiting for deletions, periodic resync) and after errors, with capped
exponential backoff.

Executing a plan: status patch first (guarded by the resourceVersion read, so a concurrent change makes
us re-read instead of overwriting), then deletions, then creations (409 AlreadyExists is success: names
are deterministic, so a retry or a restarted operator never creates a duplicate), then events.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubetrain_operator import builders, constants, kube, names, reconcile
from kubetrain_operator import status as st
from kubetrain_operator.metrics import Metrics

logger = logging.getLogger("kubetrain.operator")

Key = tuple[str, str]
"""(namespace, name) of a TrainingJob."""

GANG_APIS = {
    "volcano": constants.VOLCANO_PODGROUP_API,
    "scheduler-plugins": constants.COSCHEDULING_PODGROUP_API,
}

ERROR_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
"""Delays before re-running a reconcile that failed: the k-th consecutive error waits ERROR_BACKOFF[k]."""
ERROR_EVENT_AFTER = 5
"""Consecutive failed reconciles after which a Warning event tells the user the operator is stuck."""


@dataclasses.dataclass
class Outcome:
    """What one reconcile did, for the kopf handlers and tests."""

    plan: reconcile.Plan | None = None
    invalid: str | None = None
    """A message when the TrainingJob cannot be run as specified (kopf.PermanentError)."""
    gone: bool = False


class InvalidChildError(Exception):
    """The API server refused a child built from the spec (422): the spec cannot work."""


def utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@dataclasses.dataclass
class _KeyState:
    running: bool = False
    dirty: bool = False
    errors: int = 0


class Controller:
    def __init__(
        self,
        client: kube.Kube,
        defaults: reconcile.Defaults | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], datetime] = utcnow,
        scheduler_workers: int = 4,
    ) -> None:
        self.kube = client
        self.defaults = defaults or reconcile.Defaults()
        self.metrics = metrics or Metrics.create()
        self.clock = clock
        self._lock = threading.Lock()
        self._keys: dict[Key, _KeyState] = {}
        self._active: dict[Key, bool] = {}
        self._heap: list[tuple[float, Key]] = []
        self._due: dict[Key, float] = {}
        self._wake = threading.Condition(self._lock)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=scheduler_workers, thread_name_prefix="kubetrain-requeue")

    # ------------------------------------------------------------ triggering

    def trigger(self, namespace: str, name: str) -> Outcome | None:
        """Reconcile now in this thread, or mark dirty if another thread is at it. Never raises."""
        key = (namespace, name)
        with self._lock:
            state = self._keys.setdefault(key, _KeyState())
            if state.running:
                state.dirty = True
                return None
            state.running = True
        outcome: Outcome | None = None
        try:
            while True:
                with self._lock:
                    state.dirty = False
                outcome = self._reconcile_guarded(key, state)
                with self._lock:
                    if not state.dirty:
                        state.running = False
                        if outcome is not None and outcome.gone:
                            self._keys.pop(key, None)
                        break
        except BaseException:
            with self._lock:
                state.running = False
            raise
        return outcome

    def _reconcile_guarded(self, key: Key, state: _KeyState) -> Outcome | None:
        started = time.monotonic()
        try:
            outcome = self.reconcile(*key)
        except Exception as exc:
            self.metrics.reconcile_errors.inc()
            delay = ERROR_BACKOFF[min(state.errors, len(ERROR_BACKOFF) - 1)]
            state.errors += 1
            logger.warning("reconcile of %s/%s failed (%s); retrying in %.0fs", *key, exc, delay)
            if state.errors == ERROR_EVENT_AFTER:
                self._post_event_safely(
                    key, "Warning", "ReconcileError", f"the operator keeps failing: {exc}"
                )
            self.schedule(key, delay)
            return None
        finally:
            self.metrics.reconcile_seconds.observe(time.monotonic() - started)
        state.errors = 0
        if outcome.plan is not None and outcome.plan.requeue_after is not None:
            self.schedule(key, outcome.plan.requeue_after)
        return outcome

    def schedule(self, key: Key, delay: float) -> None:
        """Trigger `key` again after `delay` seconds (from the scheduler's threads).

        At most one pending wake-up per job: a later request than the pending one is dropped (the earlier
        reconcile asks again for what it still needs), an earlier one replaces it.
        """
        due = time.monotonic() + max(0.0, delay)
        with self._lock:
            pending = self._due.get(key)
            if pending is not None and pending <= due:
                return
            self._due[key] = due
            heapq.heappush(self._heap, (due, key))
            self._wake.notify()

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._active.pop((namespace, name), None)
            self.metrics.active.set(sum(self._active.values()))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_scheduler, name="kubetrain-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
        if self._thread:
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run_scheduler(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and (not self._heap or self._heap[0][0] > time.monotonic()):
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._wake.wait(timeout=timeout)
                if self._stopping:
                    return
                due: set[Key] = set()
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    when, key = heapq.heappop(self._heap)
                    if self._due.get(key) == when:  # else superseded by an earlier wake-up
                        del self._due[key]
                        due.add(key)
            for key in due:
                self._pool.submit(self.trigger, *key)

    # ------------------------------------------------------------ one reconcile

    def reconcile(self, namespace: str, name: str) -> Outcome:
        """Read the TrainingJob and its children, plan, execute. Raises on API errors (retried)."""
        body = self.kube.get(constants.KIND, namespace, name)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            self.forget(namespace, name)
            return Outcome(gone=True)
        selector = f"{constants.LABEL_JOB_NAME}={builders.selector_labels(name)[constants.LABEL_JOB_NAME]}"
        service = self.kube.get("Service", namespace, names.service_name(name))
        jobs = self.kube.list("Job", namespace, selector)
        pods = self.kube.list("Pod", namespace, selector)
        pod_group = None
        gang = (body.get("spec") or {}).get("gangScheduling") or {}
        if gang.get("provider") in GANG_APIS:
            pod_group = self.kube.get(
                "PodGroup", namespace, names.service_name(name), api_version=GANG_APIS[gang["provider"]]
            )
        observed = reconcile.Observed.from_objects(
            body, service=service, jobs=jobs, pods=pods, pod_group=pod_group
        )
        plan = reconcile.plan(observed, self.clock(), self.defaults)
        outcome = Outcome(plan=plan)
        rv = body.get("metadata", {}).get("resourceVersion")
        if plan.status_changed(body.get("status") or {}):
            try:
                self.kube.patch_status(namespace, name, plan.status, rv)
            except kube.ApiError as exc:
                if exc.conflict:  # changed since we read it: read again soon, decide again
                    plan.requeue_after = 0.2
                    return outcome
                if exc.not_found:
                    return Outcome(gone=True)
                if exc.invalid:  # the API server refuses any write to this object: retrying cannot help
                    outcome.invalid = self._status_refused(body, plan, exc)
                    return outcome
                raise
        for deletion in plan.delete:
            self.kube.delete(deletion.kind, namespace, deletion.name, deletion.propagation)
        try:
            for manifest in plan.create:
                self._create(manifest)
        except InvalidChildError as exc:
            outcome.invalid = self._fail_invalid(body, plan, str(exc))
        except kube.ApiError as exc:
            # Quota exceeded, forbidden, server trouble: say so in status (a job must never look fine
            # while nothing can be created), then let the error schedule a retry with backoff.
            self._report_failed_create(body, plan, exc)
            raise
        for event in plan.events:
            logger.info("%s/%s: %s: %s", namespace, name, event.reason, event.message)
            self._post_event_safely((namespace, name), event.type, event.reason, event.message, body)
        if plan.delete_self:
            self.kube.delete(constants.KIND, namespace, name, "Background")
        if outcome.invalid is None and plan.status.get("phase") == "Failed":
            reason = (st.get_condition(plan.status, "Failed") or {}).get("reason")
            if reason == "InvalidSpec":
                outcome.invalid = plan.status.get("message")
        self.metrics.record(namespace, plan.transitions)
        phase = plan.status.get("phase")
        with self._lock:
            self._active[(namespace, name)] = phase not in ("Succeeded", "Failed", "Suspended")
            self.metrics.active.set(sum(self._active.values()))
        return outcome

    def _create(self, manifest: dict[str, Any]) -> None:
        try:
            self.kube.create(manifest)
        except kube.ApiError as exc:
            if exc.conflict:
                return  # already exists: created by an earlier (maybe killed) reconcile
            if exc.not_found and manifest["kind"] not in ("Job", "Service", "Event"):
                raise kube.ApiError(
                    404,
                    "NotFound",
                    f"{manifest['apiVersion']} {manifest['kind']} is not served by this cluster: install the "
                    "gang scheduler's CRDs or remove spec.gangScheduling",
                ) from exc
            if exc.invalid:
                raise InvalidChildError(
                    f"the API server refused {manifest['kind']} {manifest['metadata']['name']}: {exc.message}"
                ) from exc
            raise

    def _report_failed_create(self, body: dict[str, Any], plan: reconcile.Plan, exc: kube.ApiError) -> None:
        meta = body["metadata"]
        message = f"cannot create worker objects: {exc.status} {exc.reason}: {exc.message}"
        if plan.status.get("pendingMessage") == message:
            return
        status = {**plan.status, "pendingReason": "FailedCreate", "pendingMessage": message}
        try:
            self.kube.patch_status(meta["namespace"], meta["name"], status, None)
        except kube.ApiError as patch_error:
            logger.warning(
                "could not record FailedCreate on %s/%s: %s", meta["namespace"], meta["name"], patch_error
            )
            return
        self._post_event_safely((meta["namespace"], meta["name"]), "Warning", "FailedCreate", message, body)

    def _status_refused(self, body: dict[str, Any], plan: reconcile.Plan, exc: kube.ApiError) -> str:
        """The API server refuses to store any status for this TrainingJob (422): its stored spec no longer
        passes the CRD's rules (written before a schema change, e.g. a value of the wrong type in a field
        with a transition rule, which cannot even be evaluated). Retrying cannot help until someone edits
        the object, which arrives as an update event: say what is wrong in a Warning event and stop (the
        kopf handler raises PermanentError; nothing is rescheduled)."""
        meta = body["metadata"]
        failed = st.get_condition(plan.status, "Failed") or {}
        if plan.status.get("phase") == "Failed" and failed.get("reason") == "InvalidSpec":
            reason = "InvalidSpec"
            message = f"{plan.status.get('message')} (the API server refuses to store status: {exc.message})"
        else:
            reason = "StatusRefused"
            message = f"the API server refuses to store this TrainingJob's status: {exc.message}"
        logger.warning("%s/%s: %s: %s", meta["namespace"], meta["name"], reason, message)
        self._post_event_safely((meta["namespace"], meta["name"]), "Warning", reason, message, body)
        return message

    def _fail_invalid(self, body: dict[str, Any], plan: reconcile.Plan, message: str) -> str:
        meta = body["metadata"]
        status = dict(plan.status)
        now = self.clock()
        st.enter_phase(status, "Failed", "InvalidSpec", message, now)
        status["completionTime"] = st.timestamp(now)
        self.kube.patch_status(meta["namespace"], meta["name"], status, None)
        self._post_event_safely((meta["namespace"], meta["name"]), "Warning", "InvalidSpec", message, body)
        self.metrics.record(meta["namespace"], ["failed"])
        return message

    def _post_event_safely(
        self, key: Key, type_: str, reason: str, message: str, body: dict[str, Any] | None = None
    ) -> None:
        namespace, name = key
        now = st.timestamp(self.clock())
        uid = (body or {}).get("metadata", {}).get("uid")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name[:200]}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": constants.API_VERSION,
                "kind": constants.KIND,
                "name": name,
                "namespace": namespace,
                **({"uid": uid} if uid else {}),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": constants.FIELD_MANAGER},
            "reportingComponent": f"{constants.GROUP}/operator",
            "reportingInstance": constants.FIELD_MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.kube.create(event)
        except Exception as exc:  # events are best effort: never fail a reconcile for one
            logger.info("could not post event %s on %s/%s: %s", reason, namespace, name, exc)
