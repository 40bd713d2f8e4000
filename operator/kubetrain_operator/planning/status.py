"""Status computation: phase, conditions, worker counts, pending reasons and progress.

Pure functions over the status as the JSON dict the operator patches (camelCase keys). Conditions keep
their lastTransitionTime unless their status flips, so `kubectl describe` shows when things happened.

Phase to conditions: entering a phase sets its condition True (Running, Restarting, Succeeded, Failed,
Suspended) and turns the conditions it excludes False; Created is set once, when the first workers are
created, and never turned off.

When a change is written (`write_wait`): at once when it records a decision (a restart, a terminal phase,
a suspension or admission, a refusal) or a finding someone must act on (a pending reason such as
Unschedulable); a job's start and its progress may wait a little, so that states a job leaves within
seconds cost no write; worker counts wait for another change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from kubetrain_operator.planning.observe import Worker

EXCLUDED_BY: dict[str, tuple[str, ...]] = {
    "Pending": ("Running",),
    "Running": ("Restarting", "Suspended"),
    "Restarting": ("Running",),
    "Succeeded": ("Running", "Restarting", "Suspended"),
    "Failed": ("Running", "Restarting", "Suspended"),
    "Suspended": ("Running", "Restarting"),
}
QUIET_PENDING_REASONS = ("PodNotCreated", "WaitingForScheduler")
"""Pending reasons reported in status but neither as Warning events nor written at once: the Job
controller and the scheduler usually act within a second, so an event would be noise (and both post their
own events when they fail)."""
OBSERVED_PHASES = ("Pending", "Running")
"""Phases that say where the group stands, as observed; every other phase records a decision."""
START_CONDITIONS = ("Created", "Running")
"""Conditions that follow the group's start, as observed (see OBSERVED_PHASES)."""
START_FIELDS = ("startTime", "observedGeneration")
"""Fields that change with the group's start (or a spec edit) and wait `WriteWaits.start`."""
RECORDED_AT_START = ("gangProvider", "elastic")
"""Fields a first status records that later passes plan from (the provider kept for the job's life, an
elastic group's membership and store generation): such a first status waits `WriteWaits.start`, never
the longer wait of one that only says Pending."""
COUNT_FIELDS = ("workers", "workersReady", "message", "pendingMessage")
"""Fields that move with every pod's step and wait `WriteWaits.counts` (with a quiet pending reason)."""
PHASE_CONDITION = {
    "Running": "Running",
    "Restarting": "Restarting",
    "Succeeded": "Succeeded",
    "Failed": "Failed",
    "Suspended": "Suspended",
}


def timestamp(now: datetime) -> str:
    """RFC 3339 in UTC with seconds precision, as Kubernetes writes times."""
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def get_condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for cond in status.get("conditions") or ():
        if cond.get("type") == type_:
            return cond
    return None


def is_true(status: dict[str, Any], type_: str) -> bool:
    cond = get_condition(status, type_)
    return bool(cond and cond.get("status") == "True")


def set_condition(  # noqa: PLR0917  (reads like the condition it writes)
    status: dict[str, Any], type_: str, value: bool, reason: str, message: str, now: datetime
) -> bool:
    """Set a condition; returns whether its status flipped (or it is new)."""
    conditions = [dict(c) for c in status.get("conditions") or ()]
    text = "True" if value else "False"
    for cond in conditions:
        if cond.get("type") == type_:
            flipped = cond.get("status") != text
            if flipped:
                cond["lastTransitionTime"] = timestamp(now)
            cond.update(status=text, reason=reason, message=message)
            status["conditions"] = conditions
            return flipped
    conditions.append(
        {
            "type": type_,
            "status": text,
            "reason": reason,
            "message": message,
            "lastTransitionTime": timestamp(now),
        }
    )
    status["conditions"] = conditions
    return True


def enter_phase(status: dict[str, Any], phase: str, reason: str, message: str, now: datetime) -> bool:
    """Move to `phase` with its conditions; returns whether anything a human should hear about changed."""
    changed = status.get("phase") != phase
    status["phase"] = phase
    if phase in PHASE_CONDITION:
        changed |= set_condition(status, PHASE_CONDITION[phase], True, reason, message, now)
    for other in EXCLUDED_BY.get(phase, ()):
        if get_condition(status, other) is not None and is_true(status, other):
            set_condition(status, other, False, reason or phase, message, now)
    if changed:
        status["message"] = message
    return changed


def children_not_created(planned: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
    """`planned` for a pass whose children the API server refused: the Created condition and startTime
    stay as `stored` had them, so status never claims worker Jobs that do not exist."""
    out = dict(planned)
    created = get_condition(stored, "Created")
    out["conditions"] = [
        (created if c.get("type") == "Created" else c)
        for c in planned.get("conditions") or ()
        if c.get("type") != "Created" or created is not None
    ]
    if stored.get("startTime") is None:
        out.pop("startTime", None)
    return out


def worker_counts(workers: Sequence[Worker]) -> dict[str, int]:
    return {
        "active": sum(w.phase in ("pending", "running") for w in workers),
        "ready": sum(w.phase == "running" and w.ready for w in workers),
        "pending": sum(w.phase in ("pending", "missing") for w in workers),
        "succeeded": sum(w.phase == "succeeded" for w in workers),
        "failed": sum(w.phase == "failed" for w in workers),
    }


def pending_reason(workers: Sequence[Worker]) -> tuple[str | None, str | None]:
    """Why the group is not running yet, naming the first worker with a reason worth reporting."""
    for worker in workers:
        if worker.phase == "pending" and worker.reason and worker.reason != "ContainerCreating":
            message = f"worker {worker.index}"
            if worker.pod_name:
                message += f" (pod {worker.pod_name})"
            message += f": {worker.reason}"
            if worker.message:
                message += f": {worker.message}"
            return worker.reason, message
    return None, None


def group_running(workers: Sequence[Worker]) -> bool:
    """Every worker has a running (or already finished successfully) pod and at least one runs."""
    return (
        bool(workers)
        and all(w.phase in ("running", "succeeded") for w in workers)
        and any(w.phase == "running" for w in workers)
    )


def record_workers(status: dict[str, Any], workers: Sequence[Worker], total: int) -> None:
    counts = worker_counts(workers)
    status["workers"] = counts
    status["workersReady"] = f"{counts['ready']}/{total}"
    reason, message = pending_reason(workers)
    status["pendingReason"] = reason
    status["pendingMessage"] = message


def record_progress(status: dict[str, Any], progress: dict[str, Any] | None) -> None:
    """Keep the last report when pods (and their annotations) are gone."""
    if progress:
        status["progress"] = progress


@dataclasses.dataclass(frozen=True)
class WriteWaits:
    """How long a status change that records no decision may wait before it is written (`write_wait`).

    Changes that wait accumulate in the next write: it goes out when the earliest of them has waited its
    time, or at once with a decision. A state the job leaves sooner is therefore never written on its own:
    a group whose workers all run within `details` of the job's creation gets one write for its start
    (`start` after they run), one that runs for less than `start` gets none for Running (its end says
    it), and a job that waits for the scheduler shows Pending, the schema's default, until then. The Job
    controller batches its pods' changes the same way (its sync batch period); JobSet was measured
    writing two status updates per JobSet, at its start and at its end (`benchmarks/peers.py`)."""

    start: float = 5.0
    """Seconds for a new job's first status (Running, or a queued job's Suspended while Kueue, which admits
    a job that fits at once, has said nothing yet), for the group moving between Pending and Running, and
    for observedGeneration: how late `kubectl get` may show a job's start."""
    details: float = 30.0
    """Seconds for progress (epoch, loss), for a condition's new message (what Kueue says of a queued job),
    and for a new job's first status while it only waits for its pods (Pending for no reason to act on:
    `kubectl get` already shows Pending, the schema's default): at most one write per this time for
    them."""
    counts: float | None = None
    """Seconds for worker counts (READY), messages and pending reasons that need no action
    (QUIET_PENDING_REASONS, or none); None: they are written only with another change. They move with
    every pod's step, and the phase they belong to says what a user acts on: a reason to act (such as
    Unschedulable) is written at once, and Running and the end carry the counts."""


WRITE_AT_ONCE = WriteWaits(start=0.0, details=0.0, counts=0.0)
"""Every change written when it is planned (tests of what is written, not when)."""


def _decisions(status: dict[str, Any]) -> tuple[Any, ...]:
    """What in a status records a decision or a finding, so is written at once: every field but those
    `_start`, `_details` and COUNT_FIELDS name (an unknown field is a decision: safe to write at once)."""
    phase = status.get("phase")
    reason = status.get("pendingReason")
    named = (*START_FIELDS, *COUNT_FIELDS, "progress", "phase", "conditions", "pendingReason")
    rest = {k: v for k, v in normalised(status).items() if k not in named}
    return (
        None if phase in OBSERVED_PHASES else phase,
        None if reason in QUIET_PENDING_REASONS else reason,
        sorted(
            (c.get("type"), c.get("status"), c.get("reason"))
            for c in status.get("conditions") or ()
            if c.get("type") not in START_CONDITIONS
        ),
        sorted(rest.items(), key=lambda item: item[0]),
    )


def _start(status: dict[str, Any]) -> tuple[Any, ...]:
    """Where the group stands: its phase, the start conditions' truth, startTime, observedGeneration."""
    return (
        status.get("phase"),
        sorted(
            (c.get("type"), c.get("status"))
            for c in status.get("conditions") or ()
            if c.get("type") in START_CONDITIONS
        ),
        *(status.get(field) for field in START_FIELDS),
    )


def _details(status: dict[str, Any]) -> tuple[Any, ...]:
    """Progress and the conditions' messages."""
    messages = sorted((c.get("type"), c.get("message")) for c in status.get("conditions") or ())
    return (status.get("progress"), messages)


def _plain_first_status(planned: dict[str, Any]) -> bool:
    """Whether a job's first status only says where its group stands (Pending, Running, or Suspended while
    queued) and decides nothing: no end, and no restart or suspension already recorded (a worker can fail,
    or a user suspend, before the first status is written; the children of the old attempt are deleted in
    that pass, so a status that waited would leave the next pass planning that attempt again)."""
    return (
        planned.get("phase") in (*OBSERVED_PHASES, "Suspended")
        and not planned.get("restartAttempt")
        and not planned.get("restarts")
        and not planned.get("lastFailure")
    )


def _only_pending(planned: dict[str, Any]) -> bool:
    """Whether a job's first status says no more than `kubectl get` already shows (Pending, the schema's
    default): Pending for no reason to act on, and nothing later passes plan from (RECORDED_AT_START)."""
    return (
        planned.get("phase") == "Pending"
        and planned.get("pendingReason") in (None, *QUIET_PENDING_REASONS)
        and not any(planned.get(field) for field in RECORDED_AT_START)
    )


def write_wait(stored: dict[str, Any], planned: dict[str, Any], waits: WriteWaits) -> float | None:
    """How long writing `planned` over `stored` may wait, in seconds; None: until another change is
    written. 0 for a decision or a finding (a restart, a terminal phase, a suspension, an admission, a
    refusal, an actionable pending reason, a failure record, elastic membership); `waits.start` for a new
    job's first status that decides nothing (`_plain_first_status`) and for the group's start (`_start`);
    `waits.details` for progress, conditions' messages and a first status that only says Pending
    (`_only_pending`); `waits.counts` for the rest (COUNT_FIELDS).
    Call it only for a status that changed."""
    if not stored.get("phase"):
        if not _plain_first_status(planned):
            return 0.0
        return waits.details if _only_pending(planned) else waits.start
    if _decisions(stored) != _decisions(planned):
        return 0.0
    if _start(stored) != _start(planned):
        return waits.start
    if _details(stored) != _details(planned):
        return waits.details
    return waits.counts


def normalised(status: dict[str, Any]) -> dict[str, Any]:
    """The status without empty values, to compare what is stored with what was computed."""
    out: dict[str, Any] = {}
    for key, value in status.items():
        if value is None:
            continue
        if isinstance(value, dict):
            inner = normalised(value)
            if inner:
                out[key] = inner
            continue
        out[key] = value
    return out
