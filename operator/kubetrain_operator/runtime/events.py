"""Kubernetes Events about TrainingJobs, posted in the background.

Why in the background: an Event is for people (`kubectl describe`), never an input to a decision, yet
posting one inline made it one of the requests between a new TrainingJob and its workers. Like client-go's
event broadcaster, the controller hands events to a queue and one thread posts them. The poster also
holds an event back while `busy()` says new jobs are waiting for their workers, until it is HOLD_LIMIT
seconds old, so in a burst of submissions every Service and Job goes to the API server before any event.
The limit is on each event's age, not on each wait: under steady churn new jobs arrive all the time and
`busy()` is nearly always true, and a wait of HOLD_LIMIT per event would let the queue grow without end
(a soak saw hundreds queued within minutes); by age, a held event costs nothing to those behind it.
Best effort, as Events are: a refused post is logged, never retried. When the API server is slower than
events arrive (a soak on a saturated machine saw one post a second and the queue grow by 0.3 a second),
the queue stops at QUEUE_LIMIT and newer events are dropped, counted, and reported once a minute: the
operator's memory stays bounded however long the overload lasts, as client-go's broadcaster does.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from kubetrain_operator.api import constants

logger = logging.getLogger("kubetrain.operator")

HOLD_LIMIT = 30.0
"""Age at which an event is posted even while the controller is busy (events must not go stale)."""
HOLD_POLL = 0.1

QUEUE_LIMIT = 1_000
"""Events waiting to be posted before new ones are dropped (the API server is far behind by then). An
event takes about 1.4 KB, so a full queue holds about 1.4 MB; client-go's broadcaster keeps as many."""
DROP_REPORT_INTERVAL = 60.0
"""At most one warning per interval about dropped events: under overload a warning per drop would
flood the log as well."""


def build_event(
    namespace: str, name: str, *, uid: str | None, type_: str, reason: str, message: str, timestamp: str
) -> dict[str, Any]:
    """A core v1 Event about the TrainingJob `name` (uid ties it to this incarnation of the name)."""
    return {
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
        "firstTimestamp": timestamp,
        "lastTimestamp": timestamp,
        "count": 1,
    }


_STOP = object()


class EventPoster:
    """Posts events handed to `post` from one background thread, in order."""

    def __init__(
        self,
        create: Callable[[dict[str, Any]], Any],
        busy: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        limit: int = QUEUE_LIMIT,
    ) -> None:
        self._create = create
        self._busy = busy
        self._clock = clock
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=limit)
        self.dropped = 0
        self._reported_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="kubetrain-events", daemon=True)
        self._thread.start()

    def post(self, event: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait((self._clock(), event))
        except queue.Full:
            self.dropped += 1
            now = self._clock()
            if self._reported_at is None or now - self._reported_at >= DROP_REPORT_INTERVAL:
                self._reported_at = now
                logger.warning(
                    "event queue full (the API server is behind): %d dropped so far, the latest %s on %s",
                    self.dropped,
                    event["reason"],
                    _about(event),
                )

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every event handed in so far has been posted (or refused); False on timeout."""
        reached = threading.Event()
        self._queue.put(reached)
        return reached.wait(timeout)

    def stop(self) -> None:
        """Post what is queued (for up to 5 s), then end the thread."""
        self._queue.put(_STOP)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            posted_at, event = item
            while self._busy() and self._clock() - posted_at < HOLD_LIMIT:
                time.sleep(HOLD_POLL)
            try:
                self._create(event)
            except Exception as exc:  # best effort: never let one event stop the others
                logger.info("could not post event %s on %s: %s", event["reason"], _about(event), exc)


def _about(event: dict[str, Any]) -> str:
    involved = event["involvedObject"]
    return f"{involved['namespace']}/{involved['name']}"
