"""kopf's change-detection storages as the operator configures them: with no change handlers there is
nothing for kopf to diff, copy or record (runtime/handlers.py says why)."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from kubetrain_operator.runtime import handlers

pytestmark = pytest.mark.unit


def _trainingjob(workers: int) -> kopf.Body:
    raw: Any = {
        "apiVersion": "kubetrain.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "resnet", "namespace": "ml", "labels": {"team": "vision"}},
        "spec": {"workers": workers, "image": "trainer:1"},
        "status": {"phase": "Running"},
    }
    return kopf.Body(raw)


def _essence(storage: kopf.DiffBaseStorage, progress: kopf.ProgressStorage, body: kopf.Body) -> Any:
    """What kopf compares between two versions of an object (its cause detection)."""
    return progress.clear(essence=storage.build(body=body))


def test_kopf_finds_nothing_to_diff_between_two_specs() -> None:
    old = _essence(handlers.NoEssence(), handlers.NoProgress(), _trainingjob(2))
    new = _essence(handlers.NoEssence(), handlers.NoProgress(), _trainingjob(4))
    assert old == new == {}
    assert handlers.NoEssence().fetch(body=_trainingjob(4)) is None


def test_kopfs_default_storages_would_diff_the_same_two_specs() -> None:
    """The contrast: kopf's defaults copy and diff every event, the work the operator's storages skip."""
    storage, progress = kopf.AnnotationsDiffBaseStorage(), kopf.SmartProgressStorage()
    old = _essence(storage, progress, _trainingjob(2))
    new = _essence(storage, progress, _trainingjob(4))
    assert old != new
    assert (old["spec"]["workers"], new["spec"]["workers"]) == (2, 4)
