"""The kopf shell for TrainingJobs: feed the cache, wake the controller. No decisions, no API calls.

- An index handler (`@kopf.index`) puts every listed, added or modified TrainingJob into the
  `ClusterCache`. It returns nothing, so kopf stores nothing itself; it is an index handler for kopf's
  guarantee that no other handler runs before the initial listing has been indexed.
- An event handler (`@kopf.on.event`) drops deleted TrainingJobs and enqueues the others, urgently when
  new or changed (someone is waiting for workers).

Both are async and return at once (no executor thread per event). No create/update/resume handlers:
the controller is level-based and needs no kopf change detection, so kopf writes nothing on the
TrainingJob (no last-handled-configuration or progress annotations) and needs no finalizer, and it is
given storages that keep nothing (`NoEssence`, `NoProgress`): kopf still computes every event's essence
and diff for change handlers, which a profile of 500 jobs (benchmarks/peers.py under py-spy) found to
be about 6% of the operator's CPU, for handlers this operator does not have. Children
carry ownerReferences and the garbage collector removes them, so deleting a TrainingJob never hangs
while the operator is down. The children themselves are watched by the `informer` threads, not kopf.
"""

from __future__ import annotations

from typing import Any

import kopf

from kubetrain_operator.api import constants
from kubetrain_operator.runtime.cache import ClusterCache
from kubetrain_operator.runtime.controller import Controller


class NoEssence(kopf.DiffBaseStorage):
    """kopf's diff base for change handlers, of which there are none: nothing is copied, nothing is kept."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: Any) -> None:
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        return None


class NoProgress(kopf.ProgressStorage):
    """kopf's record of change handlers' progress, of which there is none to record."""

    def fetch(self, *, key: Any, body: Any) -> None:
        return None

    def store(self, *, key: Any, record: Any, body: Any, patch: Any) -> None:
        return None

    def purge(self, *, key: Any, body: Any, patch: Any) -> None:
        return None

    def touch(self, *, body: Any, patch: Any, value: str | None) -> None:
        return None

    def clear(self, *, essence: Any) -> Any:
        return essence


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
