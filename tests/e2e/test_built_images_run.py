"""The two images the project ships, built from Dockerfile.operator and Dockerfile.trainer, run as
containers (podman + crun) the way a cluster runs them: their own users, the operator read-only."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest
from testcluster import binaries
from testcluster.node import PODMAN, build_images

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SAMPLE = binaries.REPO_ROOT / "examples" / "data" / "cifar10-sample.tar.gz"


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    operator, trainer = build_images()
    return {"operator": operator, "trainer": trainer}


def _podman_run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # No network: nothing either image does here may need one.
    return subprocess.run(
        [str(PODMAN), "run", "--rm", "--network=none", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.trains
def test_trainer_image_trains_on_the_cifar_sample_as_uid_1000(images: dict[str, str], tmp_path: Path) -> None:
    data, output = tmp_path / "data", tmp_path / "output"
    data.mkdir()
    output.mkdir(mode=0o777)
    output.chmod(0o777)
    with tarfile.open(SAMPLE) as archive:
        archive.extractall(data, filter="data")

    result = _podman_run(
        "--volume",
        f"{data}:/data:ro",
        "--volume",
        f"{output}:/output",
        images["trainer"],
        "train",
        "--dataset=cifar10",
        "--data-root=/data/cifar10-sample",
        "--model=simple_cnn",
        "--epochs=1",
        "--device=cpu",
        "--output-dir=/output",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    model = output / "local" / "model.pt"
    assert model.is_file(), sorted(str(p.relative_to(output)) for p in output.rglob("*"))
    assert model.stat().st_uid == 1000, "the image's own user (uid 1000) wrote the artifacts"


def test_operator_image_starts_as_uid_65532_on_a_read_only_root(images: dict[str, str]) -> None:
    help_text = _podman_run("--read-only", images["operator"], "--help")
    assert help_text.returncode == 0, help_text.stderr
    assert "usage: kubetrain operator" in help_text.stdout
    identity = _podman_run("--read-only", "--entrypoint=id", images["operator"])
    assert identity.stdout.startswith("uid=65532"), identity.stdout + identity.stderr


def test_operator_image_has_no_torch(images: dict[str, str]) -> None:
    probe = _podman_run(
        "--read-only",
        "--entrypoint=python3",
        images["operator"],
        "-c",
        "import kubetrain_operator.runtime.main, torch",
    )
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr, probe.stderr
