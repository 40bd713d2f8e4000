"""TrainingJobStatus, what the operator reports (phase, conditions, worker counts, progress, failures,
elastic membership): the shape of the status subresource. How the status is computed from the cluster is
`planning/status.py`'s part.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from kubetrain_operator.api import base
from kubetrain_operator.api.scheduling import GangProvider

Phase = Literal["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
PHASES: tuple[str, ...] = ("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended")
TERMINAL_PHASES = ("Succeeded", "Failed")
UNWRITTEN_STATUS: dict[str, str] = {"phase": "Pending"}
"""What the API server shows as the status of a TrainingJob whose status the operator has not written yet
(the CRD schema's default, applied when the object is read, never stored): a job is Pending from the
moment it is accepted, as a new Pod is, so `kubectl get` has a phase at once while the operator's first
write may wait (`planning/status.write_wait`)."""
ConditionType = Literal["Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended", "SpecRefused"]
CONDITION_TYPES: tuple[str, ...] = (
    "Created",
    "Running",
    "Restarting",
    "Succeeded",
    "Failed",
    "Suspended",
    "SpecRefused",
)


class Condition(base.Model):
    type: ConditionType = Field(
        ...,
        description=(
            "type is Created, Running, Restarting, Succeeded, Failed, Suspended or SpecRefused (True while "
            "the operator refuses the spec of a job it had accepted: reason InvalidSpec or NotAllowed; its "
            "workers are left running and nothing is created or deleted for it until the spec passes)."
        ),
    )
    status: Literal["True", "False", "Unknown"] = Field(..., description="status is True, False or Unknown.")
    reason: str | None = Field(None, description="reason is a CamelCase word saying why, e.g. WorkerFailed.")
    message: str | None = Field(None, description="message explains the condition to humans.")
    last_transition_time: datetime | None = Field(
        None, description="lastTransitionTime is when status last changed (RFC 3339)."
    )


class WorkerCounts(base.Model):
    active: int = Field(
        0, description="active is the number of workers of the current attempt not finished yet."
    )
    ready: int = Field(0, description="ready is the number of workers whose pod is Ready.")
    pending: int = Field(
        0,
        description="pending is the number of workers without a running pod yet (not scheduled, pulling...).",
    )
    succeeded: int = Field(0, description="succeeded is the number of workers whose container exited 0.")
    failed: int = Field(0, description="failed is the number of workers that failed in the current attempt.")


class ResumedFrom(base.Model):
    attempt: int = Field(
        ..., description="attempt is the restart attempt that resumed (0 before any restart)."
    )
    epoch: int = Field(..., description="epoch is the epoch (1-based) of the checkpoint's last step.")
    step: int = Field(
        ...,
        description=(
            "step is the run's optimizer step count at the checkpoint: the steps after it, up to the "
            "failure, were lost and trained again."
        ),
    )


class Progress(base.Model):
    epoch: int | None = Field(None, description="epoch is the last epoch rank 0 reported (1-based).")
    epochs: int | None = Field(None, description="epochs is the total number of epochs.")
    step: int | None = Field(None, description="step is the last optimizer step reported.")
    loss: float | None = Field(
        None, description="loss is the mean training loss of the last reported epoch (column Train-Loss)."
    )
    validation_loss: float | None = Field(
        None,
        description="validationLoss is the last reported loss on the validation split (column Val-Loss).",
    )
    accuracy: float | None = Field(
        None,
        description="accuracy is the last reported validation-split accuracy, 0..1 (column Val-Accuracy).",
    )
    images_per_second: float | None = Field(
        None,
        description="imagesPerSecond is the last reported epoch's training throughput, all workers together.",
    )
    updated_at: str | None = Field(None, description="updatedAt is when rank 0 wrote the report (RFC 3339).")
    resumed_from: ResumedFrom | None = Field(
        None,
        description=(
            "resumedFrom is the checkpoint this attempt's rank 0 resumed from; absent when it started fresh."
        ),
    )


class WorkerFailure(base.Model):
    worker: int = Field(..., description="worker is the index of the failed worker.")
    pod: str | None = Field(None, description="pod is the failed worker's pod name.")
    exit_code: int | None = Field(None, description="exitCode is the container's exit code, when it had one.")
    reason: str | None = Field(
        None, description="reason is the Kubernetes reason (Error, OOMKilled, Evicted...)."
    )
    message: str | None = Field(None, description="message is the full human-readable description.")
    restart_attempt: int = Field(0, description="restartAttempt is the attempt the failure happened in.")
    node: str | None = Field(None, description="node is the node the failed worker's pod ran on.")
    disruption: str | None = Field(
        None,
        description=(
            "disruption is set when the cluster took the worker away rather than the worker failing: the "
            "reason of its pod's DisruptionTarget condition (EvictionByEvictionAPI, PreemptionByScheduler, "
            "DeletionByTaintManager, DeletionByPodGC, TerminationByKubelet), or DisruptionTarget when only "
            "the worker Job's podFailurePolicy said so (the pod was deleted before the operator saw its last "
            "state, as across an operator restart). Such a restart counts in disruptionRestarts."
        ),
    )


class ElasticStatus(base.Model):
    members: list[int] | None = Field(
        None,
        description=(
            "members are the indices of the workers whose pods run now, in order; every change is also a "
            "MembershipChanged event."
        ),
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    world_size: int | None = Field(
        None,
        description="worldSize is the number of training processes the running workers hold (members x "
        "nprocPerWorker); torchrun forms its group from them at the next rendezvous.",
    )
    worker_attempts: list[int] | None = Field(
        None,
        description=(
            "workerAttempts lists, by worker index, the attempt each worker's current Job carries "
            "(`<trainingjob>-r<attempt>-w<index>`): a replaced worker gets a new attempt, the others keep "
            "theirs. A worker beyond the list (scaled up) starts at restartAttempt."
        ),
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    store_generation: int | None = Field(
        None,
        description=(
            "storeGeneration numbers the rendezvous store the workers use (`<trainingjob>-rdzv`, then "
            "`-rdzv-g<generation>`): each lost store (its pod evicted, its node gone, its Job deleted) is "
            "replaced by a new one under a new name, at once, however long the old pod takes to go."
        ),
    )


class TrainingJobStatus(base.Model):
    phase: Phase | None = Field(
        None,
        description=(
            "phase summarises the job: Pending (workers not all running yet), Running (every worker's pod "
            "running), Restarting (the group is being recreated after a failure), Succeeded (every worker "
            "succeeded, or worker 0 under successPolicy Worker0), Failed, or Suspended."
        ),
    )
    message: str | None = Field(
        None, description="message is a one-line human summary of the latest transition."
    )
    conditions: list[Condition] | None = Field(
        None,
        description=(
            "conditions are Created, Running, Restarting, Succeeded, Failed, Suspended and SpecRefused, "
            "with reasons."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    workers: WorkerCounts | None = Field(
        None, description="workers counts the current attempt's workers by state."
    )
    workers_ready: str | None = Field(
        None, description="workersReady is `<ready>/<workers>` for the printer column, e.g. 2/4."
    )
    restarts: int | None = Field(
        None,
        description=(
            "restarts is how many whole-group restarts (on an elastic job: single-worker replacements) "
            "failures have caused (at most maxRestarts)."
        ),
    )
    disruption_restarts: int | None = Field(
        None,
        description=(
            "disruptionRestarts is how many restarts disruptions caused (evictions, drains, preemptions, "
            "lost nodes: see runPolicy.maxDisruptionRestarts); they are not counted in restarts."
        ),
    )
    restart_attempt: int | None = Field(
        None,
        description=(
            "restartAttempt numbers the current worker group: 0 for the first, +1 each time a group is "
            "replaced, by a restart or by a resume after a suspend that deleted running workers (a job "
            "created suspended runs its first group, when admitted, as attempt 0). It appears in worker "
            "Job names and in KUBETRAIN_RESTART_ATTEMPT."
        ),
    )
    start_time: datetime | None = Field(
        None, description="startTime is when the current run's workers were first created (reset by suspend)."
    )
    completion_time: datetime | None = Field(
        None, description="completionTime is when the job Succeeded or Failed."
    )
    observed_generation: int | None = Field(
        None, description="observedGeneration is the metadata.generation this status was computed from."
    )
    gang_provider: GangProvider | None = Field(
        None,
        description=(
            "gangProvider is the gang scheduler this job was given (spec.gangScheduling.provider, or when "
            "that is empty the operator's choice, the first the cluster served), recorded when the job was "
            "first planned and kept for its life: an operator restart that finds another provider served "
            "does not switch a job between providers."
        ),
    )
    pending_reason: str | None = Field(
        None,
        description=(
            "pendingReason says why workers are not running yet: Unschedulable, ImagePullBackOff, "
            "ErrImagePull, CreateContainerConfigError, FailedCreate, WaitingForOldWorkers..."
        ),
    )
    pending_message: str | None = Field(
        None, description="pendingMessage names the worker and repeats Kubernetes' explanation."
    )
    last_failure: WorkerFailure | None = Field(
        None, description="lastFailure describes the latest worker failure."
    )
    progress: Progress | None = Field(
        None,
        description=(
            "progress is the latest training progress rank 0 reported (pod annotation kubetrain.io/progress)."
        ),
    )
    elastic: ElasticStatus | None = Field(
        None, description="elastic is the membership of an elastic job (spec.elastic): who runs, how many."
    )
