"""The work queue of TrainingJob keys: what the controller's worker threads take, in what order, and when.

Kept apart from the controller for the reason client-go keeps its workqueue apart: the guarantees the rest
of the operator leans on live here, in one small type with its own tests, not in the reconcile code.

- A key is queued at most once, however many events ask for it.
- A key is processed by one thread at a time. Asked for again while it is processed, it is marked dirty,
  and the thread processing it goes round once more when it is done (`release` says so): a burst of one
  job's pod events costs one more pass, not one per event, and never two passes in flight.
- Urgent keys (a new TrainingJob, a changed spec: someone is waiting for workers) are taken before routine
  ones (child events, resyncs). A routine key also waits while urgent keys are being processed, so a burst
  of submissions gets its workers created before older jobs' status refreshes, unless it has waited
  `ROUTINE_MAX_WAIT` already.
- Delayed keys (`add_after`: deadlines, TTLs, waits, error backoff) are added by `run_delays` when due.
  At most one pending wake-up per key: the earliest wins, a later one is dropped (the reconcile it wakes
  asks again for what it still needs).
- Consecutive failures are counted per key (`failed`, `succeeded`), for the caller's backoff.
- Nothing about a key outlives it (`forget`), and the delay heap is rebuilt whenever stale entries
  outnumber live ones, so a process that runs for months holds state in proportion to the keys alive.
"""

from __future__ import annotations

import collections
import heapq
import threading
import time
from collections.abc import Callable, Hashable

ROUTINE_MAX_WAIT = 30.0
"""Longest a routine key waits behind urgent work before it is taken anyway."""
HEAP_SLACK = 64
"""Stale delay-heap entries tolerated beyond one per pending wake-up before the heap is rebuilt."""

Key = Hashable


class WorkQueue:
    def __init__(self, on_depth: Callable[[int], None] = lambda depth: None) -> None:
        self._on_depth = on_depth
        """Told the number of queued keys whenever it changes (the queue-depth metric)."""
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._wake = threading.Condition(self._lock)
        self._stopped = False
        self._urgent: collections.deque[Key] = collections.deque()
        self._routine: collections.deque[Key] = collections.deque()
        self._queued: dict[Key, bool] = {}
        """Queued keys -> whether urgent (a key may sit in both deques; this says which entry counts)."""
        self._queued_at: dict[Key, float] = {}
        self._urgent_running = 0
        """Urgent keys taken and not yet released: routine work waits for them."""
        self._processing: dict[Key, bool] = {}
        """Keys being processed -> whether asked for again meanwhile (dirty)."""
        self._failures: dict[Key, int] = {}
        """Keys whose last processing failed -> consecutive failures (kept between processings)."""
        self._heap: list[tuple[float, Key]] = []
        self._due: dict[Key, float] = {}

    # ------------------------------------------------------------ queueing

    def add(self, key: Key, urgent: bool = False) -> None:
        """Ask for `key` to be processed. Never blocks."""
        with self._lock:
            if key in self._processing:
                self._processing[key] = True  # dirty: the thread at it goes round once more
                return
            queued_urgent = self._queued.get(key)
            if queued_urgent is None or (urgent and not queued_urgent):
                self._queued[key] = urgent
                self._queued_at.setdefault(key, time.monotonic())
                (self._urgent if urgent else self._routine).append(key)
                self._on_depth(len(self._queued))
                self._work.notify()

    def get(self) -> tuple[Key, bool] | None:
        """Block until a key may be taken; (key, urgent), or None once shut down. The caller processes it
        under `claim`; an urgent key counts as urgent work (routine keys wait) until `urgent_done`."""
        with self._lock:
            while not self._stopped:
                taken = self._take_next()
                if taken is not None:
                    key, urgent = taken
                    del self._queued[key]
                    self._queued_at.pop(key, None)
                    self._on_depth(len(self._queued))
                    self._urgent_running += urgent
                    return key, urgent
                self._work.wait(self._routine_wait())
        return None

    def _take_next(self) -> tuple[Key, bool] | None:
        """The next key by the rules above, popped from its deque; None when none may be taken now.
        Call with the lock held."""
        while self._urgent:
            key = self._urgent.popleft()
            if self._queued.get(key) is True:  # else a stale entry: the key was taken
                return key, True
        while self._routine:
            key = self._routine[0]
            if self._queued.get(key) is not False:  # stale: the key moved up or was taken
                self._routine.popleft()
                continue
            if self._urgent_running == 0 or time.monotonic() - self._queued_at[key] >= ROUTINE_MAX_WAIT:
                self._routine.popleft()
                return key, False
            return None
        return None

    def _routine_wait(self) -> float | None:
        """Seconds until the oldest routine key may be taken despite urgent work; None: wait for news."""
        if not self._routine:
            return None
        return max(0.0, ROUTINE_MAX_WAIT - (time.monotonic() - self._queued_at.get(self._routine[0], 0.0)))

    def urgent_done(self) -> None:
        """An urgent key taken with `get` has been processed: routine work need not wait for it."""
        with self._lock:
            self._urgent_running -= 1
            self._work.notify_all()

    def busy(self) -> bool:
        """Whether urgent keys are queued or being processed."""
        with self._lock:
            return self._urgent_running > 0 or any(self._queued.values())

    # ------------------------------------------------------------ processing

    def claim(self, key: Key) -> bool:
        """Start processing `key` in this thread; False (and `key` marked dirty) if another thread is."""
        with self._lock:
            if key in self._processing:
                self._processing[key] = True
                return False
            self._processing[key] = False
            return True

    def release(self, key: Key) -> bool:
        """Done with one pass of `key`: False if it was asked for meanwhile (the caller goes round again,
        still holding it), True when it is released."""
        with self._lock:
            if self._processing[key]:
                self._processing[key] = False
                return False
            del self._processing[key]
            return True

    def abandon(self, key: Key) -> None:
        """Release `key` after an exception escaped its processing."""
        with self._lock:
            self._processing.pop(key, None)

    def failed(self, key: Key) -> int:
        """Count a failed processing of `key`; how many failed in a row before this one."""
        with self._lock:
            before = self._failures.get(key, 0)
            self._failures[key] = before + 1
            return before

    def succeeded(self, key: Key) -> None:
        with self._lock:
            self._failures.pop(key, None)

    def forget(self, key: Key) -> None:
        """`drop`, and a pass of `key` in progress goes round once more, to see that it is gone."""
        with self._lock:
            self._drop(key)
            if key in self._processing:
                self._processing[key] = True

    def drop(self, key: Key) -> None:
        """Drop what is kept about `key` between processings (its wake-up, its failures): it is gone."""
        with self._lock:
            self._drop(key)

    def _drop(self, key: Key) -> None:
        self._due.pop(key, None)  # its heap entry, if any, is now stale (see _compact_heap)
        self._failures.pop(key, None)

    # ------------------------------------------------------------ delays

    def add_after(self, key: Key, delay: float) -> None:
        """Add `key` after `delay` seconds, unless an earlier wake-up is pending."""
        due = time.monotonic() + max(0.0, delay)
        with self._lock:
            pending = self._due.get(key)
            if pending is not None and pending <= due:
                return
            self._due[key] = due
            heapq.heappush(self._heap, (due, key))
            if len(self._heap) > 2 * len(self._due) + HEAP_SLACK:
                self._compact_heap()
            self._wake.notify()

    def wakes_up(self, key: Key) -> bool:
        """Whether a wake-up of `key` is pending."""
        with self._lock:
            return key in self._due

    def _compact_heap(self) -> None:
        """Drop the heap's superseded and forgotten entries. Call with the lock held.

        Why: an earlier wake-up replacing a later one (a child's event before a job's TTL or resync) leaves
        the later entry in the heap until its time, which for a TTL of days is days."""
        self._heap = [(due, key) for key, due in self._due.items()]
        heapq.heapify(self._heap)

    def run_delays(self) -> None:
        """Add delayed keys when due, until shut down (the body of the queue's timer thread)."""
        while True:
            with self._lock:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._wake.wait(timeout=self._heap[0][0] - time.monotonic() if self._heap else None)
                if self._stopped:
                    return
                due: list[Key] = []
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    when, key = heapq.heappop(self._heap)
                    if self._due.get(key) == when:  # else superseded by an earlier wake-up
                        del self._due[key]
                        due.append(key)
            for key in due:
                self.add(key)

    def shut_down(self) -> None:
        """Wake every thread waiting in `get` or `run_delays`: they return."""
        with self._lock:
            self._stopped = True
            self._wake.notify_all()
            self._work.notify_all()

    def sizes(self) -> dict[str, int]:
        """Entries per structure (stale heap and deque entries included): what a long-running process
        holds, for the soak benchmark and the tests that bound it."""
        with self._lock:
            return {
                "queued": len(self._queued),
                "urgent": len(self._urgent),
                "routine": len(self._routine),
                "processing": len(self._processing),
                "failures": len(self._failures),
                "due": len(self._due),
                "heap": len(self._heap),
            }
