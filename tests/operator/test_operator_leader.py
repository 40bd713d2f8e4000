"""Lease-based leader election: one leader, takeover after expiry, conflicts lose, clean release."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubetrain_operator import kube, leader

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class FakeLeases:
    """Just enough of the API for Leases, with resourceVersion checks like the real server."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.rv = 0

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.lease)

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if self.lease is not None:
            raise kube.ApiError(409, "AlreadyExists", "exists")
        return self._store(manifest)

    def replace(self, manifest: dict[str, Any]) -> dict[str, Any]:
        assert self.lease is not None
        if manifest["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise kube.ApiError(409, "Conflict", "the object has been modified")
        return self._store(manifest)

    def _store(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        self.lease = copy.deepcopy(manifest)
        self.lease["metadata"]["resourceVersion"] = str(self.rv)
        return self.lease


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def _elector(api: FakeLeases, clock: Clock, identity: str) -> leader.LeaderElector:
    return leader.LeaderElector(api, "ops", identity, lease_seconds=15, renew_seconds=5, clock=clock)  # type: ignore[arg-type]


def test_first_replica_creates_and_holds_the_lease() -> None:
    api, clock = FakeLeases(), Clock()
    a = _elector(api, clock, "a")
    assert a.try_acquire_or_renew()
    assert api.lease is not None and api.lease["spec"]["holderIdentity"] == "a"
    assert api.lease["spec"]["leaseDurationSeconds"] == 15


def test_a_held_lease_keeps_others_standing_by_until_it_expires() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = _elector(api, clock, "a"), _elector(api, clock, "b")
    assert a.try_acquire_or_renew()
    clock.now += timedelta(seconds=10)
    assert not b.try_acquire_or_renew()
    assert a.try_acquire_or_renew()  # renewal
    clock.now += timedelta(seconds=14)
    assert not b.try_acquire_or_renew()
    clock.now += timedelta(seconds=2)  # a stopped renewing 16 s ago
    assert b.try_acquire_or_renew()
    assert api.lease is not None
    assert api.lease["spec"]["holderIdentity"] == "b"
    assert api.lease["spec"]["leaseTransitions"] == 1
    assert a.lost()
    assert not a.try_acquire_or_renew()


def test_of_two_racing_replicas_only_one_wins() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = _elector(api, clock, "a"), _elector(api, clock, "b")
    assert a.try_acquire_or_renew()
    clock.now += timedelta(seconds=60)  # expired: both see it free
    stale = api.get("Lease", "ops", "kubetrain-operator")
    assert b.try_acquire_or_renew()
    api.get = lambda *args: copy.deepcopy(stale)  # type: ignore[method-assign]  # a read before b wrote
    assert not a.try_acquire_or_renew()


def test_release_hands_over_at_once() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = _elector(api, clock, "a"), _elector(api, clock, "b")
    assert a.try_acquire_or_renew()
    a.release()
    assert b.try_acquire_or_renew()


@pytest.mark.parametrize(
    ("spec", "free"),
    [
        ({}, True),
        ({"holderIdentity": ""}, True),
        ({"holderIdentity": "me", "renewTime": "2026-01-01T00:00:00.000000Z"}, True),
        (
            {"holderIdentity": "x", "renewTime": "2026-01-01T00:00:00.000000Z", "leaseDurationSeconds": 15},
            False,
        ),
        (
            {"holderIdentity": "x", "renewTime": "2025-12-31T23:59:00.000000Z", "leaseDurationSeconds": 15},
            True,
        ),
        ({"holderIdentity": "x"}, True),
    ],
)
def test_when_a_lease_is_free(spec: dict[str, Any], free: bool) -> None:
    assert leader.is_free(spec, "me", T0 + timedelta(seconds=5)) is free
