"""The TrainingJob API (kubetrain.io/v1alpha1): pydantic models for spec and status.

These models are the one source of truth: `crdgen` turns their JSON schema into the CRD's
openAPIV3Schema, and the operator validates every object it reconciles with them. Every field's
description starts with its JSON name and says its default, unit, format and whether it can change
after creation, because it becomes `kubectl explain trainingjob.spec.<field>` text.

Rules the schema keywords cannot say are written twice on purpose: as CEL `x-kubernetes-validations`
(so `kubectl apply` refuses a bad object, naming its field, and nothing is created) and as pydantic
validators (so the operator refuses the same object when the CRD was installed without them). CEL is
used where a keyword cannot say it (quantity comparison, label keys, path spelling) or where a keyword's
error would quote a long regex at the user (quantities, image references). The table
tests/operator/testdata/refused-trainingjobs.yaml holds both sides to the same verdict: unit tests run it
through the models, cluster tests through a real API server.

Mutability, in one place: the shape of the group (image, imagePullPolicy, workers, nprocPerWorker,
resources, trainer, command, args, launcher, storage, masterPort, successPolicy, gangScheduling,
elastic) is
immutable, because changing it under a running DDP group has no safe meaning; only an elastic job's
workers may change (`kubectl scale`: torchrun re-rendezvouses the group). Run and failure policies, and the
scheduling and pod-metadata fields (env, imagePullSecrets, nodeSelector, tolerations, affinity,
priorityClassName, schedulerName, serviceAccountName, podLabels, podAnnotations), can change at any
time; scheduling and pod-metadata changes apply to workers created afterwards (the next restart attempt
or resume), which is what queueing systems such as Kueue need when they admit a suspended job (the
Workload of a job queued in Kueue keeps the values it was created with).
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from kubetrain_trainer import contract
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.exit_codes import PERMANENT_EXIT_CODES
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from kubetrain_operator import constants

QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""A non-negative Kubernetes resource.Quantity (the syntax controller-gen emits for quantities, without the
minus sign: no resource, size or divisor the spec takes may be negative)."""

DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""An RFC 1123 subdomain, the name of most Kubernetes objects (Secrets, ConfigMaps, claims, accounts)."""

LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
"""A label value (with maxLength 63): empty, or alphanumerics with -, _ and . inside."""

LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""A label key (a qualified name): an optional DNS-subdomain prefix and /, then at most 63 characters."""

CONFIG_KEY_PATTERN = r"^\.?[-_a-zA-Z0-9][-._a-zA-Z0-9]*$"
"""A key of a ConfigMap or Secret: letters, digits, -, _ and ., not . itself nor starting with .."""

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

RESERVED_ENV = (
    contract.MASTER_ADDR,
    contract.MASTER_PORT,
    contract.WORLD_SIZE,
    contract.RANK,
    contract.LOCAL_RANK,
    contract.LOCAL_WORLD_SIZE,
    contract.NODE_RANK,
)
"""Env names the operator injects outside the reserved prefixes; a user env entry with one is refused."""

RESERVED_ENV_PREFIXES = ("PET_", "KUBETRAIN_")
"""Env name prefixes that belong to the operator: torchrun reads PET_* as its settings (a user's
PET_RDZV_ENDPOINT would silently redirect the rendezvous) and KUBETRAIN_* is the trainer's contract."""

STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
"""Container resources without a domain; anything else is hugepages-<size> or <domain>/<name>."""

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
`spec`: see `_add_immutable_rules`)."""
ELASTIC_MUTABLE_SPEC_FIELDS = ("workers",)
"""Immutable fields an elastic job may change (`kubectl scale`); their rules are in `_elastic_rules`."""

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


def _cel(
    rule: str, message: str, field_path: str | None = None, message_expression: str | None = None
) -> dict[str, str]:
    """One x-kubernetes-validations rule. `message_expression` (CEL, evaluated only when the rule fails)
    names the offending key or value; `message` stays as the fallback the API server shows when that
    expression cannot be evaluated."""
    out = {"rule": rule, "message": message}
    if message_expression:
        out["messageExpression"] = message_expression
    if field_path:
        out["fieldPath"] = field_path
    return out


def _extra(*rules: dict[str, str], **more: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict(more)
    if rules:
        out["x-kubernetes-validations"] = list(rules)
    return out


def _first(items: str, predicate: str, var: str = "k") -> str:
    """CEL for the first element (key, for a map) of `items` failing `predicate`, for messageExpressions."""
    return f"{items}.filter({var}, !({predicate}))[0]"


class _Model(BaseModel):
    """camelCase JSON names, unknown keys refused, Python names usable too."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


QUANTITY_MESSAGE = (
    "must be a non-negative quantity such as 2, 500m, 1.5 or 8Gi: digits with an optional fraction and "
    "one unit suffix (m, k, M, G, Ki, Mi, Gi ...), no spaces"
)
QUANTITY_RULE = _cel("type(self) == int || (isQuantity(self) && !self.startsWith('-'))", QUANTITY_MESSAGE)
"""How the CRD checks a quantity's string form: a rule, so that the message says what a quantity looks
like (a pattern's error would quote QUANTITY_PATTERN at the user)."""


def _check_quantity(value: str) -> str:
    if not re.match(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} {QUANTITY_MESSAGE}")
    return value


Quantity = Annotated[
    Annotated[int, Field(ge=0)] | Annotated[str, Field(max_length=64), AfterValidator(_check_quantity)],
    Field(json_schema_extra={"x-kubetrain-quantity": True}),
]
"""A non-negative quantity: an integer, or a string in Kubernetes quantity syntax (500m, 8Gi, 1e3)."""

_BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def quantity_value(value: int | str) -> Decimal:
    """The number a quantity stands for (500m -> 0.5, 1Ki -> 1024), to compare requests with limits as
    the API server does. Raises ValueError for anything QUANTITY_PATTERN refuses."""
    text = _check_quantity(str(value))
    number = re.match(r"^\+?([0-9]*\.?[0-9]*)", text)
    assert number is not None  # the pattern above guarantees a leading number
    digits, suffix = number.group(1), text[number.end() :]
    if suffix in _BINARY_SUFFIXES:
        return Decimal(digits) * _BINARY_SUFFIXES[suffix]
    if suffix in _DECIMAL_SUFFIXES:
        return Decimal(digits).scaleb(_DECIMAL_SUFFIXES[suffix])
    return Decimal(digits).scaleb(int(suffix[1:]))


def is_label_key(key: str) -> bool:
    """Whether `key` is a qualified name, as label, annotation, node-selector and resource keys must be."""
    prefix, _, _ = key.rpartition("/")
    return bool(re.match(LABEL_KEY_PATTERN, key)) and len(prefix) <= 253


def _resource_name_ok(name: str) -> bool:
    return (
        name in STANDARD_RESOURCES
        or name.startswith("hugepages-")
        or ("/" in name and not name.startswith("requests.") and is_label_key(name))
    )


def _extended(name: str) -> bool:
    """Extended resources (nvidia.com/gpu) are counted in whole units and never overcommitted."""
    return "/" in name and "kubernetes.io/" not in name


def request_must_equal_limit(name: str) -> bool:
    """Extended resources and hugepages are never overcommitted: a request needs an equal limit."""
    return _extended(name) or name.startswith("hugepages-")


def _cel_resource_name_ok(k: str) -> str:
    standard = ", ".join(f"'{n}'" for n in STANDARD_RESOURCES)
    return (
        f"{k} in [{standard}] || {k}.startsWith('hugepages-') || ({k}.contains('/') && "
        f"!{k}.startsWith('requests.') && !format.qualifiedName().validate({k}).hasValue())"
    )


def _cel_extended(k: str) -> str:
    return f"({k}.contains('/') && !{k}.contains('kubernetes.io/'))"


def _cel_quantity(expr: str) -> str:
    return f"quantity(string({expr}))"


def _cel_is_quantity(expr: str) -> str:
    """Guards every quantity() call: a string QUANTITY_RULE refuses must not also fail a rule with an
    evaluation error (QUANTITY_RULE's own error already names the field)."""
    return f"isQuantity(string({expr}))"


def _resource_map_rules(field: str) -> dict[str, Any]:
    """Rules on resources.requests or resources.limits: known resource names, whole numbers for extended
    resources (QUANTITY_RULE and the schema's minimum already refuse negative quantities). Each message
    names the offending key."""
    name_ok = _cel_resource_name_ok("k")
    whole_ok = (
        f"!{_cel_extended('k')} || !{_cel_is_quantity('self[k]')} || {_cel_quantity('self[k]')}.isInteger()"
    )
    bad_name = _first("self", name_ok)
    bad_whole = _first("self", whole_ok)
    return _extra(
        _cel(
            f"self.all(k, {name_ok})",
            f"resources.{field} keys must be cpu, memory, ephemeral-storage, hugepages-<size> or an extended "
            "resource with a domain, such as nvidia.com/gpu",
            message_expression=(
                f"'resource name ' + {bad_name} + ' is not cpu, memory, ephemeral-storage, "
                "hugepages-<size> or an extended resource with a domain such as nvidia.com/gpu'"
            ),
        ),
        _cel(
            f"self.all(k, {whole_ok})",
            f"resources.{field} of extended resources such as nvidia.com/gpu must be whole numbers",
            message_expression=(
                f"{bad_whole} + ' is ' + string(self[{bad_whole}]) + ': extended resources such as "
                "nvidia.com/gpu are counted in whole units (no fractions)'"
            ),
        ),
    )


def _request_limit_rule(equal: bool) -> dict[str, str]:
    """requests against limits, key by key: at most the limit (cpu, memory), or equal to it (extended
    resources and hugepages, which are never overcommitted)."""
    both = "!has(self.requests) || !has(self.limits) || self.requests.all(k, "
    comparable = (
        f"!(k in self.limits) || !{_cel_is_quantity('self.requests[k]')} "
        f"|| !{_cel_is_quantity('self.limits[k]')} || "
    )
    order = f"{_cel_quantity('self.requests[k]')}.compareTo({_cel_quantity('self.limits[k]')})"
    kind = f"({_cel_extended('k')} || k.startsWith('hugepages-'))"
    check = f"!{kind} || {order} == 0" if equal else f"{kind} || {order} <= 0"
    bad = f"self.requests.filter(k, !({comparable}{check}))[0]"
    shown = f"{bad} + ' ' + string(self.requests[{bad}]) + ' vs limit ' + string(self.limits[{bad}])"
    if equal:
        return _cel(
            both + comparable + check + ")",
            "requests of extended resources and hugepages must equal their limits",
            ".requests",
            f"'request ' + {shown} + ': extended resources and hugepages need the request equal to the "
            "limit (or give only one of them)'",
        )
    return _cel(
        both + comparable + check + ")",
        "a request cannot be above its limit",
        ".requests",
        f"'request ' + {shown} + ': a request cannot be above its limit'",
    )


def _cel_mentions(predicate: str) -> str:
    """CEL: some key of requests or limits satisfies `predicate` (over `k`)."""
    return " || ".join(f"(has(self.{m}) && self.{m}.exists(k, {predicate}))" for m in ("requests", "limits"))


_HUGEPAGES_MESSAGE = "hugepages need a cpu or memory request or limit beside them"
_CEL_HUGEPAGES = "k.startsWith('hugepages-')"
_CEL_CPU_OR_MEMORY = "k in ['cpu', 'memory']"


class Resources(_Model):
    """Compute resources of each worker's container (the Kubernetes ResourceRequirements shape)."""

    model_config = ConfigDict(
        json_schema_extra=_extra(
            _request_limit_rule(False),
            _request_limit_rule(True),
            _cel(
                f"!({_cel_mentions(_CEL_HUGEPAGES)}) || {_cel_mentions(_CEL_CPU_OR_MEMORY)}",
                _HUGEPAGES_MESSAGE,
            ),
        )
    )

    requests: dict[str, Quantity] | None = Field(
        None,
        max_length=32,
        description=(
            "requests is the minimum each worker needs, keyed by resource name (cpu, memory, "
            "ephemeral-storage, hugepages-<size>, or an extended resource with a domain such as "
            "nvidia.com/gpu), values in Kubernetes quantity syntax (cpu: 2 or 500m; memory: 8Gi), never "
            "negative; extended resources take whole numbers. A request of an extended resource or hugepages "
            "without a limit gets the same limit (they need one); with a limit, the two must be equal. "
            "Default: none. Immutable."
        ),
        json_schema_extra=_resource_map_rules("requests"),
    )
    limits: dict[str, Quantity] | None = Field(
        None,
        max_length=32,
        description=(
            "limits is the most each worker may use, keyed by resource name, in quantity syntax, never below "
            "the request. nvidia.com/gpu here is the number of GPUs per worker and drives "
            "nprocPerWorker: auto. Default: none. Immutable."
        ),
        json_schema_extra=_resource_map_rules("limits"),
    )

    @field_validator("requests", "limits")
    @classmethod
    def _quantities(cls, values: dict[str, int | str] | None) -> dict[str, int | str] | None:
        for key, value in (values or {}).items():
            if not _resource_name_ok(key):
                raise ValueError(
                    f"resource name {key} is not cpu, memory, ephemeral-storage, hugepages-<size> or an "
                    "extended resource with a domain such as nvidia.com/gpu"
                )
            number = quantity_value(value)
            if _extended(key) and number != number.to_integral_value():
                raise ValueError(f"{key} is {value}: extended resources are counted in whole units")
        return values

    @model_validator(mode="after")
    def _requests_within_limits(self) -> Resources:
        for key, request in (self.requests or {}).items():
            if key not in (self.limits or {}):
                continue
            limit = (self.limits or {})[key]
            order = quantity_value(request).compare(quantity_value(limit))
            if request_must_equal_limit(key) and order != 0:
                raise ValueError(
                    f"requests.{key} {request} vs limits.{key} {limit}: extended resources and hugepages "
                    "need the request equal to the limit"
                )
            if order > 0:
                raise ValueError(
                    f"requests.{key} {request} vs limits.{key} {limit}: a request cannot be above its limit"
                )
        named = {*(self.requests or {}), *(self.limits or {})}
        if any(k.startswith("hugepages-") for k in named) and not named & {"cpu", "memory"}:
            raise ValueError(_HUGEPAGES_MESSAGE)
        return self

    def gpus(self) -> int:
        """GPUs per worker: the nvidia.com/gpu limit, else the request, else 0."""
        for source in (self.limits, self.requests):
            if source and constants.GPU_RESOURCE in source:
                return int(quantity_value(source[constants.GPU_RESOURCE]))
        return 0


def is_clean_mount_path(path: str) -> bool:
    """An absolute path in its one spelling: no trailing /, no empty, . or .. parts, and not / itself.
    Two spellings of one directory (/data and /data/, /output/../data) would mount twice on one place."""
    return path.startswith("/") and all(part not in ("", ".", "..") for part in path[1:].split("/"))


def is_descending_path(path: str) -> bool:
    """A relative path that stays below where it starts (a subPath): not absolute, no .. part."""
    return not path.startswith("/") and ".." not in path.split("/")


_CLEAN_MOUNT_PATH_RULE = _cel(
    "self.startsWith('/') && self != '/' && !self.endsWith('/') && !self.contains('//') "
    "&& !(self + '/').contains('/./') && !(self + '/').contains('/../')",
    "mountPath must be an absolute path other than / with no trailing /, no // and no . or .. parts, "
    "e.g. /data",
)
_DESCENDING_PATH_RULE = _cel(
    "!self.startsWith('/') && !('/' + self + '/').contains('/../')",
    "subPath must be a relative path inside the volume: no leading / and no .. parts, e.g. cifar10/train",
)
_HOST_PATH_RULE = _cel(
    "self.startsWith('/') && !(self + '/').contains('/../')",
    "path must be an absolute path on the node with no .. parts, e.g. /mnt/datasets",
)


class PVCSource(_Model):
    claim_name: str = Field(
        ...,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description=(
            "claimName is the name of a PersistentVolumeClaim in the TrainingJob's namespace (a DNS "
            "subdomain: lower-case letters, digits, - and .)."
        ),
    )
    read_only: bool = Field(False, description="readOnly mounts the claim read-only. Default false.")


class HostPathSource(_Model):
    path: str = Field(
        ...,
        min_length=1,
        max_length=4096,
        description=(
            "path is the directory on the node, an absolute path without .. parts. hostPath volumes break "
            "the restricted Pod Security Standard: use them only on development clusters."
        ),
        json_schema_extra=_extra(_HOST_PATH_RULE),
    )

    @field_validator("path")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/") or ".." in path.split("/"):
            raise ValueError(_HOST_PATH_RULE["message"])
        return path

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
        description=(
            "mountPath is the absolute path where the volume appears in the worker container, written "
            "once (no trailing /, no . or .. parts, not / itself) and unique within storage. /dev/shm "
            "replaces the memory-backed /dev/shm the operator mounts otherwise. Required."
        ),
        json_schema_extra=_extra(_CLEAN_MOUNT_PATH_RULE),
    )
    sub_path: str | None = Field(
        None,
        max_length=4096,
        description=(
            "subPath mounts only this sub-directory of the volume: a relative path without .. parts. "
            "Default: the root."
        ),
        json_schema_extra=_extra(_DESCENDING_PATH_RULE),
    )
    persistent_volume_claim: PVCSource | None = Field(
        None, description="persistentVolumeClaim mounts an existing claim (ReadWriteMany when workers > 1)."
    )
    host_path: HostPathSource | None = Field(None, description="hostPath mounts a directory of the node.")
    empty_dir: EmptyDirSource | None = Field(
        None, description="emptyDir is scratch space that lives as long as the worker pod."
    )

    @field_validator("mount_path")
    @classmethod
    def _clean_mount_path(cls, path: str) -> str:
        if not is_clean_mount_path(path):
            raise ValueError(_CLEAN_MOUNT_PATH_RULE["message"])
        return path

    @field_validator("sub_path")
    @classmethod
    def _descending_sub_path(cls, path: str | None) -> str | None:
        if path is not None and not is_descending_path(path):
            raise ValueError(_DESCENDING_PATH_RULE["message"])
        return path

    @model_validator(mode="after")
    def _one_source(self) -> StorageVolume:
        given = [s for s in (self.persistent_volume_claim, self.host_path, self.empty_dir) if s is not None]
        if len(given) != 1:
            raise ValueError("exactly one of persistentVolumeClaim, hostPath and emptyDir must be set")
        return self


ENV_FIELD_PATH_PATTERN = (
    r"^(metadata\.(name|namespace|uid)|spec\.(nodeName|serviceAccountName)|status\.(hostIPs?|podIPs?)"
    r"|metadata\.(labels|annotations)\['[^']+'\])$"
)
"""The pod fields an env variable can read through the downward API."""

DIVISORS = {
    "cpu": ("1m", "1"),
    "other": ("1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei"),
}
"""resourceFieldRef divisors the API server accepts: for cpu, and for memory, storage and hugepages."""


class ObjectFieldSelector(_Model):
    api_version: Literal["v1"] | None = Field(None, description="apiVersion of fieldPath: v1 (the default).")
    field_path: str = Field(
        ...,
        max_length=256,
        pattern=ENV_FIELD_PATH_PATTERN,
        description=(
            "fieldPath is the pod field to read: metadata.name, metadata.namespace, metadata.uid, "
            "metadata.labels['<key>'], metadata.annotations['<key>'], spec.nodeName, "
            "spec.serviceAccountName, status.hostIP, status.hostIPs, status.podIP or status.podIPs. Required."
        ),
    )


def _cel_divisor_ok() -> str:
    def one_of(values: tuple[str, ...]) -> str:
        listed = ", ".join(f"'{d}'" for d in values)
        return f"[{listed}].exists(d, quantity(d).compareTo({_cel_quantity('self.divisor')}) == 0)"

    return (
        f"!has(self.divisor) || !{_cel_is_quantity('self.divisor')} || (self.resource.endsWith('.cpu') ? "
        f"{one_of(DIVISORS['cpu'])} : {one_of(DIVISORS['other'])})"
    )


class ResourceFieldSelector(_Model):
    model_config = ConfigDict(
        json_schema_extra=_extra(
            _cel(
                _cel_divisor_ok(),
                f"divisor must be {' or '.join(DIVISORS['cpu'])} for cpu, and one of "
                f"{', '.join(DIVISORS['other'])} for memory, ephemeral-storage and hugepages",
                ".divisor",
            )
        )
    )

    container_name: Literal["worker"] | None = Field(
        None, description="containerName is the worker container's name, worker (the only container)."
    )
    resource: str = Field(
        ...,
        max_length=64,
        pattern=r"^(limits|requests)\.(cpu|memory|ephemeral-storage|hugepages-.+)$",
        description=(
            "resource is the limit or request to read: limits.cpu, limits.memory, limits.ephemeral-storage, "
            "requests.cpu, requests.memory, requests.ephemeral-storage or limits/requests.hugepages-<size>. "
            "Required."
        ),
    )
    divisor: Quantity | None = Field(
        None,
        description=(
            "divisor scales the value: 1m or 1 for cpu; 1, 1Ki, 1Mi, 1Gi ... for the others. Default 1."
        ),
    )

    @model_validator(mode="after")
    def _known_divisor(self) -> ResourceFieldSelector:
        if self.divisor is None:
            return self
        allowed = DIVISORS["cpu"] if self.resource.endswith(".cpu") else DIVISORS["other"]
        if quantity_value(self.divisor) not in {quantity_value(d) for d in allowed}:
            raise ValueError(
                f"divisor {self.divisor} for {self.resource} must be one of {', '.join(allowed)}"
            )
        return self


class KeySelector(_Model):
    """One key of a ConfigMap or Secret in the TrainingJob's namespace."""

    name: str = Field(
        ...,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="name of the ConfigMap or Secret (a DNS subdomain). Required.",
    )
    key: str = Field(
        ...,
        min_length=1,
        max_length=253,
        pattern=CONFIG_KEY_PATTERN,
        description="key to read (letters, digits, -, _ and .). Required.",
    )
    optional: bool | None = Field(
        None,
        description="optional lets the worker start without the object or key. Default false: it waits.",
    )


class EnvVarSource(_Model):
    """Where an env value comes from: exactly one of the four sources, as in a Kubernetes container."""

    model_config = ConfigDict(
        json_schema_extra=_extra(
            _cel(
                "(has(self.fieldRef) ? 1 : 0) + (has(self.resourceFieldRef) ? 1 : 0) + "
                "(has(self.configMapKeyRef) ? 1 : 0) + (has(self.secretKeyRef) ? 1 : 0) == 1",
                "valueFrom needs exactly one of fieldRef, resourceFieldRef, configMapKeyRef and secretKeyRef",
            )
        )
    )

    field_ref: ObjectFieldSelector | None = Field(
        None, description="fieldRef reads a field of the worker's pod (downward API)."
    )
    resource_field_ref: ResourceFieldSelector | None = Field(
        None, description="resourceFieldRef reads a limit or request of the worker container."
    )
    config_map_key_ref: KeySelector | None = Field(None, description="configMapKeyRef reads a ConfigMap key.")
    secret_key_ref: KeySelector | None = Field(None, description="secretKeyRef reads a Secret key.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        sources = (self.field_ref, self.resource_field_ref, self.config_map_key_ref, self.secret_key_ref)
        if sum(s is not None for s in sources) != 1:
            raise ValueError(
                "valueFrom needs exactly one of fieldRef, resourceFieldRef, configMapKeyRef and secretKeyRef"
            )
        return self


def env_name_reserved(name: str) -> bool:
    """Whether the operator owns this env name (RESERVED_ENV and the RESERVED_ENV_PREFIXES)."""
    return name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES)


_RESERVED_ENV_TEXT = (
    f"the operator sets {', '.join(RESERVED_ENV)} and every "
    f"{' and '.join(p + '*' for p in RESERVED_ENV_PREFIXES)} variable: choose another name"
)


class EnvVar(_Model):
    model_config = ConfigDict(
        json_schema_extra=_extra(
            _cel(
                "!(self.name in ["
                + ", ".join(f"'{n}'" for n in RESERVED_ENV)
                + "]) && "
                + " && ".join(f"!self.name.startsWith('{p}')" for p in RESERVED_ENV_PREFIXES),
                f"env name is reserved: {_RESERVED_ENV_TEXT}",
                ".name",
                f"'env name ' + self.name + ' is reserved: {_RESERVED_ENV_TEXT}'",
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
            "name of the environment variable. Names the operator injects (MASTER_ADDR, MASTER_PORT, "
            "WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, PET_*, KUBETRAIN_*) are refused."
        ),
    )
    value: str | None = Field(
        None,
        max_length=32768,
        description="value of the variable; may refer to earlier ones as $(NAME), e.g. $(RANK).",
    )
    value_from: EnvVarSource | None = Field(
        None,
        description=(
            "valueFrom takes the value from a Secret, ConfigMap, pod field or resource, as in a Kubernetes "
            "container's env[].valueFrom."
        ),
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if env_name_reserved(name):
            raise ValueError(f"env name {name} is reserved: {_RESERVED_ENV_TEXT}")
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
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="name of a Secret in the TrainingJob's namespace (kubernetes.io/dockerconfigjson).",
    )


class Affinity(_Model):
    """Pod affinity as in Kubernetes. Its three kinds are named here, so a misspelt kind is refused rather
    than dropped; what is inside each is checked by the API server when the worker Job is created."""

    node_affinity: dict[str, Any] | None = Field(
        None, description="nodeAffinity places workers on nodes by label (Kubernetes syntax)."
    )
    pod_affinity: dict[str, Any] | None = Field(
        None, description="podAffinity places workers near pods by label (Kubernetes syntax)."
    )
    pod_anti_affinity: dict[str, Any] | None = Field(
        None, description="podAntiAffinity keeps workers away from pods by label (Kubernetes syntax)."
    )


class Toleration(_Model):
    """A pod toleration, as in Kubernetes: lets workers run on nodes with a matching taint."""

    model_config = ConfigDict(
        json_schema_extra=_extra(
            _cel(
                "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
                "value must be empty when operator is Exists",
                ".value",
            ),
            _cel(
                "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
                "operator must be Exists when key is empty (a toleration of every taint)",
                ".operator",
            ),
            _cel(
                "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                "tolerationSeconds needs effect NoExecute",
                ".tolerationSeconds",
            ),
        )
    )

    key: str | None = Field(
        None,
        max_length=317,
        pattern=r"^$|" + LABEL_KEY_PATTERN,
        description="key is the taint key to tolerate (a label key); empty with operator Exists matches all.",
    )
    operator: Literal["", "Exists", "Equal"] | None = Field(
        None, description="operator is Equal (key and value match, the default) or Exists (any value)."
    )
    value: str | None = Field(
        None,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        description="value is the taint value to match under operator Equal (a label value).",
    )
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None,
        description="effect is the taint effect to match: NoSchedule, PreferNoSchedule, NoExecute or all.",
    )
    toleration_seconds: int | None = Field(
        None,
        description=(
            "tolerationSeconds is how long a NoExecute taint is tolerated before eviction. Default: forever."
        ),
    )

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty when operator is Exists")
        if not self.key and self.operator != "Exists":
            raise ValueError("operator must be Exists when key is empty (a toleration of every taint)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect NoExecute")
        return self


GangProvider = Literal["kubernetes", "volcano", "scheduler-plugins"]


class GangScheduling(_Model):
    """All workers are placed together or not at all, by a gang scheduler (see `gang`)."""

    provider: GangProvider | None = Field(
        None,
        description=(
            "provider is the gang scheduler: kubernetes (the default scheduler's gang scheduling, "
            "Kubernetes 1.37+ with the GenericWorkload feature gate and scheduling.k8s.io/v1beta1 served: "
            "one Workload named like the Service, and per restart attempt one PodGroup "
            "<service>-r<attempt>, which the pods join through spec.schedulingGroup), volcano (a "
            "scheduling.volcano.sh/v1beta1 PodGroup, pods annotated scheduling.k8s.io/group-name) or "
            "scheduler-plugins (a scheduling.x-k8s.io/v1alpha1 PodGroup for the Coscheduling plugin, pods "
            "labelled scheduling.x-k8s.io/pod-group). Every group requires all workers (minCount or "
            "minMember = workers); the volcano and scheduler-plugins PodGroups are named like the Service. "
            "Default: the first of kubernetes, volcano, scheduler-plugins whose API the cluster served when "
            "the operator started."
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
            "the TrainingJob. On an elastic job each replacement of one failed worker counts as one restart. "
            "Default 3, at most 1000. Mutable: raising it revives nothing that already "
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
            "activeDeadlineSeconds clock. Queueing systems create jobs suspended and admit them by setting "
            "false: such a job's first group is attempt 0, as nothing was replaced. A job labelled "
            "kueue.x-k8s.io/queue-name is also kept Suspended until Kueue admits its Workload (and suspended "
            "again when Kueue evicts it); suspend true deactivates its Workload, giving its quota back. "
            "Default false. Mutable."
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
            raise ValueError(
                f"retryableExitCodes and nonRetryableExitCodes share {sorted(both)}: a code cannot be both"
            )
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


ELASTIC_LAST_CALL_SECONDS = 30
"""torchrun's own last_call_timeout: how long a rendezvous round with at least the minimum stays open."""


class Elastic(_Model):
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


def _elastic_rules() -> list[dict[str, str]]:
    """spec.workers may change only on an elastic job (kubectl scale), and only within its bounds."""
    return [
        _cel(
            "!has(self.elastic) || self.elastic.minWorkers <= self.elastic.maxWorkers",
            "spec.elastic.minWorkers must not exceed spec.elastic.maxWorkers",
            ".elastic",
        ),
        _cel(
            "!has(self.elastic) || (self.workers >= self.elastic.minWorkers && self.workers <= "
            "self.elastic.maxWorkers)",
            "spec.workers must lie between spec.elastic.minWorkers and spec.elastic.maxWorkers",
            ".workers",
        ),
        _cel(
            "!has(self.elastic) || !has(self.gangScheduling)",
            "spec.elastic and spec.gangScheduling cannot be combined yet: a gang of a changing size is not "
            "designed",
            ".gangScheduling",
        ),
        _cel(
            "!has(self.elastic) || !has(self.command) || self.launcher != 'plain'",
            "spec.elastic needs spec.launcher torchrun: torchrun runs the rendezvous",
            ".launcher",
        ),
        _cel(
            "has(self.elastic) || self.workers == oldSelf.workers",
            "spec.workers is immutable unless spec.elastic is set: create a new TrainingJob to change it",
            ".workers",
        ),
    ]


def _reserved_keys_rule(field: str) -> dict[str, str]:
    return _cel(
        f"self.all(k, !k.startsWith('{constants.RESERVED_LABEL_PREFIX}'))",
        f"{field} keys under {constants.RESERVED_LABEL_PREFIX} are reserved for the operator",
    )


LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
"""A label value: at most 63 letters, digits, -, _ and ., starting and ending alphanumeric, or empty."""


def _label_keys_rule(field: str) -> dict[str, str]:
    valid = "!format.qualifiedName().validate(k).hasValue()"
    bad = _first("self", valid)
    return _cel(
        f"self.all(k, {valid})",
        f"{field} keys must be label keys: an optional DNS-subdomain prefix and /, then at most 63 letters, "
        "digits, -, _ and ., starting and ending with a letter or digit",
        message_expression=(
            f"'key ' + {bad} + ' is not a label key: an optional DNS-subdomain prefix and /, then at most "
            "63 letters, digits, -, _ and ., starting and ending with a letter or digit'"
        ),
    )


_IMAGE_RULE = _cel(
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
        child.setdefault("x-kubernetes-validations", []).append(_cel("self == oldSelf", message))
        if "default" not in child:
            presence.append(_cel(f"has(self.{name}) == has(oldSelf.{name})", message, f".{name}"))
    if presence:
        node["x-kubernetes-validations"] = [*node.get("x-kubernetes-validations", ()), *presence]


def _add_immutable_rules(spec: dict[str, Any]) -> None:
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
            value_kept = _cel("self == oldSelf", _immutable_message(name))
            field.setdefault("x-kubernetes-validations", []).append(value_kept)
        if field.get("default") is None:
            presence.append(
                _cel(f"has(self.{name}) == has(oldSelf.{name})", _immutable_message(name), f".{name}")
            )
    spec.setdefault("x-kubernetes-validations", []).extend(presence)


def _spec_schema(spec: dict[str, Any], *rules: dict[str, str]) -> None:
    """TrainingJobSpec's schema: its own rules, then the immutability rules on and for its fields."""
    spec["x-kubernetes-validations"] = list(rules)
    _add_immutable_rules(spec)


class TrainingJobSpec(_Model):
    """What to train, on how many workers, and the policies that run it."""

    model_config = ConfigDict(
        json_schema_extra=lambda schema: _spec_schema(
            schema,
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
        json_schema_extra=_extra(_IMAGE_RULE),
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
    node_selector: dict[str, LabelValue] | None = Field(
        None,
        max_length=64,
        description=(
            "nodeSelector constrains workers to nodes with these labels (label keys and values). Default: "
            "none. Mutable: applies to workers created after the change."
        ),
        json_schema_extra=_extra(_label_keys_rule("nodeSelector")),
    )
    tolerations: list[Toleration] | None = Field(
        None,
        max_length=64,
        description=(
            "tolerations are the workers' pod tolerations (Kubernetes syntax). Default: none. Mutable: "
            "applies to workers created after the change."
        ),
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    affinity: Affinity | None = Field(
        None,
        description=(
            "affinity is the workers' pod affinity (Kubernetes syntax). Default: none. Mutable: applies to "
            "workers created after the change."
        ),
    )
    priority_class_name: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
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
        pattern=DNS_SUBDOMAIN_PATTERN,
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
        json_schema_extra=_extra(_label_keys_rule("podLabels"), _reserved_keys_rule("podLabels")),
    )
    pod_annotations: dict[str, Annotated[str, Field(max_length=4096)]] | None = Field(
        None,
        max_length=64,
        description=(
            "podAnnotations are added to every worker pod (keys are label keys); keys under kubetrain.io/ "
            "are reserved. Mutable: applies to workers created after the change."
        ),
        json_schema_extra=_extra(_label_keys_rule("podAnnotations"), _reserved_keys_rule("podAnnotations")),
    )
    gang_scheduling: GangScheduling | None = Field(
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

    elastic: Elastic | None = Field(
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
                if not is_label_key(key):
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


class ResumedFrom(_Model):
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
    resumed_from: ResumedFrom | None = Field(
        None,
        description=(
            "resumedFrom is the checkpoint this attempt's rank 0 resumed from; absent when it started fresh."
        ),
    )


class WorkerFailure(_Model):
    worker: int = Field(..., description="worker is the index of the failed worker.")
    pod: str | None = Field(None, description="pod is the failed worker's pod name.")
    exit_code: int | None = Field(None, description="exitCode is the container's exit code, when it had one.")
    reason: str | None = Field(
        None, description="reason is the Kubernetes reason (Error, OOMKilled, Evicted...)."
    )
    message: str | None = Field(None, description="message is the full human-readable description.")
    restart_attempt: int = Field(0, description="restartAttempt is the attempt the failure happened in.")


class ElasticStatus(_Model):
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
        description=(
            "restarts is how many whole-group restarts (on an elastic job: single-worker replacements) "
            "failures have caused (at most maxRestarts)."
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


class TrainingJob(_Model):
    """A distributed PyTorch training job (for validating whole manifests in tests and tools)."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["kubetrain.io/v1alpha1"] = Field(constants.API_VERSION)
    kind: Literal["TrainingJob"] = Field(constants.KIND)
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: TrainingJobSpec
    status: TrainingJobStatus | None = None
