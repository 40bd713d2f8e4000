"""The kopf shell: feed the cache, wake the controller. No decisions and no API calls here.

Four watched kinds: TrainingJobs, and the Services, batch Jobs and Pods labelled kubetrain.io/job-name
(the label is a server-side watch selector, so the operator never lists unrelated pods).

- Index handlers (`@kopf.index`) put every listed, added or modified object into the `ClusterCache`.
  They return nothing, so kopf stores nothing itself; they are index handlers for kopf's guarantee that
  no other handler runs before every watched kind's initial listing has been indexed: the controller
  never plans from a half-filled cache.
- Event handlers (`@kopf.on.event`) drop deleted objects from the cache and enqueue the TrainingJob
  concerned: at once for a TrainingJob's own event (urgent when it is new or its spec changed), half a
  second later for a child's, so a group's burst of Job and Pod events shares one reconcile.

All are async and return at once (no executor thread per event). No create/update/resume handlers:
the controller is level-based and needs no kopf change detection, so kopf writes nothing on the
TrainingJob (no last-handled-configuration or progress annotations) and needs no finalizer. Children
carry ownerReferences and the garbage collector removes them, so deleting a TrainingJob never hangs
while the operator is down. Time-based work (deadlines, TTL, resync) runs in the controller's scheduler.
"""

from __future__ import annotations

from typing import Any

import kopf

from kubetrain_operator import constants
from kubetrain_operator.cache import ClusterCache, owner_name
from kubetrain_operator.controller import Controller

CHILD_EVENT_DELAY = 0.5
"""Seconds between a child's event and the reconcile it asks for. A group's Jobs and pods change in bursts
(created, scheduled, running, finished: dozens of events per TrainingJob); every event of one job within
this window shares one reconcile (the controller keeps one pending wake-up per job)."""

CHILD_RESOURCES = (("", "v1", "services"), ("batch", "v1", "jobs"), ("", "v1", "pods"))


def _cache(memo: Any) -> ClusterCache:
    return memo["cache"]


def _controller(memo: Any) -> Controller:
    return memo["controller"]


def needs_workers(body: Any) -> bool:
    """A TrainingJob someone is waiting on: never reconciled, or its spec changed since."""
    status = body.get("status") or {}
    generation = (body.get("metadata") or {}).get("generation")
    return not status.get("phase") or status.get("observedGeneration") != generation


@kopf.index(constants.GROUP, constants.VERSION, constants.PLURAL)
async def cache_trainingjob(memo: Any, body: Any, **_: Any) -> None:
    _cache(memo).observe(body)


@kopf.on.event(constants.GROUP, constants.VERSION, constants.PLURAL)
async def trainingjob_event(memo: Any, type: str | None, body: Any, **_: Any) -> None:
    if type == "DELETED":
        key = _cache(memo).forget(body)
        if key is not None:
            _controller(memo).forget(*key)
        return
    meta = body.get("metadata") or {}
    _controller(memo).enqueue((meta["namespace"], meta["name"]), urgent=needs_workers(body))


def _child_event(memo: Any, type: str | None, body: Any) -> None:
    if type == "DELETED":
        key = _cache(memo).forget(body)
    else:  # already cached by the index handler
        owner, namespace = owner_name(body), (body.get("metadata") or {}).get("namespace")
        key = (namespace, owner) if owner and namespace else None
    if key is not None:
        _controller(memo).schedule(key, CHILD_EVENT_DELAY)


def _register_child_handlers(group: str, version: str, plural: str) -> None:
    labels = {constants.LABEL_JOB_NAME: kopf.PRESENT}

    @kopf.index(group, version, plural, labels=labels, id=f"cache_{plural}")
    async def cache_child(memo: Any, body: Any, **_: Any) -> None:
        _cache(memo).observe(body)

    @kopf.on.event(group, version, plural, labels=labels, id=f"{plural}_event")
    async def child_event(memo: Any, type: str | None, body: Any, **_: Any) -> None:
        _child_event(memo, type, body)


for _resource in CHILD_RESOURCES:
    _register_child_handlers(*_resource)
