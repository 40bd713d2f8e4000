"""The local `kubectl scale`: spec.workers read from the manifest while an elastic job runs locally."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubetrain_operator import api
from kubetrain_operator.local import elastic_run

pytestmark = pytest.mark.unit


def _spec(workers: int = 2) -> dict:
    return {
        "workers": workers,
        "trainer": {},
        "elastic": {"minWorkers": 2, "maxWorkers": 3},
    }


def _write(path: Path, workers: object) -> None:
    path.write_text(yaml.safe_dump({"kind": "TrainingJob", "spec": {**_spec(), "workers": workers}}))


def test_an_edit_within_the_bounds_scales_and_anything_else_keeps_the_last_good_value(tmp_path: Path) -> None:
    path = tmp_path / "tj.yaml"
    _write(path, 2)
    workers = elastic_run.manifest_workers(path, api.TrainingJobSpec.model_validate(_spec()))
    assert workers() == 2
    _write(path, 3)
    assert workers() == 3
    for refused in (4, 1, "three"):
        _write(path, refused)
        assert workers() == 3, refused
    path.write_text("spec: {workers: [")  # caught mid-save
    assert workers() == 3
    _write(path, 2)
    assert workers() == 2
