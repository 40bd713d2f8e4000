"""TrainingJob manifests for cluster tests, whose simulated pods obey kwok.yaml's annotations."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


def trainingjob(
    name: str, *, workers: int = 2, annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A small built-in-trainer TrainingJob; `annotations` go on its pods, `spec` overrides fields."""
    return {
        "apiVersion": "kubetrain.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "image": "registry.local/kubetrain-trainer:test",
            "workers": workers,
            "trainer": {"epochs": 1, "data": {"dataset": "fake"}},
            "podAnnotations": annotations or {},
            **spec,
        },
    }


REFUSED_TABLE = Path(__file__).resolve().parents[1] / "operator" / "testdata" / "refused-trainingjobs.yaml"
"""The table of TrainingJobs the API server must refuse (see the file's header)."""


@dataclass(frozen=True)
class RefusedCase:
    """One row of REFUSED_TABLE: a whole manifest, the field its refusal must name, and what refuses it."""

    name: str
    by: str
    field: str
    manifest: dict[str, Any]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def refused_cases() -> list[RefusedCase]:
    """Every row of REFUSED_TABLE with its spec patch applied to the table's base spec."""
    table = yaml.safe_load(REFUSED_TABLE.read_text())
    return [
        RefusedCase(
            name=row["name"],
            by=row["by"],
            field=row["field"],
            manifest={
                "apiVersion": "kubetrain.io/v1alpha1",
                "kind": "TrainingJob",
                "metadata": {"name": row["name"]},
                "spec": merge_patch(table["base"], row["spec"]),
            },
        )
        for row in table["cases"]
    ]
