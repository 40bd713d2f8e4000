"""The policies that run a job: restarts, deadline, cleanup and suspension (RunPolicy), which exit codes
are retryable (FailurePolicy), and elastic membership (Elastic), with the limits on group size and restarts.
"""

from __future__ import annotations

from typing import Annotated, Literal

from kubetrain_trainer.exit_codes import PERMANENT_EXIT_CODES, ExitCode
from pydantic import ConfigDict, Field, model_validator

from kubetrain_operator.api import base

MAX_WORKERS = 4096
"""The most workers a group may have: the bound of spec.workers and of the elastic bounds."""
MAX_RESTARTS = 1000
"""The most restarts runPolicy.maxRestarts may allow."""
MIN_PROGRESS_DEADLINE_SECONDS = 20
"""The shortest failurePolicy.progressDeadlineSeconds: heartbeats every 5 s, four to a deadline."""


class RunPolicy(base.Model):
    max_restarts: int = Field(
        3,
        ge=0,
        le=MAX_RESTARTS,
        description=(
            "maxRestarts is how many times the whole worker group may be torn down and recreated after a "
            "worker fails with a retryable exit code or reason; the failure after the last restart fails "
            "the TrainingJob. On an elastic job each replacement of one failed worker counts as one restart. "
            "Default 3, at most 1000. Mutable: raising it revives nothing that already "
            "failed, but counts for later failures."
        ),
    )
    max_disruption_restarts: int | None = Field(
        None,
        ge=0,
        le=MAX_RESTARTS,
        description=(
            "maxDisruptionRestarts bounds the restarts caused by disruptions, which never count against "
            "maxRestarts: a worker pod the cluster took away (the API server's DisruptionTarget condition: "
            "an eviction or `kubectl drain`, a preemption by the scheduler, a taint on a lost node, the "
            "pod garbage collector after a node was deleted, the kubelet under node pressure). A group "
            "restarted for a disruption resumes from its checkpoint as a failure would; the disruption after "
            "the last allowed one fails the job with reason DisruptionLimitExceeded, so a flapping node "
            "cannot loop for ever. Default: unlimited, as a Job's podFailurePolicy Ignore rule. Mutable."
        ),
    )
    active_deadline_seconds: int | None = Field(
        None,
        ge=1,
        description=(
            "activeDeadlineSeconds is the longest the job may run, in seconds, counted from status.startTime "
            "(the latest start or resume, across restarts); past it the job fails with reason "
            "DeadlineExceeded and its workers are deleted. Default: no deadline. Mutable."
        ),
    )
    ttl_seconds_after_finished: int | None = Field(
        None,
        ge=0,
        description=(
            "ttlSecondsAfterFinished deletes the TrainingJob (and, through ownerReferences, its children) "
            "this many seconds after it Succeeded or Failed. Default: never deleted. Mutable."
        ),
    )
    clean_pod_policy: Literal["None", "Running", "All"] = Field(
        "Running",
        description=(
            "cleanPodPolicy says which worker Jobs (and their pods) are deleted when the TrainingJob "
            "finishes: Running deletes the ones still running (finished pods stay for their logs), All "
            "deletes every worker Job and the Service, None deletes nothing (still-running workers keep "
            "running and holding their resources). Default Running. Mutable."
        ),
    )
    suspend: bool = Field(
        False,
        description=(
            "suspend true deletes the workers (their progress lives only in checkpoints) and reports phase "
            "Suspended; setting it back to false recreates them as a new restart attempt, once the old "
            "workers' pods are gone, without using the restart budget, and restarts the "
            "activeDeadlineSeconds clock. Queueing systems create jobs suspended and admit them by setting "
            "false: such a job's first group is attempt 0, as nothing was replaced. A job labelled "
            "kueue.x-k8s.io/queue-name is also kept Suspended until Kueue admits its Workload (and suspended "
            "again when Kueue evicts it); suspend true deactivates its Workload, giving its quota back. "
            "Default false. Mutable."
        ),
    )


class FailurePolicy(base.Model):
    model_config = ConfigDict(
        json_schema_extra=base.schema_extra(
            base.cel_rule(
                "!has(self.retryableExitCodes) || "
                "self.retryableExitCodes.all(c, !(c in self.nonRetryableExitCodes))",
                "an exit code cannot be both retryable and non-retryable",
                ".retryableExitCodes",
            )
        )
    )

    non_retryable_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=lambda: [int(c) for c in PERMANENT_EXIT_CODES],
        max_length=64,
        description=(
            "nonRetryableExitCodes fail the TrainingJob at once, without a restart, when any worker's "
            "container exits with one of them. Default [2, 3]: the built-in trainer's bad-configuration and "
            "data-error codes. Mutable."
        ),
        json_schema_extra={
            "default": [int(c) for c in PERMANENT_EXIT_CODES],
            "x-kubernetes-list-type": "set",
        },
    )
    retryable_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] | None = Field(
        None,
        max_length=64,
        description=(
            "retryableExitCodes, when set, are the only exit codes that restart the group; any other "
            "non-zero code fails the job at once. Default: unset, every code not in nonRetryableExitCodes "
            "is retryable (the trainer's 1, 10, 11 and 12 among them). Failures without an exit code "
            "(eviction, node loss, deleted pod) are always retryable, and so is the trainer's 130 (SIGTERM: "
            "its pod was being deleted). Mutable."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    progress_deadline_seconds: int | None = Field(
        None,
        ge=MIN_PROGRESS_DEADLINE_SECONDS,
        le=7 * 24 * 3600,
        description=(
            "progressDeadlineSeconds restarts the group when a worker made no progress (no optimizer step, "
            "evaluation batch or checkpoint written) for this many seconds while the group runs: a hung "
            "collective or a frozen process, which no exit code ever reports. Each worker then reports its "
            "progress on its pod (kubetrain.io/heartbeat) every quarter of the deadline, at most every 30 "
            "s. The restart counts against maxRestarts like a crash, and status, lastFailure and an Event "
            "name the stalled workers and their last step. Set it above the longest pause a healthy run "
            "makes (data loading at start, a resume). An elastic group is judged once all its wanted "
            "workers run, and restarts whole with a new rendezvous store. Default: unset, no heartbeat, no "
            "check. Mutable."
        ),
    )

    @model_validator(mode="after")
    def _disjoint(self) -> FailurePolicy:
        both = set(self.retryable_exit_codes or ()) & set(self.non_retryable_exit_codes)
        if both:
            raise ValueError(
                f"retryableExitCodes and nonRetryableExitCodes share {sorted(both)}: a code cannot be both"
            )
        return self

    def is_retryable(self, exit_code: int | None) -> bool:
        """Whether a worker ending with this exit code (None: no code, e.g. evicted) may be restarted."""
        if exit_code is None or exit_code == ExitCode.INTERRUPTED:
            return True
        if exit_code in self.non_retryable_exit_codes:
            return False
        if self.retryable_exit_codes is not None:
            return exit_code in self.retryable_exit_codes
        return True


def heartbeat_seconds(progress_deadline_seconds: int) -> int:
    """How often each worker reports progress for a deadline: four reports fit in it, at most every 30 s."""
    return max(MIN_PROGRESS_DEADLINE_SECONDS // 4, min(30, progress_deadline_seconds // 4))


ELASTIC_LAST_CALL_SECONDS = 30
"""torchrun's own last_call_timeout: how long a rendezvous round with at least the minimum stays open."""


class Elastic(base.Model):
    """Elastic membership: the group trains with any number of workers between minWorkers and maxWorkers.

    Workers run under torchrun with a c10d rendezvous whose store lives in a pod of its own (see
    docs/elastic.md), so losing any worker, worker 0 included, leaves the rendezvous intact: the
    operator replaces only the lost worker and the survivors re-rendezvous with it.
    """

    min_workers: int = Field(
        ...,
        ge=1,
        le=MAX_WORKERS,
        description=(
            "minWorkers is the fewest workers the group trains with (torchrun --nnodes MIN:MAX). With fewer "
            "running (pods Pending, unschedulable) the job waits in phase Pending and says why. Required. "
            "Immutable."
        ),
    )
    max_workers: int = Field(
        ...,
        ge=1,
        le=MAX_WORKERS,
        description=(
            "maxWorkers is the most workers the group trains with, and the upper bound of spec.workers. "
            "The built-in trainer keeps its global batch at batch_size x maxWorkers x nprocPerWorker at "
            "every world size. Required. Immutable."
        ),
    )
    last_call_seconds: int = Field(
        ELASTIC_LAST_CALL_SECONDS,
        ge=1,
        le=3600,
        description=(
            "lastCallSeconds is how long a rendezvous round that has minWorkers stays open for more "
            "workers (up to maxWorkers) before training starts with those present (torchrun's "
            "last_call_timeout). Default 30. Immutable."
        ),
    )

    @model_validator(mode="after")
    def _ordered(self) -> Elastic:
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"elastic.minWorkers ({self.min_workers}) must not exceed elastic.maxWorkers "
                f"({self.max_workers})"
            )
        return self
