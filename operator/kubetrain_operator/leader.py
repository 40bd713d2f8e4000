"""Lease-based leader election (coordination.k8s.io/v1 Lease), the Kubernetes way to run HA replicas.

kopf's peering pauses every replica whose priority is not the highest, so equal priorities pause them all,
and it pauses only kopf's own watches: the operator's scheduler thread would keep reconciling in a paused
replica. A Lease avoids both: a replica runs nothing (no kopf, no scheduler) until it holds the Lease,
renews it every `renew_seconds`, and exits the process if it cannot renew within `lease_seconds` so two
replicas never act at once (its Deployment restarts it as a standby). A replica shutting down cleanly
releases the Lease, so a rolling update hands over at once instead of after `lease_seconds`.

All writes carry the Lease's resourceVersion: of two replicas racing for a free Lease, one wins and the
other gets 409 Conflict and stays standby.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from kubetrain_operator import kube

logger = logging.getLogger("kubetrain.operator")

DEFAULT_LEASE_NAME = "kubetrain-operator"


def micro_time(now: datetime) -> str:
    """Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def is_free(spec: dict[str, Any], identity: str, now: datetime) -> bool:
    """Whether `identity` may take (or keep) the Lease: unheld, held by itself, or expired."""
    holder = spec.get("holderIdentity")
    if not holder or holder == identity:
        return True
    renewed = parse_micro_time(spec.get("renewTime") or spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds") or 15
    return renewed is None or now > renewed + timedelta(seconds=duration)


class LeaderElector:
    def __init__(
        self,
        client: kube.Kube,
        namespace: str,
        identity: str,
        *,
        name: str = DEFAULT_LEASE_NAME,
        lease_seconds: int = 15,
        renew_seconds: float = 5.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.clock = clock
        self._stop = threading.Event()
        self._last_renewal: datetime | None = None

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards."""
        now = self.clock()
        lease = self.kube.get("Lease", self.namespace, self.name)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": self.lease_seconds,
                    "acquireTime": micro_time(now),
                    "renewTime": micro_time(now),
                    "leaseTransitions": 0,
                },
            }
            return self._write(self.kube.create, body, now)
        spec = dict(lease.get("spec") or {})
        if not is_free(spec, self.identity, now):
            return False
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = micro_time(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            logger.info("acquiring Lease %s/%s as %s", self.namespace, self.name, self.identity)
        spec.update(
            holderIdentity=self.identity, renewTime=micro_time(now), leaseDurationSeconds=self.lease_seconds
        )
        return self._write(self.kube.replace, {**lease, "spec": spec}, now)

    def _write(self, call: Callable[[dict[str, Any]], Any], body: dict[str, Any], now: datetime) -> bool:
        try:
            call(body)
        except kube.ApiError as exc:
            if exc.conflict:
                return False  # another replica wrote first
            raise
        self._last_renewal = now
        return True

    def wait_for_leadership(self) -> bool:
        """Block until this replica holds the Lease (True) or `stop()` was called (False)."""
        announced = False
        while not self._stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    logger.info("leading as %s (Lease %s/%s)", self.identity, self.namespace, self.name)
                    return True
            except Exception as exc:
                logger.warning("leader election failed, retrying: %s", exc)
            if not announced:
                logger.info("standing by: Lease %s/%s is held by another replica", self.namespace, self.name)
                announced = True
            self._stop.wait(self.renew_seconds)
        return False

    def lost(self) -> bool:
        """Whether the last successful renewal is older than the lease: another replica may lead now."""
        if self._last_renewal is None:
            return True
        return self.clock() - self._last_renewal >= timedelta(seconds=self.lease_seconds)

    def keep_renewing(self, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew in a daemon thread; call `on_lost` (which should end the process) when leadership is gone."""

        def loop() -> None:
            while not self._stop.wait(self.renew_seconds):
                try:
                    renewed = self.try_acquire_or_renew()
                except Exception as exc:
                    logger.warning("cannot renew Lease %s/%s: %s", self.namespace, self.name, exc)
                    renewed = False
                if not renewed and self.lost():
                    logger.error(
                        "lost Lease %s/%s: stopping so that only one replica acts", self.namespace, self.name
                    )
                    on_lost()
                    return

        thread = threading.Thread(target=loop, name="kubetrain-leader", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Give the Lease up on a clean shutdown so a standby takes over at once."""
        self._stop.set()
        try:
            lease = self.kube.get("Lease", self.namespace, self.name)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1}
                self.kube.replace({**lease, "spec": spec})
        except Exception as exc:
            logger.info("could not release Lease %s/%s: %s", self.namespace, self.name, exc)

    def stop(self) -> None:
        self._stop.set()
