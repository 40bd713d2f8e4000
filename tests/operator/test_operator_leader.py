"""Lease-based leader election: expiry judged by observed time, a renew deadline shorter than the lease,
writes fenced by that deadline, conflicts lose, clean release."""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubetrain_operator.runtime import kube, leader
from kubetrain_operator.runtime.leader import Decision, Observation, Timing

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TIMING = Timing(lease_seconds=15, renew_deadline=10, retry_period=2)


class FakeLeases:
    """Just enough of the API for Leases, with resourceVersion checks like the real server. `down` makes
    every request fail as an unreachable server would; `timeouts` records each request's timeout."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.rv = 0
        self.down = False
        self.timeouts: list[float | None] = []

    def get(
        self, kind: str, namespace: str, name: str, timeout: float | None = None
    ) -> dict[str, Any] | None:
        self._request(timeout)
        return copy.deepcopy(self.lease)

    def create(self, manifest: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        self._request(timeout)
        if self.lease is not None:
            raise kube.ApiError(409, "AlreadyExists", "exists")
        return self._store(manifest)

    def replace(self, manifest: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        self._request(timeout)
        assert self.lease is not None
        if manifest["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise kube.ApiError(409, "Conflict", "the object has been modified")
        return self._store(manifest)

    def _request(self, timeout: float | None) -> None:
        self.timeouts.append(timeout)
        if self.down:
            raise kube.ApiError(0, "Timeout", "no answer")

    def _store(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        self.lease = copy.deepcopy(manifest)
        self.lease["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(self.lease)


class Replica:
    """One replica's clocks: a monotonic one (seconds since its start) and a wall clock that may be off."""

    def __init__(self, wall_offset: timedelta = timedelta()) -> None:
        self.mono = 1000.0
        self.wall_offset = wall_offset

    def monotonic(self) -> float:
        return self.mono

    def wall(self) -> datetime:
        return T0 + self.wall_offset + timedelta(seconds=self.mono - 1000.0)


def _elector(api: FakeLeases, replica: Replica, identity: str) -> leader.LeaderElector:
    return leader.LeaderElector(
        api,  # type: ignore[arg-type]
        "ops",
        identity,
        timing=TIMING,
        monotonic=replica.monotonic,
        wall_clock=replica.wall,
    )


def _advance(seconds: float, *replicas: Replica) -> None:
    for replica in replicas:
        replica.mono += seconds


def _held(holder: str, renew: str = "2026-01-01T00:00:00.000000Z", duration: int = 15) -> dict[str, Any]:
    return {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": duration}


# ---------------------------------------------------------------- the pure core


@pytest.mark.parametrize(
    ("case", "spec", "seen_at", "now", "expected"),
    [
        ("never held", {}, 0.0, 0.0, Decision.ACQUIRE),
        ("released", {"holderIdentity": "", "leaseDurationSeconds": 1}, 0.0, 0.0, Decision.ACQUIRE),
        ("ours", _held("me"), 0.0, 100.0, Decision.RENEW),
        ("another's, changed 14.9 s ago", _held("x"), 0.0, 14.9, Decision.WAIT),
        ("another's, unchanged for its duration", _held("x"), 0.0, 15.0, Decision.ACQUIRE),
        ("another's, renewTime a day old, changed just now", _held("x", "2025-12-31T00:00:00Z"), 50.0, 50.0,
         Decision.WAIT),
        ("another's, renewTime in the future, unchanged 15 s", _held("x", "2027-01-01T00:00:00Z"), 0.0, 15.0,
         Decision.ACQUIRE),
        ("another's 60 s lease, unchanged 59 s", _held("x", duration=60), 0.0, 59.0, Decision.WAIT),
        ("another's without a duration: the default", {"holderIdentity": "x"}, 0.0, 15.0, Decision.ACQUIRE),
    ],
)  # fmt: skip
def test_a_candidate_judges_expiry_by_when_it_saw_the_record_change_never_by_the_holders_times(
    case: str, spec: dict[str, Any], seen_at: float, now: float, expected: Decision
) -> None:
    observation = leader.observe(None, spec, seen_at)
    assert leader.decide(spec, observation, "me", now, default_lease_seconds=15) is expected, case


def test_an_unchanged_record_keeps_the_time_it_was_first_seen_and_any_change_resets_it() -> None:
    first = leader.observe(None, _held("x"), 10.0)
    assert first == Observation(first.record, 10.0)
    assert leader.observe(first, _held("x"), 20.0) is first
    renewed = leader.observe(first, _held("x", "2026-01-01T00:00:02.000000Z"), 20.0)
    assert renewed.seen_at == 20.0
    taken = leader.observe(renewed, _held("y", "2026-01-01T00:00:02.000000Z"), 21.0)
    assert taken.seen_at == 21.0


@pytest.mark.parametrize(
    ("lease", "deadline", "retry", "valid"),
    [(15, 10, 2, True), (15, 15, 2, False), (10, 15, 2, False), (15, 10, 10, False), (15, 10, 0, False)],
)
def test_the_renew_deadline_must_be_shorter_than_the_lease_and_longer_than_the_retry_period(
    lease: float, deadline: float, retry: float, valid: bool
) -> None:
    if valid:
        assert Timing(lease, deadline, retry).deadline(100.0) == 100.0 + deadline
    else:
        with pytest.raises(ValueError, match="lease_seconds"):
            Timing(lease, deadline, retry)


@pytest.mark.parametrize(
    ("case", "spec", "decision", "transitions", "keeps_acquire_time"),
    [
        ("the chart's empty Lease", {}, Decision.ACQUIRE, 0, False),
        ("a takeover", {**_held("x"), "acquireTime": "t", "leaseTransitions": 3}, Decision.ACQUIRE, 4, False),
        ("after a release", {"holderIdentity": "", "acquireTime": "t", "leaseTransitions": 3}, Decision.ACQUIRE,
         4, False),
        ("a renewal", {**_held("a"), "acquireTime": "t", "leaseTransitions": 3}, Decision.RENEW, 3, True),
    ],
)  # fmt: skip
def test_the_written_record_counts_transitions_and_keeps_the_acquire_time_of_a_renewal(
    case: str, spec: dict[str, Any], decision: Decision, transitions: int, keeps_acquire_time: bool
) -> None:
    written = leader.renewed_spec(spec, "a", decision, 15, T0)
    assert written["holderIdentity"] == "a", case
    assert written["renewTime"] == "2026-01-01T00:00:00.000000Z"
    assert written["leaseDurationSeconds"] == 15
    assert written.get("leaseTransitions", 0) == transitions, case
    assert (written["acquireTime"] == "t") is keeps_acquire_time, case


# ---------------------------------------------------------------- the shell


def test_a_standby_never_takes_a_lease_its_holder_keeps_renewing_whatever_their_clocks_say() -> None:
    """The holder's wall clock is a minute behind the standby's: its renewTime always looks expired."""
    api = FakeLeases()
    holder, standby = Replica(wall_offset=timedelta(seconds=-60)), Replica()
    a, b = _elector(api, holder, "a"), _elector(api, standby, "b")
    assert a.try_acquire_or_renew()
    for _ in range(20):
        _advance(2, holder, standby)
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert api.lease is not None and api.lease["spec"]["holderIdentity"] == "a"


def test_a_standby_takes_over_once_the_record_stayed_unchanged_for_the_lease_duration() -> None:
    api = FakeLeases()
    holder, standby = Replica(), Replica(wall_offset=timedelta(hours=5))
    a, b = _elector(api, holder, "a"), _elector(api, standby, "b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # first sight: the 15 s count from now
    _advance(14.9, standby)
    assert not b.try_acquire_or_renew()
    _advance(0.1, standby)
    assert b.try_acquire_or_renew()
    assert api.lease is not None
    assert api.lease["spec"]["holderIdentity"] == "b"
    assert api.lease["spec"]["leaseTransitions"] == 1
    assert b.leading()


def test_a_leader_stops_acting_at_its_renew_deadline_well_before_a_standby_may_take_over() -> None:
    api = FakeLeases()
    holder, standby = Replica(), Replica()
    lost: list[float] = []
    a, b = _elector(api, holder, "a"), _elector(api, standby, "b")
    assert a.try_acquire_or_renew()
    a._on_lost = lambda: lost.append(holder.mono)
    assert not b.try_acquire_or_renew()
    api.down = True  # the leader's renewals fail from here on
    _advance(9.99, holder, standby)
    a.check()  # still allowed to write
    _advance(0.01, holder, standby)
    assert not a.leading()
    with pytest.raises(leader.LeadershipLostError):
        a.check()
    assert lost == [holder.mono]
    api.down = False
    _advance(4.9, holder, standby)  # 14.9 s after the renewal the standby still waits
    assert not b.try_acquire_or_renew()
    _advance(0.1, holder, standby)
    assert b.try_acquire_or_renew()


def test_a_leader_frozen_past_its_deadline_is_refused_its_first_write_when_it_wakes() -> None:
    api = FakeLeases()
    frozen = Replica()
    a = _elector(api, frozen, "a")
    assert a.try_acquire_or_renew()
    lost: list[str] = []
    a._on_lost = lambda: lost.append("exit")
    _advance(2, frozen)
    a.check()
    assert a.try_acquire_or_renew()  # renewed at t = 2: may act until t = 12
    _advance(60, frozen)  # SIGSTOP ... SIGCONT: the monotonic clock went on
    with pytest.raises(leader.LeadershipLostError):
        a.check()
    assert lost == ["exit"]
    writes_before = api.rv
    with pytest.raises(leader.LeadershipLostError):
        a.try_acquire_or_renew()  # not even a renewal goes out after the deadline
    assert api.rv == writes_before


def test_a_leader_that_sees_another_holder_stops_at_once() -> None:
    api = FakeLeases()
    holder, standby = Replica(), Replica()
    a, b = _elector(api, holder, "a"), _elector(api, standby, "b")
    assert a.try_acquire_or_renew()
    assert api.lease is not None
    api.lease["spec"] = _held("b")  # e.g. an operator with a longer deadline than ours took it
    assert not a.try_acquire_or_renew()
    assert not a.leading()
    assert not b.leading()


def test_lease_requests_of_a_leader_time_out_before_its_deadline() -> None:
    api = FakeLeases()
    replica = Replica()
    a = _elector(api, replica, "a")
    assert a.try_acquire_or_renew()
    api.timeouts.clear()
    api.down = True
    _advance(7, replica)
    with pytest.raises(kube.ApiError):
        a.try_acquire_or_renew()
    assert api.timeouts == [pytest.approx(3.0)]


def test_of_two_racing_replicas_only_one_wins() -> None:
    api = FakeLeases()
    a, b = _elector(api, Replica(), "a"), _elector(api, Replica(), "b")
    api.lease = {"metadata": {"name": "kubetrain-operator", "namespace": "ops", "resourceVersion": "0"}}
    api.lease["spec"] = {"holderIdentity": ""}
    stale = api.get("Lease", "ops", "kubetrain-operator")
    assert b.try_acquire_or_renew()
    api.get = lambda *args, **kwargs: copy.deepcopy(stale)  # type: ignore[method-assign]  # a read before b wrote
    assert not a.try_acquire_or_renew()
    assert not a.leading()


def test_release_fences_the_leader_and_hands_over_at_once() -> None:
    api = FakeLeases()
    a, b = _elector(api, Replica(), "a"), _elector(api, Replica(), "b")
    assert a.try_acquire_or_renew()
    a.release()
    with pytest.raises(leader.LeadershipLostError):
        a.check()
    assert b.try_acquire_or_renew()


def test_the_renewing_thread_calls_on_lost_by_the_deadline_while_the_api_server_is_silent() -> None:
    """The real renewing thread against a server whose every request hangs until its timeout, as on a dead
    connection: each such request moves the replica's clock on by its timeout. Whatever the machine's
    load, on_lost must come no later on that clock than the deadline: no request outlived it."""
    replica = Replica()

    class Silent(FakeLeases):
        def _request(self, timeout: float | None) -> None:
            self.timeouts.append(timeout)
            if self.down:
                replica.mono += 30.0 if timeout is None else timeout
                raise kube.ApiError(0, "Timeout", "no answer")

    api = Silent()
    timing = Timing(lease_seconds=15, renew_deadline=10, retry_period=0.05)
    a = leader.LeaderElector(
        api,  # type: ignore[arg-type]
        "ops",
        "a",
        timing=timing,
        monotonic=replica.monotonic,
        wall_clock=replica.wall,
    )
    assert a.try_acquire_or_renew()
    deadline = replica.mono + timing.renew_deadline
    # Part of the deadline is spent: a request given the whole renew deadline would now outlive it.
    _advance(4, replica)
    api.down = True
    lost_at: list[float] = []
    lost = threading.Event()
    a.keep_renewing(on_lost=lambda: (lost_at.append(replica.mono), lost.set()))
    assert lost.wait(30)
    a.stop()
    assert api.timeouts[-1] == pytest.approx(6.0), api.timeouts
    assert lost_at and lost_at[0] <= deadline, (lost_at, deadline)


def test_the_client_calls_the_fence_right_before_every_write_and_never_before_a_read() -> None:
    from test_operator_kube import FakeApiClient

    fenced: list[str] = []
    api = FakeApiClient([(200, {"metadata": {}})] * 4)
    client = kube.Kube(api, fence=lambda: fenced.append(api.requests[-1]["method"]))
    client.get("Job", "ns", "x")
    client.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"namespace": "ns", "name": "x"}})
    client.patch_status("ns", "x", {"phase": "Running"}, "1")
    client.delete("Job", "ns", "x")
    assert fenced == ["POST", "PATCH", "DELETE"]


def test_a_refusing_fence_stops_the_write_before_it_is_sent() -> None:
    from test_operator_kube import FakeApiClient

    def refuse() -> None:
        raise leader.LeadershipLostError("not leading")

    api = FakeApiClient([])
    client = kube.Kube(api, fence=refuse)
    with pytest.raises(
        leader.LeadershipLostError
    ):  # not IndexError: the pool, with no answer left, was never asked
        client.delete("Job", "ns", "x")


# ---------------------------------------------------------------- liveness while standing by


def test_a_standby_campaigns_for_as_long_as_it_stands_by_whatever_the_api_server_answers() -> None:
    """What a standby's liveness endpoint reports: healthy from its start, an hour of standing by later
    (the Lease held by another) and while the API server answers nothing, as long as attempts go on."""
    api = FakeLeases()
    holder, standby = Replica(), Replica()
    a, b = _elector(api, holder, "a"), _elector(api, standby, "b")
    assert b.campaigning(), "before its first attempt"
    assert a.try_acquire_or_renew()
    for _ in range(1800):
        _advance(TIMING.retry_period, holder, standby)
        assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
        assert b.campaigning() and a.campaigning()
    api.down = True
    for _ in range(60):
        _advance(TIMING.retry_period, standby)
        with pytest.raises(kube.ApiError):
            b.try_acquire_or_renew()
        assert b.campaigning()


def test_an_election_that_stopped_turning_is_not_campaigning_until_it_attempts_again() -> None:
    api = FakeLeases()
    replica = Replica()
    b = _elector(api, replica, "b")
    api.lease = {"metadata": {"name": "kubetrain-operator", "namespace": "ops", "resourceVersion": "0"}}
    api.lease["spec"] = _held("a")
    assert not b.try_acquire_or_renew()
    _advance(leader.STALLED_AFTER_SECONDS, replica)
    assert b.campaigning()
    _advance(0.01, replica)
    assert not b.campaigning()
    assert b.try_acquire_or_renew()  # an attempt, whatever comes of it (here: a Lease no one renewed)
    assert b.campaigning()
