"""The TrainingJob field behind a child's field: API errors about a worker Job said in the user's terms.

The CRD refuses bad specs at `kubectl apply`; whatever still gets through (a free-form affinity, a rule of
a newer Kubernetes) is refused when the operator creates the worker Job, and the API server names the
Job's field: `spec.template.spec.containers[0].env[18].valueFrom...`. The user wrote `spec.env[0]`, so the
operator rewrites every path it can trace back before it reports the failure. The operator's own
variables, volumes and command arguments come first in each list; the user's follow in spec order, which
is what makes the index arithmetic below exact.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import pydantic

_TEMPLATE = r"spec\.template\.spec\."
_CONTAINER = _TEMPLATE + r"containers\[0\]\."

_POD_FIELDS = (
    "nodeSelector",
    "tolerations",
    "affinity",
    "priorityClassName",
    "schedulerName",
    "serviceAccountName",
    "imagePullSecrets",
)
"""Pod spec fields copied unchanged from the TrainingJob spec."""


def _shifted(path: str, user_items: int, child_items: int) -> Callable[[re.Match[str]], str]:
    """Replace `<child list>[i]` by `<path>[i - operator items]`, the user's items being the list's tail;
    an index into the operator's own items is left alone (it names no field of the user's)."""
    first_user = child_items - user_items

    def replace(match: re.Match[str]) -> str:
        index = int(match.group(1))
        return f"{path}[{index - first_user}]" if index >= first_user else match.group(0)

    return replace


def _container(child: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = child.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or [{}]
    return containers[0]


def to_trainingjob_fields(message: str, spec: Mapping[str, Any], child: Mapping[str, Any]) -> str:
    """`message` (an API error about `child`, built from `spec`) with the child's field paths rewritten
    as the TrainingJob's, e.g. `spec.template.spec.containers[0].env[18]` -> `spec.env[0]`."""
    if child.get("kind") == "Service":
        return re.sub(r"spec\.ports\[0\]\.(?:targetPort|port)\b", "spec.masterPort", message)
    if child.get("kind") != "Job":
        return message
    container = _container(child)
    pod = child.get("spec", {}).get("template", {}).get("spec", {})
    storage = len(spec.get("storage") or ())
    command = len(spec.get("command") or ())
    rules: list[tuple[str, str | Callable[[re.Match[str]], str]]] = [
        (
            _CONTAINER + r"env\[(\d+)\]",
            _shifted("spec.env", len(spec.get("env") or ()), len(container.get("env") or ())),
        ),
        (
            _CONTAINER + r"volumeMounts\[(\d+)\]",
            _shifted("spec.storage", storage, len(container.get("volumeMounts") or ())),
        ),
        (_TEMPLATE + r"volumes\[(\d+)\]", _shifted("spec.storage", storage, len(pod.get("volumes") or ()))),
        (
            _CONTAINER + r"command\[(\d+)\]",
            _shifted("spec.command", command, len(container.get("command") or ())),
        ),
        (_CONTAINER + r"(resources|imagePullPolicy|image|args)\b", r"spec.\1"),
        (_CONTAINER + r"ports\[0\]\.containerPort\b", "spec.masterPort"),
        (_TEMPLATE + "(" + "|".join(_POD_FIELDS) + r")\b", r"spec.\1"),
        (r"spec\.template\.metadata\.labels\b", "spec.podLabels"),
        (r"spec\.template\.metadata\.annotations\b", "spec.podAnnotations"),
    ]
    for pattern, replacement in rules:
        message = re.sub(pattern, replacement, message)
    return message


def spec_error(exc: pydantic.ValidationError) -> str:
    """The first validation errors as `spec.<field>: <message>`, the field written as the API server
    writes it (spec.env[0].name), so the message points into the user's manifest."""
    parts = []
    for err in exc.errors()[:3]:
        loc = "spec"
        for part in err.get("loc", ()):
            if isinstance(part, int):
                loc += f"[{part}]"
            elif not part.startswith("function-") and part not in ("int", "str", "constrained-int"):
                loc += f".{part}"  # the union of a quantity names its branches (int, str): not fields
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)
