"""The heartbeat contract with the operator: each worker's `kubetrain.io/heartbeat` annotation on its own pod.

A hung collective or a frozen process never exits, so no exit code reports it; a job with
failurePolicy.progressDeadlineSeconds is restarted instead when a worker made no progress for that long.
Progress is a `ProgressTick`: the training loop ticks on every optimizer step, the evaluator on every
validation batch and checkpointing when a checkpoint is written, so that an evaluation or a slow checkpoint
write is not taken for a hang. A daemon thread merge-patches `heartbeat_record` every
KUBETRAIN_HEARTBEAT_SECONDS: `{"step": int, "stepAt": RFC 3339, "updatedAt": RFC 3339}`, `stepAt` being the
last tick (until the first one, when the heartbeat started, with the step the run resumed at) and `step` the
optimizer step count then. The thread runs beside the training thread, so while that thread is blocked in a
collective `updatedAt` stays fresh and `stepAt` ages (alive but stuck); a frozen (SIGSTOPped) process stops
writing altogether.

One process per pod reports: the one with LOCAL_RANK 0 (under torchrun the pod's other processes step in
lockstep with it, DDP's collectives holding them together, so one of them hung blocks it too). There is no
heartbeat and no thread when KUBETRAIN_HEARTBEAT_SECONDS is unset (the operator sets it only for jobs with
a progress deadline) or outside a pod (`PodAnnotator.from_environment()` is None): local runs are unchanged.
A failed patch is a warning, repeated at most every `WARN_EVERY_SECONDS` while patches keep failing, never
fatal; the thread is a daemon and never keeps the process alive.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubetrain_trainer import contract
from kubetrain_trainer.distributed import WorldEnv
from kubetrain_trainer.failures import ConfigError
from kubetrain_trainer.progress import PodAnnotator

log = logging.getLogger(__name__)

THREAD_NAME = "kubetrain-heartbeat"
WARN_EVERY_SECONDS = 300.0
"""While patches keep failing, one warning (with the count of failures since the last) this often at most:
the first failure is always told, the next hundreds of periods are not."""


def rfc3339(seconds: float) -> str:
    """A Unix time as RFC 3339 in UTC, to the second (as the progress report and Kubernetes write times)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def heartbeat_record(step: int, step_at: float, updated_at: float) -> dict[str, Any]:
    """The annotation's JSON object: the optimizer step count at the last progress, when that progress was
    made, and when this report was written (Unix times)."""
    return {"step": step, "stepAt": rfc3339(step_at), "updatedAt": rfc3339(updated_at)}


class ProgressTick:
    """When this process last made progress, and its optimizer step count then.

    Called by the training thread, read by the heartbeat thread: a lock keeps the pair consistent. Cheap
    enough to call on every step and batch whether or not a heartbeat reads it.
    """

    def __init__(self, step: int = 0, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._step = step
        self._at = clock()

    def __call__(self, step: int | None = None) -> None:
        """Progress now: optimizer step `step` done, or (None) progress at the same step (an evaluation
        batch, a checkpoint written)."""
        now = self._clock()
        with self._lock:
            if step is not None:
                self._step = step
            self._at = now

    def last(self) -> tuple[int, float]:
        """(step, Unix time) of the last progress."""
        with self._lock:
            return self._step, self._at


def period_from_environment(env: Mapping[str, str]) -> float | None:
    """KUBETRAIN_HEARTBEAT_SECONDS as seconds; None when unset or empty (no heartbeat)."""
    raw = env.get(contract.HEARTBEAT_SECONDS, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(
            f"environment variable {contract.HEARTBEAT_SECONDS}={raw!r} is not a positive number"
        )
    return seconds


@dataclass
class FailureLog:
    """Which patch failures to warn about: the first after a success, then one every `every` seconds while
    they go on, counting those not told; a success after failures is told once."""

    every: float = WARN_EVERY_SECONDS
    failures: int = 0
    """Failures in a row so far."""
    untold: int = 0
    """Failures since the last warning."""
    warned_at: float | None = None

    def failed(self, error: BaseException, now: float) -> str | None:
        """The warning to log for this failure at monotonic time `now`, or None to keep quiet."""
        self.failures += 1
        self.untold += 1
        if self.warned_at is not None and now - self.warned_at < self.every:
            return None
        also = f" ({self.untold - 1} more failed since the last warning)" if self.untold > 1 else ""
        self.warned_at, self.untold = now, 0
        return f"{error}{also}; the operator may take this worker for stalled until a heartbeat gets through"

    def succeeded(self) -> str | None:
        """The line to log when a patch succeeds after failures, else None."""
        failures, self.failures, self.untold, self.warned_at = self.failures, 0, 0, None
        return f"heartbeat patches get through again after {failures} failed" if failures else None


class Heartbeat:
    """Patches this pod's heartbeat annotation from `tick` every `period` seconds on a daemon thread."""

    def __init__(
        self,
        tick: ProgressTick,
        annotator: PodAnnotator,
        period: float,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tick = tick
        self.annotator = annotator
        self.period = period
        self._clock = clock
        self._failures = FailureLog()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)

    def beat(self) -> None:
        """One patch of the annotation now; raises what the patch raised."""
        step, step_at = self.tick.last()
        self.annotator.annotate(contract.HEARTBEAT_ANNOTATION, heartbeat_record(step, step_at, self._clock()))

    def start(self) -> Heartbeat:
        """Start the thread: the first patch at once, then one every period."""
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop patching (a patch in flight finishes, within its own timeout) and wait up to `timeout`."""
        self._stopped.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        due = time.monotonic()
        while True:
            try:
                self.beat()
            except Exception as error:  # any: a dead thread would leave the worker looking stalled for good
                warning = self._failures.failed(error, time.monotonic())
                if warning is not None:
                    log.warning(
                        "could not patch pod %s/%s heartbeat annotation: %s",
                        self.annotator.namespace,
                        self.annotator.pod,
                        warning,
                    )
            else:
                recovered = self._failures.succeeded()
                if recovered is not None:
                    log.info(recovered)
            # A fixed rate: a slow patch does not push the next one later (never two at once, though).
            due = max(due + self.period, time.monotonic())
            if self._stopped.wait(due - time.monotonic()):
                return


def start(
    world: WorldEnv,
    tick: ProgressTick,
    annotator: PodAnnotator | None,
    env: Mapping[str, str] = os.environ,
) -> Heartbeat | None:
    """The running heartbeat of this pod when the operator asked for one (KUBETRAIN_HEARTBEAT_SECONDS), this
    is a pod (`annotator`) and this process is its LOCAL_RANK 0; else None and no thread."""
    period = period_from_environment(env)
    if period is None or annotator is None or world.local_rank != 0:
        return None
    log.info(
        "heartbeat: patching pod %s/%s annotation %s every %g s",
        annotator.namespace,
        annotator.pod,
        contract.HEARTBEAT_ANNOTATION,
        period,
    )
    return Heartbeat(tick, annotator, period).start()
