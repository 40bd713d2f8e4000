"""`make images`, `make push`, `make chart` and `make push-chart`: the commands they run, and what they make.

`make -n` prints a target's commands without running them (its variables, the container engine's choice
among them, are still worked out), so the push targets are checked without a registry. `make chart` runs
for real with the helm the tests build; `docker build` is replaced by a recorder on PATH, since no Docker
engine runs here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml
from kubetrain_operator.api import constants
from testcluster.binaries import KUBERNETES_VERSION

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
MAKE = shutil.which("make") or "make"


def make(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("CONTAINER_ENGINE", None)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [MAKE, "--no-print-directory", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def fake_docker(directory: Path, *, engine_answers: bool) -> Path:
    """A `docker` command that records its arguments; `docker info` succeeds only if an engine 'answers'."""
    directory.mkdir(exist_ok=True)
    docker = directory / "docker"
    docker.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >>"{directory}/calls"\n'
        f'if [ "$1" = info ]; then exit {0 if engine_answers else 1}; fi\n'
    )
    docker.chmod(0o755)
    return directory


@pytest.mark.parametrize(("engine", "cli"), [("docker", "docker"), ("podman", "hack/podman")])
def test_push_builds_then_tags_and_pushes_both_images_for_the_registry(engine: str, cli: str) -> None:
    made = make("-n", "push", "REGISTRY=example.test/me", f"CONTAINER_ENGINE={engine}")
    assert made.returncode == 0, made.stderr
    lines = made.stdout.splitlines()
    assert lines[-5:] == [
        f"CONTAINER_ENGINE={engine} bash hack/build-images.sh",
        f"{cli} tag ghcr.io/kubetrain/kubetrain-operator:{VERSION} example.test/me/kubetrain-operator:{VERSION}",
        f"{cli} tag ghcr.io/kubetrain/kubetrain-trainer:{VERSION} example.test/me/kubetrain-trainer:{VERSION}",
        f"{cli} push example.test/me/kubetrain-operator:{VERSION}",
        f"{cli} push example.test/me/kubetrain-trainer:{VERSION}",
    ]


@pytest.mark.parametrize("target", ["push", "push-chart"])
def test_push_without_a_registry_stops_before_anything_runs(target: str) -> None:
    made = make("-n", target)
    assert made.returncode != 0
    assert "REGISTRY is empty" in made.stderr
    assert made.stdout == ""


def test_images_use_docker_when_a_docker_engine_answers(tmp_path: Path) -> None:
    bin_dir = fake_docker(tmp_path / "bin", engine_answers=True)
    made = make("-n", "images", path=f"{bin_dir}:{os.environ['PATH']}")
    assert made.returncode == 0, made.stderr
    # Docker pulls the real base: none of podman's system packages are needed.
    assert made.stdout.splitlines() == ["CONTAINER_ENGINE=docker bash hack/build-images.sh"]


@pytest.mark.parametrize("docker", ["without a daemon", "absent"])
def test_images_use_this_projects_podman_otherwise(docker: str, tmp_path: Path) -> None:
    if docker == "absent":
        # Only what the Makefile's own commands need, and no docker anywhere on PATH.
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for tool in ("sed", "sh"):
            (bin_dir / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    else:
        bin_dir = fake_docker(tmp_path / "bin", engine_answers=False)
    path = str(bin_dir) if docker == "absent" else f"{bin_dir}:{os.environ['PATH']}"
    made = make("-n", "images", path=path)
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines() == [
        "bash hack/install-system-packages.sh",
        "CONTAINER_ENGINE=podman bash hack/build-images.sh",
    ]


def test_make_test_builds_and_pushes_the_podman_images_the_real_node_pulls_whatever_the_engine(
    tmp_path: Path,
) -> None:
    bin_dir = fake_docker(tmp_path / "bin", engine_answers=True)
    made = make("-n", "test", "node-images", path=f"{bin_dir}:{os.environ['PATH']}")
    assert made.returncode == 0, made.stderr
    # testcluster's push-images runs hack/build-images.sh (podman) and pushes to the test registry.
    assert "PYTHONPATH=tests .venv/bin/python -m testcluster push-images" in made.stdout.splitlines()
    assert "CONTAINER_ENGINE=docker" not in made.stdout
    # Only `make images` and `make push` ask docker whether an engine runs.
    assert not (bin_dir / "calls").exists()


def test_make_test_lints_then_starts_the_background_builds_before_the_others_and_pytest_last() -> None:
    made = make("-n", "test")
    assert made.returncode == 0, made.stderr
    lines = made.stdout.splitlines()
    order = [
        ".venv/bin/ruff check .",
        "PYTHONPATH=tests .venv/bin/python -m testcluster build-in-background",
        "bash hack/build-k8s.sh",
        ".venv/bin/python -m pytest",
    ]
    assert [lines.index(line) for line in order] == sorted(lines.index(line) for line in order)
    assert lines[-1] == ".venv/bin/python -m pytest"


def test_the_docker_build_tags_both_dockerfiles_images_with_the_version(tmp_path: Path) -> None:
    bin_dir = fake_docker(tmp_path / "bin", engine_answers=True)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "KUBETRAIN_CACHE": str(tmp_path / "cache"),
    }
    env["CONTAINER_ENGINE"] = "docker"
    built = subprocess.run(
        ["bash", "hack/build-images.sh"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    references = [constants.OPERATOR_IMAGE, constants.TRAINER_IMAGE]
    assert (bin_dir / "calls").read_text().splitlines() == [
        f"build -f Dockerfile.{name} -t {reference} ."
        for name, reference in zip(("operator", "trainer"), references, strict=True)
    ]
    # tests/testcluster/node.py and users' scripts read the references from the last two lines.
    assert built.stdout.splitlines()[-2:] == references


@pytest.mark.binaries
def test_chart_packages_the_chart_with_the_version(helm_bin: Path, tmp_path: Path) -> None:
    made = make("chart", f"HELM={helm_bin}", f"DIST={tmp_path}")
    assert made.returncode == 0, made.stderr
    assert [p.name for p in tmp_path.iterdir()] == [f"kubetrain-{VERSION}.tgz"]
    with tarfile.open(tmp_path / f"kubetrain-{VERSION}.tgz") as package:
        chart_file = package.extractfile("kubetrain/Chart.yaml")
        assert chart_file is not None
        chart = yaml.safe_load(chart_file.read())
        names = package.getnames()
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION)
    assert {"kubetrain/values.yaml", "kubetrain/values.schema.json"} <= set(names)
    assert any(name.startswith("kubetrain/crds/") for name in names)


def test_push_chart_pushes_the_package_that_make_chart_wrote() -> None:
    made = make("-n", "push-chart", "REGISTRY=oci://example.test/me/charts", "HELM=helm", "DIST=out")
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines() == [
        "helm package charts/kubetrain --destination out",
        f"helm push out/kubetrain-{VERSION}.tgz oci://example.test/me/charts",
    ]


@pytest.mark.binaries
def test_the_readmes_own_images_route_installs_the_pushed_images(helm_bin: Path) -> None:
    """`make push REGISTRY=R` then the README's `helm install ... --set ...`: the operator runs R's operator
    image and gives workers R's trainer image, both at the version `make push` tagged."""
    readme = (REPO_ROOT / "README.md").read_text()
    install = readme.split("## Install\n", 1)[1].split("\n## ", 1)[0]
    registry = re.findall(r"^make push REGISTRY=(\S+)$", install, flags=re.MULTILINE)
    assert len(registry) == 1, registry
    sets = re.findall(r"--set (\S+=\S+)", install)
    assert sets, "the README's install section sets the image repositories"
    rendered = subprocess.run(
        [
            *(
                str(helm_bin),
                "template",
                "kubetrain",
                "charts/kubetrain",
                "--kube-version",
                KUBERNETES_VERSION,
            ),
            *(f"--set={value}" for value in sets),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    deployment = next(doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"{registry[0]}/kubetrain-operator:{VERSION}"
    assert f"--default-image={registry[0]}/kubetrain-trainer:{VERSION}" in container["args"]
