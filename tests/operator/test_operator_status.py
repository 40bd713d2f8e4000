"""status.write_wait: which status changes are written at once, how long the others may wait, and which
wait for another change (None)."""

from __future__ import annotations

from typing import Any

import pytest
from kubetrain_operator.planning import status as st

pytestmark = pytest.mark.unit

WAITS = st.WriteWaits(start=5.0, details=30.0, counts=None)


def _cond(type_: str, value: str = "True", reason: str = "r", message: str = "m") -> dict[str, Any]:
    return {"type": type_, "status": value, "reason": reason, "message": message, "lastTransitionTime": "t"}


PENDING = {
    "phase": "Pending",
    "restartAttempt": 0,
    "restarts": 0,
    "startTime": "t0",
    "observedGeneration": 1,
    "conditions": [_cond("Created")],
    "workers": {"active": 2, "pending": 2},
    "workersReady": "0/2",
    "pendingReason": "PodNotCreated",
    "pendingMessage": "worker 0: PodNotCreated",
}
RUNNING = {
    **PENDING,
    "phase": "Running",
    "conditions": [_cond("Created"), _cond("Running")],
    "workers": {"active": 2, "ready": 2},
    "workersReady": "2/2",
    "pendingReason": None,
    "pendingMessage": None,
}
QUEUED = {
    "phase": "Suspended",
    "restartAttempt": 0,
    "restarts": 0,
    "conditions": [_cond("Suspended", reason="Queued", message="queued in LocalQueue team")],
}


@pytest.mark.parametrize(
    ("stored", "planned", "wait"),
    [
        pytest.param(
            {},
            PENDING,
            WAITS.details,
            id="a new job waiting for its pods: kubectl shows the schema's Pending meanwhile",
        ),
        pytest.param(
            {},
            {**PENDING, "pendingReason": "WaitingForScheduler"},
            WAITS.details,
            id="and for the scheduler",
        ),
        pytest.param(
            {},
            {**PENDING, "pendingReason": "Unschedulable", "pendingMessage": "0/3 nodes"},
            WAITS.start,
            id="a new job pending for a reason to act on waits only for its start",
        ),
        pytest.param(
            {},
            {**PENDING, "gangProvider": "volcano"},
            WAITS.start,
            id="a new gang job: the provider it is given is recorded after its start wait",
        ),
        pytest.param(
            {},
            {**PENDING, "elastic": {"members": [0, 1], "worldSize": 0}},
            WAITS.start,
            id="a new elastic job: its membership too",
        ),
        pytest.param({}, RUNNING, WAITS.start, id="a new job already running: its start too"),
        pytest.param({}, QUEUED, WAITS.start, id="a new queued job waits for Kueue's word"),
        pytest.param(
            {},
            {"phase": "Failed", "conditions": [_cond("Failed", reason="InvalidSpec")]},
            0.0,
            id="a refused new job: at once",
        ),
        pytest.param(
            {},
            {
                **PENDING,
                "phase": "Restarting",
                "restartAttempt": 1,
                "restarts": 1,
                "lastFailure": {"worker": 0},
            },
            0.0,
            id="a worker failed before the first status was written: the restart at once",
        ),
        pytest.param(
            {},
            {**QUEUED, "restartAttempt": 1},
            0.0,
            id="suspended by its user before the first status was written: at once",
        ),
        pytest.param(PENDING, RUNNING, WAITS.start, id="Pending to Running: its start"),
        pytest.param(RUNNING, {**RUNNING, "phase": "Pending"}, WAITS.start, id="Running to Pending"),
        pytest.param(PENDING, {**PENDING, "observedGeneration": 2}, WAITS.start, id="a spec edit seen"),
        pytest.param(
            RUNNING, {**RUNNING, "workers": {"active": 1, "succeeded": 1}}, None, id="worker counts"
        ),
        pytest.param(RUNNING, {**RUNNING, "progress": {"epoch": 3}}, WAITS.details, id="progress"),
        pytest.param(
            PENDING,
            {**PENDING, "pendingReason": "WaitingForScheduler", "pendingMessage": "worker 0: waiting"},
            None,
            id="a pending reason that needs no action",
        ),
        pytest.param(
            QUEUED,
            {**QUEUED, "conditions": [_cond("Suspended", reason="Queued", message="no quota")]},
            WAITS.details,
            id="what Kueue says while the job stays queued",
        ),
        pytest.param(
            PENDING,
            {**PENDING, "pendingReason": "Unschedulable", "pendingMessage": "0/3 nodes"},
            0.0,
            id="a pending reason someone must act on: at once",
        ),
        pytest.param(
            {**PENDING, "pendingReason": "ImagePullBackOff"}, PENDING, 0.0, id="and its end: at once"
        ),
        pytest.param(
            RUNNING,
            {**RUNNING, "phase": "Succeeded", "completionTime": "t1", "conditions": [_cond("Succeeded")]},
            0.0,
            id="success",
        ),
        pytest.param(
            RUNNING,
            {
                **RUNNING,
                "phase": "Restarting",
                "restartAttempt": 1,
                "restarts": 1,
                "lastFailure": {"worker": 1},
                "conditions": [_cond("Created"), _cond("Running", "False"), _cond("Restarting")],
            },
            0.0,
            id="a restart",
        ),
        pytest.param(
            RUNNING,
            {**RUNNING, "conditions": [*RUNNING["conditions"], _cond("SpecRefused", reason="NotAllowed")]},
            0.0,
            id="a refusal of a running job's spec",
        ),
        pytest.param(
            RUNNING,
            {**RUNNING, "phase": "Suspended", "restartAttempt": 1, "conditions": [_cond("Suspended")]},
            0.0,
            id="a suspension",
        ),
        pytest.param(
            QUEUED,
            {**PENDING, "conditions": [_cond("Suspended", "False", reason="Admitted"), _cond("Created")]},
            0.0,
            id="an admission",
        ),
        pytest.param(
            RUNNING,
            {**RUNNING, "elastic": {"members": [0, 1], "worldSize": 2}},
            0.0,
            id="elastic membership",
        ),
    ],
)
def test_decisions_and_findings_are_written_at_once_and_what_is_observed_waits(
    stored: dict[str, Any], planned: dict[str, Any], wait: float | None
) -> None:
    assert st.write_wait(stored, planned, WAITS) == wait
