"""The kopf shell: event routing only. All decisions live in `reconcile`, all API calls in `controller`.

- TrainingJob create/resume/update (spec changes, and every job once per operator start) -> reconcile.
  These handlers are sync (kopf runs them in its thread pool), retried a bounded number of times, and
  raise kopf.PermanentError for a TrainingJob that cannot run as specified (its status already says
  Failed with reason InvalidSpec and the field).
- Events of batch Jobs and Pods labelled kubetrain.io/job-name -> reconcile their TrainingJob half a second
  later (one reconcile per burst, in the controller's scheduler threads), so status follows the workers
  promptly. The label is also a server-side watch selector, so the operator never
  lists unrelated pods.

No handler needs a finalizer (no delete handlers, no timers or daemons): children carry ownerReferences
and the garbage collector removes them, so deleting a TrainingJob never hangs while the operator is down.
Time-based work (deadlines, TTL, resync) runs in the controller's own scheduler instead of kopf timers,
because kopf timers put a finalizer on every object.
"""

from __future__ import annotations

from typing import Any

import kopf

from kubetrain_operator import constants
from kubetrain_operator.controller import Controller

HANDLER_RETRIES = 5
HANDLER_BACKOFF = 5.0


def _controller(memo: Any) -> Controller:
    return memo["controller"] if isinstance(memo, dict) else memo.controller


def _reconcile_trainingjob(memo: Any, namespace: str, name: str) -> None:
    outcome = _controller(memo).trigger(namespace, name)
    if outcome is not None and outcome.invalid:
        raise kopf.PermanentError(outcome.invalid)


@kopf.on.create(
    constants.GROUP, constants.VERSION, constants.PLURAL, retries=HANDLER_RETRIES, backoff=HANDLER_BACKOFF
)
def trainingjob_created(memo: Any, namespace: str, name: str, **_: Any) -> None:
    _reconcile_trainingjob(memo, namespace, name)


@kopf.on.resume(
    constants.GROUP, constants.VERSION, constants.PLURAL, retries=HANDLER_RETRIES, backoff=HANDLER_BACKOFF
)
def trainingjob_resumed(memo: Any, namespace: str, name: str, **_: Any) -> None:
    _reconcile_trainingjob(memo, namespace, name)


@kopf.on.update(
    constants.GROUP, constants.VERSION, constants.PLURAL, retries=HANDLER_RETRIES, backoff=HANDLER_BACKOFF
)
def trainingjob_updated(memo: Any, namespace: str, name: str, **_: Any) -> None:
    _reconcile_trainingjob(memo, namespace, name)


def owner_name(body: Any) -> str | None:
    """The TrainingJob a Job or Pod belongs to: the Job's controller reference, else the pod annotation."""
    meta = body.get("metadata", {})
    for ref in meta.get("ownerReferences") or ():
        if ref.get("kind") == constants.KIND and ref.get("apiVersion", "").startswith(constants.GROUP + "/"):
            return ref.get("name")
    annotations = meta.get("annotations") or {}
    if constants.ANNOTATION_JOB_NAME in annotations:
        return annotations[constants.ANNOTATION_JOB_NAME]
    return (meta.get("labels") or {}).get(constants.LABEL_JOB_NAME)


CHILD_EVENT_DELAY = 0.5
"""Seconds between a child's event and the reconcile it asks for. A group's Jobs and pods change in bursts
(created, scheduled, running, finished: dozens of events per TrainingJob); every event of one job within
this window shares one reconcile (the scheduler keeps one pending wake-up per job), instead of each
taking a thread of kopf's pool for four reads, ahead of new TrainingJobs waiting for their workers."""


def _child_event(memo: Any, body: Any, namespace: str | None) -> None:
    owner = owner_name(body)
    if owner and namespace:
        _controller(memo).schedule((namespace, owner), CHILD_EVENT_DELAY)


# Async on purpose: they only note a wake-up (no API call, no blocking), so they need no executor thread.
@kopf.on.event("batch", "v1", "jobs", labels={constants.LABEL_JOB_NAME: kopf.PRESENT})
async def worker_job_event(memo: Any, body: Any, namespace: str | None, **_: Any) -> None:
    _child_event(memo, body, namespace)


@kopf.on.event("", "v1", "pods", labels={constants.LABEL_JOB_NAME: kopf.PRESENT})
async def worker_pod_event(memo: Any, body: Any, namespace: str | None, **_: Any) -> None:
    _child_event(memo, body, namespace)
