"""Status computation: phase, conditions, worker counts, pending reasons and progress.

Pure functions over the status as the JSON dict the operator patches (camelCase keys). Conditions keep
their lastTransitionTime unless their status flips, so `kubectl describe` shows when things happened.

Phase to conditions: entering a phase sets its condition True (Running, Restarting, Succeeded, Failed,
Suspended) and turns the conditions it excludes False; Created is set once, when the first workers are
created, and never turned off.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from kubetrain_operator.observe import Worker

EXCLUDED_BY: dict[str, tuple[str, ...]] = {
    "Pending": ("Running",),
    "Running": ("Restarting", "Suspended"),
    "Restarting": ("Running",),
    "Succeeded": ("Running", "Restarting", "Suspended"),
    "Failed": ("Running", "Restarting", "Suspended"),
    "Suspended": ("Running", "Restarting"),
}
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
