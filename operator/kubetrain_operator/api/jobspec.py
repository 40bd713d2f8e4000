"""TrainingJobSpec, the desired job, and the rules across its fields: exactly one of trainer and command,
unique names and mount paths, elastic bounds, and immutability (which fields, and the CEL that keeps them).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from kubetrain_trainer.config import TrainerConfig
from pydantic import ConfigDict, Field, field_validator, model_validator

from kubetrain_operator.api import (
    base,
    compute,
    constants,
    environment,
    policies,
    scheduling,
    volumes,
)

IMAGE_PATTERN = (
    r"^(([a-zA-Z0-9]|[a-zA-Z0-9][-a-zA-Z0-9]*[a-zA-Z0-9])(\.([a-zA-Z0-9]|[a-zA-Z0-9][-a-zA-Z0-9]*[a-zA-Z0-9]))*"
    r"(:[0-9]+)?/)?"
    r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][-A-Za-z0-9_.]{0,127})?"
    r"(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
"""A container image reference, `[registry[:port]/]repository[:tag][@digest]` (the distribution grammar):
no spaces, lower-case repository. A reference the schema lets through but a registry cannot resolve
would leave workers Pending forever on real nodes."""

MANAGED_BY_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$"
"""spec.managedBy: a domain-prefixed path, as batch/v1 Job's and JobSet's managedBy."""

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
    "managedBy",
    "elastic",
)
"""Spec fields that cannot change after creation (CEL transition rules on each field and, for presence, on
`spec`: see `add_immutable_rules`)."""
ELASTIC_MUTABLE_SPEC_FIELDS = ("workers",)
"""Immutable fields an elastic job may change (`kubectl scale`); their rules are in `_elastic_rules`."""


def _elastic_rules() -> list[dict[str, str]]:
    """spec.workers may change only on an elastic job (kubectl scale), and only within its bounds."""
    return [
        base.cel_rule(
            "!has(self.elastic) || self.elastic.minWorkers <= self.elastic.maxWorkers",
            "spec.elastic.minWorkers must not exceed spec.elastic.maxWorkers",
            ".elastic",
        ),
        base.cel_rule(
            "!has(self.elastic) || (self.workers >= self.elastic.minWorkers && self.workers <= "
            "self.elastic.maxWorkers)",
            "spec.workers must lie between spec.elastic.minWorkers and spec.elastic.maxWorkers",
            ".workers",
        ),
        base.cel_rule(
            "!has(self.elastic) || !has(self.gangScheduling)",
            "spec.elastic and spec.gangScheduling cannot be combined yet: a gang of a changing size is not "
            "designed",
            ".gangScheduling",
        ),
        base.cel_rule(
            "!has(self.elastic) || !has(self.command) || self.launcher != 'plain'",
            "spec.elastic needs spec.launcher torchrun: torchrun runs the rendezvous",
            ".launcher",
        ),
        base.cel_rule(
            "has(self.elastic) || self.workers == oldSelf.workers",
            "spec.workers is immutable unless spec.elastic is set: create a new TrainingJob to change it",
            ".workers",
        ),
    ]


def _reserved_keys_rule(field: str) -> dict[str, str]:
    return base.cel_rule(
        f"self.all(k, !k.startsWith('{constants.RESERVED_LABEL_PREFIX}'))",
        f"{field} keys under {constants.RESERVED_LABEL_PREFIX} are reserved for the operator",
    )


LabelValue = Annotated[str, Field(max_length=63, pattern=base.LABEL_VALUE_PATTERN)]
"""A label value: at most 63 letters, digits, -, _ and ., starting and ending alphanumeric, or empty."""


def _label_keys_rule(field: str) -> dict[str, str]:
    valid = "!format.qualifiedName().validate(k).hasValue()"
    bad = base.cel_first_failing("self", valid)
    return base.cel_rule(
        f"self.all(k, {valid})",
        f"{field} keys must be label keys: an optional DNS-subdomain prefix and /, then at most 63 letters, "
        "digits, -, _ and ., starting and ending with a letter or digit",
        message_expression=(
            f"'key ' + {bad} + ' is not a label key: an optional DNS-subdomain prefix and /, then at most "
            "63 letters, digits, -, _ and ., starting and ending with a letter or digit'"
        ),
    )


_IMAGE_RULE = base.cel_rule(
    f"self.matches(r'{IMAGE_PATTERN}')",
    "image must be a reference such as registry.example.com:5000/team/train:1.0 or "
    "train@sha256:<64 hex digits>: no spaces, a lower-case repository, a tag of letters, digits, _, . and -",
)


IMMUTABLE_BY_CHILD = ("trainer",)
"""Immutable objects whose children carry the rule (see `immutable_child_rules`): comparing a whole object
copies its property table once per key in the API server's CEL adapter, which for the trainer's 20
properties was 9 % of the API server's CPU on every status write (benchmarks/results/crd-admission.md)."""
IMMUTABLE_CHILDREN = "x-kubetrain-immutable-children"
"""Schema marker for crdgen: put `immutable_child_rules` on this object, with this message."""


def _immutable_message(name: str) -> str:
    return f"spec.{name} is immutable: create a new TrainingJob to change it"


def immutable_child_rules(node: dict[str, Any], message: str) -> None:
    """Make a structural object schema immutable child by child: `self == oldSelf` on each child, and on the
    object `has(self.c) == has(oldSelf.c)` for each child without a default. The same check as
    `self == oldSelf` on the object, at a fraction of the cost."""
    presence = []
    for name, child in node["properties"].items():
        child.setdefault("x-kubernetes-validations", []).append(base.cel_rule("self == oldSelf", message))
        if "default" not in child:
            presence.append(base.cel_rule(f"has(self.{name}) == has(oldSelf.{name})", message, f".{name}"))
    if presence:
        node["x-kubernetes-validations"] = [*node.get("x-kubernetes-validations", ()), *presence]


def add_immutable_rules(spec: dict[str, Any]) -> None:
    """Immutability as the cheapest rules that say it (they run on every write, status writes included).

    The value: `self == oldSelf` on the field itself (on each of its children for IMMUTABLE_BY_CHILD),
    which the API server evaluates only where both the old and the new object have the field. The
    presence: `has(self.f) == has(oldSelf.f)` on spec, only for fields without a schema default (a
    defaulted field is never absent). Each read of a field through spec (`self.f`, `has(self.f)`) copies
    spec's whole property table in the API server (k8s.io/apiserver/pkg/cel/common unstructuredMap.Find):
    these cost 37-38 % less per status write than one rule per field on spec reading it up to six times
    (benchmarks/results/crd-admission.md)."""
    presence = []
    for name in IMMUTABLE_SPEC_FIELDS:
        if name in ELASTIC_MUTABLE_SPEC_FIELDS:
            continue
        field = spec["properties"][name]
        if name in IMMUTABLE_BY_CHILD:
            field[IMMUTABLE_CHILDREN] = _immutable_message(name)
        else:
            value_kept = base.cel_rule("self == oldSelf", _immutable_message(name))
            field.setdefault("x-kubernetes-validations", []).append(value_kept)
        if field.get("default") is None:
            presence.append(
                base.cel_rule(
                    f"has(self.{name}) == has(oldSelf.{name})", _immutable_message(name), f".{name}"
                )
            )
    spec.setdefault("x-kubernetes-validations", []).extend(presence)


def _spec_schema(spec: dict[str, Any], *rules: dict[str, str]) -> None:
    """TrainingJobSpec's schema: its own rules, then the immutability rules on and for its fields."""
    spec["x-kubernetes-validations"] = list(rules)
    add_immutable_rules(spec)


class TrainingJobSpec(base.Model):
    """What to train, on how many workers, and the policies that run it."""

    model_config = ConfigDict(
        json_schema_extra=lambda schema: _spec_schema(
            schema,
            base.cel_rule(
                "has(self.trainer) != has(self.command)",
                "exactly one of spec.trainer (the built-in trainer) and spec.command (your own program) "
                "must be set",
            ),
            base.cel_rule("!has(self.args) || has(self.command)", "spec.args needs spec.command", ".args"),
            base.cel_rule(
                "!has(self.storage) || self.storage.all(a, self.storage.exists_one(b, b.mountPath == "
                "a.mountPath))",
                "spec.storage mountPaths must be unique",
                ".storage",
                "'mountPath ' + self.storage.map(a, a.mountPath).filter(p, "
                "!self.storage.exists_one(b, b.mountPath == p))[0] + ' is used by two storage volumes: "
                "give each its own path'",
            ),
            *_elastic_rules(),
        )
    )

    image: str | None = Field(
        None,
        max_length=1024,
        description=(
            "image is the container image every worker runs, a reference "
            "[registry[:port]/]repository[:tag][@digest] without spaces, e.g. "
            "registry.example.com/team/train:1.0. Default: the operator's default image "
            "(`kubetrain operator --default-image`, env KUBETRAIN_DEFAULT_IMAGE). Immutable."
        ),
        json_schema_extra=base.schema_extra(_IMAGE_RULE),
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None,
        description=(
            "imagePullPolicy is Always, IfNotPresent or Never. Default: Kubernetes' default. Immutable."
        ),
    )
    image_pull_secrets: list[scheduling.SecretReference] | None = Field(
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
        le=policies.MAX_WORKERS,
        description=(
            "workers is the number of worker pods (nodes) in the group, each one a batch Job named "
            "`<trainingjob>-r<restartAttempt>-w<index>` (the TrainingJob name is cut to a prefix plus a hash "
            "when longer than 48 characters or not a DNS label); worker 0 is the master. Default 1, at most "
            "4096. Immutable, except on an elastic job (spec.elastic), where it is the desired number of "
            "workers between minWorkers and maxWorkers and `kubectl scale --replicas` changes it."
        ),
    )
    nproc_per_worker: int | Literal["auto"] = Field(
        "auto",
        description=(
            "nprocPerWorker is the number of training processes per worker (torchrun's nproc_per_node): an "
            "integer >= 1, or auto for one per GPU (resources nvidia.com/gpu), else 1. "
            "WORLD_SIZE = workers x nprocPerWorker. Default auto. Immutable."
        ),
        json_schema_extra=base.schema_extra(
            base.cel_rule(
                "type(self) == int ? self >= 1 : self == 'auto'",
                'nprocPerWorker must be an integer >= 1 or "auto"',
            )
        ),
    )
    resources: compute.Resources | None = Field(
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
    storage: list[volumes.StorageVolume] | None = Field(
        None,
        max_length=16,
        description=(
            "storage lists volumes mounted into every worker for data, checkpoints and artifacts "
            "(a PersistentVolumeClaim, hostPath or emptyDir each). Default: none. Immutable."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    env: list[environment.EnvVar] | None = Field(
        None,
        max_length=128,
        description=(
            "env adds environment variables to every worker (the operator's own contract variables cannot "
            "be overridden). Mutable: applies to workers created after the change."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    node_selector: dict[str, LabelValue] | None = Field(
        None,
        max_length=64,
        description=(
            "nodeSelector constrains workers to nodes with these labels (label keys and values). Default: "
            "none. Mutable: applies to workers created after the change."
        ),
        json_schema_extra=base.schema_extra(_label_keys_rule("nodeSelector")),
    )
    tolerations: list[scheduling.Toleration] | None = Field(
        None,
        max_length=64,
        description=(
            "tolerations are the workers' pod tolerations (Kubernetes syntax). Default: none. Mutable: "
            "applies to workers created after the change."
        ),
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    affinity: scheduling.Affinity | None = Field(
        None,
        description=(
            "affinity is the workers' pod affinity (Kubernetes syntax). Default: none. Mutable: applies to "
            "workers created after the change."
        ),
    )
    priority_class_name: str | None = Field(
        None,
        max_length=253,
        pattern=base.DNS_SUBDOMAIN_PATTERN,
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
            "scheduler-plugins-scheduler). Default: the cluster default. Mutable: applies to workers created "
            "after the change."
        ),
    )
    service_account_name: str | None = Field(
        None,
        max_length=253,
        pattern=base.DNS_SUBDOMAIN_PATTERN,
        description=(
            "serviceAccountName runs the workers as this ServiceAccount. Default: the operator's "
            "--worker-service-account (the chart's kubetrain-worker, which may only report progress), else "
            "the namespace's default account. Mutable: applies to workers created after the change."
        ),
    )
    pod_labels: dict[str, LabelValue] | None = Field(
        None,
        max_length=64,
        description=(
            "podLabels are added to every worker pod (label keys and values); keys under kubetrain.io/ are "
            "reserved. Mutable: applies to workers created after the change."
        ),
        json_schema_extra=base.schema_extra(_label_keys_rule("podLabels"), _reserved_keys_rule("podLabels")),
    )
    pod_annotations: dict[str, Annotated[str, Field(max_length=4096)]] | None = Field(
        None,
        max_length=64,
        description=(
            "podAnnotations are added to every worker pod (keys are label keys); keys under kubetrain.io/ "
            "are reserved. Mutable: applies to workers created after the change."
        ),
        json_schema_extra=base.schema_extra(
            _label_keys_rule("podAnnotations"), _reserved_keys_rule("podAnnotations")
        ),
    )
    gang_scheduling: scheduling.GangScheduling | None = Field(
        None,
        description=(
            "gangScheduling makes a gang scheduler place all workers at once, so a half-scheduled group "
            "never holds GPUs while waiting: the operator creates the provider's group objects before the "
            "workers, and for volcano and scheduler-plugins sets schedulerName to volcano or "
            "scheduler-plugins-scheduler unless spec.schedulerName says otherwise (kubernetes needs no "
            "other scheduler). Default: none (each worker is scheduled on its own). Immutable."
        ),
    )
    managed_by: str | None = Field(
        None,
        max_length=63,
        pattern=MANAGED_BY_PATTERN,
        description=(
            f"managedBy names the controller that reconciles this TrainingJob, as a domain-prefixed path. "
            f"Unset or {constants.MANAGED_BY_CONTROLLER}: the kubetrain operator. Any other value: the "
            "kubetrain operator leaves the object alone (creates no workers, writes no status), so another "
            "controller, such as Kueue's MultiKueue dispatching it to a worker cluster, can run it. "
            "Default: unset. Immutable."
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
    run_policy: policies.RunPolicy = Field(
        default_factory=policies.RunPolicy,
        description="runPolicy holds restarts, deadline, TTL, cleanup and suspend. Mutable.",
        json_schema_extra={"default": {}},
    )
    failure_policy: policies.FailurePolicy = Field(
        default_factory=policies.FailurePolicy,
        description=(
            "failurePolicy says which worker exit codes restart the group and which fail the job at once. "
            "Default: the trainer's permanent codes 2 and 3 fail at once, any other failure restarts. "
            "Mutable."
        ),
        json_schema_extra={"default": {}},
    )

    elastic: policies.Elastic | None = Field(
        None,
        description=(
            "elastic makes the group elastic: workers run under torchrun with a c10d rendezvous on a "
            "rendezvous-store pod of their own (`<trainingjob>-rdzv`), a worker that fails with a retryable "
            "code is replaced alone (counted against runPolicy.maxRestarts) while the others "
            "re-rendezvous, and spec.workers can be scaled between minWorkers and maxWorkers on a running "
            "job. Needs the torchrun launcher. Default: none (a fixed-size group). Immutable."
        ),
    )

    @model_validator(mode="after")
    def _elastic_bounds(self) -> TrainingJobSpec:
        if self.elastic is None:
            return self
        low, high = self.elastic.min_workers, self.elastic.max_workers
        if not low <= self.workers <= high:
            raise ValueError(
                f"spec.workers ({self.workers}) must lie between spec.elastic.minWorkers ({low}) and "
                f"spec.elastic.maxWorkers ({high})"
            )
        if self.command is not None and self.launcher == "plain":
            raise ValueError("spec.elastic needs spec.launcher torchrun: torchrun runs the rendezvous")
        if self.gang_scheduling is not None:
            raise ValueError(
                "spec.elastic and spec.gangScheduling cannot be combined yet: a gang of a changing size is "
                "not designed"
            )
        return self

    @model_validator(mode="after")
    def _cross_field(self) -> TrainingJobSpec:
        if (self.trainer is None) == (self.command is None):
            raise ValueError(
                "exactly one of spec.trainer (the built-in trainer) and spec.command (your own program) "
                "must be set"
            )
        if self.args is not None and self.command is None:
            raise ValueError("spec.args needs spec.command")
        for field, values in (
            ("storage", [v.name for v in self.storage or ()]),
            ("env", [e.name for e in self.env or ()]),
        ):
            for index, name in enumerate(values):
                if name in values[:index]:
                    raise ValueError(f"spec.{field}[{index}] repeats name {name}: names must be unique")
        paths = [v.mount_path for v in self.storage or ()]
        for index, path in enumerate(paths):
            if path in paths[:index]:
                raise ValueError(
                    f"spec.storage[{index}].mountPath {path} is used by two storage volumes: give each "
                    "its own path"
                )
        for field, values in (
            ("nodeSelector", self.node_selector),
            ("podLabels", self.pod_labels),
            ("podAnnotations", self.pod_annotations),
        ):
            for key in values or {}:
                if not base.is_label_key(key):
                    raise ValueError(f"spec.{field} key {key} is not a label key")
                if field != "nodeSelector" and key.startswith(constants.RESERVED_LABEL_PREFIX):
                    raise ValueError(
                        f"spec.{field} keys under {constants.RESERVED_LABEL_PREFIX} are reserved for the "
                        f"operator"
                    )
        return self

    @field_validator("image")
    @classmethod
    def _image_reference(cls, image: str | None) -> str | None:
        if image is not None and not re.match(IMAGE_PATTERN, image):
            raise ValueError(_IMAGE_RULE["message"])
        return image

    @field_validator("nproc_per_worker")
    @classmethod
    def _nproc(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError('nprocPerWorker must be an integer >= 1 or "auto"')
        return value

    def managed_by_kubetrain(self) -> bool:
        """Whether the kubetrain operator reconciles this TrainingJob (spec.managedBy unset or ours)."""
        return self.managed_by in (None, constants.MANAGED_BY_CONTROLLER)

    def procs_per_worker(self) -> int:
        """nprocPerWorker resolved: auto is the GPU count per worker, or 1 without GPUs."""
        if self.nproc_per_worker == "auto":
            gpus = self.resources.gpus() if self.resources else 0
            return gpus if gpus > 0 else 1
        return int(self.nproc_per_worker)

    def world_size(self) -> int:
        """Total training processes: workers x processes per worker (never the number of nodes)."""
        return self.workers * self.procs_per_worker()
