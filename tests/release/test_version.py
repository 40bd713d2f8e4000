"""The version is written once, in pyproject.toml; every copy a user, helm or a build reads agrees with it.

Helm cannot read pyproject.toml, so the chart keeps copies (Chart.yaml's version and appVersion, the
default image tags in values.yaml); the operator keeps `__version__` for its user agent and default
worker image. These tests fail naming the copy that drifted. What reads the version instead of copying
it: the Makefile (`make version`), hack/build-images.sh, the Dockerfiles (the wheel by pattern) and the
release workflow (its tag check, tests/release/test_workflows.py).
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from kubetrain_operator import __version__
from kubetrain_operator.api import constants
from testcluster import binaries

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "kubetrain"
VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_version_is_plain_major_minor_patch() -> None:
    """PEP 440 (the wheel) and SemVer (helm's chart version) spell pre-releases differently (0.2.0rc1,
    0.2.0-rc.1); only MAJOR.MINOR.PATCH is one string in both, so only that can be written once."""
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION), VERSION


def test_the_operator_package_carries_it() -> None:
    assert __version__ == VERSION, "operator/kubetrain_operator/__init__.py __version__"


def test_the_chart_is_versioned_with_it() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION), "charts/kubetrain/Chart.yaml"


def test_the_chart_and_the_operator_default_to_images_of_it() -> None:
    images = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["image"]
    assert {part: images[part]["tag"] for part in ("operator", "trainer")} == {
        "operator": VERSION,
        "trainer": VERSION,
    }, "charts/kubetrain/values.yaml image.*.tag"
    assert constants.OPERATOR_IMAGE.endswith(f"/kubetrain-operator:{VERSION}"), constants.OPERATOR_IMAGE
    assert constants.TRAINER_IMAGE.endswith(f"/kubetrain-trainer:{VERSION}"), constants.TRAINER_IMAGE


@pytest.mark.parametrize("name", ["Dockerfile.operator", "Dockerfile.trainer"])
def test_the_dockerfiles_read_it_from_the_wheel_instead_of_naming_it(name: str) -> None:
    text = (REPO_ROOT / name).read_text()
    assert re.findall(r"/wheels/(\S+\.whl)", text) == ["kubetrain-*-py3-none-any.whl"]
    tagged = re.findall(r"ghcr\.io/kubetrain/kubetrain-\w+:(\d[\w.\-]*)", text)
    assert not tagged, f"{name} names image tags {tagged}; the version lives in pyproject.toml"


def test_make_and_the_image_build_read_it() -> None:
    made = subprocess.run(
        ["make", "--no-print-directory", "-s", "version"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert made.stdout == f"{VERSION}\n"
    script = (REPO_ROOT / "hack" / "build-images.sh").read_text()
    assert VERSION not in script
    assert (
        'version=$(python3 -c \'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])\')'
        in script
    )


def test_the_readme_installs_it() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert f"helm install kubetrain oci://ghcr.io/kubetrain/charts/kubetrain --version {VERSION}" in readme


def test_the_suites_kubernetes_is_the_one_the_build_script_builds() -> None:
    """Offline chart renders say which Kubernetes they stand for (testcluster.binaries); it must be the
    version the suite's clusters run."""
    script = binaries.BUILD_SCRIPT.read_text()
    assert f"K8S_VERSION=${{K8S_VERSION:-{binaries.KUBERNETES_VERSION}}}" in script
