"""The API reference in docs/ is generated from the models and must not drift from them."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubetrain_operator.api import apidocs

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_api_reference_matches_the_models() -> None:
    assert (ROOT / apidocs.REFERENCE).read_text() == apidocs.render(), "run kubetrain crds"


def test_reference_documents_every_spec_field_and_printer_column() -> None:
    text = apidocs.render()
    for field in ("spec.workers", "spec.nprocPerWorker", "spec.runPolicy.maxRestarts", "spec.trainer.epochs"):
        assert f"| `{field}` |" in text
    assert "| Phase | `.status.phase` | always |" in text
