"""What every TrainingJob model builds on: the model base class, the CEL rule helpers and the string
patterns several models share.

CEL is used where a schema keyword cannot say a rule (quantity comparison, label keys, path spelling) or
where a keyword's error would quote a long regex at the user (quantities, image references); each such rule
is also a pydantic validator on the same model (see the package docstring).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""An RFC 1123 subdomain, the name of most Kubernetes objects (Secrets, ConfigMaps, claims, accounts)."""

LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
"""A label value (with maxLength 63): empty, or alphanumerics with -, _ and . inside."""

LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""A label key (a qualified name): an optional DNS-subdomain prefix and /, then at most 63 characters."""


def cel_rule(
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


def schema_extra(*rules: dict[str, str], **more: Any) -> dict[str, Any]:
    """A `json_schema_extra` holding `rules` as x-kubernetes-validations, beside any other keys."""
    out: dict[str, Any] = dict(more)
    if rules:
        out["x-kubernetes-validations"] = list(rules)
    return out


def cel_first_failing(items: str, predicate: str, var: str = "k") -> str:
    """CEL for the first element (key, for a map) of `items` failing `predicate`, for messageExpressions."""
    return f"{items}.filter({var}, !({predicate}))[0]"


class Model(BaseModel):
    """camelCase JSON names, unknown keys refused, Python names usable too."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def is_label_key(key: str) -> bool:
    """Whether `key` is a qualified name, as label, annotation, node-selector and resource keys must be."""
    prefix, _, _ = key.rpartition("/")
    return bool(re.match(LABEL_KEY_PATTERN, key)) and len(prefix) <= 253
