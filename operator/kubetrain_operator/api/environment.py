"""The environment variables a user adds to every worker, their sources (downward API, resources,
ConfigMap and Secret keys), and the names the operator keeps for itself.
"""

from __future__ import annotations

from typing import Literal

from kubetrain_trainer import contract
from pydantic import ConfigDict, Field, field_validator, model_validator

from kubetrain_operator.api import base, quantities

CONFIG_KEY_PATTERN = r"^\.?[-_a-zA-Z0-9][-._a-zA-Z0-9]*$"
"""A key of a ConfigMap or Secret: letters, digits, -, _ and ., not . itself nor starting with .."""

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


class ObjectFieldSelector(base.Model):
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
        return f"[{listed}].exists(d, quantity(d).compareTo({quantities.cel_quantity('self.divisor')}) == 0)"

    return (
        f"!has(self.divisor) || !{quantities.cel_is_quantity('self.divisor')} || "
        f"(self.resource.endsWith('.cpu') ? "
        f"{one_of(DIVISORS['cpu'])} : {one_of(DIVISORS['other'])})"
    )


class ResourceFieldSelector(base.Model):
    model_config = ConfigDict(
        json_schema_extra=base.schema_extra(
            base.cel_rule(
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
    divisor: quantities.Quantity | None = Field(
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
        if quantities.quantity_value(self.divisor) not in {quantities.quantity_value(d) for d in allowed}:
            raise ValueError(
                f"divisor {self.divisor} for {self.resource} must be one of {', '.join(allowed)}"
            )
        return self


class KeySelector(base.Model):
    """One key of a ConfigMap or Secret in the TrainingJob's namespace."""

    name: str = Field(
        ...,
        min_length=1,
        max_length=253,
        pattern=base.DNS_SUBDOMAIN_PATTERN,
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


class EnvVarSource(base.Model):
    """Where an env value comes from: exactly one of the four sources, as in a Kubernetes container."""

    model_config = ConfigDict(
        json_schema_extra=base.schema_extra(
            base.cel_rule(
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


class EnvVar(base.Model):
    model_config = ConfigDict(
        json_schema_extra=base.schema_extra(
            base.cel_rule(
                "!(self.name in ["
                + ", ".join(f"'{n}'" for n in RESERVED_ENV)
                + "]) && "
                + " && ".join(f"!self.name.startsWith('{p}')" for p in RESERVED_ENV_PREFIXES),
                f"env name is reserved: {_RESERVED_ENV_TEXT}",
                ".name",
                f"'env name ' + self.name + ' is reserved: {_RESERVED_ENV_TEXT}'",
            ),
            base.cel_rule(
                "has(self.value) != has(self.valueFrom)", "exactly one of value and valueFrom must be set"
            ),
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
