"""Fixtures for the chart tests: the helm binary built with the test control plane (hack/build-k8s.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest
from testcluster import binaries


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    """helm v3 from the cached Kubernetes binaries (built once, like the control plane itself)."""
    return binaries.ensure_binaries() / "helm"
