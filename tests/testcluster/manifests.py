"""TrainingJob manifests for cluster tests, whose simulated pods obey kwok.yaml's annotations."""

from __future__ import annotations

from typing import Any


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
