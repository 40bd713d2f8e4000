"""Lease-based leader election (coordination.k8s.io/v1 Lease): one replica acts, the others stand by.

The semantics are client-go's (k8s.io/client-go/tools/leaderelection):

- Observed time. A candidate never compares its own clock with the holder's `renewTime`: the clocks of
  two machines differ by any amount. It notes, on its own monotonic clock, when it last saw the Lease's
  record change, and takes the Lease only once that record has stayed unchanged for the record's
  `leaseDurationSeconds`. A released (unheld) Lease is free at once.
- Renew deadline. The leader's authority lasts `renew_deadline` (shorter than the lease duration) from
  the moment it sent its last successful renewal. A candidate can only take over with a write carrying
  the resourceVersion of the record it watched, so it saw that record no earlier than the renewal was
  written, which is after it was sent: the takeover comes `lease_seconds` after the send at the
  earliest. The gap between the two durations (5 s by default) absorbs differences in clock rates and
  writes still in flight when the leader stops.
- Fencing. Every write of the operator first calls `LeaderElector.check` (kube.Kube's `fence`), which
  ends the process once the deadline has passed. A leader that was frozen (SIGSTOP, a paused VM, a long
  stall) therefore exits when it wakes instead of acting on its stale cache, whichever of its threads
  wakes first, and a leader whose API server stopped answering writes nothing after its deadline. The
  Lease requests themselves time out before the deadline, so the renewing thread never sits in a
  request past it. What no in-process check can fence: a thread frozen between the check and the send
  of its request (microseconds). kopf writes nothing: it handles no objects and posts no Events (`main`).
- Conflicts. Every write carries the Lease's resourceVersion: of two replicas racing for a free Lease
  one wins and the other gets 409 Conflict and stays standby; after a takeover the old holder's
  renewal fails the same way.

A replica runs nothing (no kopf, no controller, no informers) until it holds the Lease; meanwhile it
answers its liveness endpoint (`health`), healthy while its election turns (`LeaderElector.campaigning`),
so that a standby is Ready and a rolling update can go on, and serves /metrics (`metrics.Endpoint`: the
process's series and kubetrain_leader_election_leading 0), so that, Ready, it scrapes as up. A replica
that shuts down cleanly fences itself and then releases the Lease, so a rolling update hands over at once.
The identity is the pod's name: a restarted container of the same pod finds itself the holder and leads
at once, which is safe because the kubelet killed the previous container before starting it.

The decisions are pure functions of the observed Lease and this replica's clocks (`observe`, `decide`,
`renewed_spec`, `Timing.deadline`); `LeaderElector` is the thin shell that makes the requests.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubetrain_operator.runtime import kube

logger = logging.getLogger("kubetrain.operator")

DEFAULT_LEASE_NAME = "kubetrain-operator"

STALLED_AFTER_SECONDS = 120.0
"""A replica whose last attempt (to acquire or to renew) began longer ago than this is stuck: its election
no longer turns. Well past the longest gap of one that turns: an attempt is a read and a write, each given
up after the renew deadline (10 s) and retried by the HTTP client up to three times, then the retry period
(2 s); about 82 s when the API server answers nothing at all."""

RECORD_FIELDS = ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime", "leaseTransitions")
"""The Lease spec fields a renewal, takeover or release changes: a change in any of them is news."""


class LeadershipLostError(Exception):
    """Raised by `LeaderElector.check` when this replica may no longer act (after calling `on_lost`)."""


@dataclasses.dataclass(frozen=True)
class Timing:
    """The durations of one election, client-go's defaults and constraints (lease > deadline > retry)."""

    lease_seconds: float = 15.0
    """How long a candidate waits, after it last saw the record change, before taking the Lease."""
    renew_deadline: float = 10.0
    """How long after sending its last successful renewal the leader may act."""
    retry_period: float = 2.0
    """Pause between two attempts, to acquire (standby) or to renew (leader)."""

    def __post_init__(self) -> None:
        if not self.lease_seconds > self.renew_deadline > self.retry_period > 0:
            raise ValueError(
                f"leader election needs lease_seconds ({self.lease_seconds}) > renew_deadline "
                f"({self.renew_deadline}) > retry_period ({self.retry_period}) > 0"
            )

    def deadline(self, sent_at: float) -> float:
        """Until when a leader whose renewal (or acquisition) was sent at `sent_at` may act."""
        return sent_at + self.renew_deadline


@dataclasses.dataclass(frozen=True)
class Observation:
    """The Lease record a replica last saw, and when (its monotonic clock) it first saw it so."""

    record: tuple[Any, ...]
    seen_at: float


class Decision(enum.Enum):
    ACQUIRE = "acquire"
    """Unheld, or unchanged for its duration as seen from here: take it (a leader transition)."""
    RENEW = "renew"
    """Held by this identity: renew it."""
    WAIT = "wait"
    """Held by another identity that renewed it recently, as seen from here."""


def micro_time(now: datetime) -> str:
    """Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def observe(previous: Observation | None, spec: dict[str, Any], now: float) -> Observation:
    """The observation after reading `spec` at `now`: the earlier one while the record is unchanged."""
    record = tuple(spec.get(field) for field in RECORD_FIELDS)
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def decide(
    spec: dict[str, Any], observation: Observation, identity: str, now: float, default_lease_seconds: float
) -> Decision:
    """What `identity` may do with the Lease whose current spec is `spec`, judged on its own clock only."""
    holder = spec.get("holderIdentity")
    if holder == identity:
        return Decision.RENEW
    if not holder:
        return Decision.ACQUIRE
    duration = spec.get("leaseDurationSeconds") or default_lease_seconds
    if now >= observation.seen_at + duration:
        return Decision.ACQUIRE
    return Decision.WAIT


def renewed_spec(
    spec: dict[str, Any], identity: str, decision: Decision, lease_seconds: float, wall_now: datetime
) -> dict[str, Any]:
    """The spec `identity` writes to acquire or renew. Its times are for people reading the Lease; no
    replica judges expiry by them."""
    out = dict(spec)
    stamp = micro_time(wall_now)
    if decision is Decision.ACQUIRE:
        out["acquireTime"] = stamp
        held_before = bool(spec.get("holderIdentity") or spec.get("acquireTime"))
        out["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + held_before
    else:
        out.setdefault("acquireTime", stamp)
    out.update(holderIdentity=identity, renewTime=stamp, leaseDurationSeconds=math.ceil(lease_seconds))
    return out


class LeaderElector:
    """The election's I/O: reads and writes the Lease, keeps the leader's deadline, fences its writes."""

    def __init__(
        self,
        client: kube.Kube,
        namespace: str,
        identity: str,
        *,
        name: str = DEFAULT_LEASE_NAME,
        timing: Timing = Timing(),
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing
        self.monotonic = monotonic
        self.wall_clock = wall_clock
        self._observation: Observation | None = None
        self._leading_until = -math.inf
        """Monotonic time after which this replica must not act; -inf while it does not lead."""
        self._on_lost: Callable[[], None] | None = None
        self._stop = threading.Event()
        self._attempted_at = monotonic()
        """When the last attempt began (to acquire or to renew); its construction until the first."""

    def leading(self) -> bool:
        """Whether this replica may act now."""
        return self.monotonic() < self._leading_until

    def campaigning(self) -> bool:
        """Whether this replica's election turns: its last attempt, to acquire the Lease (standing by) or to
        renew it (leading), began within `STALLED_AFTER_SECONDS`, whatever the API server answered. What the
        liveness endpoint of a replica that kopf does not serve yet reports (`health`)."""
        return self.monotonic() - self._attempted_at <= STALLED_AFTER_SECONDS

    def check(self) -> None:
        """The fence before every write: call `on_lost` (which ends the process) and raise LeadershipLostError
        unless this replica may act now. Cheap: one clock read."""
        if self.leading():
            return
        self._lose("this replica no longer holds the Lease; refusing to write")
        raise LeadershipLostError(f"{self.identity} does not hold Lease {self.namespace}/{self.name}")

    def try_acquire_or_renew(self) -> bool:
        """One attempt (a read, then a write if allowed); True when this replica leads afterwards."""
        self._attempted_at = self.monotonic()
        lease = self.kube.get("Lease", self.namespace, self.name, timeout=self._request_timeout())
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": renewed_spec(
                    {}, self.identity, Decision.ACQUIRE, self.timing.lease_seconds, self.wall_clock()
                ),
            }
            return self._write(self.kube.create, body)
        spec = lease.get("spec") or {}
        now = self.monotonic()
        self._observation = observe(self._observation, spec, now)
        decision = decide(spec, self._observation, self.identity, now, self.timing.lease_seconds)
        if decision is Decision.WAIT:
            self._leading_until = -math.inf  # another replica holds it: lost, whatever the time says
            return False
        if decision is Decision.ACQUIRE:
            logger.info("acquiring Lease %s/%s as %s", self.namespace, self.name, self.identity)
        spec = renewed_spec(spec, self.identity, decision, self.timing.lease_seconds, self.wall_clock())
        return self._write(self.kube.replace, {**lease, "spec": spec})

    def _request_timeout(self) -> float:
        """A Lease request never outlives the leader's deadline (nor, standing by, the renew deadline)."""
        if self._leading_until == -math.inf:
            return self.timing.renew_deadline
        left = self._leading_until - self.monotonic()
        if left <= 0:
            raise LeadershipLostError("the renew deadline passed before the request could be sent")
        return left

    def _write(self, call: Callable[..., dict[str, Any]], body: dict[str, Any]) -> bool:
        timeout = self._request_timeout()
        sent_at = self.monotonic()
        try:
            written = call(body, timeout=timeout)
        except kube.ApiError as exc:
            if exc.conflict:
                return False  # another replica wrote first
            raise
        self._leading_until = self.timing.deadline(sent_at)
        self._observation = observe(None, written.get("spec") or {}, self.monotonic())
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
            self._stop.wait(self.timing.retry_period)
        return False

    def keep_renewing(self, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew every `retry_period` in a daemon thread; call `on_lost` (which should end the process) the
        moment the deadline passes or another replica is seen holding the Lease."""
        self._on_lost = on_lost

        def loop() -> None:
            while not self._stop.wait(min(self.timing.retry_period, max(0.0, self._until_deadline()))):
                if self.leading():
                    try:
                        self.try_acquire_or_renew()
                    except Exception as exc:
                        logger.warning("cannot renew Lease %s/%s: %s", self.namespace, self.name, exc)
                if not self.leading():
                    self._lose("lost the Lease: stopping so that only one replica acts")
                    return

        thread = threading.Thread(target=loop, name="kubetrain-leader", daemon=True)
        thread.start()
        return thread

    def _until_deadline(self) -> float:
        return self._leading_until - self.monotonic()

    def _lose(self, why: str) -> None:
        logger.error("Lease %s/%s, %s: %s", self.namespace, self.name, self.identity, why)
        if self._on_lost is not None:
            self._on_lost()

    def release(self) -> None:
        """On a clean shutdown: fence this replica, then give the Lease up so a standby takes over at once."""
        self._stop.set()
        self._on_lost = None  # shutting down anyway: a late write is refused (check raises), not fatal
        self._leading_until = -math.inf
        try:
            lease = self.kube.get("Lease", self.namespace, self.name, timeout=self.timing.retry_period)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                spec = {
                    **lease["spec"],
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "renewTime": micro_time(self.wall_clock()),
                }
                self.kube.replace({**lease, "spec": spec}, timeout=self.timing.retry_period)
        except Exception as exc:
            logger.info("could not release Lease %s/%s: %s", self.namespace, self.name, exc)

    def stop(self) -> None:
        self._stop.set()
