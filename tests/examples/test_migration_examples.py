"""docs/migrating.md's translated manifests: each is a file the guide shows verbatim, valid under the
models and accepted by a real API server as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubetrain_operator import api
from testcluster.cluster import Cluster
from testcluster.operator_process import install_crd

DOCS = Path(__file__).resolve().parents[2] / "docs"
GUIDE = DOCS / "migrating.md"
TRANSLATIONS = sorted((DOCS / "migrating").glob("*.yaml"))


@pytest.mark.unit
def test_the_guide_translates_pytorchjob_and_trainjob_examples() -> None:
    assert {path.stem for path in TRANSLATIONS} >= {
        "pytorchjob-master-workers",
        "pytorchjob-gpu-gang",
        "pytorchjob-elastic",
        "trainjob-torch-distributed",
    }


@pytest.mark.unit
@pytest.mark.parametrize("path", TRANSLATIONS, ids=lambda p: p.name)
def test_the_guide_shows_each_translation_exactly_as_the_file_the_tests_apply(path: Path) -> None:
    guide = GUIDE.read_text()
    assert f"```yaml\n{path.read_text()}```" in guide
    assert f"(migrating/{path.name})" in guide


@pytest.mark.unit
@pytest.mark.parametrize("path", TRANSLATIONS, ids=lambda p: p.name)
def test_each_translation_validates_against_the_models(path: Path) -> None:
    api.TrainingJob.model_validate(yaml.safe_load(path.read_text()))


@pytest.mark.cluster
def test_the_api_server_accepts_every_translation_as_written(cluster: Cluster, namespace: str) -> None:
    install_crd(cluster)
    for path in TRANSLATIONS:
        result = cluster.run_kubectl("-n", namespace, "apply", "-f", str(path))
        assert result.returncode == 0, f"{path.name}: {result.stderr}"
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        stored = json.loads(cluster.kubectl("-n", namespace, "get", "trainingjob", name, "-o", "json"))
        assert stored["spec"]["workers"] == yaml.safe_load(path.read_text())["spec"]["workers"]
