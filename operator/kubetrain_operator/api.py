"""The TrainingJob API (kubetrain.io/v1alpha1): pydantic models for spec and status.

These models are the one source of truth: `crdgen` turns their JSON schema into the CRD's
openAPIV3Schema, and the operator validates every object it reconciles with them. Every field's
description starts with its JSON name and says its default, unit, format and whether it can change
after creation, because it becomes `kubectl explain trainingjob.spec.<field>` text.

Cross-field rules are written twice on purpose: as CEL `x-kubernetes-validations` (so `kubectl apply`
refuses a bad object and nothing is created) and as pydantic validators (so the operator refuses the same
object when the CRD was installed without them); a unit test checks both sides agree.

Mutability, in one place: the shape of the group (image, imagePullPolicy, workers, nprocPerWorker,
resources, trainer, command, args, launcher, storage, masterPort, successPolicy, gangScheduling) is
immutable, because
changing it under a running DDP group has no safe meaning. Run and failure policies, and the
scheduling and pod-metadata fields (env, imagePullSecrets, nodeSelector, tolerations, affinity,
priorityClassName, schedulerName, serviceAccountName, podLabels, podAnnotations), can change at any
time; scheduling and pod-metadata changes apply to workers created afterwards (the next restart attempt
or resume), which is what queueing systems such as Kueue need when they admit a suspended job.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from kubetrain_trainer import contract
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.exit_codes import PERMANENT_EXIT_CODES
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from kubetrain_operator import constants

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""Kubernetes resource.Quantity syntax (the pattern controller-gen emits for quantities)."""

RESERVED_ENV = (
    contract.MASTER_ADDR,
    contract.MASTER_PORT,
    contract.WORLD_SIZE,
    contract.RANK,
    contract.LOCAL_RANK,
    contract.LOCAL_WORLD_SIZE,
    contract.NODE_RANK,
    contract.PET_NNODES,
    contract.PET_NPROC_PER_NODE,
    contract.PET_NODE_RANK,
    contract.PET_MASTER_ADDR,
    contract.PET_MASTER_PORT,
    contract.JOB_NAME,
    contract.RESTART_ATTEMPT,
    contract.TRAINER_CONFIG,
    contract.POD_NAME,
    contract.POD_NAMESPACE,
)
"""Env names the operator injects; a user env entry with one of these names is refused."""

IMMUTABLE_SPEC_FIELDS = (
    "image",
    "imagePullPolicy",
    "workers",
    "nprocPerWorker",
    "resources",
    "trainer",
    "command",
    "args",
    "launcher",
    "storage",
    "masterPort",
    "successPolicy",
    "gangScheduling",
)
"""Spec fields that cannot change after creation (enforced by CEL transition rules on `spec`)."""

MAX_WORKERS = 4096
MAX_RESTARTS = 1000

Phase = Literal["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
PHASES: tuple[str, ...] = ("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended")
TERMINAL_PHASES = ("Succeeded", "Failed")
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


def _cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def _extra(*rules: dict[str, str], **more: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict(more)
    if rules:
        out["x-kubernetes-validations"] = list(rules)
    return out


class _Model(BaseModel):
    """camelCase JSON names, unknown keys refused, Python names usable too."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


Quantity = Annotated[int | str, Field(json_schema_extra={"x-kubetrain-quantity": True})]


class Resources(_Model):
    """Compute resources of each worker's container (the Kubernetes ResourceRequirements shape)."""

    model_config = ConfigDict(
        json_schema_extra=_extra(
            _cel(
                "!has(self.requests) || !has(self.limits) || !('nvidia.com/gpu' in self.requests) "
                "|| !('nvidia.com/gpu' in self.limits) "
                "|| string(self.requests['nvidia.com/gpu']) == string(self.limits['nvidia.com/gpu'])",
                "resources.requests['nvidia.com/gpu'] must equal resources.limits['nvidia.com/gpu']",
            )
        )
    )

    requests: dict[str, Quantity] | None = Field(
        None,
        max_length=32,
        description=(
            "requests is the minimum each worker needs, keyed by resource name (cpu, memory, "
            "nvidia.com/gpu, ...), values in Kubernetes quantity syntax (cpu: 2 or 500m; memory: 8Gi). "
            "An nvidia.com/gpu request without a limit gets the same limit (extended resources need one). "
            "Default: none. Immutable."
        ),
    )
    limits: dict[str, Quantity] | None = Field(
        None,
        max_length=32,
        description=(
            "limits is the most each worker may use, keyed by resource name, in quantity syntax. "
            "nvidia.com/gpu here is the number of GPUs per worker and drives nprocPerWorker: auto. "
            "Default: none. Immutable."
        ),
    )

    @field_validator("requests", "limits")
    @classmethod
    def _quantities(cls, values: dict[str, int | str] | None) -> dict[str, int | str] | None:
        for key, value in (values or {}).items():
            if isinstance(value, str) and not re.match(QUANTITY_PATTERN, value):
                raise ValueError(f"{key}: {value!r} is not a Kubernetes quantity (e.g. 2, 500m, 8Gi)")
        return values

    @model_validator(mode="after")
    def _gpu_limit_matches_request(self) -> Resources:
        gpu = constants.GPU_RESOURCE
        both = self.requests and self.limits and gpu in self.requests and gpu in self.limits
        if both and str(self.requests[gpu]) != str(self.limits[gpu]):  # type: ignore[index]
            raise ValueError(f"resources.requests['{gpu}'] must equal resources.limits['{gpu}']")
        return self

    def gpus(self) -> int:
        """GPUs per worker: the nvidia.com/gpu limit, else the request, else 0."""
        for source in (self.limits, self.requests):
            if source and constants.GPU_RESOURCE in source:
                try:
                    return int(str(source[constants.GPU_RESOURCE]))
                except ValueError:
                    return 0
        return 0


class PVCSource(_Model):
    claim_name: str = Field(
        ...,
        min_length=1,
        max_length=253,
        description="claimName is the name of a PersistentVolumeClaim in the TrainingJob's namespace.",
    )
    read_only: bool = Field(False, description="readOnly mounts the claim read-only. Default false.")


class HostPathSource(_Model):
    path: str = Field(
        ...,
        min_length=1,
        max_length=4096,
        description=(
            "path is the directory on the node. hostPath volumes break the restricted Pod Security "
            "Standard: use them only on development clusters."
        ),
    )
    type: Literal["", "Directory", "DirectoryOrCreate"] = Field(
        "DirectoryOrCreate",
        description=(
            "type is the hostPath type check: Directory, DirectoryOrCreate or empty. Default "
            "DirectoryOrCreate."
        ),
    )


class EmptyDirSource(_Model):
    medium: Literal["", "Memory"] = Field(
        "", description="medium is the storage medium: empty (node disk, default) or Memory (tmpfs)."
    )
    size_limit: Quantity | None = Field(
        None,
        description="sizeLimit caps the volume's size in quantity syntax (e.g. 10Gi). Default: no limit.",
    )


class StorageVolume(_Model):
    """One volume mounted into every worker for data, checkpoints and artifacts."""

    model_config = ConfigDict(
        json_schema_extra=_extra(
            _cel(
                "[has(self.persistentVolumeClaim), has(self.hostPath), has(self.emptyDir)]"
                ".filter(x, x).size() == 1",
                "exactly one of persistentVolumeClaim, hostPath and emptyDir must be set",
            )
        )
    )

    name: str = Field(
        ...,
        min_length=1,
        max_length=40,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description=(
            "name identifies the volume (a DNS label of at most 40 characters); the pod volume is named "
            "`data-<name>`. Required, unique within storage."
        ),
    )
    mount_path: str = Field(
        ...,
        min_length=1,
        max_length=4096,
        pattern=r"^/",
        description=(
            "mountPath is the absolute path where the volume appears in the worker container. Required."
        ),
    )
    sub_path: str | None = Field(
        None,
        max_length=4096,
        description="subPath mounts only this sub-directory of the volume. Default: the root.",
    )
    persistent_volume_claim: PVCSource | None = Field(
        None, description="persistentVolumeClaim mounts an existing claim (ReadWriteMany when workers > 1)."
    )
    host_path: HostPathSource | None = Field(None, description="hostPath mounts a directory of the node.")
    empty_dir: EmptyDirSource | None = Field(
        None, description="emptyDir is scratch space that lives as long as the worker pod."
    )

    @model_validator(mode="after")
    def _one_source(self) -> StorageVolume:
        given = [s for s in (self.persistent_volume_claim, self.host_path, self.empty_dir) if s is not None]
        if len(given) != 1:
            raise ValueError("exactly one of persistentVolumeClaim, hostPath and emptyDir must be set")
        return self


class EnvVar(_Model):
    model_config = ConfigDict(
        json_schema_extra=_extra(
            _cel(
                "!(self.name in " + "[" + ", ".join(f"'{n}'" for n in RESERVED_ENV) + "])",
                "env name is reserved: the operator sets it (see the worker environment contract)",
                ".name",
            ),
            _cel("has(self.value) != has(self.valueFrom)", "exactly one of value and valueFrom must be set"),
        )
    )

    name: str = Field(
        ...,
        min_length=1,
        max_length=256,
        pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
        description=(
            "name of the environment variable. Names the operator injects (MASTER_ADDR, RANK, WORLD_SIZE, "
            "PET_*, KUBETRAIN_*) are refused."
        ),
    )
    value: str | None = Field(
        None,
        max_length=32768,
        description="value of the variable; may refer to earlier ones as $(NAME), e.g. $(RANK).",
    )
    value_from: dict[str, Any] | None = Field(
        None,
        description=(
            "valueFrom takes the value from a Secret, ConfigMap or field, exactly as in a Kubernetes "
            "container's env[].valueFrom."
        ),
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name in RESERVED_ENV:
            raise ValueError(f"env name {name} is reserved: the operator sets it")
        return name

    @model_validator(mode="after")
    def _value_xor(self) -> EnvVar:
        if (self.value is None) == (self.value_from is None):
            raise ValueError("exactly one of value and valueFrom must be set")
        return self


class SecretReference(_Model):
    name: str = Field(
        ...,
        min_length=1,
        max_length=253,
        description="name of a Secret in the TrainingJob's namespace (kubernetes.io/dockerconfigjson).",
    )


class GangScheduling(_Model):
    """All workers are placed together or not at all, by a gang scheduler through a PodGroup."""

    provider: Literal["volcano", "scheduler-plugins"] = Field(
        ...,
        description=(
            "provider is the gang scheduler: volcano (a scheduling.volcano.sh/v1beta1 PodGroup, pods "
            "annotated scheduling.k8s.io/group-name) or scheduler-plugins (a scheduling.x-k8s.io/v1alpha1 "
            "PodGroup for the Coscheduling plugin, pods labelled scheduling.x-k8s.io/pod-group). The "
            "PodGroup is named like the Service and requires every worker (minMember = workers). Required."
        ),
    )
    queue: str | None = Field(
        None,
        max_length=253,
        description="queue is the Volcano queue of the PodGroup. Default: Volcano's default.",
    )
    schedule_timeout_seconds: int | None = Field(
        None,
        ge=1,
        description=(
            "scheduleTimeoutSeconds is how long scheduler-plugins waits for the whole group before giving "
            "up a scheduling cycle. Default: the plugin's default."
        ),
    )


class RunPolicy(_Model):
    max_restarts: int = Field(
        3,
        ge=0,
        le=MAX_RESTARTS,
        description=(
            "maxRestarts is how many times the whole worker group may be torn down and recreated after a "
            "worker fails with a retryable exit code or reason; the failure after the last restart fails "
            "the TrainingJob. Default 3, at most 1000. Mutable: raising it revives nothing that already "
            "failed, but counts for later failures."
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
            "activeDeadlineSeconds clock. Queueing systems such as Kueue "
            "create jobs suspended and admit them by setting false. Default false. Mutable."
        ),
    )


class FailurePolicy(_Model):
    model_config = ConfigDict(
        json_schema_extra=_extra(
            _cel(
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
            "(eviction, node loss, deleted pod) are always retryable. Mutable."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @model_validator(mode="after")
    def _disjoint(self) -> FailurePolicy:
        both = set(self.retryable_exit_codes or ()) & set(self.non_retryable_exit_codes)
        if both:
            raise ValueError(f"exit codes {sorted(both)} cannot be both retryable and non-retryable")
        return self

    def is_retryable(self, exit_code: int | None) -> bool:
        """Whether a worker ending with this exit code (None: no code, e.g. evicted) may be restarted."""
        if exit_code is None:
            return True
        if exit_code in self.non_retryable_exit_codes:
            return False
        if self.retryable_exit_codes is not None:
            return exit_code in self.retryable_exit_codes
        return True


def _reserved_keys_rule(field: str) -> dict[str, str]:
    return _cel(
        f"self.all(k, !k.startsWith('{constants.RESERVED_LABEL_PREFIX}'))",
        f"{field} keys under {constants.RESERVED_LABEL_PREFIX} are reserved for the operator",
    )


def _immutable_rules() -> list[dict[str, str]]:
    rules = []
    for name in IMMUTABLE_SPEC_FIELDS:
        rules.append(
            _cel(
                f"has(self.{name}) == has(oldSelf.{name}) && (!has(self.{name}) || self.{name} == "
                f"oldSelf.{name})",
                f"spec.{name} is immutable: create a new TrainingJob to change it",
                f".{name}",
            )
        )
    return rules


class TrainingJobSpec(_Model):
    """What to train, on how many workers, and the policies that run it."""

    model_config = ConfigDict(
        json_schema_extra=_extra(
            _cel(
                "has(self.trainer) != has(self.command)",
                "exactly one of spec.trainer (the built-in trainer) and spec.command (your own program) "
                "must be set",
            ),
            _cel("!has(self.args) || has(self.command)", "spec.args needs spec.command", ".args"),
            _cel(
                "!has(self.storage) || self.storage.all(a, self.storage.exists_one(b, b.mountPath == "
                "a.mountPath))",
                "spec.storage mountPaths must be unique",
                ".storage",
            ),
            *_immutable_rules(),
        )
    )

    image: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description=(
            "image is the container image every worker runs. Default: the operator's default image "
            "(`kubetrain operator --default-image`, env KUBETRAIN_DEFAULT_IMAGE). Immutable."
        ),
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None,
        description=(
            "imagePullPolicy is Always, IfNotPresent or Never. Default: Kubernetes' default. Immutable."
        ),
    )
    image_pull_secrets: list[SecretReference] | None = Field(
        None,
        max_length=16,
        description=(
            "imagePullSecrets name Secrets holding registry credentials for the image. Default: none. "
            "Mutable: applies to workers created after the change."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    workers: int = Field(
        1,
        ge=1,
        le=MAX_WORKERS,
        description=(
            "workers is the number of worker pods (nodes) in the group, each one a batch Job named "
            "`<trainingjob>-r<restartAttempt>-w<index>` (the TrainingJob name is cut to a prefix plus a hash "
            "when longer than 48 characters or not a DNS label); worker 0 is the master. Default 1, at most "
            "4096. Immutable."
        ),
    )
    nproc_per_worker: int | Literal["auto"] = Field(
        "auto",
        description=(
            "nprocPerWorker is the number of training processes per worker (torchrun's nproc_per_node): an "
            "integer >= 1, or auto for one per GPU (resources nvidia.com/gpu), else 1. "
            "WORLD_SIZE = workers x nprocPerWorker. Default auto. Immutable."
        ),
        json_schema_extra=_extra(
            _cel(
                "type(self) == int ? self >= 1 : self == 'auto'",
                'nprocPerWorker must be an integer >= 1 or "auto"',
            )
        ),
    )
    resources: Resources | None = Field(
        None, description="resources are each worker's requests and limits. Default: none. Immutable."
    )
    trainer: TrainerConfig | None = Field(
        None,
        description=(
            "trainer configures the built-in trainer (`kubetrain train`), passed to every worker as JSON in "
            "KUBETRAIN_TRAINER_CONFIG; field names are the trainer's own (snake_case). Exactly one of "
            "trainer and command. Immutable."
        ),
    )
    command: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        None,
        min_length=1,
        max_length=256,
        description=(
            "command runs your own program instead of the built-in trainer, e.g. [python, /app/train.py]. "
            "Under launcher torchrun it runs as `torchrun --no-python <command> <args>`, torchrun reading "
            "its settings from the PET_* variables. Exactly one of trainer and command. Default: none "
            "(the built-in trainer runs when trainer is set). Immutable."
        ),
    )
    args: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        None,
        max_length=256,
        description="args are appended to command. Needs command. Default: none. Immutable.",
    )
    launcher: Literal["torchrun", "plain"] = Field(
        "torchrun",
        description=(
            "launcher says how command starts on each worker: torchrun starts nprocPerWorker processes "
            "(each with its own RANK and LOCAL_RANK); plain runs command once per worker with RANK set to "
            "the worker's first global rank (NODE_RANK x nprocPerWorker). The built-in trainer uses torchrun "
            "only when nprocPerWorker > 1. Default torchrun. Immutable."
        ),
    )
    master_port: int = Field(
        constants.DEFAULT_MASTER_PORT,
        ge=1024,
        le=65535,
        description=(
            "masterPort is the TCP port of the rendezvous on worker 0 (MASTER_PORT). Default 29500. "
            "Immutable."
        ),
    )
    storage: list[StorageVolume] | None = Field(
        None,
        max_length=16,
        description=(
            "storage lists volumes mounted into every worker for data, checkpoints and artifacts "
            "(a PersistentVolumeClaim, hostPath or emptyDir each). Default: none. Immutable."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    env: list[EnvVar] | None = Field(
        None,
        max_length=128,
        description=(
            "env adds environment variables to every worker (the operator's own contract variables cannot "
            "be overridden). Mutable: applies to workers created after the change."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    node_selector: dict[str, Annotated[str, Field(max_length=253)]] | None = Field(
        None,
        max_length=64,
        description=(
            "nodeSelector constrains workers to nodes with these labels. Default: none. Mutable: applies to "
            "workers created after the change."
        ),
    )
    tolerations: list[dict[str, Any]] | None = Field(
        None,
        max_length=64,
        description=(
            "tolerations are the workers' pod tolerations (Kubernetes syntax). Default: none. Mutable: "
            "applies to workers created after the change."
        ),
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    affinity: dict[str, Any] | None = Field(
        None,
        description=(
            "affinity is the workers' pod affinity (Kubernetes syntax). Default: none. Mutable: applies to "
            "workers created after the change."
        ),
    )
    priority_class_name: str | None = Field(
        None,
        max_length=253,
        description=(
            "priorityClassName is the workers' PriorityClass. Default: none. Mutable: applies to workers "
            "created after the change."
        ),
    )
    scheduler_name: str | None = Field(
        None,
        max_length=253,
        description=(
            "schedulerName picks the scheduler for the workers, e.g. a gang scheduler (volcano, "
            "scheduler-plugins). Default: the cluster default. Mutable: applies to workers created after "
            "the change."
        ),
    )
    service_account_name: str | None = Field(
        None,
        max_length=253,
        description=(
            "serviceAccountName runs the workers as this ServiceAccount. Default: the namespace default. "
            "Mutable: applies to workers created after the change."
        ),
    )
    pod_labels: dict[str, Annotated[str, Field(max_length=63)]] | None = Field(
        None,
        max_length=64,
        description=(
            "podLabels are added to every worker pod; keys under kubetrain.io/ are reserved. "
            "Mutable: applies to workers created after the change."
        ),
        json_schema_extra=_extra(_reserved_keys_rule("podLabels")),
    )
    pod_annotations: dict[str, Annotated[str, Field(max_length=4096)]] | None = Field(
        None,
        max_length=64,
        description=(
            "podAnnotations are added to every worker pod; keys under kubetrain.io/ are reserved. "
            "Mutable: applies to workers created after the change."
        ),
        json_schema_extra=_extra(_reserved_keys_rule("podAnnotations")),
    )
    gang_scheduling: GangScheduling | None = Field(
        None,
        description=(
            "gangScheduling makes a gang scheduler place all workers at once, so a half-scheduled group "
            "never holds GPUs while waiting: the operator creates a PodGroup and sets schedulerName to "
            "volcano (for provider volcano) or scheduler-plugins-scheduler unless spec.schedulerName says "
            "otherwise. Needs that scheduler and its CRDs installed. Default: none (the default scheduler). "
            "Immutable."
        ),
    )
    success_policy: Literal["AllWorkers", "Worker0"] = Field(
        "AllWorkers",
        description=(
            "successPolicy says when the job Succeeded: AllWorkers (every worker's container exited 0) or "
            "Worker0 (the master exited 0; the other workers are then deleted). Default AllWorkers. "
            "Immutable."
        ),
    )
    run_policy: RunPolicy = Field(
        default_factory=RunPolicy,
        description="runPolicy holds restarts, deadline, TTL, cleanup and suspend. Mutable.",
        json_schema_extra={"default": {}},
    )
    failure_policy: FailurePolicy = Field(
        default_factory=FailurePolicy,
        description=(
            "failurePolicy says which worker exit codes restart the group and which fail the job at once. "
            "Default: the trainer's permanent codes 2 and 3 fail at once, any other failure restarts. "
            "Mutable."
        ),
        json_schema_extra={"default": {}},
    )

    @model_validator(mode="after")
    def _cross_field(self) -> TrainingJobSpec:
        if (self.trainer is None) == (self.command is None):
            raise ValueError(
                "exactly one of spec.trainer (the built-in trainer) and spec.command (your own program) "
                "must be set"
            )
        if self.args is not None and self.command is None:
            raise ValueError("spec.args needs spec.command")
        if self.storage:
            paths = [v.mount_path for v in self.storage]
            names = [v.name for v in self.storage]
            if len(set(paths)) != len(paths):
                raise ValueError("spec.storage mountPaths must be unique")
            if len(set(names)) != len(names):
                raise ValueError("spec.storage names must be unique")
        if self.env:
            names = [e.name for e in self.env]
            if len(set(names)) != len(names):
                raise ValueError("spec.env names must be unique")
        for field, values in (("podLabels", self.pod_labels), ("podAnnotations", self.pod_annotations)):
            for key in values or {}:
                if key.startswith(constants.RESERVED_LABEL_PREFIX):
                    raise ValueError(
                        f"spec.{field} keys under {constants.RESERVED_LABEL_PREFIX} are reserved for the "
                        f"operator"
                    )
        return self

    @field_validator("nproc_per_worker")
    @classmethod
    def _nproc(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError('nprocPerWorker must be an integer >= 1 or "auto"')
        return value

    def procs_per_worker(self) -> int:
        """nprocPerWorker resolved: auto is the GPU count per worker, or 1 without GPUs."""
        if self.nproc_per_worker == "auto":
            gpus = self.resources.gpus() if self.resources else 0
            return gpus if gpus > 0 else 1
        return int(self.nproc_per_worker)

    def world_size(self) -> int:
        """Total training processes: workers x processes per worker (never the number of nodes)."""
        return self.workers * self.procs_per_worker()


# ---------------------------------------------------------------- status


class Condition(_Model):
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


class WorkerCounts(_Model):
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


class Progress(_Model):
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
    updated_at: str | None = Field(None, description="updatedAt is when rank 0 wrote the report (RFC 3339).")


class WorkerFailure(_Model):
    worker: int = Field(..., description="worker is the index of the failed worker.")
    pod: str | None = Field(None, description="pod is the failed worker's pod name.")
    exit_code: int | None = Field(None, description="exitCode is the container's exit code, when it had one.")
    reason: str | None = Field(
        None, description="reason is the Kubernetes reason (Error, OOMKilled, Evicted...)."
    )
    message: str | None = Field(None, description="message is the full human-readable description.")
    restart_attempt: int = Field(0, description="restartAttempt is the attempt the failure happened in.")


class TrainingJobStatus(_Model):
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
        description="restarts is how many whole-group restarts failures have caused (at most maxRestarts).",
    )
    restart_attempt: int | None = Field(
        None,
        description=(
            "restartAttempt numbers the current worker group: 0 at first, +1 on every restart and every "
            "resume from suspend. It appears in worker Job names and in KUBETRAIN_RESTART_ATTEMPT."
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


class TrainingJob(_Model):
    """A distributed PyTorch training job (for validating whole manifests in tests and tools)."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["kubetrain.io/v1alpha1"] = Field(constants.API_VERSION)
    kind: Literal["TrainingJob"] = Field(constants.KIND)
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: TrainingJobSpec
    status: TrainingJobStatus | None = None
