"""Each worker's compute resources (requests and limits): which resource names exist, which are counted in
whole units and never overcommitted, and how requests compare with limits.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from kubetrain_operator.api import base, constants, quantities

STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
"""Container resources without a domain; anything else is hugepages-<size> or <domain>/<name>."""


def _resource_name_ok(name: str) -> bool:
    return (
        name in STANDARD_RESOURCES
        or name.startswith("hugepages-")
        or ("/" in name and not name.startswith("requests.") and base.is_label_key(name))
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


def _resource_map_rules(field: str) -> dict[str, Any]:
    """Rules on resources.requests or resources.limits: known resource names, whole numbers for extended
    resources (QUANTITY_RULE and the schema's minimum already refuse negative quantities). Each message
    names the offending key."""
    name_ok = _cel_resource_name_ok("k")
    whole_ok = (
        f"!{_cel_extended('k')} || !{quantities.cel_is_quantity('self[k]')} || "
        f"{quantities.cel_quantity('self[k]')}.isInteger()"
    )
    bad_name = base.cel_first_failing("self", name_ok)
    bad_whole = base.cel_first_failing("self", whole_ok)
    return base.schema_extra(
        base.cel_rule(
            f"self.all(k, {name_ok})",
            f"resources.{field} keys must be cpu, memory, ephemeral-storage, hugepages-<size> or an extended "
            "resource with a domain, such as nvidia.com/gpu",
            message_expression=(
                f"'resource name ' + {bad_name} + ' is not cpu, memory, ephemeral-storage, "
                "hugepages-<size> or an extended resource with a domain such as nvidia.com/gpu'"
            ),
        ),
        base.cel_rule(
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
        f"!(k in self.limits) || !{quantities.cel_is_quantity('self.requests[k]')} "
        f"|| !{quantities.cel_is_quantity('self.limits[k]')} || "
    )
    order = (
        f"{quantities.cel_quantity('self.requests[k]')}"
        f".compareTo({quantities.cel_quantity('self.limits[k]')})"
    )
    kind = f"({_cel_extended('k')} || k.startsWith('hugepages-'))"
    check = f"!{kind} || {order} == 0" if equal else f"{kind} || {order} <= 0"
    bad = f"self.requests.filter(k, !({comparable}{check}))[0]"
    shown = f"{bad} + ' ' + string(self.requests[{bad}]) + ' vs limit ' + string(self.limits[{bad}])"
    if equal:
        return base.cel_rule(
            both + comparable + check + ")",
            "requests of extended resources and hugepages must equal their limits",
            ".requests",
            f"'request ' + {shown} + ': extended resources and hugepages need the request equal to the "
            "limit (or give only one of them)'",
        )
    return base.cel_rule(
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


class Resources(base.Model):
    """Compute resources of each worker's container (the Kubernetes ResourceRequirements shape)."""

    model_config = ConfigDict(
        json_schema_extra=base.schema_extra(
            _request_limit_rule(False),
            _request_limit_rule(True),
            base.cel_rule(
                f"!({_cel_mentions(_CEL_HUGEPAGES)}) || {_cel_mentions(_CEL_CPU_OR_MEMORY)}",
                _HUGEPAGES_MESSAGE,
            ),
        )
    )

    requests: dict[str, quantities.Quantity] | None = Field(
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
    limits: dict[str, quantities.Quantity] | None = Field(
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
            number = quantities.quantity_value(value)
            if _extended(key) and number != number.to_integral_value():
                raise ValueError(f"{key} is {value}: extended resources are counted in whole units")
        return values

    @model_validator(mode="after")
    def _requests_within_limits(self) -> Resources:
        for key, request in (self.requests or {}).items():
            if key not in (self.limits or {}):
                continue
            limit = (self.limits or {})[key]
            order = quantities.quantity_value(request).compare(quantities.quantity_value(limit))
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
                return int(quantities.quantity_value(source[constants.GPU_RESOURCE]))
        return 0
