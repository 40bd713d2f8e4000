"""The API reference in docs/ is generated from the models and must not drift from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubetrain_operator.api import apidocs, crdgen

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_api_reference_matches_the_models() -> None:
    assert (ROOT / apidocs.REFERENCE).read_text() == apidocs.render(), "run kubetrain crds"


def _field_paths(node: dict[str, Any], path: str) -> list[str]:
    """Every field under `node` in the CRD schema, as the reference names them (a list's item fields under
    `field[]`), walked here rather than by the renderer so that a field it skips is caught."""
    paths = []
    for name, child in (node.get("properties") or {}).items():
        field = f"{path}.{name}"
        paths.append(field)
        paths += _field_paths(child, field)
        if isinstance(child.get("items"), dict):
            paths += _field_paths(child["items"], f"{field}[]")
        if isinstance(child.get("additionalProperties"), dict):
            paths += _field_paths(child["additionalProperties"], f"{field}.*")
    return paths


def test_reference_documents_every_spec_and_status_field_and_every_printer_column() -> None:
    text = apidocs.render()
    version = crdgen.crd()["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    fields = _field_paths(schema["spec"], "spec") + _field_paths(schema["status"], "status")
    assert {"spec.workers", "spec.runPolicy.maxRestarts", "spec.trainer.epochs", "status.phase"} <= set(
        fields
    )
    assert [field for field in fields if f"| `{field}` |" not in text] == []
    columns = version["additionalPrinterColumns"]
    assert {"Phase", "Epoch"} <= {column["name"] for column in columns}
    rows = [f"| {column['name']} | `{column['jsonPath']}` |" for column in columns]
    assert [row for row in rows if row not in text] == []
