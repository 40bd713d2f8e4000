"""Every shipped example is a valid TrainingJob, and the ones that can run here do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubetrain_operator import api
from testcluster.cluster import Cluster
from testcluster.operator_process import install_crd

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MANIFESTS = sorted(
    p
    for p in EXAMPLES.rglob("*.yaml")
    if [doc.get("kind") for doc in yaml.safe_load_all(p.read_text())] == ["TrainingJob"]
)


@pytest.mark.unit
def test_examples_cover_gpu_cpu_custom_script_and_queueing() -> None:
    names = {path.relative_to(EXAMPLES).as_posix() for path in MANIFESTS}
    assert {
        "cifar10-cpu.yaml",
        "cifar10-gpu.yaml",
        "custom-torchrun/trainingjob.yaml",
        "suspend-resume-queue.yaml",
    } <= names


@pytest.mark.unit
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_example_validates_against_the_models(path: Path) -> None:
    api.TrainingJob.model_validate(yaml.safe_load(path.read_text()))


@pytest.mark.cluster
def test_api_server_accepts_every_example(cluster: Cluster, namespace: str) -> None:
    install_crd(cluster)
    for path in MANIFESTS:
        result = cluster.run_kubectl("-n", namespace, "apply", "--dry-run=server", "-f", str(path))
        assert result.returncode == 0, f"{path}: {result.stderr}"


@pytest.mark.distributed
@pytest.mark.trains
def test_custom_torchrun_example_runs_four_ranks_locally(tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubetrain_operator.cli",
            "run",
            "-f",
            str(EXAMPLES / "custom-torchrun" / "trainingjob.yaml"),
            "--local",
            "--mount",
            f"code={EXAMPLES / 'custom-torchrun'}",
            "--mount",
            f"output={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    result = json.loads((tmp_path / "custom-torchrun" / "result.json").read_text())
    assert result["world_size"] == 4, "2 workers x nprocPerWorker 2 under torchrun"
    assert result["loss"] < 0.5, "the group fitted y = 3x + 1 together (an untrained model scores above 4)"
