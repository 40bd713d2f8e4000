"""The whole TrainingJob object (apiVersion, kind, metadata, spec, status), for validating complete
manifests in tests and tools; the operator itself validates spec and status separately.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from kubetrain_operator.api import base, constants, jobspec, jobstatus


class TrainingJob(base.Model):
    """A distributed PyTorch training job (for validating whole manifests in tests and tools)."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["kubetrain.io/v1alpha1"] = Field(constants.API_VERSION)
    kind: Literal["TrainingJob"] = Field(constants.KIND)
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: jobspec.TrainingJobSpec
    status: jobstatus.TrainingJobStatus | None = None
