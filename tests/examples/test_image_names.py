"""One name for each image the project builds, everywhere a user reads or copies one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from kubetrain_operator.api import constants

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
# oci://ghcr.io/kubetrain/charts/... is the chart, not an image (tests/release/test_workflows.py).
IMAGE_REFERENCE = re.compile(r"(?<!oci://)ghcr\.io/kubetrain/[\w.\-/]+(?::[\w.\-]+)?")
BUILT = {constants.OPERATOR_IMAGE, constants.TRAINER_IMAGE}


def _documents() -> list[Path]:
    return [
        REPO_ROOT / "README.md",
        REPO_ROOT / "Dockerfile.operator",
        REPO_ROOT / "Dockerfile.trainer",
        REPO_ROOT / "charts" / "kubetrain" / "README.md",
        *sorted((REPO_ROOT / "docs").glob("*.md")),
        *sorted((REPO_ROOT / "examples").rglob("*.yaml")),
        *sorted((REPO_ROOT / "examples").rglob("*.md")),
    ]


@pytest.mark.parametrize("path", _documents(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_image_named_in_docs_and_examples_is_one_the_project_builds(path: Path) -> None:
    named = {match.group(0) for match in IMAGE_REFERENCE.finditer(path.read_text())}
    # A repository named without a tag is fine (the chart's values table splits repository and tag).
    wrong = {ref for ref in named if ref not in BUILT and ref not in {b.rsplit(":", 1)[0] for b in BUILT}}
    assert not wrong, f"{path.name} names images nothing builds: {sorted(wrong)}; built: {sorted(BUILT)}"


def test_chart_defaults_are_the_built_images() -> None:
    values = yaml.safe_load((REPO_ROOT / "charts" / "kubetrain" / "values.yaml").read_text())["image"]
    chart = {f"{values[part]['repository']}:{values[part]['tag']}" for part in ("operator", "trainer")}
    assert chart == BUILT


def test_the_image_build_script_tags_the_same_names() -> None:
    script = (REPO_ROOT / "hack" / "build-images.sh").read_text()
    assert f"registry={constants.IMAGE_REGISTRY}\n" in script
    assert 'ref="$registry/kubetrain-$1:$version"' in script
    assert "build_image operator" in script and "build_image trainer" in script


def test_an_operator_without_default_image_gives_workers_the_built_trainer_image() -> None:
    from kubetrain_operator import cli
    from kubetrain_operator.planning import builders
    from kubetrain_operator.runtime import main

    assert main.Options().default_image == constants.TRAINER_IMAGE
    assert cli._parser().parse_args(["operator"]).default_image == constants.TRAINER_IMAGE
    assert builders.Context.__dataclass_fields__["default_image"].default == constants.TRAINER_IMAGE


def test_operator_help_states_the_default_worker_image(capsys: pytest.CaptureFixture[str]) -> None:
    """A locally run operator gives workers this image unless told otherwise: --help must say which."""
    from kubetrain_operator import cli

    with pytest.raises(SystemExit):
        cli._parser().parse_args(["operator", "--help"])
    assert f"default: {constants.TRAINER_IMAGE}," in " ".join(capsys.readouterr().out.split())
